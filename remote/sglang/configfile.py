"""Read, validate and write SGLang fused-MoE config JSON files (stdlib only).

Format (SGLang 0.5.23 ``get_moe_configs``): a JSON object mapping a batch size M,
written as a string of a positive integer, to a config object with int fields
``BLOCK_SIZE_M``, ``BLOCK_SIZE_N``, ``BLOCK_SIZE_K``, ``GROUP_SIZE_M``, ``num_warps``,
``num_stages``; optional ``USE_TMA`` (bool, down files) and the AMD-only ints
``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``. The loader does ``int(key)`` on
every key, so any other key (vLLM's ``"triton_version"``) crashes the server.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..protocol import PayloadError

REQUIRED_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
OPTIONAL_INT_FIELDS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
OPTIONAL_BOOL_FIELDS = ("USE_TMA",)
#: Largest batch-size key accepted (tokens on one rank); far above any real server.
MAX_BATCH_KEY = 1 << 24


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bad(source: str, msg: str) -> PayloadError:
    return PayloadError("bad_input", f"{source}: {msg}")


def validate_config(obj: Any, source: str) -> dict[str, dict]:
    """Check one SGLang fused-MoE config and return it with canonical keys.

    ``obj``: the parsed JSON. ``source``: a label (path or "up"/"down") used in messages.
    Keys must be strings of positive integers (ASCII digits, no sign, no leading zero,
    at most :data:`MAX_BATCH_KEY`); values objects with the int fields
    :data:`REQUIRED_FIELDS` (BLOCK_SIZE_*, GROUP_SIZE_M, num_warps positive, num_stages
    non-negative as ROCm files use 0; BLOCK_SIZE_M/N/K and num_warps powers of two, as Triton's ``tl.arange``
    and launch need), optional ``USE_TMA`` (bool) and ``waves_per_eu``,
    ``matrix_instr_nonkdim``, ``kpack`` (non-negative ints). No other fields.
    Returns a new dict ``{str(M): {field: value}}`` in ascending M.

    Raises PayloadError('bad_input') naming ``source`` and the offending key/field.
    """
    if not isinstance(obj, dict):
        raise _bad(source, f"top level must be a JSON object, got {type(obj).__name__}")
    if not obj:
        raise _bad(source, "no batch sizes (empty object)")
    out: dict[int, dict] = {}
    for key, val in obj.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit() or key.startswith("0"):
            raise _bad(source, f"key {key!r} is not a positive integer batch size (SGLang does int(key) on every key)")
        m = int(key)
        if m > MAX_BATCH_KEY:
            raise _bad(source, f"key {key!r} is larger than {MAX_BATCH_KEY}")
        if not isinstance(val, dict):
            raise _bad(source, f"key {key!r}: value must be an object, got {type(val).__name__}")
        for f in REQUIRED_FIELDS:
            if f not in val:
                raise _bad(source, f"key {key!r}: missing field {f}")
        clean: dict[str, Any] = {}
        for f, v in val.items():
            if f in REQUIRED_FIELDS:
                low = 0 if f == "num_stages" else 1  # ROCm configs use num_stages 0
                if not _is_int(v) or v < low:
                    kind = "a non-negative" if low == 0 else "a positive"
                    raise _bad(source, f"key {key!r}: field {f} must be {kind} int, got {v!r}")
                if f in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps") and v & (v - 1):
                    raise _bad(source, f"key {key!r}: field {f} must be a power of two, got {v}")
            elif f in OPTIONAL_INT_FIELDS:
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


def load_config_file(path: str | os.PathLike, max_bytes: int = 4 * 1024 * 1024) -> dict[str, dict]:
    """Read and validate a config file (see :func:`validate_config`).

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
    return loads_config(raw, p)


def loads_config(data: str | bytes, source: str) -> dict[str, dict]:
    """Parse JSON text/bytes of a config and validate it; errors name ``source``."""
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
    return validate_config(obj, source)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def dumps_config(cfg: dict) -> str:
    """Serialise a config: keys sorted numerically, indent 4, trailing newline.

    ``cfg`` keys may be ints or digit strings; it is validated first (PayloadError
    'bad_input' with source "config" when invalid). Field order inside each entry is
    REQUIRED_FIELDS first, then the optional ones in a fixed order.
    """
    canon = validate_config({str(k): v for k, v in cfg.items()} if isinstance(cfg, dict) else cfg, "config")
    order = REQUIRED_FIELDS + OPTIONAL_BOOL_FIELDS + OPTIONAL_INT_FIELDS
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
