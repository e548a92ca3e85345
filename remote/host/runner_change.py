"""A runner trial's changes to the host (``runner_change``): the unit's drop-in, the daemon-reload
check, and FlashInfer's autotune cache kept as host state.

``python -m remote runner_change --op OP --run-id ID [--state-dir D] ...``

``--op set-dropin --unit U.service --systemd-dir DIR [--name N] [--request F | --remove]``: write
(request ``{"content": text}``) (or remove) the drop-in ``DIR/U.service.d/orch-moe-runner.conf``
(:data:`DROPIN_NAME`), or with ``--name orch-moe-configs.conf`` the one that points the unit at
orch's config folder (``remote.protocol.CONFIGS_DROPIN_NAME``). ``DIR`` is the folder of the unit's own manager, which the controller's unit
handle gives (``orchestrator.facts.systemd_unit.Unit.unit_dir``): ``/etc/systemd/system``
(:data:`SYSTEM_UNIT_DIR`) for the system manager, the login user's ``~/.config/systemd/user`` for
a user unit (systemd.unit(5)); it must be absolute. The first change of
a run goes through :func:`remote.host.changes.apply_changes` (backup of the file as it was, manifest
``action`` ``runner`` before the write), so ``restore --run-id ID`` (and ``orch rollback``) puts the
drop-in back to its bytes, or removes it and the folder when the run created them. A later change of
the same run (the next candidate) rewrites the file atomically and updates the manifest's
``sha256_after``; the backup stays the one taken before the first. ``--as-before`` puts the
drop-in back as it was before the first change (the manifest then records no change). Result: the
manifest.

``--op set-file --path FILE (--request F | --as-before)``: the same for the unit's own file where
its runner is set (an ``EnvironmentFile=`` that sets the variable its ``--moe-runner-backend`` takes,
or its SGLang ``--config`` YAML): the request's content (the file with that one value changed, made
by the controller) replaces ``FILE``, which must exist and stay a regular file; the first change is
backed up with a manifest (``action`` ``runner``, ``unit_file`` true, so ``restore`` accepts the
name), its mode and owner are kept. ``--as-before`` puts it back to its bytes before the run. The
file is never removed.

``--op reload-check``: before ``systemctl daemon-reload``. On hosts with the NVIDIA container
toolkit, a daemon-reload can take the GPU devices away from running containers whose device access
was set up by the toolkit's runtime hook rather than by systemd (NVIDIA/nvidia-container-toolkit
#48). Result: ``{"toolkit": [paths found], "gpu_containers": [{"pid", "cmdline", "cgroup"}],
"risky": bool}``: ``risky`` when the toolkit is installed and a process in a container cgroup
(docker, containerd, libpod, kubepods) holds a ``/dev/nvidia*`` file.

``--op cache-backup --cache-dir DIR``: copy every file under ``DIR`` (FlashInfer's autotune cache,
``$SGLANG_CACHE_DIR/flashinfer/autotune``) into ``<run>/flashinfer-autotune/`` with a list of
paths and sha256 (``flashinfer-autotune.json``); a second backup of the same run keeps the first.
``--op cache-restore --cache-dir DIR``: write back each backed-up file whose bytes differ or that is
missing; files created since are kept (the cache is never deleted). Result: ``{"dir", "files":
[{"path", "action": "restored"|"unchanged"|"removed"}], "kept_new": [paths]}``. With ``--exact``
(``orch recover`` of a run a controller left unfinished: every start since the backup was that
run's, made while it held the host lock) the folder is put back exactly as backed up: files
created since are removed too (``removed``), with the folders that removal leaves empty.
"""

from __future__ import annotations

import os
import shutil

from ..gpus import DEFAULT, local_vendor
from ..protocol import PayloadError
from .changes import DROPIN_NAMES, RUNNER_DROPIN_NAME, apply_changes, check_name, held_by_other, holder_text
from .fs import (AUTOTUNE_BACKUP, DEFAULT_STATE_DIR, atomic_write, atomic_write_json, check_run_id, fsync_dir, load_request,
                 read_bytes, read_json, run_dir, sha256_bytes, sha256_file)

#: the drop-in orch writes for a runner trial (one per unit)
DROPIN_NAME = RUNNER_DROPIN_NAME
#: the system manager's folder for the administrator's units and their drop-ins (systemd.unit(5))
SYSTEM_UNIT_DIR = "/etc/systemd/system"
#: the GPU vendor's container toolkit files (remote.gpus.GpuVendor.container_toolkit_paths)
TOOLKIT_PATHS = DEFAULT.container_toolkit_paths
CONTAINER_CGROUP_MARKS = ("docker", "containerd", "libpod", "kubepods", "crio")
CACHE_BACKUP = AUTOTUNE_BACKUP
MAX_CACHE_BYTES = 256 * 1024 * 1024


def add_arguments(parser) -> None:
    """Flags of ``runner_change``."""
    parser.add_argument("--op", required=True, choices=("set-dropin", "set-file", "reload-check", "cache-backup", "cache-restore"))
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--unit", default=None)
    parser.add_argument("--name", default=RUNNER_DROPIN_NAME, choices=DROPIN_NAMES,
                        help="set-dropin: which of orch's drop-ins (default: the runner trial's)")
    parser.add_argument("--path", default=None, help="set-file: the unit's own file (absolute)")
    parser.add_argument("--request", default=None, help='JSON request file {"content": the drop-in text}')
    parser.add_argument("--remove", action="store_true", help="remove orch's drop-in")
    parser.add_argument("--as-before", action="store_true",
                        help="put the drop-in back as it was before the run's first change (its backup, or none)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--exact", action="store_true",
                        help="cache-restore: also remove the files created since the backup")
    parser.add_argument("--systemd-dir", default=None,
                        help="set-dropin: the unit manager's folder the drop-in folder goes in (absolute: "
                             f"{SYSTEM_UNIT_DIR}, or a user manager's ~/.config/systemd/user)")


def run(args) -> dict:
    """``runner_change`` command: see the module docstring."""
    if args.op == "reload-check":
        return reload_check()
    run_id = check_run_id(args.run_id)
    if args.op == "set-dropin":
        if not args.unit or "/" in args.unit or args.unit.startswith("."):
            raise PayloadError("bad_input", f"--unit must be a unit name, got {args.unit!r}")
        systemd_dir = args.systemd_dir or ""
        if not os.path.isabs(systemd_dir) or os.path.normpath(systemd_dir) != systemd_dir:
            raise PayloadError("bad_input", f"set-dropin: --systemd-dir must be the unit manager's folder (absolute), "
                                            f"got {args.systemd_dir!r}")
        content = None
        if args.as_before:
            return set_dropin_as_before(args.state_dir, run_id, dropin_dir(args.unit, systemd_dir), name=args.name)
        if not args.remove:
            if not args.request:
                raise PayloadError("bad_input", "set-dropin needs --request or --remove")
            text = load_request(args.request).get("content")
            if not isinstance(text, str) or "[Service]" not in text or len(text) > 65536:
                raise PayloadError("bad_input", "set-dropin: content must be a drop-in's text with a [Service] "
                                                "section (at most 64 KiB)")
            content = text.encode("utf-8")
        return set_dropin(args.state_dir, run_id, dropin_dir(args.unit, systemd_dir), content, name=args.name)
    if args.op == "set-file":
        path = args.path or ""
        if not os.path.isabs(path) or os.path.normpath(path) != path or not os.path.isfile(path) or os.path.islink(path):
            raise PayloadError("bad_input", f"set-file: --path must be an existing regular file (absolute, "
                                            f"no symlink), got {args.path!r}")
        folder, name = os.path.split(path)
        check_name(name, unit_file=True)
        if args.as_before:
            return set_dropin_as_before(args.state_dir, run_id, folder, name=name)
        if not args.request:
            raise PayloadError("bad_input", "set-file needs --request or --as-before")
        text = load_request(args.request).get("content")
        if not isinstance(text, str) or len(text) > 1024 * 1024:
            raise PayloadError("bad_input", "set-file: content must be the file's text (at most 1 MiB)")
        return set_dropin(args.state_dir, run_id, folder, text.encode("utf-8"), name=name)
    if not args.cache_dir or not os.path.isabs(args.cache_dir):
        raise PayloadError("bad_input", f"--cache-dir must be an absolute path, got {args.cache_dir!r}")
    if args.op == "cache-backup":
        return cache_backup(args.state_dir, run_id, args.cache_dir)
    return cache_restore(args.state_dir, run_id, args.cache_dir, exact=args.exact)


def dropin_dir(unit: str, systemd_dir: str) -> str:
    """``<systemd_dir>/<unit>.service.d`` (``.service`` added to a bare name): the drop-in folder of
    ``unit`` under its manager's folder ``systemd_dir``."""
    name = unit if "." in unit else f"{unit}.service"
    return os.path.join(systemd_dir, name + ".d")


def set_dropin(state_dir: str, run_id: str, folder: str, content: bytes | None, name: str = DROPIN_NAME) -> dict:
    """Write ``content`` as ``folder/name`` (None: remove it) as run ``run_id`` (module
    docstring); ``name`` other than orch's drop-ins (:data:`remote.host.changes.DROPIN_NAMES`): the unit's own file (``set-file``), never
    created or removed. Returns the manifest. Raises ``PayloadError`` (``locked`` when another run
    holds the host lock)."""
    own = name not in DROPIN_NAMES
    other = held_by_other(state_dir, {run_id})
    if other:
        raise PayloadError("locked", f"host lock held by {holder_text(other)}; not changing {folder}")
    mpath = os.path.join(run_dir(state_dir, run_id), "manifest.json")
    manifest = read_json(mpath, default=None)
    if not isinstance(manifest, dict) or manifest.get("status") == "failed":
        if content is None and not os.path.exists(os.path.join(folder, name)):
            return {"run_id": run_id, "dest_dir": folder, "files": [], "status": "unchanged"}
        if own and content is None:
            raise PayloadError("bad_input", f"run {run_id}: orch never removes {folder}/{name}")
        return apply_changes(state_dir, run_id, "runner", folder, [(name, content)],
                             create_dest=not own, remove_dest_if_empty=not own,
                             extra={"unit_file": True} if own else None)
    if manifest.get("dest_dir") != folder or manifest.get("action") != "runner":
        raise PayloadError("bad_input", f"run {run_id} already changed {manifest.get('dest_dir')} "
                                        f"({manifest.get('action')}); one runner change per run")
    if own and (content is None or not manifest.get("unit_file")):
        raise PayloadError("bad_input", f"run {run_id}: {folder}/{name} can only be rewritten, not removed")
    path = os.path.join(folder, name)
    if content is None:
        if os.path.exists(path):
            os.unlink(path)
            fsync_dir(folder)
        if os.path.isdir(folder) and not os.listdir(folder) and not manifest.get("dest_existed_before", True):
            os.rmdir(folder)
            fsync_dir(os.path.dirname(folder))
    else:
        if not os.path.isdir(folder):
            os.makedirs(folder, 0o755)
            fsync_dir(os.path.dirname(folder))
        # the file's mode and owner as they were before the run, whatever the steps in between did
        entry = next((f for f in manifest.get("files") or [] if f.get("name") == name), {})
        mode = entry.get("mode_before")
        atomic_write(path, content, mode=0o644 if mode is None else mode, uid=entry.get("uid_before"),
                     gid=entry.get("gid_before"))
    for f in manifest.get("files") or []:
        if f.get("name") == name:
            f["sha256_after"] = None if content is None else sha256_bytes(content)
            before, after = f.get("sha256_before"), f["sha256_after"]
            f["action"] = ("absent" if before is None and after is None else "unchanged" if before == after
                           else "deleted" if after is None else "created" if before is None else "replaced")
            f["bytes_after"] = None if content is None else len(content)
    atomic_write_json(mpath, manifest)
    return manifest


def set_dropin_as_before(state_dir: str, run_id: str, folder: str, name: str = DROPIN_NAME) -> dict:
    """Put the drop-in back as it was before run ``run_id`` first changed it (its backup's bytes, or
    no file and no folder the run made), recorded in the manifest as ``unchanged``/``absent``: the
    run then changed nothing, so ``orch rollback`` has nothing of it to undo. A run that never
    changed it: nothing to do. Returns the manifest."""
    manifest = read_json(os.path.join(run_dir(state_dir, run_id), "manifest.json"), default=None)
    if not isinstance(manifest, dict):
        return {"run_id": run_id, "dest_dir": folder, "files": [], "status": "unchanged"}
    entry = next((f for f in manifest.get("files") or [] if f.get("name") == name), None)
    if entry is None:
        raise PayloadError("runtime", f"run {run_id} recorded no {name}")
    before = None
    if entry.get("existed"):
        before = read_bytes(os.path.join(run_dir(state_dir, run_id), "backup", name))
        if before is None or sha256_bytes(before) != entry.get("sha256_before"):
            raise PayloadError("runtime", f"backup of {entry.get('path')} in run {run_id} is missing or damaged")
    got = set_dropin(state_dir, run_id, folder, before, name=name)
    if sha256_file(os.path.join(folder, name)) != entry.get("sha256_before"):
        raise PayloadError("runtime", f"{folder}/{name} is not back to its bytes before run {run_id}")
    return got


def reload_check(toolkit_paths: tuple[str, ...] | None = None, proc: str = "/proc") -> dict:
    """See the module docstring (``--op reload-check``); the host's GPU vendor
    (:func:`remote.gpus.local_vendor`) gives the toolkit's files and its device files;
    ``toolkit_paths`` and ``proc`` for tests."""
    vendor = local_vendor()
    toolkit = [p for p in (vendor.container_toolkit_paths if toolkit_paths is None else toolkit_paths)
               if os.path.exists(p)]
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            fds = os.path.join(proc, entry, "fd")
            links = [os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds)]
            if not any(vendor.is_device_file(link) for link in links):
                continue
            with open(os.path.join(proc, entry, "cgroup")) as f:
                cgroup = f.read()
            with open(os.path.join(proc, entry, "cmdline"), "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if any(m in cgroup for m in CONTAINER_CGROUP_MARKS):
            found.append({"pid": int(entry), "cmdline": cmd[:200], "cgroup": cgroup.strip()[-200:]})
    return {"toolkit": toolkit, "gpu_containers": found, "risky": bool(toolkit and found)}


def _walk(root: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(os.path.relpath(path, root))
    return sorted(out)


def cache_backup(state_dir: str, run_id: str, cache_dir: str) -> dict:
    """See the module docstring (``--op cache-backup``). Returns ``{"dir", "files": [{"path",
    "sha256"}], "kept_earlier": bool}``."""
    rdir = run_dir(state_dir, run_id, create=True)
    index = os.path.join(rdir, CACHE_BACKUP + ".json")
    earlier = read_json(index, default=None)
    if isinstance(earlier, dict) and earlier.get("dir") == cache_dir:
        return dict(earlier, kept_earlier=True)
    dest = os.path.join(rdir, CACHE_BACKUP)
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    files, total = [], 0
    for rel in (_walk(cache_dir) if os.path.isdir(cache_dir) else []):
        data = read_bytes(os.path.join(cache_dir, rel))
        if data is None:
            continue
        total += len(data)
        if total > MAX_CACHE_BYTES:
            raise PayloadError("runtime", f"{cache_dir} holds over {MAX_CACHE_BYTES} bytes; not backing it up")
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), 0o700, exist_ok=True)
        atomic_write(os.path.join(dest, rel), data, mode=0o600)
        files.append({"path": rel, "sha256": sha256_bytes(data)})
    result = {"dir": cache_dir, "files": files}
    atomic_write_json(index, result)
    return dict(result, kept_earlier=False)


def cache_restore(state_dir: str, run_id: str, cache_dir: str, exact: bool = False) -> dict:
    """See the module docstring (``--op cache-restore``; ``exact``: ``--exact``). A run without a
    backup restores nothing. Raises ``PayloadError`` (``bad_input`` for another folder than the
    backed-up one, ``runtime`` for a damaged backup)."""
    rdir = run_dir(state_dir, run_id)
    index = read_json(os.path.join(rdir, CACHE_BACKUP + ".json"), default=None)
    if not isinstance(index, dict):
        return {"dir": cache_dir, "files": [], "kept_new": [], "note": f"run {run_id} backed up no autotune cache"}
    if index.get("dir") != cache_dir:
        raise PayloadError("bad_input", f"run {run_id} backed up {index.get('dir')}, not {cache_dir}")
    out = []
    for f in index.get("files") or []:
        rel = f["path"]
        if rel.startswith("/") or ".." in rel.split("/"):
            raise PayloadError("runtime", f"backup index of run {run_id} names {rel!r}")
        target = os.path.join(cache_dir, rel)
        if sha256_file(target) == f["sha256"]:
            out.append({"path": target, "action": "unchanged"})
            continue
        data = read_bytes(os.path.join(rdir, CACHE_BACKUP, rel))
        if data is None or sha256_bytes(data) != f["sha256"]:
            raise PayloadError("runtime", f"backup of {target} in run {run_id} is missing or damaged")
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        atomic_write(target, data, mode=0o644)
        out.append({"path": target, "action": "restored"})
    backed = {f["path"] for f in index.get("files") or []}
    new = [os.path.join(cache_dir, r) for r in (_walk(cache_dir) if os.path.isdir(cache_dir) else [])
           if r not in backed]
    if not exact:
        return {"dir": cache_dir, "files": out, "kept_new": new}
    keep = {os.path.dirname(os.path.join(cache_dir, r)) for r in backed}
    for path in new:
        os.unlink(path)
        out.append({"path": path, "action": "removed"})
        folder = os.path.dirname(path)
        # the folders the run's starts made (a new <version>/sm<XY>/<hash>), up to the cache folder
        while folder != cache_dir and folder.startswith(cache_dir + "/") and folder not in keep \
                and not os.listdir(folder):
            os.rmdir(folder)
            folder = os.path.dirname(folder)
    return {"dir": cache_dir, "files": out, "kept_new": []}
