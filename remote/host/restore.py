"""Put back every file a run changed, from its manifest and backups (``restore``).

``python -m remote restore --run-id ID [--state-dir D] [--as-run-id NEW_ID]``

Reads ``<state_dir>/runs/<ID>/manifest.json`` (written by ``install``, any status, also a run
that crashed mid-way), checks every backup against its recorded ``sha256_before`` before
touching anything, then for each file:

- it existed before the run: its exact earlier bytes are written back atomically (with the
  earlier mode/owner), unless it already has them (``unchanged``);
- it did not exist before: it is deleted (``deleted``), or ``unchanged`` when already absent.

A ``dest_dir`` the run created (``dest_existed_before`` false) is removed when it is empty
afterwards; one that existed before but is gone is re-created when a file must go back into it.
Every file is verified by sha256 afterwards. ``state.json`` of the run gets ``state``
``restored``, ``restored_at`` and a ``restores`` list (``{"at", "as_run_id", "changed"}``). Running it twice is harmless (everything ``unchanged`` the second time).

With ``--as-run-id NEW_ID`` the restore itself is recorded as run ``NEW_ID`` (action ``rollback``,
manifest with before/after hashes and backups of the content it replaced, ``"restores": ID``),
written by the same code path as ``install``; ``restore --run-id NEW_ID`` then undoes the rollback.

Result ``data``::

    {"run_id", "as_run_id": str|null, "dest_dir", "dest_removed": bool,
     "files": [{"path", "action": "restored"|"deleted"|"unchanged", "sha256": str|null}]}

``sha256`` is the file's hash after the restore (``null`` = absent).
"""

from __future__ import annotations

import os

from .fs import (DEFAULT_STATE_DIR, atomic_write, check_run_id, fsync_dir, load_manifest,
                     now_iso, read_bytes, remove_stale_temps, run_dir, sha256_bytes, sha256_file,
                     update_state)
from .changes import apply_changes, check_name, held_by_other
from ..protocol import PayloadError, log


def add_arguments(parser) -> None:
    """Flags of ``restore``."""
    parser.add_argument("--run-id", required=True, help="run whose changes to undo")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--as-run-id", default=None,
                        help="record this restore as a new run (action rollback) so it can be undone")
    parser.add_argument("--ignore-lock", action="store_true",
                        help="do not refuse when the host lock is held by another run")


def run(args) -> dict:
    """``restore`` command: see the module docstring."""
    return restore(args.state_dir, args.run_id, as_run_id=args.as_run_id,
                   ignore_lock=args.ignore_lock)


def _load_backups(state_dir: str, run_id: str, manifest: dict) -> list[tuple[dict, bytes | None]]:
    """Each manifest file entry with its earlier bytes (``None`` = did not exist), hash-checked.

    Raises ``PayloadError('runtime')`` for a missing or corrupt backup, ``bad_input`` for an
    entry whose path is not ``dest_dir/<safe name>``.
    """
    rdir = run_dir(state_dir, run_id)
    dest_dir = manifest.get("dest_dir")
    out = []
    for e in manifest["files"]:
        name = check_name(e.get("name"), unit_file=bool(manifest.get("unit_file")))
        if e.get("path") != os.path.join(dest_dir, name):
            raise PayloadError("bad_input", f"manifest entry {e.get('path')!r} is not inside {dest_dir}")
        if not e.get("existed"):
            out.append((e, None))
            continue
        data = read_bytes(os.path.join(rdir, "backup", name))
        if data is None:
            raise PayloadError("runtime", f"backup of {e['path']} missing in run {run_id}")
        if sha256_bytes(data) != e.get("sha256_before"):
            raise PayloadError("runtime", f"backup of {e['path']} in run {run_id} does not match "
                                          f"its recorded sha256; not restoring")
        out.append((e, data))
    return out


def restore(state_dir: str, run_id: str, as_run_id: str | None = None,
            ignore_lock: bool = False) -> dict:
    """Undo run ``run_id`` (see module docstring) and return the result ``data``.

    Raises ``PayloadError``: ``not_found`` (no manifest), ``bad_input`` (bad run ids),
    ``locked`` (host lock held by a run other than ``run_id``/``as_run_id``), ``runtime``
    (backup missing/corrupt, write failed, verification failed).
    """
    check_run_id(run_id)
    if as_run_id is not None:
        check_run_id(as_run_id)
        if as_run_id == run_id:
            raise PayloadError("bad_input", "--as-run-id must differ from --run-id")
    if not ignore_lock:
        other = held_by_other(state_dir, {run_id, as_run_id} - {None})
        if other:
            raise PayloadError("locked", f"host lock held by run {other.get('run_id')} "
                                         f"({other.get('controller')}); not restoring {run_id}")
    manifest = load_manifest(state_dir, run_id)
    dest_dir = manifest.get("dest_dir")
    if not isinstance(dest_dir, str) or not os.path.isabs(dest_dir):
        raise PayloadError("runtime", f"manifest of {run_id} has no absolute dest_dir")
    items = _load_backups(state_dir, run_id, manifest)
    dest_existed_before = bool(manifest.get("dest_existed_before", True))

    if as_run_id is not None:
        done = apply_changes(state_dir, as_run_id, "rollback", dest_dir,
                             [(e["name"], data) for e, data in items], create_dest=True,
                             remove_dest_if_empty=not dest_existed_before,
                             extra={"restores": run_id, **({"unit_file": True} if manifest.get("unit_file") else {})})
        amap = {"created": "restored", "replaced": "restored", "deleted": "deleted",
                "unchanged": "unchanged", "absent": "unchanged"}
        files = [{"path": f["path"], "action": amap[f["action"]], "sha256": f["sha256_after"]}
                 for f in done["files"]]
        dest_removed = bool(done.get("dest_removed"))
    else:
        files = []
        for e, data in items:
            path = e["path"]
            cur = sha256_file(path)
            if data is None:
                if cur is None:
                    files.append({"path": path, "action": "unchanged", "sha256": None})
                    continue
                if cur != e.get("sha256_after"):
                    log(f"{path} changed since run {run_id}; deleting it anyway (it did not exist before)",
                        "warning")
                os.unlink(path)
                fsync_dir(dest_dir)
                files.append({"path": path, "action": "deleted", "sha256": None})
                continue
            if cur == e["sha256_before"]:
                files.append({"path": path, "action": "unchanged", "sha256": cur})
                continue
            if cur is not None and cur != e.get("sha256_after"):
                log(f"{path} changed since run {run_id}; putting back its earlier content anyway", "warning")
            if not os.path.isdir(dest_dir):
                os.makedirs(dest_dir, 0o755)
                fsync_dir(os.path.dirname(dest_dir))
            mode = e.get("mode_before")
            atomic_write(path, data, mode=0o644 if mode is None else mode,
                         uid=e.get("uid_before"), gid=e.get("gid_before"))
            files.append({"path": path, "action": "restored", "sha256": sha256_bytes(data)})
        dest_removed = False
        if os.path.isdir(dest_dir):
            remove_stale_temps(dest_dir)
            if not dest_existed_before and not os.listdir(dest_dir):
                os.rmdir(dest_dir)
                fsync_dir(os.path.dirname(dest_dir))
                dest_removed = True

    bad = [f["path"] for f, (e, _) in zip(files, items) if sha256_file(f["path"]) != e.get("sha256_before")]
    if bad:
        raise PayloadError("runtime", f"restore of run {run_id}: verification failed for {bad}",
                           detail={"files": files})
    at = now_iso()
    changed = sum(1 for f in files if f["action"] != "unchanged")
    st = update_state(state_dir, run_id)
    restores = list(st.get("restores") or [])
    restores.append({"at": at, "as_run_id": as_run_id, "changed": changed})
    update_state(state_dir, run_id, state="restored",
                 data={"restored_by": as_run_id} if as_run_id else None,
                 restored_at=at, restores=restores)
    return {"run_id": run_id, "as_run_id": as_run_id, "dest_dir": dest_dir,
            "dest_removed": dest_removed, "files": files}
