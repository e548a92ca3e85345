"""vLLM's fused-MoE config file names (pure functions, standard library only).

The rules, the same in vLLM 0.32.0, 0.33.0 and 0.34.0 except where a release is named
(``vllm/model_executor/layers/fused_moe/fused_moe.py`` ``get_config_file_name``,
``vllm/model_executor/layers/fused_moe/config.py`` ``_get_config_dtype_str``,
``vllm/utils/platform_utils.py`` ``get_device_name_as_file_name``):

* ``E={E},N={N},device_name={DEV}{,dtype=X}{,block_shape=[n,k]}.json``: no space in the block
  shape (``str(list).replace(" ", "")``), the block selector only when both block sizes are
  non-zero, no per-channel selector, no Triton-version folder;
* 0.34.0 adds ``_down.json`` (same stem): read only for fp8_w8a8 with block ``[128,128]``, and
  only as the TMA "sorted A" config of the down GEMM (``TritonExperts.apply``); every other case
  reads one file for both GEMMs;
* the device part: ``current_platform.get_device_name()`` (NVML's board name, or
  ``torch.cuda.get_device_name`` where NVML is absent) with every run of whitespace or ``/``
  replaced by one ``_``; then any name whose ``_``-separated parts include ``H200`` becomes
  ``NVIDIA_H200`` (so ``NVIDIA H200 NVL`` reads the H200 files; ``NVIDIA GH200 480GB`` does not);
* the dtype selector (``_get_config_dtype_str``): ``fp8_w8a8``, ``fp8_w8a16``, ``int8_w8a16``,
  ``int4_w4a16`` by the quantization, ``float32`` for float32 activations, else none; int8_w8a8
  has **no** selector (its file is the bf16 one's name), unlike SGLang.

This module must not import torch or triton: the controller imports it too.
"""

from __future__ import annotations

import re
from typing import Iterable

from ...protocol import BadInput

#: The dtype selectors vLLM's ``_get_config_dtype_str`` returns, in its order of precedence.
DTYPE_SELECTORS = ("fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16", "float32")
#: Weight formats that run the fused-MoE Triton kernel but name no dtype in the file name
#: (``_get_config_dtype_str`` has no branch for them).
UNNAMED_FORMATS = ("int8_w8a8",)
#: Releases whose loader reads ``_down.json`` (for :data:`DOWN_FILE_CASE` only).
DOWN_FILE_RELEASES = ("0.34.0",)
#: The one case a ``_down.json`` is read in (0.34.0 ``TritonExperts.apply``): dtype and block.
DOWN_FILE_CASE = ("fp8_w8a8", (128, 128))

_WS_SLASH = re.compile(r"[\s/]+")


def vllm_device_name(device_name: str) -> str:
    """vLLM's file-name form of a GPU name (``get_device_name_as_file_name`` then the H200 rule
    of ``get_config_file_name``), e.g. ``"NVIDIA H200"`` and ``"NVIDIA H200 NVL"`` ->
    ``"NVIDIA_H200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA_H100_80GB_HBM3"``,
    ``"NVIDIA A100-SXM4-80GB"`` keeps its hyphens.

    ``device_name``: what NVML (``nvmlDeviceGetName``) or ``torch.cuda.get_device_name`` says.
    Raises :class:`remote.protocol.BadInput` for a non-string or empty name, or one with ``\\``,
    ``..``, NUL or another control character (``/`` is vLLM's separator and becomes ``_``).
    """
    if not isinstance(device_name, str):
        raise BadInput(f"device name must be a string, got {type(device_name).__name__}")
    if not device_name.strip():
        raise BadInput("device name is empty")
    bad = [c for c in device_name if c == "\\" or (ord(c) < 32 and not c.isspace()) or ord(c) == 127]
    if bad:
        raise BadInput(f"device name {device_name!r} contains forbidden character {bad[0]!r}")
    if ".." in device_name:
        raise BadInput(f"device name {device_name!r} could escape a folder ('..')")
    name = _WS_SLASH.sub("_", device_name)
    if "H200" in name.split("_"):
        return "NVIDIA_H200"
    return name


def block_selector(block_shape: Iterable[int] | None) -> str:
    """``,block_shape=[n,k]`` (no space), or ``""`` when ``block_shape`` is None/empty or any
    size is 0 (vLLM's ``not all(block_shape)``: int4/int8 weight-only groups ``[0, g]`` name no
    block)."""
    if not block_shape:
        return ""
    bs = [int(x) for x in block_shape]
    if not all(bs):
        return ""
    return ",block_shape=" + str(bs).replace(" ", "")


def config_file_name(E: int, N: int, device_name: str, dtype: str | None = None,
                     block_shape: Iterable[int] | None = None, down: bool = False) -> str:
    """The file name vLLM looks up for a MoE layer.

    ``E``: experts of the layer on this rank (``w2.shape[0]``); ``N``: the intermediate size per
    partition as vLLM's ``_moe_config_shape`` gives it (``w2.shape[2]``, doubled for int4_w4a16:
    the unpacked size); ``device_name``: already in vLLM's form (:func:`vllm_device_name`);
    ``dtype``: a selector of :data:`DTYPE_SELECTORS` or None; ``down``: the ``_down.json`` name
    (0.34.0). Raises :class:`remote.protocol.BadInput` for a non-positive E/N or an unknown
    selector.
    """
    if int(E) <= 0 or int(N) <= 0:
        raise BadInput(f"E and N must be positive, got E={E} N={N}")
    if dtype is not None and dtype not in DTYPE_SELECTORS:
        raise BadInput(f"unknown vLLM dtype selector {dtype!r} (known: {', '.join(DTYPE_SELECTORS)})")
    stem = f"E={int(E)},N={int(N)},device_name={device_name}" + (f",dtype={dtype}" if dtype else "") \
        + block_selector(block_shape)
    return stem + ("_down.json" if down else ".json")


def dtype_selector(weight_format: str | None, act_dtype: str = "bfloat16") -> str | None:
    """vLLM's dtype selector for a MoE weight format (``_get_config_dtype_str``).

    ``weight_format``: ``fp8_w8a8``, ``fp8_w8a16``, ``int8_w8a8``, ``int8_w8a16``, ``int4_w4a16``
    or None (16-bit weights); ``act_dtype``: the activation dtype name (``float32`` names its own
    files). Returns the selector or None (int8_w8a8: None, see module docstring)."""
    if weight_format in ("fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16"):
        return weight_format
    if weight_format in (None, "int8_w8a8"):
        return "float32" if act_dtype == "float32" else None
    raise BadInput(f"unknown MoE weight format {weight_format!r}")


def reads_down_file(release: str, dtype: str | None, block_shape: Iterable[int] | None) -> bool:
    """Whether vLLM ``release`` reads a ``_down.json`` for this dtype selector and block shape
    (0.34.0 ``TritonExperts.apply``: fp8_w8a8, block ``[128, 128]``; earlier releases never)."""
    return release_at_least(release, DOWN_FILE_RELEASES[0]) and dtype == DOWN_FILE_CASE[0] \
        and block_shape is not None and tuple(int(x) for x in block_shape) == DOWN_FILE_CASE[1]


_NAME = re.compile(r"E=(?P<E>[0-9]+),N=(?P<N>[0-9]+),device_name=(?P<device>[^,]+?)"
                   r"(?:,dtype=(?P<dtype>[a-z0-9_]+))?(?:,block_shape=\[(?P<bn>[0-9]+),(?P<bk>[0-9]+)\])?"
                   r"(?P<down>_down)?\.json\Z")


def parse_config_file_name(name: str) -> dict | None:
    """``{"E", "N", "device", "dtype", "block_shape", "down"}`` of a vLLM config file name, or
    None for a name vLLM would never look up (e.g. SGLang's ``[128, 128]`` with a space)."""
    m = _NAME.match(name)
    if not m:
        return None
    return {"E": int(m["E"]), "N": int(m["N"]), "device": m["device"], "dtype": m["dtype"],
            "block_shape": [int(m["bn"]), int(m["bk"])] if m["bn"] else None, "down": bool(m["down"])}


def release_tuple(release: str) -> tuple[int, ...]:
    """``"0.34.0"`` -> ``(0, 34, 0)``; a suffix such as ``rc1``/``.post1``/``+cu129`` is dropped.
    Raises :class:`remote.protocol.BadInput` for a string that starts with no number."""
    m = re.match(r"[0-9]+(?:\.[0-9]+)*", str(release))
    if not m:
        raise BadInput(f"not a vLLM release: {release!r}")
    return tuple(int(x) for x in m.group(0).split("."))


def release_at_least(release: str, floor: str) -> bool:
    """Whether ``release`` is ``floor`` or newer (:func:`release_tuple` order)."""
    return release_tuple(release) >= release_tuple(floor)
