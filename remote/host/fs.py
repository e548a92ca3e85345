"""File-system helpers of the payload: durable atomic writes, sha256, run-record folders.

Standard library only (runs with the host's Python). Nothing here goes through a shell.

Layout of the host state (docs/protocol.md, "Run records on the host")::

    <state_dir>/                 0700
      lock.json                  see remote/host/lock.py
      runs/                      0700
        <RUN_ID>/                0700
          manifest.json          see remote/host/changes.py
          backup/<name>          earlier content of every file a run touched
          state.json             the controller's progress, see :func:`update_state`

Every JSON file of the state is written with :func:`atomic_write_json` (temp file in the
same folder, fsync file, rename, fsync folder), so a reader sees the old or the new
content, never a torn one.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import stat
import tempfile
from typing import Any

from ..protocol import NO_MANIFEST, PayloadError, is_run_id

#: Default state folder on a host (docs/protocol.md).
DEFAULT_STATE_DIR = "/var/lib/orch"

#: a run's backup of FlashInfer's autotune cache: ``<run>/flashinfer-autotune/`` and its index
#: ``<run>/flashinfer-autotune.json`` (``runner_change --op cache-backup``, read by ``runs``)
AUTOTUNE_BACKUP = "flashinfer-autotune"

#: Run ids allowed by the payload: letters, digits, ``_``, ``.``, ``-`` (no ``/``, not ``.``/``..``).

#: Marker inside the names of our temp files; files named ``.<name>.orch-tmp-*`` are ours.
TMP_MARK = ".orch-tmp-"

#: Mode of the state folders (state_dir, runs/, runs/<id>/, backup/).
PRIVATE_DIR_MODE = 0o700

#: Mode of state files (manifest, state.json, backups).
PRIVATE_FILE_MODE = 0o600


def now_iso() -> str:
    """Current UTC time as ISO-8601 text with microseconds and a ``Z`` suffix.

    The fixed width makes the strings sort in time order.
    """
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 (64 lowercase characters) of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str | None:
    """Hex sha256 of the regular file at ``path``; ``None`` when the path does not exist.

    Raises ``OSError`` for other failures (permission, not a file).
    """
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except FileNotFoundError:
        return None
    return h.hexdigest()


def read_bytes(path: str, follow_symlinks: bool = True) -> bytes | None:
    """Whole content of ``path``; ``None`` when it does not exist.

    ``follow_symlinks=False`` opens with ``O_NOFOLLOW``: a symlink swapped in after an
    ``lstat`` check raises ``OSError`` (ELOOP) instead of being read through (root reading a
    folder another user can write)."""
    flags = os.O_RDONLY | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def fsync_dir(path: str) -> None:
    """fsync the folder ``path`` so that renames/unlinks/creates inside it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (loops over short writes; raises ``OSError``)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - os.write raises instead on real errors
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def atomic_write(path: str, data: bytes, mode: int = 0o644,
                 uid: int | None = None, gid: int | None = None) -> None:
    """Replace ``path`` by a file holding exactly ``data``, atomically and durably.

    Writes a temp file ``.<name>.orch-tmp-XXXX`` in the same folder, sets ``mode``
    (permission bits) and, when given, owner ``uid``/``gid`` (best effort: EPERM is
    ignored for non-root users), fsyncs it, renames it over ``path`` and fsyncs the folder.
    On any failure the temp file is removed and the exception (e.g. ``OSError`` ENOSPC)
    propagates; ``path`` then still holds its earlier content.
    """
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}{TMP_MARK}", dir=folder)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
            if uid is not None or gid is not None:
                try:
                    os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
                except PermissionError:
                    pass
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(folder)


def atomic_write_json(path: str, obj: Any, mode: int = PRIVATE_FILE_MODE) -> None:
    """:func:`atomic_write` of ``obj`` as indented, key-sorted JSON text plus a newline."""
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    atomic_write(path, text.encode("utf-8"), mode=mode)


def read_json(path: str, default: Any = None) -> Any:
    """Parsed JSON of ``path``; ``default`` when it does not exist.

    Raises ``PayloadError('runtime')`` when the file exists but is not valid JSON.
    """
    data = read_bytes(path)
    if data is None:
        return default
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError("runtime", f"corrupt JSON in {path}: {exc}") from exc


def check_run_id(run_id: Any) -> str:
    """Return ``run_id`` when it is a run id (:func:`remote.protocol.is_run_id`).

    Raises ``PayloadError('bad_input')`` otherwise.
    """
    if not is_run_id(run_id):
        raise PayloadError("bad_input", f"invalid run id {run_id!r}: want [A-Za-z0-9_.-]+")
    return run_id


def ensure_private_dir(path: str) -> None:
    """Create folder ``path`` (and missing parents) and make it mode 0700.

    Raises ``PayloadError('runtime')`` when it exists but is not a folder or is a symlink.
    """
    try:
        os.makedirs(path, mode=PRIVATE_DIR_MODE, exist_ok=True)
    except FileExistsError as exc:
        raise PayloadError("runtime", f"{path} exists and is not a folder") from exc
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PayloadError("runtime", f"{path} is not a plain folder")
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)


def runs_root(state_dir: str) -> str:
    """``<state_dir>/runs``."""
    return os.path.join(state_dir, "runs")


def run_dir(state_dir: str, run_id: str, create: bool = False) -> str:
    """``<state_dir>/runs/<run_id>``; with ``create``, make it (and state_dir, runs/) mode 0700.

    Raises ``PayloadError('bad_input')`` for a bad run id.
    """
    check_run_id(run_id)
    path = os.path.join(runs_root(state_dir), run_id)
    if create:
        ensure_private_dir(state_dir)
        ensure_private_dir(runs_root(state_dir))
        ensure_private_dir(path)
    return path


def manifest_path(state_dir: str, run_id: str) -> str:
    """``<state_dir>/runs/<run_id>/manifest.json``."""
    return os.path.join(run_dir(state_dir, run_id), "manifest.json")


def load_manifest(state_dir: str, run_id: str) -> dict:
    """The manifest of ``run_id``; raises ``PayloadError('not_found')`` when there is none, with
    ``detail`` :data:`remote.protocol.NO_MANIFEST` (what a controller reads, never the message)."""
    path = manifest_path(state_dir, run_id)
    data = read_json(path)
    if data is None:
        raise PayloadError("not_found", f"no manifest for run {run_id} ({path})", detail=dict(NO_MANIFEST))
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise PayloadError("runtime", f"malformed manifest {path}")
    return data


def state_path(state_dir: str, run_id: str) -> str:
    """``<state_dir>/runs/<run_id>/state.json``."""
    return os.path.join(run_dir(state_dir, run_id), "state.json")


def update_state(state_dir: str, run_id: str, state: str | None = None,
                 data: dict | None = None, **fields: Any) -> dict:
    """Read-modify-write ``state.json`` of ``run_id`` atomically; create the run folder if needed.

    ``state`` (when given) becomes ``"state"`` and is appended to ``"history"`` as
    ``{"state", "at", "data"}``; ``data`` (a dict, e.g. bench numbers) is merged into
    ``"data"``; other ``fields`` are set at top level (e.g. ``restored_at``).
    ``"updated"`` is always set to :func:`now_iso`. Returns the new content.
    """
    run_dir(state_dir, run_id, create=True)
    path = state_path(state_dir, run_id)
    cur = read_json(path, default=None)
    if not isinstance(cur, dict):
        cur = {"run_id": run_id, "state": None, "history": [], "data": {}, "created": now_iso()}
    at = now_iso()
    if state is not None:
        cur["state"] = state
        entry: dict[str, Any] = {"state": state, "at": at}
        if data:
            entry["data"] = data
        cur.setdefault("history", []).append(entry)
    if data:
        cur.setdefault("data", {}).update(data)
    cur.update(fields)
    cur["updated"] = at
    atomic_write_json(path, cur)
    return cur


def remove_stale_temps(folder: str) -> list[str]:
    """Delete our leftover temp files (``*.orch-tmp-*``) in ``folder``; return their paths.

    Such files only remain after the payload was SIGKILLed mid-write.
    """
    removed = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(".") and TMP_MARK in name:
            p = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(p).st_mode):
                    os.unlink(p)
                    removed.append(p)
            except FileNotFoundError:
                pass
    return removed


def load_request(path: str) -> dict:
    """Parse the JSON object of a ``--request`` file (``-`` reads stdin).

    Raises ``PayloadError('bad_input')`` for a missing/unreadable file or anything but a JSON object.
    """
    import sys

    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise PayloadError("bad_input", f"cannot read request {path}: {exc}") from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError("bad_input", f"request {path} is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise PayloadError("bad_input", f"request {path} must be a JSON object")
    return obj
