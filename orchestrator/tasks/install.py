"""Tasks ``install`` and ``restore`` (payload commands of the same names): write tuned files into
SGLang's tree, or undo that.

The host side (payload ``install``/``restore``) backs up every file it will replace
into ``<state_dir>/runs/<run_id>/backup/`` and writes a manifest (paths, sha256 before
and after) BEFORE the first write; each file is written atomically (temp file in the
same folder, fsync, rename). The JSON is validated on the controller first
(SGLang's loader does ``int(key)`` on every top-level key) and again on the host.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import task
from ..host.container import install_target
from ..payload.client import PayloadFailed
from ..records.layout import INSTALL_MANIFEST


def _validate(name: str, text: str) -> None:
    from remote.sglang.configfile import validate_config
    from remote.protocol import PayloadError

    try:
        validate_config(json.loads(text), name)
    except (ValueError, PayloadError) as exc:
        raise TaskFailed(f"refusing to install {name}: {getattr(exc, 'msg', exc)}") from None


@task("install", sets=("orch_installed",))
def install(ctx, dest_dir: str, files: dict | None = None, names: dict | None = None) -> TaskResult:
    """Install config files into ``dest_dir`` (``orch_plan.install_dir``: ``configs/triton_X_Y_Z``
    of the loader, or of ``$SGLANG_MOE_CONFIG_DIR``), created when missing, after backing up what
    they replace; ``files``: role -> local path (default: the files this run tuned or reused);
    ``names``: role -> the path the server reads (``orch_plan.paths``): only those roles are
    installed, under those names (a release that reads no ``_down`` file gets none). Sets
    ``orch_installed`` (the paths written, as the server sees them). ``ok`` when every file
    already had these bytes. For a container unit ``dest_dir`` is the container's folder; the
    files are written into the host folder bind-mounted there
    (:func:`orchestrator.host.container.install_target`; fails when there is none).
    """
    files = files or ctx.run.tuned_files
    if not files:
        raise TaskFailed("no config files to install")
    if names is not None:
        missing = sorted(set(names) - set(files))
        if missing:
            raise TaskFailed(f"no tuned {', '.join(missing)} file to install")
        files = {role: files[role] for role in names}
    payload_files = []
    for role, local in sorted(files.items()):
        text = Path(local).read_text()
        name = posixpath.basename(names[role]) if names is not None else Path(local).name
        _validate(name, text)
        payload_files.append({"name": name, "content": text, "role": role})
    write_dir = dest_dir
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        # the folder the server reads inside the container, written on the host through its bind mount
        write_dir = install_target(unit.container, dest_dir, unit.environment)
    request = {"run_id": ctx.options.run_id, "state_dir": ctx.payload.state_dir, "action": "tune",
               "dest_dir": write_dir, "files": payload_files, "create_dest": True}
    ctx.run.install_attempted = True
    manifest = ctx.payload.call("install", request=request, timeout=300)
    ctx.run.install_manifest = manifest
    paths = [posixpath.join(dest_dir, f["name"]) for f in payload_files]
    ctx.run.summary.installed = paths
    (ctx.host_dir / INSTALL_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    changed = any(f.get("action") != "unchanged" for f in manifest.get("files") or [{}])
    result = TaskResult.changed if changed else TaskResult.ok
    where = f" (on the host in {write_dir})" if write_dir != dest_dir else ""
    return result(("installed " if changed else "already installed ") + ", ".join(paths) + where,
                  facts={"orch_installed": paths}, manifest=manifest, paths=paths)


@task("restore")
def restore(ctx, run_id: str | None = None) -> TaskResult:
    """Put back every file a run changed (``run_id``, default: this run; rescue steps) from the
    host's own backups and manifest. Skipped when this run installed nothing."""
    if run_id is None and not ctx.run.install_attempted:
        return TaskResult.skipped("this run installed nothing")
    rid = run_id or ctx.options.run_id
    try:
        data = ctx.payload.call("restore", ["--run-id", rid, "--state-dir", ctx.payload.state_dir], timeout=300)
    except PayloadFailed as exc:
        if exc.kind == "not_found" and run_id is None:
            # install failed before its manifest: nothing on the host was changed
            return TaskResult.ok(f"run {rid} wrote nothing on the host: nothing to restore")
        raise
    ctx.run.summary.restored = data.get("files")
    ctx.emit("configs_restored", run_id=rid, files=data.get("files"))
    return TaskResult.changed(f"restored the files of run {rid}", **data)
