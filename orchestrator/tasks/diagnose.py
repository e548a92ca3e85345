"""Task ``diagnose``: why a host does or does not run tuned fused-MoE kernels (read-only).

The task gathers facts (:func:`gather`: the unit, the probe, the unit's last start in its log,
each config file's validity, files changed since that start, GPU holders outside the unit, the
run that wrote an invalid file) and :func:`classify` decides, as a pure function of them.

Verdicts (one per host):

- ``not-applicable``: flags with which the engine never reads the files whatever the runner
  (SGLang: ``--enable-deterministic-inference`` on 0.5.5+, KTransformers' kt-kernel:
  :func:`orchestrator.host.hazards.bypass_reason`); ``orch tune`` skips it and stops nothing.
- ``not-triton``: the server's MoE runner reads no Triton config file (the engine's answer,
  ``Engine.moe_runner``, the one ``orch tune``'s plan gives: for SGLang only the ``triton`` runner
  reads them); ``orch tune`` would change nothing. For a runner that autotunes (``autotunes``:
  FlashInfer's) the row's ``autotune`` is its start-up autotune state
  (:mod:`orchestrator.host.autotune`: on or off and why, this server's cache present or missing,
  caches left by another FlashInfer version).
- ``broken``: a config file the engine would read is invalid (the server crashes at start),
  or an unparsable ``configs/triton_*`` folder breaks the engine's fallback sort (ValueError), or an
  empty or relative config-dir variable points at a folder that does not exist
  (:class:`remote.engines.RootHazards`; each such entry is also a note, ``will-crash``
  or ``not-loaded``, with its path). An installed up/``_down`` pair that disagrees on BLOCK_SIZE_M
  at some batch size is a warning note (SGLang 0.5.23 overrides the down value), and so is the
  server's own Triton cache on a shared filesystem, with kernels of another GPU architecture or
  truncated files (:func:`orchestrator.host.hazards.triton_cache_note`).
- ``restart-needed``: the files on disk differ from what the server logged at its last
  start, or a file it loaded was modified after the unit's main process started
  (configs are cached in-process: a restart picks them up).
- ``tuned``: the up (and down) file is in the installed Triton's folder, valid, and the
  last start logged ``Using MoE kernel config from <path>.`` for it.
- ``fallback``: found only in another Triton's folder, or the down file is missing
  (sub-optimal line at start).
- ``default``: no file anywhere: the built-in default config runs.
- ``unfinished-run``: an orch run left the host unfinished (its controller was killed or lost the
  link after stopping the unit, :func:`orchestrator.records.host.unfinished`): the unit is down and
  held by that run (its lock, its record), or the host's dead-man restored it by itself
  (remote/host/deadman.py); ``orch recover`` brings it back and records it. It comes before the
  file verdicts: the files are half a run's.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from remote.engines import AutotuneState, Engine, MoeLogReport, MoeRunner, RootHazards, engine_named, probe_view

from ..engine.results import TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.catalog import server_of
from ..facts.files import changed_since_start, config_problem, file_digest
from ..facts.legacy import DOCTOR_FILE_KEYS, DOCTOR_KEYS, with_old_names
from ..facts.journal import last_start_log, start_failure
from ..facts.probe import ProbeFacts
from ..facts.processes import unit_pids
from ..facts.schema import from_dict
from ..facts.unit import ServerArgs, UnitFacts
from ..host.autotune import autotune_state
from ..host.devices import unit_gpu_devices
from ..host.hazards import bypass_reason, pair_mismatch, root_hazards, triton_cache_note
from ..host.records import records


@dataclass
class DoctorFacts:
    """What :func:`classify` decides from (all gathered read-only).

    ``unit``: ``orch_unit`` (the unit's facts, :class:`~orchestrator.facts.unit.UnitFacts`); ``probe``:
    ``orch_probe`` (:class:`~orchestrator.facts.probe.ProbeFacts`); ``log``: the parsed
    lines of the unit's last start (``Engine.parse_log``, its autotune lines included; None when its
    log holds no start); ``file_errors``: role -> why the file the engine would load is invalid
    (None: valid or absent); ``changed_since_start``: paths of files the engine would load that
    were replaced after the last start; ``orphans``: GPU
    holders outside the unit (dicts with ``pid``, ``cmdline``); ``installed_by_run``: the orch run
    that wrote an invalid file (None when none did); ``start_failure``: the line of the last start
    that says why it failed (None when none does); ``file_digests``: role -> sha256 of the file the engine
    would load (None: absent or unreadable), compared across the ranks of a multi-node server;
    ``engine``: whose rules classify (None: the unit's, ``UnitFacts.engine``);
    ``unfinished``/``lock``: runs an orch controller left unfinished, and the host lock;
    ``hazards``: the configs root's :class:`~remote.engines.RootHazards`;
    ``pair_mismatch``: the warning for an installed pair that disagrees on BLOCK_SIZE_M (None: none).
    """

    unit: UnitFacts
    probe: ProbeFacts
    log: MoeLogReport | None
    file_errors: dict[str, str | None] = field(default_factory=dict)
    changed_since_start: list[str] = field(default_factory=list)
    orphans: list[dict] = field(default_factory=list)
    installed_by_run: str | None = None
    start_failure: str | None = None
    file_digests: dict[str, str | None] = field(default_factory=dict)
    engine: Engine | None = None
    #: runs an orch controller left unfinished on the host (:func:`orchestrator.records.host.unfinished`),
    #: and the host lock then (None: free or unread)
    unfinished: list[dict] = field(default_factory=list)
    lock: dict | None = None
    hazards: RootHazards | None = None
    pair_mismatch: str | None = None


def _file_info(f: DoctorFacts, role: str) -> dict[str, Any]:
    probe = f.probe
    names = probe.file_names or {}
    install_dir = probe.install_dir or ""
    ex = probe.existing_file(role)
    return with_old_names({"name": names.get(role), "in_installed_folder": ex.in_installed_folder,
            "other_folders": [d for d in ex.folders if d != probe.triton_folder],
            "would_load": ex.would_load, "fallback_error": ex.fallback_error,
            "error": f.file_errors.get(role), "sha256": f.file_digests.get(role),
            "path": posixpath.join(install_dir, names[role]) if names.get(role) and install_dir else None},
                          DOCTOR_FILE_KEYS)


def _logged(rep: MoeLogReport | None, up: dict, down: dict) -> str | None:
    """What the last start logged: tuned, fallback, default, other, none (None: no start logged)."""
    if rep is None:
        return None
    if up["would_load"] and up["would_load"] in rep.loaded and (
            not down["would_load"] or down["would_load"] in rep.loaded) and not rep.suboptimal:
        return "tuned"
    # moe_log's one model for every release's wording (a missing down file reuses the up table)
    return {"loaded": "fallback" if rep.suboptimal else "other", "fallback": "fallback",
            "default": "default", "none": "none"}[rep.overall]


def not_triton_why(runner: MoeRunner, tune: AutotuneState | None, engine: Engine | None = None) -> str:
    """The doctor's ``why`` for a server whose MoE runner reads no Triton config file: the
    runner's reason (``Engine.moe_runner``), what it means for ``orch tune``, and FlashInfer's
    autotune state (``tune``, None: a runner that does not autotune). Pure."""
    why = f"{runner.reason}; orch tune would change nothing"
    if tune is not None:
        why += ". " + autotune_why(tune, engine)
    return why


def autotune_why(tune: AutotuneState, engine: Engine | None = None) -> str:
    """FlashInfer's autotune state in words: on or off and why, the cache for this server's key
    (present, missing, not reused, unknown) and caches left by another FlashInfer version. Pure."""
    if tune.enabled is False:
        return f"FlashInfer autotune is off: {tune.why}"
    text = "FlashInfer autotunes at start" if tune.enabled else f"FlashInfer autotune: {tune.why}"
    where = tune.path or tune.root or "?"
    text += {"present": f"; its cache for this server is present ({where})",
             "missing": f"; no cache for this server's key at {where}: the next start autotunes again (minutes on "
                        "large models)",
             "not-reused": f"; {(engine or engine_named(None)).autotune_reuse_env}=0: every start autotunes again "
                           f"and writes a new file under {where}/runs/",
             "unknown": f"; whether its cache is present is not known ({tune.key_why or 'key not derived'})",
             }[tune.cache]
    if tune.key_source == "derived" and tune.key_why:
        text += f" ({tune.key_why})"
    if tune.other_versions:
        text += (f"; cache left by another FlashInfer version (not read by {tune.flashinfer_version}): "
                 + ", ".join(tune.other_versions))
    return text


def classify(f: DoctorFacts) -> dict[str, Any]:
    """The doctor's row for one host: the facts shown in the table plus ``verdict``, ``why`` and
    ``notes`` (see the module docstring for the verdicts). Pure: reads only ``f``."""
    unit, probe = f.unit, f.probe
    engine = f.engine or engine_named(unit.engine)
    server = server_of(unit, engine)
    backend = server.moe_backend
    sg = probe.engine
    model = probe.model
    rep = f.log
    runner = engine.moe_runner(server, probe_view(probe), log=rep)
    tune = autotune_state(engine, unit, server, probe, runner, rep)
    notes: list[str] = list(probe.warnings)
    up, down = _file_info(f, "up"), _file_info(f, "down")
    row = {
        "gpus": [g.name for g in probe.gpus], "device_name": probe.device_name,
        "capability": probe.gpus[0].capability if probe.gpus else None,
        "triton_version": probe.triton_version, "engine": engine.name, "engine_version": sg.version,
        "configs_root": sg.configs_root,
        "moe_config_dir": unit.environment.get(engine.config_dir_env) if engine.config_dir_env else None,
        "backend": backend,
        "tp": server.tp, "ep": server.ep, "E": model.E if model else None, "N": model.N if model else None,
        "dtype_selector": model.dtype_selector if model else None, "file_names": probe.file_names or {},
        "files": {"up": up, "down": down},
        "log": ({"loaded": rep.loaded, "fallback": rep.fallback, "default": rep.default,
                 "down_missing": rep.down_missing, "suboptimal": rep.suboptimal} if rep else None),
        "orphans": list(f.orphans), "unit_state": unit.active_state, "installed_by_run": None,
        "runner": runner.to_dict(), "flashinfer_version": probe.flashinfer_version,
        "autotune": tune.to_dict() if tune is not None else None,
    }
    invalid = [f"{posixpath.basename(posixpath.dirname(i['would_load']))}/"
               f"{posixpath.basename(i['would_load'])} is invalid (a start would crash): {i['error']}"
               for i in (up, down) if i["error"] and i["would_load"]]
    hazards = f.hazards or RootHazards()
    bypass = bypass_reason(engine, unit, probe)
    row.update(bypass=bypass, hazards={"entries": hazards.entries, "config_dir": hazards.config_dir},
               pair_mismatch=f.pair_mismatch)
    if f.unfinished:
        verdict = "unfinished-run"
        why = unfinished_why(unit, f.unfinished, f.lock)
    elif bypass:
        verdict = "not-applicable"
        why = f"{bypass}; orch tune skips this server and stops nothing"
    elif runner.reads_triton_configs is False:
        verdict = "not-triton"
        why = not_triton_why(runner, tune, engine)
    elif invalid or any("unparsable" in str(i.get("fallback_error") or "") for i in (up, down)):
        verdict = "broken"
        why = "; ".join(invalid) or f"{up.get('fallback_error') or down.get('fallback_error')}"
    elif hazards.will_crash:
        verdict = "broken"
        why = "; ".join(hazards.will_crash)
    elif rep is not None and not rep.any_lookup and not rep.ready and unit.active_state in ("failed", "inactive"):
        # the server died before its MoE layers ran: nothing says which runner it would use
        verdict = "broken"
        why = (f"the last start ended ({unit.active_state}) before any MoE config lookup"
               + (f": {f.start_failure}" if f.start_failure else "")
               + "; orch tune reaps leftover GPU processes and starts it again")
    else:
        # a role the engine's release never reads (vLLM's _down file but in one case) needs no file
        down_read = f.probe.existing_file("down").read_by_engine
        if up["in_installed_folder"] and (down["in_installed_folder"] or not down_read):
            disk = "tuned"
        elif up["would_load"]:
            disk = "fallback"
        else:
            disk = "default"
        logged = _logged(rep, up, down)
        quiet = engine.hidden_load_lines(server)
        if quiet and (rep is None or not rep.any_lookup):
            logged = None  # a tuned start logs nothing above INFO (issue 32 row 18)
            notes.append(f"{quiet} (and its start and ready lines), so the verdict is the files on disk")
        elif rep is not None and not rep.any_lookup and not rep.ready:
            logged = None  # still starting: its lookups are not logged yet
            notes.append("the last start has not finished warming up: its MoE config lookups are not logged yet")
        newer = f.changed_since_start if logged is not None and logged == disk else []
        if logged is not None and logged != disk:
            verdict = "restart-needed"
            why = f"files on disk say {disk}, but the last start logged {logged}: restart the unit to load them"
        elif newer:
            verdict = "restart-needed"
            why = ("changed after the last start (the server caches configs): "
                   + ", ".join(posixpath.basename(p) for p in newer) + "; restart the unit to load them")
        else:
            verdict = disk
            why = {"tuned": "up and down files in the installed Triton folder, valid, loaded at the last start",
                   "fallback": ("only in " + ", ".join(up["other_folders"]) if not up["in_installed_folder"]
                                else f"down file missing: {down['name']}") + " (sub-optimal)",
                   "default": f"no up file in any Triton folder: {engine.display_name}'s default config (sub-optimal)"}[disk]
            if logged is None and not quiet:
                notes.append("no server start found in the unit log")
    if verdict != "not-applicable":
        notes += hazards.notes()
        if f.pair_mismatch:
            notes.append(f"WARNING: {f.pair_mismatch}")
    cache_note = triton_cache_note(probe.server_triton_cache)
    row["triton_cache"] = probe.server_triton_cache
    if cache_note:
        notes.append(f"WARNING: {cache_note}")
    if not runner.known:
        notes.append(f"MoE runner unknown: {runner.reason}")
    elif verdict not in ("not-triton", "not-applicable"):
        notes.append(f"MoE runner {runner.runner}: {runner.reason}")
    if tune is not None and verdict not in ("not-triton", "not-applicable"):
        notes.append(autotune_why(tune, engine))
    if runner.disagreement:
        notes.append(f"the last start's log and orch's {engine.display_name} rule disagree ({runner.disagreement}); "
                     "the log counts")
    if row["unit_state"] and row["unit_state"] != "active":
        notes.append(f"unit is {row['unit_state']}: the verdict reflects the files and its last logged start")
    if verdict == "broken" and "unparsable" in why:  # the probe's warning says it again
        notes = [n for n in notes if "unparsable" not in n]
    if verdict == "broken":
        row["installed_by_run"] = f.installed_by_run
    if f.orphans:
        notes.append(f"{len(f.orphans)} GPU holder(s) outside the unit: "
                     + ", ".join(f"pid {p.get('pid')} ({str(p.get('cmdline') or '?')})" for p in f.orphans)
                     + " (not killed; orch tune reaps them)")
    if sg.other_layout_configs_root:
        notes.append(f"stale configs of another {engine.display_name} layout at {sg.other_layout_configs_root}")
    row.update(verdict=verdict, why=why, notes=notes)
    return with_old_names(row, DOCTOR_KEYS)


def unfinished_why(unit: UnitFacts, runs: list[dict], lock: dict | None) -> str:
    """The doctor's ``why`` for a host an orch run left unfinished (``runs``: ``orch_unfinished``-like
    dicts, ``lock``: the host lock or None): the unit's state, who holds it, what the host's
    dead-man did, and ``orch recover``. Pure."""
    from ..records.host import deadman_text

    desc = ", ".join(f"{r['run_id']} (state {r['state']})" for r in runs)
    holder = (lock or {}).get("run_id")
    held = f"; the host lock is held by {holder}" if holder else ""
    fired = [r for r in runs if r.get("deadman")]
    if unit.active_state != "active":
        text = f"{unit.unit} is {unit.active_state}, held down by unfinished orch run {desc}{held}"
    else:
        text = f"{unit.unit} is {unit.active_state}, but orch run {desc} left the host unfinished{held}"
    text += "".join(f"; run {r['run_id']}: {deadman_text(r['deadman'])}" for r in fired)
    return text + ("; its controller stopped before restoring the host: `orch recover` restores the earlier configs, "
                   "proves them from a start's log and records the run")


def _unfinished(ctx) -> tuple[list[dict], dict | None]:
    """Runs an orch controller left unfinished on the host and the host lock (read-only, payload
    ``runs``/``lock status``); ([], None) when the records cannot be read (advisory)."""
    try:
        rec = records(ctx)
        st = rec.lock_status()
        lock = st.get("lock") if st.get("held") else None
        return rec.unfinished(ctx.options.run_id, (lock or {}).get("run_id")), lock
    except Exception:  # noqa: BLE001 - the verdict on the files stands without it
        return [], None


def _run_that_wrote(ctx, paths: list[str]) -> str | None:
    """Id of the newest orch run on the host (not yet restored) that wrote one of ``paths``
    (from the host's run records), else None. ``orch rollback`` can undo only such a run; any
    other invalid file is fixed by ``orch tune`` writing a valid one."""
    want = {p for p in paths if p}
    if not want:
        return None
    try:
        runs = records(ctx).runs()
    except Exception:  # noqa: BLE001 - advisory only: the verdict stands without it
        return None
    for r in runs:  # newest first
        if r.get("restored_at") or ((r.get("state") or {}).get("state") == "restored"):
            continue
        if any(c.get("path") in want for c in r.get("changed") or []):
            return r.get("run_id")
    return None


def _holders(ctx, unit_pid_set: set[int], unit: str) -> list[dict]:
    """Holders of the unit's own GPUs (:func:`orchestrator.host.devices.unit_gpu_devices`) now that are
    not processes of the unit nor of another unit's cgroup (payload ``reap --check``: kills
    nothing); [] when the unit's GPUs cannot be told."""
    devices, _why = unit_gpu_devices(ctx)
    if devices is None:
        return []
    data = ctx.payload.call("reap", ["--check", "--devices", devices,
                                     "--unit", unit if "." in unit else f"{unit}.service"], timeout=120)
    cands = data.get("killed") or data.get("would_kill") or []
    return [p for p in cands if int(p.get("pid", 0)) not in unit_pid_set]


def gather(ctx, unit: str) -> DoctorFacts:
    """Read everything :func:`classify` needs from the host (read-only; see :class:`DoctorFacts`).
    For a container unit the files the probe (run in the image) names are read on the host
    through the container's bind mounts, and GPU holders outside the unit are not listed (the
    container's own processes are the runtime's, outside the unit's cgroup)."""
    facts = ctx.facts.unit or from_dict(UnitFacts, {})
    probe = ctx.facts.probe or ProbeFacts.from_dict({})
    main_pid = int(facts.main_pid or 0)
    text = last_start_log(ctx.connection, ctx.facts.unit_handle(unit), ctx.facts.engine)
    loads = {role: probe.existing_file(role).would_load for role in ("up", "down")}
    container = facts.container
    if container is not None:
        # the probe ran in the image: its paths are the container's; orch reads them on the host
        # through the bind mounts (a file in the image's own layer is not read here)
        loads = {role: (container.host_path(p) or (None,))[0] if p else None for role, p in loads.items()}
    extra = ctx.facts.engine.config_extra_fields
    errors = {role: config_problem(ctx.connection, path, extra) if path else None for role, path in loads.items()}
    # a container's processes are outside the unit's cgroup (the runtime's): not "orphans" of it
    orphans = [] if container is not None else _holders(ctx, unit_pids(ctx.connection, main_pid), unit)
    engine = ctx.facts.engine
    f = DoctorFacts(unit=facts, probe=probe, log=engine.parse_log(text) if text is not None else None,
                    engine=engine, file_errors=errors, start_failure=start_failure(text) if text else None,
                    changed_since_start=changed_since_start(ctx.connection, main_pid, [p for p in loads.values() if p]),
                    orphans=orphans,
                    # only a rank of a multi-node server is compared with other hosts
                    file_digests={role: file_digest(ctx.connection, path) if path else None
                                  for role, path in loads.items()} if ctx.facts.server_group is not None else {})
    if any(errors.values()):
        f.installed_by_run = _run_that_wrote(ctx, [loads[r] for r, e in errors.items() if e])
    f.unfinished, f.lock = _unfinished(ctx)
    f.hazards = root_hazards(ctx.connection, engine, facts, probe)
    if not any(errors.values()) and probe.existing_file("down").read_by_engine:
        f.pair_mismatch = pair_mismatch(ctx.connection, engine, loads.get("up"), loads.get("down"), probe.engine.version)
    return f


@task("diagnose", rerun=True, check_mode=READ_ONLY, aliases={"unit": "name", "service": "name"})
def diagnose(ctx, name: str) -> TaskResult:
    """Classify the host (see the module docstring); its row goes into the host summary as ``doctor``."""
    row = classify(gather(ctx, name))
    ctx.run.summary.doctor = row
    return TaskResult.ok(f"{row['verdict']}: {row['why']}", **row)
