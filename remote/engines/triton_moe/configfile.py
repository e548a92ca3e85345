"""Read, validate and write SGLang fused-MoE config JSON files (stdlib only).

Format (``get_moe_configs`` of every SGLang release read, docs/sglang-releases.md): a JSON
object mapping a batch size M, written as a string of a positive integer, to a config
object. The loader does ``int(key)`` on every key, so any other key (vLLM's
``"triton_version"``) crashes the server. The config object is passed to the Triton kernel
launch as keyword arguments (``fused_moe_kernel[grid](..., **config)``), after SGLang pops
``USE_TMA``; so:

* ``BLOCK_SIZE_M``, ``BLOCK_SIZE_N``, ``BLOCK_SIZE_K``, ``GROUP_SIZE_M`` (the kernel's
  ``tl.constexpr`` parameters, no default) are required;
* ``num_warps``, ``num_stages``, ``num_ctas`` are Triton launch options, optional (Triton's
  defaults then apply: 4 warps, 3 stages on CUDA / 2 on ROCm, 1 CTA); 36 entries of the files
  SGLang 0.5.23 ships omit ``num_warps``/``num_stages``, and one file sets ``num_ctas``;
* ``USE_TMA`` (bool; SGLang's TMA switch, popped before the launch) and the ROCm launch options
  ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack`` are optional.

No other field appears in any shipped file; Triton refuses an unknown launch keyword
("Keyword argument X was specified but unrecognised"), so other fields are refused.
What orch writes (:func:`dumps_config`) is complete: the four tile fields plus ``num_warps``
and ``num_stages`` in every entry, batch sizes ascending.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...protocol import PayloadError

#: Kernel constexpr fields every entry needs (SGLang's loader hands them to the kernel launch).
REQUIRED_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
#: Triton launch options of every entry orch writes (optional when reading: Triton defaults).
LAUNCH_FIELDS = ("num_warps", "num_stages")
#: The fields of every entry orch writes, in the order it writes them.
WRITTEN_FIELDS = REQUIRED_FIELDS + LAUNCH_FIELDS
OPTIONAL_INT_FIELDS = ("num_ctas", "waves_per_eu", "matrix_instr_nonkdim", "kpack")
OPTIONAL_BOOL_FIELDS = ("USE_TMA",)
#: Largest batch-size key accepted (tokens on one rank); far above any real server.
MAX_BATCH_KEY = 1 << 24


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bad(source: str, msg: str) -> PayloadError:
    return PayloadError("bad_input", f"{source}: {msg}")


def validate_config(obj: Any, source: str, complete: bool = False, extra_fields: tuple[str, ...] = ()) -> dict[str, dict]:
    """Check one SGLang fused-MoE config as SGLang's loader and kernel launch accept it, and
    return it with canonical keys.

    ``obj``: the parsed JSON. ``source``: a label (path or "up"/"down") used in messages.
    ``complete``: also require :data:`LAUNCH_FIELDS` in every entry (what orch writes).
    Keys must be strings of positive integers (ASCII digits, no sign, no leading zero,
    at most :data:`MAX_BATCH_KEY`); values objects with the int fields
    :data:`REQUIRED_FIELDS` (positive; BLOCK_SIZE_M/N/K powers of two, as Triton's
    ``tl.arange`` needs), optional ``num_warps`` (a positive power of two, Triton asserts it),
    ``num_stages`` (non-negative: ROCm files use 0), ``num_ctas`` (positive),
    ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack`` (non-negative ints) and ``USE_TMA``
    (bool). No other fields, except ``extra_fields`` (non-negative ints): the fields an engine's
    loader also hands to its kernel (``Engine.config_extra_fields``, e.g. vLLM's ``SPLIT_K``, which
    its WNA16 Triton launch needs). Returns a new dict ``{str(M): {field: value}}`` in ascending M.

    Raises PayloadError('bad_input') naming ``source`` and the offending key/field.
    """
    if not isinstance(obj, dict):
        raise _bad(source, f"top level must be a JSON object, got {type(obj).__name__}")
    if not obj:
        raise _bad(source, "no batch sizes (empty object)")
    needed = WRITTEN_FIELDS if complete else REQUIRED_FIELDS
    out: dict[int, dict] = {}
    for key, val in obj.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit() or key.startswith("0"):
            raise _bad(source, f"key {key!r} is not a positive integer batch size (the engines' loaders do int(key) on every key)")
        m = int(key)
        if m > MAX_BATCH_KEY:
            raise _bad(source, f"key {key!r} is larger than {MAX_BATCH_KEY}")
        if not isinstance(val, dict):
            raise _bad(source, f"key {key!r}: value must be an object, got {type(val).__name__}")
        for f in needed:
            if f not in val:
                raise _bad(source, f"key {key!r}: missing field {f}")
        clean: dict[str, Any] = {}
        for f, v in val.items():
            if f in REQUIRED_FIELDS or f in LAUNCH_FIELDS or f == "num_ctas":
                low = 0 if f == "num_stages" else 1  # ROCm configs use num_stages 0
                if not _is_int(v) or v < low:
                    kind = "a non-negative" if low == 0 else "a positive"
                    raise _bad(source, f"key {key!r}: field {f} must be {kind} int, got {v!r}")
                if f in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps") and v & (v - 1):
                    raise _bad(source, f"key {key!r}: field {f} must be a power of two, got {v}")
            elif f in OPTIONAL_INT_FIELDS or f in extra_fields:
                if not _is_int(v) or v < 0:
                    raise _bad(source, f"key {key!r}: field {f} must be a non-negative int, got {v!r}")
            elif f in OPTIONAL_BOOL_FIELDS:
                if not isinstance(v, bool):
                    raise _bad(source, f"key {key!r}: field {f} must be true/false, got {v!r}")
            else:
                raise _bad(source, f"key {key!r}: unknown field {f!r}")
            clean[f] = v
        out[m] = clean
    return {str(m): out[m] for m in sorted(out)}


def load_config_file(path: str | os.PathLike, max_bytes: int = 4 * 1024 * 1024,
                     extra_fields: tuple[str, ...] = ()) -> dict[str, dict]:
    """Read and validate a config file (see :func:`validate_config`; ``extra_fields`` its).

    Raises PayloadError('not_found') when ``path`` is missing, PayloadError('bad_input')
    when it is not a regular file, larger than ``max_bytes`` bytes, not UTF-8 JSON, or
    invalid; duplicate keys are refused too (json would silently keep the last one).
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise PayloadError("not_found", f"{p}: no such file") from None
    except OSError as exc:
        raise PayloadError("bad_input", f"{p}: {exc.strerror or exc}") from None
    import stat as _stat
    if not _stat.S_ISREG(st.st_mode):
        raise PayloadError("bad_input", f"{p}: not a regular file")
    if st.st_size > max_bytes:
        raise PayloadError("bad_input", f"{p}: {st.st_size} bytes, more than {max_bytes}")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise PayloadError("bad_input", f"{p}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise PayloadError("bad_input", f"{p}: more than {max_bytes} bytes")
    return loads_config(raw, p, extra_fields=tuple(extra_fields))


def loads_config(data: str | bytes, source: str, extra_fields: tuple[str, ...] = ()) -> dict[str, dict]:
    """Parse JSON text/bytes of a config and validate it (``extra_fields``: :func:`validate_config`'s);
    errors name ``source``."""
    def no_dups(pairs: list[tuple[str, Any]]) -> dict:
        seen: dict = {}
        for k, v in pairs:
            if k in seen:
                raise _bad(source, f"duplicate key {k!r}")
            seen[k] = v
        return seen

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        obj = json.loads(text, object_pairs_hook=no_dups, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise _bad(source, f"not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise _bad(source, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:
        if isinstance(exc, PayloadError):
            raise
        raise _bad(source, str(exc)) from None
    return validate_config(obj, source, extra_fields=tuple(extra_fields))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def dumps_config(cfg: dict, extra_fields: tuple[str, ...] = ()) -> str:
    """Serialise a config orch writes: keys sorted numerically, indent 4, trailing newline.

    ``cfg`` keys may be ints or digit strings; it is validated first with ``complete=True``
    (every entry has :data:`WRITTEN_FIELDS`; PayloadError 'bad_input' with source "config"
    when invalid). Field order inside each entry is :data:`WRITTEN_FIELDS` first, then the
    optional ones in a fixed order, then ``extra_fields`` (:func:`validate_config`'s).
    """
    canon = validate_config({str(k): v for k, v in cfg.items()} if isinstance(cfg, dict) else cfg, "config",
                            complete=True, extra_fields=tuple(extra_fields))
    order = WRITTEN_FIELDS + OPTIONAL_BOOL_FIELDS + OPTIONAL_INT_FIELDS + tuple(extra_fields)
    ordered = {k: {f: v[f] for f in order if f in v} for k, v in canon.items()}
    return json.dumps(ordered, indent=4) + "\n"


def check_down_matches_up(up: dict, down: dict) -> None:
    """Check that the down file uses the up file's BLOCK_SIZE_M for every batch size.

    Both GEMMs of one MoE call share the token-to-block alignment, so SGLang needs one
    BLOCK_SIZE_M (0.5.23 overrides a mismatch with a warning; older builds assert in
    ``try_get_optimal_moe_config``). Lookup picks the key closest to M in each file, so
    the key sets must be equal too. Returns None on success; raises
    PayloadError('bad_input') listing the mismatching batch sizes.
    """
    u = validate_config({str(k): v for k, v in up.items()} if isinstance(up, dict) else up, "up")
    d = validate_config({str(k): v for k, v in down.items()} if isinstance(down, dict) else down, "down")
    problems: list[str] = []
    if set(u) != set(d):
        only_u = sorted(set(u) - set(d), key=int)
        only_d = sorted(set(d) - set(u), key=int)
        problems.append(f"batch sizes differ: only in up {only_u}, only in down {only_d}")
    for k in sorted(set(u) & set(d), key=int):
        if u[k]["BLOCK_SIZE_M"] != d[k]["BLOCK_SIZE_M"]:
            problems.append(f"M={k}: up BLOCK_SIZE_M {u[k]['BLOCK_SIZE_M']} != down {d[k]['BLOCK_SIZE_M']}")
    if problems:
        raise PayloadError("bad_input", "down config does not match up config: " + "; ".join(problems),
                           detail=problems)
