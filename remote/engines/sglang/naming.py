"""SGLang fused-MoE config naming rules (pure functions, stdlib only).

Every rule here follows SGLang 0.5.23
(``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``):

* ``get_config_file_name``: ``E={E},N={N},device_name={DEV}{dtype}{block}{per_channel}{down}.json``
* the device part is ``torch.cuda.get_device_name()`` with spaces replaced by ``_``;
* the version folder is ``"triton_" + triton.__version__.replace(".", "_")``;
* the fallback scan sorts every ``configs/triton_*`` entry by
  ``tuple(int(x) for x in name.removeprefix("triton_").replace("_", ".").split("."))``,
  newest first; a name whose parts are not all integers raises ValueError there.

This module must not import torch or triton: the controller imports it too.
"""

from __future__ import annotations

import re
from typing import Iterable

from ...protocol import BadInput

#: dtype selector strings understood by SGLang 0.5.23 ``get_config_dtype_str``,
#: in its order of precedence.
DTYPE_SELECTORS = ("fp8_w8a8", "int8_w8a8", "int4_w4a16", "int8_w8a16", "float32")

_INT_PART = re.compile(r"[0-9]+\Z")
_RELEASE = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def sglang_device_name(torch_name: str) -> str:
    """Return SGLang's file-name form of a CUDA device name.

    ``torch_name`` is ``torch.cuda.get_device_name()`` (e.g. ``"NVIDIA H200"``). SGLang
    0.5.23 ``get_config_file_name`` replaces every space with ``_`` and changes nothing
    else: ``"NVIDIA H200"`` -> ``"NVIDIA_H200"``, hyphens and parentheses stay.

    Raises :class:`remote.protocol.BadInput` (a ``bad_input`` PayloadError and a ValueError:
    a device name is something an operator types) for a name that is not a str, is empty
    (after stripping), or that could escape a folder or break a file name / log line: it
    contains ``/``, ``\\``, ``..``, NUL or any other control character (newline, tab, ...),
    or is ``.``/``..``.
    """
    if not isinstance(torch_name, str):
        raise BadInput(f"device name must be a string, got {type(torch_name).__name__}")
    if not torch_name.strip():
        raise BadInput("device name is empty")
    bad = [c for c in torch_name if c in "/\\" or ord(c) < 32 or ord(c) == 127]
    if bad:
        raise BadInput(f"device name {torch_name!r} contains forbidden character {bad[0]!r}")
    if ".." in torch_name or torch_name.strip() == ".":
        raise BadInput(f"device name {torch_name!r} could escape a folder ('.' or '..')")
    return torch_name.replace(" ", "_")


#: The first word of the names ``torch.cuda.get_device_name()`` gives (the driver's own name of
#: the board): every device of SGLang 0.4.10-0.5.23's shipped ``configs/triton_*/`` files is
#: named ``NVIDIA_...``, ``AMD_...`` (``AMD Instinct MI300X``, ``AMD Radeon Graphics``) or
#: ``Intel(R)_...`` (``Intel(R) Arc(TM) Pro B60 Graphics``); NVIDIA boards from before 2020
#: report their brand first instead (``Tesla T4``, ``Tesla V100-SXM2-16GB``, ``Quadro RTX 6000``,
#: ``GeForce RTX 2080 Ti``, ``TITAN RTX``).
TORCH_NAME_VENDORS = ("NVIDIA", "AMD", "Intel(R)", "Tesla", "Quadro", "GeForce", "TITAN")

_AMD_INSTINCT = re.compile(r"MI[0-9]", re.IGNORECASE)


def torch_form_hint(name: str) -> str | None:
    """None when ``name`` is in the form ``torch.cuda.get_device_name()`` gives (or already in
    SGLang's form, ``_`` for spaces: it names the same file); else the likely torch form.

    A name is in torch's form when it starts with one of :data:`TORCH_NAME_VENDORS` (exact case,
    then a space, ``_`` or the end). Otherwise the hint is that word in its case when only the
    case differs (``"nvidia H200"`` -> ``"NVIDIA H200"``), ``"AMD Instinct ..."`` for an
    ``MI<digit>...`` part, and ``"NVIDIA ..."`` for anything else (``"H200"`` -> ``"NVIDIA H200"``),
    with ``_`` read as spaces. Pure; a hint, not a rule of SGLang: a vendor not listed gets one too.
    """
    text = name.strip()
    for vendor in TORCH_NAME_VENDORS:
        if text == vendor or text.startswith((vendor + " ", vendor + "_")):
            return None
    words = text.replace("_", " ")
    for vendor in TORCH_NAME_VENDORS:
        if words.lower() == vendor.lower() or words.lower().startswith(vendor.lower() + " "):
            return vendor + words[len(vendor):]
    if _AMD_INSTINCT.match(words):
        return "AMD Instinct " + words
    return "NVIDIA " + words


def _format_block_shape(block_shape: Iterable[int]) -> str:
    parts = list(block_shape)
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise ValueError(f"block_shape entries must be non-negative ints, got {parts!r}")
    # str(list) in Python: "[128, 128]" (comma + space)
    return "[" + ", ".join(str(p) for p in parts) + "]"


def config_file_name(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: list[int] | None = None,
    per_channel_quant: bool = False,
    down: bool = False,
) -> str:
    """Return the config file name SGLang 0.5.23 ``get_config_file_name`` looks up.

    ``E``: experts on one rank (incl. a fused shared expert), positive int.
    ``N``: per-rank intermediate size (``w2.shape[2]``), positive int.
    ``device_name``: already in SGLang form (see :func:`sglang_device_name`); it is
    re-checked and must not contain a space.
    ``dtype``: one of :data:`DTYPE_SELECTORS` or None (bf16/fp16: no selector).
    ``block_shape``: ``[block_n, block_k]`` or None; omitted (like SGLang) when empty or
    when any element is 0; written as Python's list repr ``[128, 128]``.
    ``per_channel_quant``: adds ``,per_channel_quant=True``.
    ``down``: adds ``_down`` just before ``.json`` (the down-projection file).

    Example: ``E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json``.
    Raises ValueError for a bad argument.
    """
    for label, v in (("E", E), ("N", N)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{label} must be a positive int, got {v!r}")
    if sglang_device_name(device_name) != device_name:
        raise ValueError(f"device_name {device_name!r} still contains spaces; pass sglang_device_name(...)")
    if dtype is not None and dtype not in DTYPE_SELECTORS:
        raise ValueError(f"dtype selector {dtype!r} is not one of {', '.join(DTYPE_SELECTORS)} or None")
    dtype_sel = f",dtype={dtype}" if dtype else ""
    block_sel = ""
    if block_shape is not None:
        text = _format_block_shape(block_shape)
        if list(block_shape) and all(block_shape):
            block_sel = f",block_shape={text}"
    pc_sel = ",per_channel_quant=True" if per_channel_quant else ""
    down_sel = "_down" if down else ""
    return f"E={E},N={N},device_name={device_name}{dtype_sel}{block_sel}{pc_sel}{down_sel}.json"


_FILE_NAME = re.compile(
    r"^E=(?P<E>[1-9][0-9]*),N=(?P<N>[1-9][0-9]*),device_name=(?P<device_name>[^ /,]*?)"
    r"(?:,dtype=(?P<dtype>" + "|".join(DTYPE_SELECTORS) + r"))?"
    r"(?:,block_shape=\[(?P<bn>[0-9]+), (?P<bk>[0-9]+)\])?"
    r"(?P<per_channel_quant>,per_channel_quant=True)?(?P<down>_down)?\.json$")


def parse_config_file_name(name: str) -> dict | None:
    """The parts of a config file name (the inverse of :func:`config_file_name`): ``{E, N,
    device_name, dtype, block_shape, per_channel_quant, down}``; None when ``name`` (a base name,
    no folder) is not one SGLang's ``get_config_file_name`` can produce."""
    m = _FILE_NAME.match(name)
    if not m:
        return None
    return {"E": int(m["E"]), "N": int(m["N"]), "device_name": m["device_name"], "dtype": m["dtype"],
            "block_shape": [int(m["bn"]), int(m["bk"])] if m["bn"] else None,
            "per_channel_quant": bool(m["per_channel_quant"]), "down": bool(m["down"])}


def sglang_version_dir(version: str) -> str:
    """The exact folder SGLang 0.5.23 tries first: ``"triton_" + version.replace(".", "_")``.

    Unlike :func:`triton_folder` nothing is stripped: ``"3.6.0+git1a2b"`` gives
    ``"triton_3_6_0+git1a2b"``, a name that SGLang's own fallback sort cannot parse.
    """
    if not isinstance(version, str) or not version:
        raise ValueError(f"bad Triton version {version!r}")
    return "triton_" + version.replace(".", "_")


def triton_folder(version: str) -> str:
    """Folder name for configs of a Triton version: ``"3.6.0"`` -> ``"triton_3_6_0"``.

    SGLang 0.5.23 uses ``"triton_" + triton.__version__.replace(".", "_")`` verbatim.
    For a release version (digits and dots only) this function returns exactly that.
    For a version with a local or pre-release suffix (``"3.6.0+cu130"``,
    ``"3.6.0.dev20250101"``, ``"3.6.0rc1"``, ``"3.6.0.post1"``) it keeps only the leading
    numeric release part (``"triton_3_6_0"``), because a folder named
    ``triton_3_6_0+cu130`` would make SGLang's newest-first fallback sort raise
    ValueError for every other model whose file is missing. SGLang then finds the file
    through its fallback (with the "Fallback to triton version" warning) instead of
    the exact lookup; compare with :func:`sglang_version_dir` to detect that case.

    Raises ValueError when ``version`` does not start with a digit.
    """
    if not isinstance(version, str):
        raise ValueError(f"bad Triton version {version!r}")
    m = _RELEASE.match(version.strip())
    if not m:
        raise ValueError(f"Triton version {version!r} does not start with a release number")
    return "triton_" + m.group(0).replace(".", "_")


def parse_triton_folder(name: str) -> tuple[int, ...] | None:
    """Parse a ``triton_X_Y_Z`` folder name into its version tuple, e.g. ``(3, 6, 0)``.

    Mirrors SGLang 0.5.23's fallback sort key: strip ``triton_``, split on ``_``, every
    part must be an integer (any number of parts; ``triton_3_6`` gives ``(3, 6)``).
    Returns None when SGLang's ``int()`` would raise (``triton_3_6_0+git``,
    ``triton_``, ``triton_3__6``, ``triton_latest``) or the name does not start with
    ``triton_``. Only ASCII digits count as integers here, so the rare names Python's
    ``int()`` also accepts (surrounding spaces, non-ASCII digits) are reported as
    unparsable too: the safe side for a tool that warns about such folders.
    """
    if not isinstance(name, str) or not name.startswith("triton_"):
        return None
    parts = name[len("triton_"):].replace("_", ".").split(".")
    if not parts or not all(_INT_PART.match(p) for p in parts):
        return None
    return tuple(int(p) for p in parts)


def sort_triton_folders(names: Iterable[str]) -> list[str]:
    """Sort ``triton_*`` folder names newest first, as SGLang 0.5.23's fallback does.

    Returns the names :func:`parse_triton_folder` understands, newest version first
    (equal versions keep input order). Names not starting with ``triton_`` are dropped
    (SGLang ignores them), and so are unparsable ``triton_*`` names: list those with
    :func:`unparsable_triton_folders`, since each makes SGLang's fallback raise
    ValueError.
    """
    good: list[tuple[tuple[int, ...], str]] = []
    for n in names:
        v = parse_triton_folder(n)
        if v is not None:
            good.append((v, n))
    good.sort(key=lambda t: t[0], reverse=True)
    return [n for _, n in good]


def unparsable_triton_folders(names: Iterable[str]) -> list[str]:
    """The ``triton_*`` names (input order) that SGLang 0.5.23's fallback sort cannot parse."""
    return [n for n in names if isinstance(n, str) and n.startswith("triton_") and parse_triton_folder(n) is None]
