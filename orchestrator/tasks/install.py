"""Tasks ``install`` and ``restore`` (payload commands of the same names): write tuned files into
the folder the engine reads them from (SGLang's tree), or undo that.

The host side (payload ``install``/``restore``) backs up every file it will replace
into ``<state_dir>/runs/<run_id>/backup/`` and writes a manifest (paths, sha256 before
and after) BEFORE the first write; each file is written atomically (temp file in the
same folder, fsync, rename). The JSON is validated on the controller first
(the engine's loader does ``int(key)`` on every top-level key) and again on the host.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from remote.engines import dumps_config, validate_config

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.journal import last_start_log
from ..host.container import install_target
from ..host.records import records
from ..host.runner_trial import daemon_reload, triton_subrun
from ..payload.client import PayloadFailed
from ..records.layout import INSTALL_MANIFEST
from ..store import ConfigStore


def _validate(name: str, text: str, extra_fields: tuple[str, ...] = ()) -> None:
    from remote.protocol import PayloadError

    try:
        validate_config(json.loads(text), name, extra_fields=tuple(extra_fields))
    except (ValueError, PayloadError) as exc:
        raise TaskFailed(f"refusing to install {name}: {getattr(exc, 'msg', exc)}") from None


@task("install", rerun=True, sets=("orch_installed",))
def install(ctx, dest_dir: str, files: dict | None = None, names: dict | None = None) -> TaskResult:
    """Install config files into ``dest_dir`` (``orch_plan.install_dir``: ``configs/triton_X_Y_Z``
    of the loader, or of the engine's config-dir variable), created when missing, after backing up what
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
        _validate(name, text, ctx.facts.engine.config_extra_fields)
        payload_files.append({"name": name, "content": text, "role": role})
    write_dir = dest_dir
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        # the folder the server reads inside the container, written on the host through its bind mount
        write_dir = install_target(unit.container, dest_dir, unit.environment, ctx.facts.engine)
    plan = ctx.facts.plan
    dropin = plan.dropin if plan is not None and plan.install_dir == dest_dir else None
    run_id = ctx.options.run_id
    if dropin is not None:
        # the unit reads orch's folder through the engine's config-dir variable: the drop-in is the
        # run's own change (backed up, removed by rollback), the files its sub-run's (one manifest
        # per folder, as a runner trial's)
        run_id = _point_unit_at(ctx, dropin)
    request = {"run_id": run_id, "state_dir": ctx.payload.state_dir, "action": "tune",
               "dest_dir": write_dir, "files": payload_files, "create_dest": True, **_folder_rule(ctx),
               **_entry_rule(ctx)}
    ctx.run.install_attempted = True
    manifest = ctx.payload.call("install", request=request, timeout=300)
    if dropin is not None:
        records(ctx).set_state(run_id, "installed", {"action": "tune", "sub_run_of": ctx.options.run_id,
                                                     "note": f"the config files in {dropin['folder']}"})
        daemon_reload(ctx, ctx.facts.unit_handle())
    ctx.run.install_manifest = manifest
    paths = [posixpath.join(dest_dir, f["name"]) for f in payload_files]
    ctx.run.summary.installed = paths
    (ctx.host_dir / INSTALL_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    changed = any(f.get("action") != "unchanged" for f in manifest.get("files") or [{}])
    result = TaskResult.changed if changed else TaskResult.ok
    if ctx.run.stopped_by_orch:  # a part of the unit's downtime (orchestrator.facts.downtime)
        ctx.mark_phase("install")
    where = f" (on the host in {write_dir})" if write_dir != dest_dir else ""
    return result(("installed " if changed else "already installed ") + ", ".join(paths) + where,
                  facts={"orch_installed": paths}, manifest=manifest, paths=paths)


def _point_unit_at(ctx, dropin: dict) -> str:
    """Write ``orch_plan.dropin`` (the unit's drop-in that sets the engine's config-dir variable to
    orch's folder) as this run's change (payload ``runner_change --op set-dropin``: backup and
    manifest first) and return the sub-run id the config files are installed under
    (``<run id>.triton``, undone with the run by ``orch rollback``, by the rescue and ``orch recover``)."""
    handle = ctx.facts.unit_handle()
    args = ["--op", "set-dropin", "--name", dropin["name"], "--run-id", ctx.options.run_id,
            "--state-dir", ctx.payload.state_dir, "--unit", handle.name, "--systemd-dir", handle.unit_dir(ctx.connection)]
    ctx.run.install_attempted = True  # the rescue's restore puts the drop-in back
    ctx.run.dropin_written = True  # and reloads systemd
    ctx.payload.call("runner_change", args, request={"content": dropin["text"]}, timeout=120)
    sub = triton_subrun(ctx)
    if sub not in ctx.run.sub_runs:
        ctx.run.sub_runs.append(sub)
    return sub


def _folder_rule(ctx) -> dict:
    """``{"any_dest_name": True}`` for an engine that keeps no folder per Triton release (the probe's
    ``triton_folder`` is None: the folder the server reads has any name, e.g. a config-dir
    variable's), else ``{}`` (the payload's install then requires ``triton_X_Y_Z``)."""
    probe = ctx.facts.probe
    return {"any_dest_name": True} if probe is not None and probe.triton_folder is None else {}


def _entry_rule(ctx) -> dict:
    """``{"extra_fields": [...]}`` for an engine whose files carry entry fields beyond the shared
    ones (``Engine.config_extra_fields``: vLLM's ``SPLIT_K``), so the payload's install validates
    them as that engine's loader reads them; else ``{}``."""
    extra = list(ctx.facts.engine.config_extra_fields)
    return {"extra_fields": extra} if extra else {}


def _known_files(ctx) -> dict[str, str]:
    """role -> config text this run would install, when known before anything is stopped: the
    store's files for the host's key (``orch_config_source`` ``store``, also under ``--check``)
    or the files another host of the group tuned (``reuse``); ``{}`` when this host tunes them."""

    if ctx.facts.config_source == "store" and ctx.facts.tuning_key is not None and ctx.options.state_dir:
        entry = ConfigStore(ctx.options.state_dir).get(ctx.facts.tuning_key.key)
        if entry is not None:  # the bytes write_configs gives the install (sharing.write_configs)
            extra = ctx.facts.engine.config_extra_fields
            return {role: dumps_config(json.loads(p.read_text()), extra_fields=extra) for role, p in entry.files.items()}
    if ctx.facts.config_source in ("store", "reuse"):
        return {role: Path(p).read_text() for role, p in ctx.run.tuned_files.items()}
    return {}


@task("compare_installed", rerun=True, check_mode=READ_ONLY, sets=("orch_unchanged",), aliases={"unit": "name", "service": "name"})
def compare_installed(ctx, name: str) -> TaskResult:
    """Would this run change the host? ``orch_unchanged`` is True (the play then stops, tunes,
    installs and restarts nothing) when all of these hold:

    - the files to install are known before the tune (:func:`_known_files`: the store has a
      result for the host's tuning key and ``--retune`` was not given, or the group's tuner
      gave them);
    - each one, named and placed as ``orch_plan.paths``, is byte-identical (sha256) to the file
      installed there (payload ``install --dry-run``, :func:`remote.host.install.compare`);
    - the unit is active and the log of its last start shows the engine loaded every one of them
      (``Engine.verify_loaded``: SGLang's ``Using MoE kernel config from <path>.``, no fallback or
      default line for them).

    Otherwise ``orch_unchanged`` is False and the message says why. Reads only; runs under ``--check``,
    where it says ``unchanged`` instead of what the plan would write."""
    plan = ctx.facts.plan
    if plan is None or not plan.paths:
        raise TaskFailed("no plan of the files to write (orch_plan): run the plan task before compare_installed")
    texts = _known_files(ctx)
    missing = sorted(set(plan.paths) - set(texts))
    if not texts or missing:
        return TaskResult.ok("the files are known only after the tune: " + (
            "it runs" if not ctx.check else "it would run"), facts={"orch_unchanged": False})
    files = [{"name": posixpath.basename(path), "content": texts[role], "role": role}
             for role, path in sorted(plan.paths.items())]
    for f in files:
        _validate(f["name"], f["content"], ctx.facts.engine.config_extra_fields)
    request = {"run_id": ctx.options.run_id, "state_dir": ctx.payload.state_dir, "action": "tune",
               "dest_dir": plan.install_dir, "files": files, "create_dest": True, "dry_run": True, **_folder_rule(ctx),
               **_entry_rule(ctx)}
    cmp = ctx.payload.call("install", request=request, timeout=120)
    differ = [f"{f['name']} ({'new' if f['action'] == 'created' else 'other bytes installed'})"
              for f in cmp.get("files") or [] if f.get("action") != "unchanged"]
    why: list[str] = []
    if differ:
        why.append("would write " + ", ".join(differ))
    unit = ctx.facts.unit
    if unit is not None and unit.active_state != "active":
        why.append(f"the unit is {unit.active_state}")
    elif not differ:
        engine = ctx.facts.engine
        text = last_start_log(ctx.connection, ctx.facts.unit_handle(name), engine)
        if text is None:
            why.append("the unit's log holds no start, so nothing shows the files were loaded")
        else:
            problems = engine.verify_loaded(engine.parse_log(text), list(plan.paths.values()))
            if problems:
                why.append("the last start did not load them: " + "; ".join(problems))
    data = {"files": cmp.get("files"), "reasons": why}
    if why:
        return TaskResult.ok("; ".join(why), facts={"orch_unchanged": False}, **data)
    paths = [plan.paths[r] for r in sorted(plan.paths)]
    ctx.run.summary.unchanged = paths
    names = ", ".join(posixpath.basename(p) for p in paths)
    return TaskResult.ok(f"unchanged: {names} already hold these bytes and the last start loaded them; nothing "
                         + ("would be" if ctx.check else "is") + " written, stopped, tuned or restarted (--retune tunes again)",
                         facts={"orch_unchanged": True}, **data)


@task("restore", rerun=True)
def restore(ctx, run_id: str | None = None) -> TaskResult:
    """Put back every file a run changed (``run_id``, default: this run and its sub-runs,
    ``HostRun.sub_runs``; rescue steps) from the host's own backups and manifest. Skipped when
    this run installed nothing."""
    if run_id is None and not ctx.run.install_attempted:
        return TaskResult.skipped("this run installed nothing")
    rid = run_id or ctx.options.run_id
    try:
        data = ctx.payload.call("restore", ["--run-id", rid, "--state-dir", ctx.payload.state_dir], timeout=300)
    except PayloadFailed as exc:
        if exc.kind != "not_found" or run_id is not None:
            raise
        if not ctx.run.sub_runs:
            # install failed before its manifest: nothing on the host was changed
            return TaskResult.ok(f"run {rid} wrote nothing on the host: nothing to restore")
        data = {}
    files = list(data.get("files") or [])
    for sub in ctx.run.sub_runs if run_id is None else []:  # e.g. the Triton files of a runner trial
        try:
            got = ctx.payload.call("restore", ["--run-id", sub, "--state-dir", ctx.payload.state_dir], timeout=300)
        except PayloadFailed as exc:
            if exc.kind != "not_found":
                raise
            continue
        files += got.get("files") or []
    ctx.run.summary.restored = files
    ctx.emit("configs_restored", run_id=rid, files=files)
    return TaskResult.changed(f"restored the files of run {rid}", **dict(data, files=files))
