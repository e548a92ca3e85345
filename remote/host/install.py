"""Back up, validate and atomically write config files into SGLang's Triton folder (``install``).

``python -m remote install --request FILE`` (``-`` = stdin). The request is a JSON object::

    {"run_id": "20261129T0910-h200a",          # [A-Za-z0-9_.-]+
     "state_dir": "/var/lib/orch",             # optional, default /var/lib/orch
     "action": "tune",                         # "tune" (default) or "rollback"
     "dest_dir": "<configs root>/triton_3_6_0",  # absolute; basename triton_<int>_<int>_<int>
     "files": [{"name": "E=128,N=768,device_name=NVIDIA_H200.json", "content": "<json text>"}],
     "create_dest": true,                      # create dest_dir when missing (parent must exist)
     "extra_fields": ["SPLIT_K"]}              # optional: entry fields the unit's engine also reads

Rules (why: SGLang 0.5.23 reads ``configs/triton_X_Y_Z/<exact name>`` and ``int()``s every
top-level key, so one bad file breaks the server's MoE layer; a folder whose name does not
parse as ``triton_<int>_<int>_<int>`` breaks its version sort):

1. Everything is validated before anything is touched: run id, names (no ``/``, ``..``, NUL,
   control characters; must end in ``.json``), size (at most 4 MiB each), JSON syntax (no
   duplicate keys) and ``remote.engines.triton_moe.configfile.validate_config(obj, name)`` (``PayloadError('bad_input')``;
   ``extra_fields``: ``Engine.config_extra_fields`` of the unit's engine, e.g. vLLM's ``SPLIT_K``).
2. The changes are applied by :func:`remote.host.changes.apply_changes` (also used by
   ``restore --as-run-id``): backups before anything is written, the manifest before the
   first config, atomic writes that keep a replaced file's mode and owner, and on any failure
   (ENOSPC, EIO, SIGTERM/SIGHUP/SIGINT) every file put back and ``PayloadError('runtime')``.
   Old files are never left half-written.

Result ``data``: the manifest ``remote/host/changes.py`` describes (``status`` ``installed``,
one entry per file with its ``sha256_before``/``sha256_after`` and ``backup``); running the same
request again after success returns the stored manifest with ``"reattached": true`` and changes
nothing.

``--dry-run`` (or ``"dry_run": true`` in the request): the same validation, then only a comparison
of each file with the one installed (:func:`compare`); nothing is written, no lock is needed, no
run folder is made. Result::

    {"dry_run": true, "dest_dir", "dest_exists": bool, "unchanged": bool,
     "files": [{"path", "name", "existed", "sha256_before", "sha256_after",
                "action": "created"|"replaced"|"unchanged"}]}

``unchanged`` is true when every file already holds exactly these bytes (an install would change
nothing); ``orch tune`` uses it to leave an already-tuned server alone (no stop, no restart).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..protocol import PayloadError
from .changes import apply_changes, check_name, held_by_other, holder_text
from .fs import DEFAULT_STATE_DIR, check_run_id, load_request, sha256_bytes, sha256_file

#: Largest config content accepted, in bytes (UTF-8).
MAX_CONTENT_BYTES = 4 * 1024 * 1024

#: Actions a run record may carry (docs/protocol.md).
ACTIONS = ("tune", "rollback")

#: Folder name SGLang can version-sort (``triton_<int>_<int>_<int>``), SGLang 0.5.23 get_moe_configs.
TRITON_DIR_RE = re.compile(r"^triton_\d+_\d+_\d+$")


def add_arguments(parser) -> None:
    """Flags of ``install``."""
    parser.add_argument("--request", required=True, help="JSON request file, - for stdin")
    parser.add_argument("--ignore-lock", action="store_true",
                        help="do not refuse when the host lock is held by another run")
    parser.add_argument("--dry-run", action="store_true",
                        help="only compare the files with the installed ones (sha256); write nothing")


def run(args) -> dict:
    """``install`` command: see the module docstring; returns the manifest."""
    req = load_request(args.request)
    if getattr(args, "dry_run", False):
        req = dict(req, dry_run=True)
    return install(req, ignore_lock=getattr(args, "ignore_lock", False))


def check_dest_dir(dest: Any, any_name: bool = False) -> str:
    """Normalised absolute ``dest_dir``; raises ``PayloadError('bad_input')`` when unsafe.

    Unless ``any_name``, the last component must be ``triton_<int>_<int>_<int>`` (SGLang 0.5.23
    sorts these folders by version; another name raises ValueError in its fallback path).
    """
    if not isinstance(dest, str) or not dest or "\x00" in dest or "\n" in dest:
        raise PayloadError("bad_input", f"dest_dir must be a path, got {dest!r}")
    if not os.path.isabs(dest) or ".." in dest.split("/"):
        raise PayloadError("bad_input", f"dest_dir must be absolute without '..': {dest!r}")
    norm = os.path.normpath(dest)
    if norm == "/":
        raise PayloadError("bad_input", "dest_dir must not be /")
    if not any_name and not TRITON_DIR_RE.match(os.path.basename(norm)):
        raise PayloadError("bad_input",
                           f"dest_dir {dest!r} must end in triton_<int>_<int>_<int> (the engine's folder rule)")
    return norm


def validate_content(name: str, content: Any, extra_fields: tuple[str, ...] = ()) -> bytes:
    """Check one file's content (size, JSON, SGLang config rules) and return its UTF-8 bytes.

    Uses ``remote.engines.triton_moe.configfile.loads_config`` (JSON syntax, duplicate keys, then
    ``validate_config(obj, source)`` for the SGLang rules; ``extra_fields``: the entry fields the
    unit's engine also reads, the request's ``extra_fields``, e.g. vLLM's ``SPLIT_K``).
    Raises ``PayloadError('bad_input')``.
    """
    if not isinstance(content, str):
        raise PayloadError("bad_input", f"{name}: content must be JSON text (a string)")
    data = content.encode("utf-8")
    if len(data) > MAX_CONTENT_BYTES:
        raise PayloadError("bad_input", f"{name}: content is {len(data)} bytes, over {MAX_CONTENT_BYTES}")
    # configio.loads_config = json.loads (duplicate keys and NaN/Infinity refused) + validate_config
    from ..engines.triton_moe.configfile import loads_config

    loads_config(content, name, extra_fields=tuple(extra_fields))
    return data


def check_extra_fields(value: Any) -> tuple[str, ...]:
    """The request's ``extra_fields``: absent, or a list of upper-case field names (``SPLIT_K``).
    Raises ``PayloadError('bad_input')``."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and re.fullmatch(r"[A-Z][A-Z0-9_]{0,31}", v)
                                               for v in value):
        raise PayloadError("bad_input", f"extra_fields must be a list of upper-case field names, got {value!r}")
    return tuple(value)


def install(req: dict, ignore_lock: bool = False) -> dict:
    """Validate an install request (see module docstring) and apply it; return the manifest.

    Raises ``PayloadError`` (``bad_input`` before anything changed, ``not_found`` when the
    folder above ``dest_dir`` is missing or ``create_dest`` is false and ``dest_dir`` is missing,
    ``locked`` when another run holds the host lock, ``runtime`` after a rolled-back failure).
    """
    run_id = check_run_id(req.get("run_id"))
    state_dir = req.get("state_dir") or DEFAULT_STATE_DIR
    if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
        raise PayloadError("bad_input", f"state_dir must be an absolute path, got {state_dir!r}")
    action = req.get("action", "tune")
    if action not in ACTIONS:
        raise PayloadError("bad_input", f"action must be one of {ACTIONS}, got {action!r}")
    dest_dir = check_dest_dir(req.get("dest_dir"), any_name=bool(req.get("any_dest_name")))
    extra = check_extra_fields(req.get("extra_fields"))
    files = req.get("files")
    if not isinstance(files, list) or not files:
        raise PayloadError("bad_input", "files must be a non-empty list")
    changes: list[tuple[str, bytes | None]] = []
    seen = set()
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise PayloadError("bad_input", f"files[{i}] must be an object")
        name = check_name(f.get("name"))
        if name in seen:
            raise PayloadError("bad_input", f"file {name!r} listed twice")
        seen.add(name)
        changes.append((name, validate_content(name, f.get("content"), extra)))
    if req.get("dry_run"):
        return compare(dest_dir, changes)
    create_dest = bool(req.get("create_dest", True))
    if not ignore_lock:
        other = held_by_other(state_dir, {run_id})
        if other:
            raise PayloadError("locked", f"host lock held by {holder_text(other)}; not installing for {run_id}")
    return apply_changes(state_dir, run_id, action, dest_dir, changes, create_dest=create_dest)




def compare(dest_dir: str, changes: list[tuple[str, bytes]]) -> dict:
    """What installing ``changes`` (name, validated bytes) into ``dest_dir`` would do, file by file,
    by sha256 of the bytes against the file in place; writes and locks nothing (``--dry-run``, see
    the module docstring for the result). Raises ``PayloadError('bad_input')`` when ``dest_dir``
    exists and is not a folder, ``PayloadError('runtime')`` when a file cannot be read."""
    exists = os.path.isdir(dest_dir)
    if os.path.exists(dest_dir) and not exists:
        raise PayloadError("bad_input", f"{dest_dir} exists and is not a folder")
    files = []
    for name, data in changes:
        path = os.path.join(dest_dir, name)
        if os.path.islink(path):  # never read through a link; the install itself refuses one
            files.append({"path": path, "name": name, "existed": True, "sha256_before": None,
                          "sha256_after": sha256_bytes(data), "action": "replaced", "symlink": True})
            continue
        try:
            before = sha256_file(path) if exists else None
        except OSError as exc:
            raise PayloadError("runtime", f"cannot read {path}: {exc}") from None
        after = sha256_bytes(data)
        action = "created" if before is None else ("unchanged" if before == after else "replaced")
        files.append({"path": path, "name": name, "existed": before is not None, "sha256_before": before,
                      "sha256_after": after, "action": action})
    return {"dry_run": True, "dest_dir": dest_dir, "dest_exists": exists,
            "unchanged": all(f["action"] == "unchanged" for f in files), "files": files}
