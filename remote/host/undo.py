"""Putting back every file a run changed, from its manifest and backups: the ``restore`` command's
work (remote/host/restore.py says what it does), shared with the host's dead-man
(remote/host/deadman.py). Standard library only."""

from __future__ import annotations

import os

from .fs import (atomic_write, check_run_id, fsync_dir, load_manifest, now_iso, read_bytes, remove_stale_temps,
                 run_dir, sha256_bytes, sha256_file, update_state)
from .changes import apply_changes, check_name, held_by_other, holder_text
from ..protocol import PayloadError, log


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
            ignore_lock: bool = False, record_state: bool = True) -> dict:
    """Undo run ``run_id`` (see module docstring) and return the result ``data``.

    ``record_state`` False leaves the run's ``state.json`` as it was (the host's dead-man,
    :mod:`remote.host.deadman`: the run stays unfinished until ``orch recover`` proves the files).

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
            raise PayloadError("locked", f"host lock held by {holder_text(other)}; not restoring {run_id}")
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
    if not record_state:
        return {"run_id": run_id, "as_run_id": as_run_id, "dest_dir": dest_dir,
                "dest_removed": dest_removed, "files": files}
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
