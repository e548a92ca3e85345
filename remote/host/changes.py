"""Apply a set of file changes in one folder as a recorded run: backups, manifest, atomic writes, undo.

The routine shared by ``install`` (new configs) and ``restore --as-run-id`` (earlier content put
back as a run of its own), so both leave the same record and neither command imports the other.
:func:`apply_changes` does, for ``changes`` = ``[(name, new bytes | None), ...]`` in ``dest_dir``:

1. ``<state_dir>/runs/<run_id>/`` is created mode 0700; every existing target is copied to
   ``backup/<name>`` (fsynced) before anything is written.
2. ``manifest.json`` is written atomically (``"status": "writing"``) before the first change.
3. Each file is written atomically (:func:`remote.host.fs.atomic_write`: temp file in the same
   folder, fsync, rename, fsync folder) or deleted (``None`` bytes); mode and owner of a
   replaced file are kept, new files get 0644 and the folder's owner.
4. On any failure (ENOSPC, EIO, SIGTERM/SIGHUP/SIGINT) every file already written is put back
   from its backup (or removed when it did not exist), a folder we created is removed if empty,
   our temp files are deleted, the manifest gets ``"status": "failed"`` and
   ``PayloadError('runtime')`` is raised. Old files are never left half-written.

The manifest it returns (``status`` ``installed``)::

    {"proto": 1, "run_id", "action", "created", "status": "installed",
     "dest_dir", "dest_existed_before": bool, "dest_created": bool, "dest_removed": bool,
     "files": [{"path", "name", "existed", "sha256_before", "sha256_after", "backup",
                "action": "created"|"replaced"|"unchanged"|"deleted"|"absent",
                "mode_before", "bytes_after"}],
     "reattached": bool}

``backup`` is relative to the run folder (``backup/<name>``) or ``null`` when the file did not
exist. Applying the same changes again as the same run after success returns the stored
manifest with ``"reattached": true`` and changes nothing.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import threading
from typing import Any

from .. import PROTO
from ..protocol import CONFIGS_DROPIN_NAME, PayloadError, internal_error, log, parent_run
from .fs import (PRIVATE_FILE_MODE, TMP_MARK, atomic_write, atomic_write_json, fsync_dir, now_iso,
                 read_bytes, read_json, remove_stale_temps, run_dir, sha256_bytes, sha256_file)

#: the one file name besides ``*.json`` configs a run may change: the runner trial's drop-in
RUNNER_DROPIN_NAME = "orch-moe-runner.conf"
#: orch's drop-ins (``remote.host.runner_change``): created and removed by orch, backed up first
DROPIN_NAMES = (RUNNER_DROPIN_NAME, CONFIGS_DROPIN_NAME)
_BAD_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f/\\]")


def check_name(name: Any, unit_file: bool = False) -> str:
    """Return ``name`` if it is a safe config file name, else raise ``PayloadError('bad_input')``.

    Accepted besides configs: orch's drop-ins (:data:`DROPIN_NAMES`), and with ``unit_file`` (a runner change
    of the unit's own ``EnvironmentFile=`` or ``--config`` file, ``remote.host.runner_change``) any
    name that passes the other checks. Refused: non-strings, empty, ``/`` or ``\\``, ``..``, NUL/newline/other control characters,
    a leading ``.``, our temp marker, names not ending in ``.json``, names over 255 bytes.
    """
    if not isinstance(name, str) or not name:
        raise PayloadError("bad_input", f"file name must be a non-empty string, got {name!r}")
    if _BAD_NAME_CHARS.search(name) or ".." in name or name.startswith("."):
        raise PayloadError("bad_input", f"refused file name {name!r}")
    if name in DROPIN_NAMES:  # orch's systemd drop-ins (remote.host.runner_change)
        return name
    if unit_file and TMP_MARK not in name and len(name.encode("utf-8")) <= 255:
        return name
    if TMP_MARK in name or not name.endswith(".json") or len(name.encode("utf-8")) > 255:
        raise PayloadError("bad_input", f"refused file name {name!r} (must end in .json)")
    return name


def held_by_other(state_dir: str, run_ids: set[str]) -> dict | None:
    """The host lock (``lock.json``) when it is held by a run not in ``run_ids`` (a sub-run,
    :func:`parent_run`, counts as its run) or the host's dead-man took it over (``"deadman"``,
    remote/host/deadman.py: a controller that comes back late changes nothing), else ``None``."""
    lk = read_json(os.path.join(state_dir, "lock.json"), default=None)
    if isinstance(lk, dict) and (lk.get("deadman") or lk.get("run_id") not in run_ids | {parent_run(r) for r in run_ids}):
        return lk
    return None


def holder_text(lock: dict) -> str:
    """Who holds ``lock`` (from :func:`held_by_other`), for a refusal: the run and its controller,
    or the host's dead-man that took the run over. Pure."""
    if lock.get("deadman"):
        fired = lock["deadman"]
        return (f"the host's dead-man, which took run {lock.get('run_id')} over at {fired.get('fired_at')} "
                "and restored the host (`orch recover` records it)")
    return f"run {lock.get('run_id')} ({lock.get('controller')})"


@internal_error("apply_changes catches it (except BaseException), puts back what it wrote and ends "
                "with a PayloadError('runtime') saying so")
class Interrupted(BaseException):
    """Raised inside :func:`apply_changes` when SIGTERM/SIGHUP/SIGINT arrives mid-way."""


class _SignalGuard:
    """Within a ``with`` block, SIGTERM/SIGHUP/SIGINT raise :class:`Interrupted` while
    ``raising`` is true, and are only recorded (in ``pending``) once it is false, so the
    put-back after a failure cannot itself be interrupted. Main thread only (else a no-op).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self) -> None:
        self.raising = True
        self.pending: list[str] = []
        self._old: dict = {}

    def _handler(self, signum, frame):
        name = signal.Signals(signum).name
        if self.raising:
            self.raising = False  # one interruption is enough
            raise Interrupted(f"signal {name}")
        self.pending.append(name)

    def __enter__(self) -> "_SignalGuard":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)


def _dir_state(path: str) -> bool:
    """True when ``path`` is an existing folder (symlink to a folder allowed); False when absent.

    Raises ``PayloadError('bad_input')`` when it exists but is not a folder.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise PayloadError("bad_input", f"{path} exists and is not a folder")
    return True


def _reattach(manifest: dict, dest_dir: str, changes: list[tuple[str, bytes | None]]) -> bool:
    """True when ``manifest`` is a finished run of exactly these changes, still in place."""
    if manifest.get("status") != "installed" or manifest.get("dest_dir") != dest_dir:
        return False
    want = {n: (None if d is None else sha256_bytes(d)) for n, d in changes}
    have = {f.get("name"): f.get("sha256_after") for f in manifest["files"]}
    if want != have:
        return False
    return all(sha256_file(f["path"]) == f["sha256_after"] for f in manifest["files"])


def apply_changes(state_dir: str, run_id: str, action: str, dest_dir: str,
                  changes: list[tuple[str, bytes | None]], create_dest: bool = True,
                  remove_dest_if_empty: bool = False, extra: dict | None = None) -> dict:
    """Apply ``changes`` to files in ``dest_dir`` as run ``run_id``, with backups and a manifest.

    ``changes``: ``(name, new bytes)`` pairs; ``None`` bytes delete the file. Names must already
    be checked (:func:`check_name`). ``remove_dest_if_empty`` removes ``dest_dir`` afterwards when
    it ends up empty (used by ``restore --as-run-id`` to undo a folder a run created).
    ``extra`` is merged into the manifest (e.g. ``{"restores": "<run id>"}``).
    Returns the final manifest (see module docstring). Raises ``PayloadError``.
    """
    rdir = run_dir(state_dir, run_id)
    mpath = os.path.join(rdir, "manifest.json")
    old_manifest = read_json(mpath, default=None)
    if isinstance(old_manifest, dict):
        if _reattach(old_manifest, dest_dir, changes):
            log(f"run {run_id} already installed; nothing to do")
            return dict(old_manifest, reattached=True)
        if old_manifest.get("status") != "failed":
            raise PayloadError("bad_input", f"run {run_id} already has a manifest "
                                            f"(status {old_manifest.get('status')}); restore it or use a new run id")

    dest_existed = _dir_state(dest_dir)
    parent = os.path.dirname(dest_dir)
    needs_dest = any(d is not None for _, d in changes)
    if not dest_existed and needs_dest:
        if not create_dest:
            raise PayloadError("not_found", f"{dest_dir} does not exist and create_dest is false")
        if not _dir_state(parent):
            raise PayloadError("not_found", f"{parent} does not exist: wrong configs root?")

    # Inspect every target before touching anything.
    entries: list[dict] = []
    payloads: dict[str, bytes | None] = {}
    olds: dict[str, bytes | None] = {}
    for name, new in changes:
        path = os.path.join(dest_dir, name)
        old = None
        mode_before = uid = gid = None
        if dest_existed:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                st = None
            if st is not None:
                if not stat.S_ISREG(st.st_mode):
                    raise PayloadError("bad_input", f"{path} exists and is not a regular file (symlink?)")
                try:
                    old = read_bytes(path, follow_symlinks=False)
                except OSError as exc:
                    raise PayloadError("bad_input", f"{path}: cannot read it without following links: {exc}") \
                        from None
                mode_before, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        before = None if old is None else sha256_bytes(old)
        after = None if new is None else sha256_bytes(new)
        if old is None and new is None:
            act = "absent"
        elif before == after:
            act = "unchanged"
        elif new is None:
            act = "deleted"
        else:
            act = "created" if old is None else "replaced"
        entries.append({"path": path, "name": name, "existed": old is not None,
                        "sha256_before": before, "sha256_after": after,
                        "backup": None if old is None else f"backup/{name}",
                        "action": act, "mode_before": mode_before,
                        "uid_before": uid, "gid_before": gid,
                        "bytes_after": None if new is None else len(new)})
        payloads[name] = new
        olds[name] = old

    manifest: dict[str, Any] = {
        "proto": PROTO, "run_id": run_id, "action": action, "created": now_iso(),
        "status": "writing", "dest_dir": dest_dir, "dest_existed_before": dest_existed,
        "dest_created": False, "dest_removed": False, "files": entries,
    }
    if extra:
        manifest.update(extra)

    run_dir(state_dir, run_id, create=True)
    guard = _SignalGuard()
    with guard:
        return _apply(state_dir, run_id, action, dest_dir, entries, payloads, olds, manifest,
                      needs_dest, remove_dest_if_empty, guard)


def _apply(state_dir, run_id, action, dest_dir, entries, payloads, olds, manifest,
           needs_dest, remove_dest_if_empty, guard) -> dict:
    """The writing part of :func:`apply_changes` (runs under a :class:`_SignalGuard`)."""
    rdir = run_dir(state_dir, run_id)
    mpath = os.path.join(rdir, "manifest.json")
    parent = os.path.dirname(dest_dir)
    dest_existed = manifest["dest_existed_before"]
    bdir = os.path.join(rdir, "backup")
    written: list[dict] = []
    made_dest = False
    try:
        # 1. backups (before anything is written)
        if any(e["existed"] for e in entries):
            os.makedirs(bdir, mode=0o700, exist_ok=True)
            os.chmod(bdir, 0o700)
        for e in entries:
            if e["existed"]:
                atomic_write(os.path.join(bdir, e["name"]), olds[e["name"]], mode=PRIVATE_FILE_MODE)
        # 2. manifest (before the first config)
        if needs_dest and not dest_existed:
            manifest["dest_created"] = True
        atomic_write_json(mpath, manifest)
        # 3. configs
        if needs_dest and not dest_existed:
            pst = os.stat(parent)
            os.mkdir(dest_dir, 0o755)
            made_dest = True
            os.chmod(dest_dir, 0o755)
            try:
                os.chown(dest_dir, pst.st_uid, pst.st_gid)
            except PermissionError:
                pass
            fsync_dir(parent)
        elif dest_existed:
            for p in remove_stale_temps(dest_dir):
                log(f"removed stale temp file {p}", "warning")
        for e in entries:
            if e["action"] in ("unchanged", "absent"):
                continue
            new = payloads[e["name"]]
            if new is None:
                written.append(e)
                os.unlink(e["path"])
                fsync_dir(dest_dir)
            else:
                if e["existed"]:
                    mode, uid, gid = e["mode_before"], e["uid_before"], e["gid_before"]
                else:
                    dst = os.stat(dest_dir)
                    mode, uid, gid = 0o644, dst.st_uid, dst.st_gid
                written.append(e)
                atomic_write(e["path"], new, mode=mode, uid=uid, gid=gid)
        for e in entries:
            got = sha256_file(e["path"])
            if got != e["sha256_after"]:
                raise OSError(f"verification failed for {e['path']}: sha256 {got}, want {e['sha256_after']}")
        if remove_dest_if_empty and os.path.isdir(dest_dir) and not os.listdir(dest_dir):
            os.rmdir(dest_dir)
            fsync_dir(parent)
            manifest["dest_removed"] = True
    except BaseException as exc:
        guard.raising = False  # signals from now on are only recorded
        problems = _undo(written, olds, dest_dir, made_dest)
        manifest["status"] = "failed"
        manifest["error"] = f"{type(exc).__name__}: {exc}"
        manifest["undo_problems"] = problems
        try:
            atomic_write_json(mpath, manifest)
        except BaseException as exc2:  # e.g. the disk is still full
            problems.append(f"could not mark manifest failed: {exc2}")
        if isinstance(exc, PayloadError):
            raise
        msg = f"{action} for run {run_id} failed: {type(exc).__name__}: {exc}; "
        if problems:
            msg += "ROLLBACK INCOMPLETE: " + "; ".join(problems)
        else:
            msg += f"earlier content of {len(written)} file(s) put back"
        raise PayloadError("runtime", msg, detail={"manifest": manifest}) from (
            exc if isinstance(exc, Exception) else None)

    guard.raising = False  # done: a late signal must not undo a finished install
    manifest["status"] = "installed"
    manifest["installed_at"] = now_iso()
    try:
        atomic_write_json(mpath, manifest)
    except OSError as exc:  # the configs are in place; the "writing" manifest still restores them
        log(f"could not mark manifest installed: {exc}", "warning")
    if guard.pending:
        log(f"ignored {', '.join(guard.pending)} received while finishing", "warning")
    manifest["reattached"] = False
    return manifest


def _undo(written: list[dict], olds: dict[str, bytes | None], dest_dir: str, made_dest: bool) -> list[str]:
    """Put back the earlier content of ``written`` entries (newest first); return problems found."""
    problems: list[str] = []
    for e in reversed(written):
        try:
            old = olds[e["name"]]
            if old is None:
                try:
                    os.unlink(e["path"])
                except FileNotFoundError:
                    pass
            elif sha256_file(e["path"]) != e["sha256_before"]:
                atomic_write(e["path"], old, mode=e["mode_before"], uid=e["uid_before"], gid=e["gid_before"])
            if sha256_file(e["path"]) != e["sha256_before"]:
                problems.append(f"{e['path']} not restored")
        except BaseException as exc:  # keep going: put back as much as possible
            problems.append(f"{e['path']}: {type(exc).__name__}: {exc}")
    try:
        if os.path.isdir(dest_dir):
            remove_stale_temps(dest_dir)
            fsync_dir(dest_dir)
            if made_dest and not os.listdir(dest_dir):
                os.rmdir(dest_dir)
                fsync_dir(os.path.dirname(dest_dir))
    except OSError as exc:
        problems.append(f"{dest_dir}: {exc}")
    return problems
