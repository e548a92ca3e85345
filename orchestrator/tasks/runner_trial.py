"""Tasks of the MoE runner trial (``orch tune --moe-runners``, ``playbooks/runner-trial.yaml``) and of
undoing a runner change (``playbooks/rollback.yaml``):

- ``runner_candidates`` (read-only): the runners to start, checked against the release's runner
  backend choices and the engine's rules for these weights on this GPU;
- ``runner_trial``: the unit's runner as the reference (greedy answers, benchmark), then each
  candidate through orch's drop-in (``daemon-reload``), or the one value of the unit's own
  ``EnvironmentFile=`` or ``--config`` file where that sets the runner (restart, readiness, log proof, output check,
  benchmark), then the fastest passing candidate kept, or the unit put back as it was;
- ``daemon_reload``, ``verify_runner``, ``autotune_cache``: the steps a rollback (and a rescue) of a
  runner change adds. Definitions of the table: :mod:`orchestrator.facts.runner_trial`.
"""

from __future__ import annotations

from typing import Literal

import json
import time
from pathlib import Path

from remote.engines import dumps_config, probe_view
from remote.protocol import PROVIDER_NAMES, SEARCH_SPACES, PayloadError

from ..engine.results import TaskFailed, TaskResult
from ..errors import internal_error
from ..engine.task import READ_ONLY, task
from ..facts.journal import last_start_log, text_since, unit_log
from ..facts.catalog import TuningKey
from ..facts.runner_trial import RunnerCandidate, RunnerTrial, RunnerTritonFiles
from ..facts.schema import FactError
from ..facts.unit import read_host_file
from ..host.endpoint import find_endpoint
from ..host.runner_source import RunnerSource, configured_runner, edited_text, runner_source
from ..host.endpoint import ask
from ..host.runner_trial import (POLL_S, AutotuneHung, agreement, autotune_cache_dir, backup_autotune_cache, bench,
                                 daemon_reload, dropin_text, greedy_answers, install_rules, install_triton_files,
                                 known_misses, load_checks, logged_runner, raw_exec_start, restart_ready,
                                 restore_autotune_cache_exact, restore_triton_files, trial_group_key)
from ..host.sharing import write_configs
from ..payload.client import PayloadFailed
from ..records.layout import REFERENCE_ANSWERS
from ..store import ConfigStore, key_hash, tuning_key


def _effective(ctx, backend: str) -> str | None:
    """The runner the server runs with the runner backend ``backend`` (the engine's rules,
    ``Engine.moe_runner``), None when it would refuse to start or orch cannot tell."""
    server, probe = ctx.facts.server, ctx.facts.probe
    found = ctx.facts.engine.moe_runner(server, probe_view(probe) if probe else {}, backend=backend)
    return found.runner if found.known else None


@task("runner_candidates", check_mode=READ_ONLY, sets=("orch_runner_candidates",))
def runner_candidates(ctx, runners: str) -> TaskResult:
    """The runners the trial starts (``orch_runner_candidates``, ``list[str]``) from ``runners``
    (``--moe-runners``: names separated by commas, or ``auto``), checked against the host's engine
    release (``Engine.runner_candidates``). Fails naming the bad name."""
    probe, engine = ctx.facts.probe, ctx.facts.engine
    version = probe.engine.version if probe is not None else None
    try:
        names = engine.runner_candidates(runners, version, lambda b: _effective(ctx, b))
    except PayloadError as exc:
        raise TaskFailed(exc.msg) from None
    server = ctx.facts.server
    ref = server.moe_backend
    ref_runner = _effective(ctx, ref) or ref
    msg = (f"unit runs {engine.runner_flag} {ref} ({ref_runner}); candidates: {', '.join(names)}")
    return TaskResult.ok(msg, facts={"orch_runner_candidates": names}, candidates=names, reference=ref)


def _dropin_args(ctx, unit: str) -> list[str]:
    """``--unit NAME --systemd-dir DIR`` of payload ``runner_change --op set-dropin``: the folder
    of the unit's own manager (:meth:`orchestrator.facts.systemd_unit.Unit.unit_dir`: the
    system's, or the login user's ``~/.config/systemd/user`` for a user unit)."""
    handle = ctx.facts.unit_handle(unit)
    return ["--unit", handle.name, "--systemd-dir", handle.unit_dir(ctx.connection)]


def _set_dropin(ctx, unit: str, text: str | None) -> dict:
    args = ["--op", "set-dropin", "--run-id", ctx.options.run_id, "--state-dir", ctx.payload.state_dir,
            *_dropin_args(ctx, unit)]
    ctx.run.install_attempted = True  # the rescue's restore puts the drop-in back
    ctx.run.dropin_written = True  # and reloads systemd
    if text is None:
        return ctx.payload.call("runner_change", args + ["--remove"], timeout=120)
    return ctx.payload.call("runner_change", args, request={"content": text}, timeout=120)


def _unit_source(ctx, words: list[str]) -> tuple[RunnerSource, str | None]:
    """Where this unit's runner is set (:func:`orchestrator.host.runner_source.runner_source`), read
    from its ``EnvironmentFile=`` files and ``--config`` YAML on the host now, and that file's text
    (None for the drop-in)."""
    env_files, cfg, cfg_text = _unit_files(ctx)
    src = runner_source(words, env_files, cfg, cfg_text, ctx.facts.engine)
    return src, (cfg_text if src.kind == "config" else dict(env_files).get(src.path))


def _unit_files(ctx) -> tuple[list[tuple[str, str]], str | None, str | None]:
    """The unit's ``EnvironmentFile=`` files (``(path, text)``, in order) and its server config file
    (SGLang's ``--config``) and text, read on the host now (the paths from the unit's facts)."""
    unit = ctx.facts.unit
    env_files = []
    for f in (unit.env_files if unit is not None else []):
        if f.get("read"):
            text = read_host_file(ctx.connection, f["path"], "EnvironmentFile")
            if text is not None:
                env_files.append((f["path"], text))
    cfg = getattr(ctx.facts.server, "config_file", None) if ctx.facts.server is not None else None
    engine = ctx.facts.engine
    cfg_text = read_host_file(ctx.connection, cfg, f"{engine.display_name} {engine.config_flag} file") if cfg else None
    return env_files, cfg, cfg_text


def _set_runner(ctx, unit: str, src: RunnerSource, words: list[str], text: str | None, runner: str,
                reload: bool = True) -> dict:
    """Start ``unit`` on ``runner`` from its next start: orch's drop-in (then ``daemon-reload`` when
    ``reload``), or the one value in the unit's own file ``src.path`` (payload ``set-file``, backed
    up with the run's manifest; systemd and the engine read it at each start, so no reload). Returns
    the manifest."""
    if src.kind == "dropin":
        manifest = _set_dropin(ctx, unit, dropin_text(words, runner, ctx.options.run_id, ctx.facts.engine))
        if reload:
            daemon_reload(ctx, ctx.facts.unit_handle(unit))
        return manifest
    new = edited_text(src, text or "", runner)
    if new is None:
        raise TaskFailed(f"{unit}: cannot set {src.describe()} to {runner} alone")
    ctx.run.install_attempted = True  # the rescue's restore puts the file back
    return ctx.payload.call("runner_change", ["--op", "set-file", "--run-id", ctx.options.run_id,
                                              "--state-dir", ctx.payload.state_dir, "--path", src.path],
                            request={"content": new}, timeout=120)


def _runner_as_before(ctx, unit: str, src: RunnerSource) -> dict:
    """The drop-in, or the unit's own file, back to its bytes before this run (no reload here)."""
    if src.kind == "dropin":
        return _dropin_as_before(ctx, unit)
    return ctx.payload.call("runner_change", ["--op", "set-file", "--run-id", ctx.options.run_id,
                                              "--state-dir", ctx.payload.state_dir, "--path", src.path,
                                              "--as-before"], timeout=120)


def _restart(ctx, name: str, endpoint, start_timeout: float, ready_timeout: float,
             stall_s: float | None) -> tuple[float, str]:
    """:func:`orchestrator.host.runner_trial.restart_ready` with the warm-autotune bound ``stall_s``
    (``orch_autotune_stall_timeout``; issue 32 row 6): a start whose autotune on a warm cache hangs is
    stopped, FlashInfer's autotune cache is put back exactly as before this run (the files this run's
    starts made removed, payload ``cache-restore --exact``) and the unit started once more; a second
    hang fails the step (TaskFailed, the rescue takes over)."""
    unit = ctx.facts.unit_handle(name)
    try:
        return restart_ready(ctx, unit, endpoint, start_timeout, ready_timeout, autotune_stall_s=stall_s)
    except AutotuneHung as hung:
        ctx.emit("autotune_hang", path=hung.path, quiet_s=round(hung.quiet_s, 1))
        ctx.say(f"WARNING: {hung.msg}; stopping it, putting the autotune cache back as before this run, "
                "starting again")
        unit.systemctl(ctx.connection, "stop", timeout=start_timeout + 30)
        data = restore_autotune_cache_exact(ctx, unit)
        files = data.get("files") or []
        trial = ctx.facts.runner_trial
        if trial is not None:
            trial.autotune_hangs += 1
        cache = dict(ctx.run.summary.autotune_cache or {})
        cache.update({"hang": hung.path, "hang_restored": sum(f.get("action") == "restored" for f in files),
                      "hang_removed": sum(f.get("action") == "removed" for f in files)})
        ctx.run.summary.autotune_cache = cache
        ctx.emit("autotune_cache_restored", files=files)
        return restart_ready(ctx, unit, endpoint, start_timeout, ready_timeout, autotune_stall_s=stall_s)


@internal_error("runner_trial's candidate loop catches it and records the row as rejected")
class _Rejected(Exception):
    """A candidate rejected by its output check with ``why`` (the server died, or wrong answers)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def _died(ctx, name: str, endpoint, mark: str) -> str | None:
    """None while the unit's server is up (active, health 200); else what happened: the unit's state
    and the last lines of this start's log (issue 32 row 4: a scheduler that dies on a request)."""
    unit = ctx.facts.unit_handle(name)
    state = unit.is_active(ctx.connection)
    for _ in range(3):  # a health request lost under load is asked again: a dead server stays dead
        if state != "active":
            break
        status, _last = ask(ctx, endpoint, ctx.facts.engine.health_path)
        if status == 200:
            return None
        time.sleep(POLL_S)
        state = unit.is_active(ctx.connection)
    tail = [ln.strip() for ln in text_since(mark, unit_log(ctx.connection, unit)).splitlines() if ln.strip()][-3:]
    return f"unit {state}; log: " + " | ".join(tail)[-300:]


def _levels(result) -> dict[str, float | None]:
    return {str(lv.get("max_concurrency")): lv.get("output_throughput") if lv.get("valid", True) else None
            for lv in result.levels}


@task("runner_triton_files", check_mode=READ_ONLY, sets=("orch_runner_triton", "orch_tuning_key"),
      aliases={"unit": "name", "service": "name"})
def runner_triton_files(ctx, name: str, space: Literal[SEARCH_SPACES], batch_sizes: list[int] | None,
                        provider: Literal[PROVIDER_NAMES]) -> TaskResult:
    """Which Triton config files the trial's ``triton`` candidate runs on (``orch_runner_triton``,
    :class:`orchestrator.facts.runner_trial.RunnerTritonFiles`), by the rule ``orch tune`` decides
    with (``config_source`` and ``compare_installed``): the controller's store holds a result for
    this host's tuning key (``space``, ``batch_sizes``, ``provider``; not under ``--retune``) and
    it is installed byte for byte, and, when the unit runs the Triton runner now, its last start
    loaded it: ``current`` (no tune, no install); a stored result that differs: ``install``; no
    stored result: ``tune``. Needs ``orch_plan`` of the Triton runner (``plan`` with ``runner:
    triton``). Sets ``orch_tuning_key``, so a tune here is stored as ``orch tune`` stores it."""
    probe, plan, engine = ctx.facts.probe, ctx.facts.plan, ctx.facts.engine
    if probe is None or plan is None or not plan.paths:
        raise TaskFailed("no plan of the Triton files (orch_plan): run plan with runner: triton first")
    why = probe.untunable_reason(provider)
    if why:
        got = RunnerTritonFiles("none", f"the tuner cannot run these weights ({why}); the triton candidate runs "
                                        "on the files the host has", plan.install_dir, dict(plan.paths))
        return TaskResult.ok(got.reason, facts={"orch_runner_triton": got}, **got.to_dict())
    if plan.dropin is not None:
        # the unit reads no folder orch may write without a drop-in of its own (vLLM's package
        # configs/, no VLLM_TUNED_CONFIG_FOLDER); the trial writes one drop-in per run (the runner's)
        got = RunnerTritonFiles("none", f"the unit reads no folder orch may write (it would need the drop-in "
                                        f"{plan.dropin.get('name')}; set {engine.config_dir_env} on the unit to "
                                        "try tuned files); the triton candidate runs on the files the host has",
                                plan.install_dir, dict(plan.paths))
        return TaskResult.ok(got.reason, facts={"orch_runner_triton": got}, **got.to_dict())
    key = tuning_key(probe, space, batch_sizes, provider)
    kh = key_hash(key)
    facts = {"orch_tuning_key": TuningKey(kh, key)}
    entry = ConfigStore(ctx.options.state_dir).get(key) if (ctx.options.state_dir and not ctx.options.retune) else None
    if entry is None:
        got = RunnerTritonFiles("tune", f"no stored result for tuning key {kh}" + (" (--retune)" if ctx.options.retune
                                                                                 else ""), plan.install_dir,
                                dict(plan.paths))
        facts["orch_runner_triton"] = got
        return TaskResult.ok(("would tune" if ctx.check else "tuning") + f" the Triton files first: {got.reason}",
                             facts=facts, **got.to_dict())
    configs = {role: json.loads(p.read_text()) for role, p in entry.files.items()}
    extra = engine.config_extra_fields
    texts = {role: dumps_config(cfg, extra_fields=extra) for role, cfg in configs.items()}
    files = [{"name": path.rsplit("/", 1)[-1], "content": texts.get(role, ""), "role": role}
             for role, path in sorted(plan.paths.items())]
    cmp = ctx.payload.call("install", request={"run_id": ctx.options.run_id, "state_dir": ctx.payload.state_dir,
                                               "action": "tune", "dest_dir": plan.install_dir, "files": files,
                                               "create_dest": True, "dry_run": True, **install_rules(ctx)},
                            timeout=120)
    differ = [f["name"] for f in cmp.get("files") or [] if f.get("action") != "unchanged"]
    why_not: list[str] = []
    if differ:
        why_not.append("the stored result differs from " + ", ".join(differ))
    elif _effective(ctx, ctx.facts.server.moe_backend) == engine.triton_runner:
        text = last_start_log(ctx.connection, ctx.facts.unit_handle(name), engine)
        problems = (engine.verify_loaded(engine.parse_log(text), list(plan.paths.values())) if text
                    else ["no start in the log"])
        if problems:
            why_not.append("the last start did not load them: " + "; ".join(problems))
    if why_not:
        got = RunnerTritonFiles("install", "; ".join(why_not) + f" (stored result {kh}, no tune)", plan.install_dir,
                                dict(plan.paths))
        if not ctx.check:
            ctx.run.tuned_files = write_configs(ctx, configs, {r: p.rsplit("/", 1)[-1] for r, p in plan.paths.items()})
    else:
        got = RunnerTritonFiles("current", f"the stored result {kh} is installed and loaded: no tune", plan.install_dir,
                                dict(plan.paths))
    facts["orch_runner_triton"] = got
    return TaskResult.ok(got.reason, facts=facts, **got.to_dict())


def _settings(concurrency, input_len, output_len, check_tokens, prompts, min_agreement, min_gain) -> dict:
    return {"concurrency": [int(c) for c in concurrency], "input_len": int(input_len),
            "output_len": int(output_len), "check_tokens": int(check_tokens), "prompts": prompts,
            "min_agreement": float(min_agreement), "min_gain": float(min_gain)}


def _fresh_triton(ctx) -> bool:
    """The trial installs Triton files before the triton candidate starts (tuned, or from the store)."""
    tf = ctx.facts.runner_triton
    return tf is not None and tf.action in ("tune", "install")


@task("runner_reference", sets=("orch_runner_trial", "orch_runner_reused"), aliases={"unit": "name", "service": "name"})
def runner_reference(ctx, name: str, candidates: list[str], concurrency: list[int], input_len: int, output_len: int,
                     start_timeout: float, ready_timeout: float, min_agreement: float = 90.0, min_gain: float = 3.0,
                     check_tokens: int = 32, prompts_file: str | None = None,
                     autotune_stall_timeout: float | None = None) -> TaskResult:
    """The first half of the trial (module docstring): refuses a unit that is not running (the output
    check needs its answers), backs FlashInfer's autotune cache up, finds this host's trial group
    (:func:`orchestrator.host.runner_trial.trial_group_key`) and, when another host of it measures,
    waits for that verdict and applies it here (``orch_runner_reused`` True: the trial is done).
    Else it measures the unit's own runner, the reference: its greedy answers to the check prompts
    in two passes, one prompt at a time and all at once as one batch (kept in the host's run record,
    ``runner_reference_answers.json``), their agreement with each other (``self_agreement``), which
    known answers it gets in both, and the benchmark.
    Arguments as :func:`runner_trial`. Sets ``orch_runner_trial`` (the table so far)."""
    unit_facts = ctx.facts.unit
    if unit_facts is None or unit_facts.active_state != "active":
        raise TaskFailed(f"{name} is not running: the runner trial compares against the answers and speed of the "
                         "unit's own runner, so start it first")
    prompts, expected = load_checks(prompts_file)
    server, engine = ctx.facts.server, ctx.facts.engine
    ref_flag = server.moe_backend
    ref_runner = _effective(ctx, ref_flag) or ref_flag
    endpoint = find_endpoint(ctx)
    words = raw_exec_start(ctx.connection, ctx.facts.unit_handle(name))
    trial = RunnerTrial(reference=ref_flag, min_agreement=float(min_agreement), min_gain_pct=float(min_gain),
                        prompts=len(prompts), max_new_tokens=int(check_tokens))
    last = last_start_log(ctx.connection, ctx.facts.unit_handle(name), engine) or ""
    backup_autotune_cache(ctx, ctx.facts.unit_handle(name))
    groups = ctx.options.fleet
    settings = _settings(concurrency, input_len, output_len, check_tokens, prompts, min_agreement, min_gain)
    if engine.triton_runner in candidates and ctx.facts.tuning_key is not None:
        settings["triton_files"] = ctx.facts.tuning_key.hash  # hosts that share it can share tuned files
    gkey = trial_group_key(ctx, list(candidates), settings) if groups is not None else None
    if gkey:
        groups.report_key(ctx.name, gkey)
        try:
            role = groups.assign(ctx.name, [1], cancel=ctx.options.cancel)
        except TimeoutError as exc:
            raise TaskFailed(str(exc)) from None
        if role.tuner and role.tuner != ctx.name:
            done = _reuse(ctx, name, trial, words, endpoint, role.tuner, gkey, prompts, float(min_agreement),
                          int(check_tokens), start_timeout, ready_timeout, autotune_stall_timeout)
            if done is not None:
                done.facts["orch_runner_reused"] = True
                return done
        else:
            trial.group_key = gkey  # the verdict for the other hosts of the group, published by runner_trial
    ref_row = RunnerCandidate(runner=ref_flag, reference=True, agreement=1.0, passed=True,
                              log_runner=logged_runner(last, engine) if last else None)
    ctx.say(f"reference: {engine.runner_flag} {ref_flag} ({ref_runner})")
    single = greedy_answers(ctx, endpoint, prompts, int(check_tokens))
    batch = greedy_answers(ctx, endpoint, prompts, int(check_tokens), concurrent=True)
    (ctx.host_dir / REFERENCE_ANSWERS).write_text(json.dumps({"single": single, "batch": batch}, indent=2))
    trial.self_agreement = round(agreement(single, batch), 4)
    missed = set(known_misses(expected, single)) | set(known_misses(expected, batch))
    trial.known_answers = sum(e is not None for e in expected)
    trial.known_checked = trial.known_answers - len(missed)
    if missed:
        ctx.say(f"the reference misses {len(missed)} known answer(s) itself: not required of the candidates "
                f"({', '.join(_known_text(prompts, expected, i) for i in sorted(missed))})")
    if trial.self_agreement < 1.0:
        ctx.say(f"the reference agrees with itself on {trial.self_agreement:.0%} of the check prompts (one at a "
                f"time against one batch): a candidate needs {trial.required():.0%}")
    ref_row.tokens_per_s = _levels(bench(ctx, endpoint.url, concurrency, input_len, output_len, "runner_reference"))
    trial.candidates.append(ref_row)
    ctx.run.summary.runner_trial = trial
    return TaskResult.ok(f"reference {ref_flag} ({ref_runner}): {ref_row.top() or 0:.1f} output tok/s",
                         facts={"orch_runner_trial": trial, "orch_runner_reused": False}, **trial.to_dict())


@task("runner_trial", sets=("orch_runner_trial",), aliases={"unit": "name", "service": "name"})
def runner_trial(ctx, name: str, candidates: list[str], concurrency: list[int], input_len: int, output_len: int,
                 start_timeout: float, ready_timeout: float, min_agreement: float = 90.0, min_gain: float = 3.0,
                 check_tokens: int = 32, prompts_file: str | None = None,
                 autotune_stall_timeout: float | None = None) -> TaskResult:
    """Start each of ``candidates`` in turn and keep the fastest whose answers agree (module docstring),
    after ``runner_reference`` measured the unit's own runner (``orch_runner_trial``).

    ``concurrency``/``input_len``/``output_len``: the benchmark (output tokens/s per level);
    ``start_timeout``/``ready_timeout`` (s) per start (the ready time allows for FlashInfer's
    autotune); ``min_agreement`` (percent of the reference's own agreement, ``self_agreement``: the
    share of check prompts whose greedy answer of ``check_tokens`` tokens must equal the
    reference's, one at a time and as one batch, each; and every known answer the reference gets
    must be got); a candidate whose server dies during its check or benchmark is rejected (issue 32
    row 4); ``autotune_stall_timeout`` (s): the warm-autotune bound of each start (:func:`_restart`);
    ``min_gain`` (percent of output tokens/s at the highest level a
    passing candidate must beat the reference by to be kept); ``prompts_file`` (controller path;
    default the shipped set). The ``triton`` candidate, when the trial has Triton files to install
    (``orch_runner_triton`` ``tune``: tuned by this run's ``tune`` step, or ``install``: the store's),
    starts on them: they are installed as this run's sub-run (backed up first), the start must load
    them, and they are put back to their bytes unless it is kept. When the unit's own runner is
    Triton, that candidate is measured too (the reference ran on the old files). Sets
    ``orch_runner_trial``; the trial's ``changed`` when the unit now runs another runner or other
    Triton files; the task's status is ``changed`` also when it restarted the unit and put it back
    (``restarts``: a restart is a change), ``ok`` only when it started nothing."""
    trial = ctx.facts.runner_trial
    if trial is None or not trial.candidates or not trial.candidates[0].reference:
        raise TaskFailed("no reference measured (orch_runner_trial): run runner_reference before runner_trial")
    prompts, expected = load_checks(prompts_file)
    engine = ctx.facts.engine
    ref_flag = trial.reference
    ref_runner = _effective(ctx, ref_flag) or ref_flag
    # where the reference answered (the plan's answer, or asked now): the unit may be stopped for the tune
    endpoint = ctx.facts.endpoint or find_endpoint(ctx)
    words = raw_exec_start(ctx.connection, ctx.facts.unit_handle(name))
    src, src_text = _unit_source(ctx, words)
    if src.kind != "dropin":
        ctx.say(f"the unit sets its runner through {src.describe()}: orch changes that value there")
    ref_row = trial.candidates[0]
    ref_answers = json.loads((ctx.host_dir / REFERENCE_ANSWERS).read_text())
    ref_single, ref_batch = ref_answers["single"], ref_answers["batch"]
    ref_missed = set(known_misses(expected, ref_single)) | set(known_misses(expected, ref_batch))
    need = trial.required()
    fresh = _fresh_triton(ctx) and bool(ctx.run.tuned_files)
    tf = ctx.facts.runner_triton
    dropin_written = False
    stall = autotune_stall_timeout
    restarts = 0  # starts of the unit by this task: each is a change (the server was down meanwhile)

    def measure(row: RunnerCandidate, label: str) -> None:
        mark = ctx.run.log_mark
        try:
            single = greedy_answers(ctx, endpoint, prompts, int(check_tokens))
            batch = greedy_answers(ctx, endpoint, prompts, int(check_tokens), concurrent=True)
        except (TaskFailed, PayloadFailed) as exc:
            died = _died(ctx, name, endpoint, mark)
            if died is None:
                raise
            row.crashed = died
            ctx.emit("runner_candidate_crashed", runner=row.runner, stage="output check", detail=died)
            raise _Rejected(f"the server died on the output check's requests ({died})") from exc
        row.agreement = round(agreement(ref_single, single), 4)
        row.batch_agreement = round(agreement(ref_batch, batch), 4)
        missed = sorted((set(known_misses(expected, single)) | set(known_misses(expected, batch))) - ref_missed)
        row.known_missed = [_known_text(prompts, expected, i) for i in missed]
        row.passed = (row.agreement >= need - 1e-9 and row.batch_agreement >= need - 1e-9 and not missed)
        try:
            row.tokens_per_s = _levels(bench(ctx, endpoint.url, concurrency, input_len, output_len, label))
        except (TaskFailed, PayloadFailed) as exc:
            died = _died(ctx, name, endpoint, mark)
            if died is None:
                raise
            row.crashed, row.passed = died, False
            ctx.emit("runner_candidate_crashed", runner=row.runner, stage="benchmark", detail=died)
            raise _Rejected(f"the server died during the benchmark ({died})") from exc
        died = _died(ctx, name, endpoint, mark)
        if died is not None:
            row.crashed, row.passed = died, False
            ctx.emit("runner_candidate_crashed", runner=row.runner, stage="after the benchmark", detail=died)
            raise _Rejected(f"the server died after its output check and benchmark ({died})")

    for cand in candidates:
        own = cand == ref_flag or (cand == ref_runner and ref_flag == "auto")
        on_fresh = fresh and cand == engine.triton_runner
        if own and not on_fresh:
            continue  # the reference row measures the unit's own runner
        row = RunnerCandidate(runner=cand)
        trial.candidates.append(row)
        try:
            if on_fresh:
                row.triton_files = "tuned" if tf.action == "tune" else "store"
                texts = {r: Path(p).read_text() for r, p in ctx.run.tuned_files.items()}
                installed = install_triton_files(ctx, texts, tf.paths, tf.install_dir)
                ctx.say(f"candidate {cand}: the {row.triton_files} Triton files installed ({', '.join(installed)})")
            if own:  # the unit's own command line runs it: no drop-in (an earlier candidate's put back)
                if dropin_written:
                    _runner_as_before(ctx, name, src)
                    dropin_written = False
                    if src.kind == "dropin":
                        daemon_reload(ctx, ctx.facts.unit_handle(name))
            else:
                ctx.say(f"candidate {cand}: " + ("drop-in, daemon-reload, restart" if src.kind == "dropin"
                                                 else f"{src.describe()}, restart"))
                dropin_written = True  # before the write: a failed write may still have changed it
                _set_runner(ctx, name, src, words, src_text, cand)
            restarts += 1  # counted before the start: a failed start restarted the unit too
            row.ready_s, text = _restart(ctx, name, endpoint, start_timeout, ready_timeout, stall)
            row.log_runner = logged_runner(text, engine)
            if row.log_runner not in (cand, None) and not (own and ref_flag == "auto"):
                row.why = f"the start's log shows {engine.runner_field}={row.log_runner}, not {cand}"
                continue
            if on_fresh:
                problems = engine.verify_loaded(engine.parse_log(text), list(tf.paths.values()))
                if problems:
                    row.why = "the start did not load the installed Triton files: " + "; ".join(problems)[:200]
                    continue
            measure(row, f"runner_{cand}" + ("_tuned" if own else ""))
        except _Rejected as rej:
            row.passed, row.why = False, f"output check failed: {rej.why}"
            ctx.emit("runner_candidate_failed", runner=cand, error=row.why)
            continue
        except (TaskFailed, PayloadFailed, FactError) as exc:
            row.why = f"did not run: {str(getattr(exc, 'msg', exc)).splitlines()[0][:200]}"
            ctx.emit("runner_candidate_failed", runner=cand, error=row.why)
            continue
        if not row.passed:
            row.why = "output check failed: " + _check_failures(row, len(prompts), need, float(min_agreement),
                                                                trial.self_agreement)
    ref_top = ref_row.top() or 0.0
    passing = [r for r in trial.candidates if not r.reference and r.passed and not r.why and r.top() is not None]
    best = max(passing, key=lambda r: r.top(), default=None)
    gain = ((best.top() - ref_top) / ref_top * 100.0) if best is not None and ref_top else None
    for r in passing:
        if r is not best:
            r.why = f"slower than {best.runner}"
    keep = best is not None and (gain is None or gain > float(min_gain))
    kept_fresh = keep and best.triton_files is not None
    kept_own = keep and (best.runner == ref_flag or (best.runner == ref_runner and ref_flag == "auto"))
    if not kept_fresh and ctx.facts.runner_triton is not None:
        restored = restore_triton_files(ctx)  # the host's Triton files back to their bytes
        if restored:
            ctx.run.summary.restored = restored
    if keep:
        best.kept, best.why = True, f"fastest passing: {gain:+.1f}% output tok/s" if gain is not None else "fastest"
        ref_row.why = f"replaced by {best.runner}" + (" on the tuned files" if kept_fresh else "")
        trial.kept, trial.changed = best.runner, True
        installed = list(tf.paths.values()) if kept_fresh else []
        if kept_own:  # the unit's own runner on new files: no drop-in
            if ctx.run.install_attempted and dropin_written:
                _runner_as_before(ctx, name, src)
        else:
            manifest = _set_runner(ctx, name, src, words, src_text, best.runner, reload=False)
            trial.dropin = (manifest.get("files") or [{}])[0].get("path", "")
            installed.insert(0, trial.dropin)
        ctx.run.summary.installed = [p for p in installed if p] or None
    else:
        if best is not None:
            best.why = not_kept_why(gain, float(min_gain), ref_row.runner)
        ref_row.kept, ref_row.why = True, "the unit keeps its runner"
        trial.kept = ref_flag
        if dropin_written:  # back to its bytes; the run's record then shows no change
            data = _runner_as_before(ctx, name, src)
            ctx.run.summary.restored = (ctx.run.summary.restored or []) + list(data.get("files") or [])
    ctx.run.summary.runner_trial = trial
    if ctx.run.install_attempted:
        if src.kind == "dropin":
            daemon_reload(ctx, ctx.facts.unit_handle(name))
        restarts += 1
        _ready, text = _restart(ctx, name, endpoint, start_timeout, ready_timeout, stall)
        shown = logged_runner(text, engine)
        want = trial.kept if trial.changed and not kept_own else ref_row.log_runner
        if want and want != "auto" and shown != want:
            raise TaskFailed(f"after the trial {name} started with {engine.runner_field}={shown}, not {want}")
        if kept_fresh:
            problems = engine.verify_loaded(engine.parse_log(text), list(tf.paths.values()))
            if problems:
                raise TaskFailed(f"after the trial {name} did not load the tuned Triton files: " + "; ".join(problems))
        ctx.say(f"{name} runs {engine.runner_flag} {trial.kept} (log: {engine.runner_field}={shown})"
                + (" on the tuned Triton files" if kept_fresh else ""))
    if trial.group_key and ctx.options.fleet is not None:  # the verdict for the other hosts of the group
        verdict = {"trial": trial.to_dict(), "host": ctx.name}
        if kept_fresh:
            verdict["triton_files"] = {r: Path(p).read_text() for r, p in ctx.run.tuned_files.items()}
        ctx.options.fleet.publish(trial.group_key, verdict)
    rows = "; ".join(f"{r.runner}{' (tuned files)' if r.triton_files else ''}: {r.top() or 0:.1f} tok/s, agreement "
                     f"{'-' if r.agreement is None else f'{r.agreement:.0%}'}, "
                     f"{'kept' if r.kept else r.why}" for r in trial.candidates)
    # a restart is a change (the server stopped serving meanwhile), also when the unit ends as it was
    result = TaskResult.changed if trial.changed or restarts else TaskResult.ok
    restarted = (f"; the unit restarted {restarts} time{'s' if restarts != 1 else ''}"
                 + ("" if trial.changed else ", and runs as before") if restarts else "")
    return result(f"kept {trial.kept}: {rows}{restarted}", facts={"orch_runner_trial": trial}, restarts=restarts,
                  **trial.to_dict())


def not_kept_why(gain: float, min_gain: float, reference: str) -> str:
    """Why the fastest passing candidate was not kept: its change of output tokens/s against the
    unit's runner (``gain``, percent; at most ``min_gain``, else it is kept) said as it is: within
    the noise threshold only when ``|gain| <= min_gain``; a larger drop is a slower runner."""
    if gain < -min_gain:
        return f"{gain:+.1f}% output tok/s: slower than {reference} (the unit's runner)"
    return f"{gain:+.1f}% output tok/s: within the {min_gain:g}% noise threshold"


def _known_text(prompts: list[str], expected: list[str | None], i: int) -> str:
    """``"PROMPT -> ANSWER"`` of known-answer prompt ``i`` (the prompt cut to 60 characters)."""
    return f"{prompts[i][:60]} -> {expected[i]}"


def _check_failures(row: RunnerCandidate, n: int, need: float, min_agreement: float,
                    self_agreement: float | None) -> str:
    """Why ``row`` failed its output check, in words (agreements against ``need``, known answers)."""
    base = f"needs {need:.0%}" + (f" ({min_agreement:g}% of the reference's own {self_agreement:.0%})"
                                  if self_agreement is not None and self_agreement < 1.0 else "")
    parts = []
    if row.agreement is not None and row.agreement < need - 1e-9:
        parts.append(f"{row.agreement:.0%} of {n} prompts agree one at a time ({base})")
    if row.batch_agreement is not None and row.batch_agreement < need - 1e-9:
        parts.append(f"{row.batch_agreement:.0%} of {n} prompts agree as one batch ({base})")
    if row.known_missed:
        parts.append("known answer(s) missed: " + "; ".join(row.known_missed))
    return "; ".join(parts) or "failed"


def _dropin_as_before(ctx, name: str) -> dict:
    """The drop-in back to its bytes before this run (payload ``set-dropin --as-before``)."""
    return ctx.payload.call("runner_change", ["--op", "set-dropin", "--run-id", ctx.options.run_id,
                                              "--state-dir", ctx.payload.state_dir, *_dropin_args(ctx, name),
                                              "--as-before"], timeout=120)


def _reuse(ctx, name: str, trial: RunnerTrial, words: list[str], endpoint, tuner: str, gkey: str,
           prompts: list[str], min_agreement: float, check_tokens: int, start_timeout: float,
           ready_timeout: float, stall_s: float | None = None) -> TaskResult | None:
    """Another host of this host's trial group (:func:`orchestrator.host.runner_trial.trial_group_key`)
    runs the trial: wait for its verdict while the server keeps serving, then apply it here. A kept
    runner is started through this host's own drop-in, and its own start is verified: the log must
    name the runner and the greedy answers must agree with this host's answers before the change
    (``min_agreement`` percent of the measuring host's reference self-agreement), else TaskFailed (the rescue puts the drop-in back). A verdict that
    keeps the unit's runner changes and restarts nothing. The table is the measuring host's,
    with ``measured_on`` naming it. Returns None, with ``trial.measuring_failed`` set and nothing
    changed, when the measuring host ended without a verdict (it failed): the caller then runs the
    trial on this host."""
    ctx.say(f"waiting for {tuner}'s runner trial (same tuning group {gkey}; the server keeps serving)")
    try:
        got = ctx.options.fleet.wait_result(gkey, cancel=ctx.options.cancel)
    except RuntimeError as exc:
        if ctx.cancelled():
            raise TaskFailed(f"no runner trial verdict from {tuner}: {exc}") from None
        # the measuring host ended (failed) before its verdict: nothing changed here yet, so this
        # host runs the trial itself rather than failing with it
        trial.measuring_failed = f"{tuner}: {exc}"
        ctx.emit("runner_trial_measuring_failed", measuring_host=tuner, error=str(exc))
        ctx.say(f"{tuner} failed before its runner trial verdict ({exc}); measuring here instead")
        return None
    theirs = RunnerTrial.from_dict(got["trial"])
    trial.candidates, trial.kept, trial.changed = theirs.candidates, theirs.kept, theirs.changed
    trial.measured_on = got.get("host") or tuner
    ctx.run.summary.runner_trial = trial
    ctx.emit("runner_trial_reused", measured_on=trial.measured_on, kept=trial.kept, changed=trial.changed)
    if not theirs.changed:
        return TaskResult.ok(f"kept {trial.kept}: the verdict of {trial.measured_on}'s trial (same tuning group), "
                             "nothing changed here", facts={"orch_runner_trial": trial}, **trial.to_dict())
    before = greedy_answers(ctx, endpoint, prompts, check_tokens)
    engine = ctx.facts.engine
    ref_flag = ctx.facts.server.moe_backend
    own = trial.kept == ref_flag or (ref_flag == "auto" and trial.kept == _effective(ctx, ref_flag))
    files = got.get("triton_files")  # the measuring host kept Triton on files it tuned: the same bytes here
    tf = ctx.facts.runner_triton
    installed: list[str] = []
    if files:
        if tf is None:
            raise TaskFailed(f"the verdict of {trial.measured_on} keeps Triton on tuned files, but this host has no "
                             "plan of its Triton files")
        installed = install_triton_files(ctx, files, tf.paths, tf.install_dir)
    if not own:
        src, src_text = _unit_source(ctx, words)
        manifest = _set_runner(ctx, name, src, words, src_text, trial.kept)
        trial.dropin = (manifest.get("files") or [{}])[0].get("path", "")
    ctx.run.summary.installed = [p for p in [trial.dropin, *installed] if p] or None
    _ready, text = _restart(ctx, name, endpoint, start_timeout, ready_timeout, stall_s)
    shown = logged_runner(text, engine)
    if not own and shown != trial.kept:
        raise TaskFailed(f"{name} started with {engine.runner_field}={shown}, not {trial.kept} "
                         f"(the verdict of {trial.measured_on}'s trial)")
    if files:
        problems = engine.verify_loaded(engine.parse_log(text), installed)
        if problems:
            raise TaskFailed(f"{name} did not load the Triton files of {trial.measured_on}'s verdict: "
                             + "; ".join(problems))
    share = agreement(before, greedy_answers(ctx, endpoint, prompts, check_tokens))
    # the measuring host's reference agreed with itself on self_agreement of the prompts: the bar here too
    trial.self_agreement = theirs.self_agreement
    need = float(min_agreement) / 100.0 * (theirs.self_agreement if theirs.self_agreement is not None else 1.0)
    if share < need - 1e-9:
        raise TaskFailed(f"{name} on {trial.kept}: {share:.0%} of {len(prompts)} check prompts agree with its "
                         f"answers before (needs {need:.0%}); not kept here")
    ctx.say(f"{name} runs {engine.runner_flag} {trial.kept} (log: {engine.runner_field}={shown}; verdict of "
            f"{trial.measured_on}, answers {share:.0%} agree)")
    return TaskResult.changed(f"kept {trial.kept}: the verdict of {trial.measured_on}'s trial (same tuning group), "
                              f"started and verified here", facts={"orch_runner_trial": trial}, **trial.to_dict())


@task("daemon_reload")
def daemon_reload_task(ctx, only_if_changed: bool = False, when_dir: str | None = None,
                       when_any_dir: list | None = None, only_if_dropin: bool = False) -> TaskResult:
    """``systemctl daemon-reload`` after orch changed a unit's drop-in (refused where running GPU
    containers of the NVIDIA container toolkit could lose their devices, see
    :func:`orchestrator.host.runner_trial.daemon_reload`). ``only_if_changed`` (rescue steps):
    skipped when this run wrote nothing. ``when_dir``: skipped unless it is a drop-in folder
    (``*.service.d``, e.g. the rollback target's ``dest_dir``); ``when_any_dir``: skipped unless one of
    them is (the ``dest_dir`` of each run ``orch recover`` restored); ``only_if_dropin`` (a runner
    trial's rescue): skipped unless this run wrote orch's drop-in (``HostRun.dropin_written``)."""
    if only_if_changed and not ctx.run.install_attempted:
        return TaskResult.skipped("this run changed no unit file")
    if only_if_dropin and not ctx.run.dropin_written:
        return TaskResult.skipped("this run wrote no unit drop-in (a unit's own file needs no reload)")
    if when_dir is not None and not str(when_dir).endswith(".service.d"):
        return TaskResult.skipped(f"{when_dir} is not a unit's drop-in folder")
    if when_any_dir is not None and not any(str(d or "").endswith(".service.d") for d in when_any_dir):
        return TaskResult.skipped("no unit drop-in was restored")
    check = daemon_reload(ctx, ctx.facts.unit_handle())
    return TaskResult.changed("systemctl daemon-reload", **check)


@task("verify_runner", check_mode=READ_ONLY, aliases={"unit": "name", "service": "name"})
def verify_runner(ctx, name: str) -> TaskResult:
    """Prove from the log of the unit's last start (by this run) which MoE runner came up: the
    runner backend of the start's server-arguments line (``MoeLogReport.start_runner``) must be the
    one the unit's files now give (the engine's runner flag, ``auto`` when absent: then any resolved
    runner is shown)."""
    engine = ctx.facts.engine
    text = text_since(ctx.run.log_mark, unit_log(ctx.connection, ctx.facts.unit_handle(name)))
    shown = logged_runner(text, engine)
    words = raw_exec_start(ctx.connection, ctx.facts.unit_handle(name))
    env_files, cfg, cfg_text = _unit_files(ctx)
    unit = ctx.facts.unit
    want = configured_runner(words, env_files, cfg, cfg_text, unit.unit_environment or unit.environment
                             if unit is not None else None, engine=engine)
    if shown is None:
        raise TaskFailed(f"{name}: the start's log shows no server arguments line, so which runner came up is not proven")
    if want != "auto" and shown != want:
        raise TaskFailed(f"{name} came up with {engine.runner_field}={shown}, but its unit says {want}")
    return TaskResult.ok(f"log shows {engine.runner_field}={shown} (unit: {want})", runner=shown, expected=want)


@task("autotune_cache", aliases={"unit": "name", "service": "name"})
def autotune_cache(ctx, name: str, action: Literal["backup", "restore"], run_id: str | None = None) -> TaskResult:
    """The engine's start-up autotune cache (``Engine.autotune_cache_dir``: SGLang's
    ``$SGLANG_CACHE_DIR/flashinfer/autotune``) as host state:
    ``backup`` copies it into this run's folder on the host before a restart; ``restore`` puts the
    files run ``run_id`` backed up back to their bytes (files made since are kept: never deleted)."""
    if action == "backup":
        data = backup_autotune_cache(ctx, ctx.facts.unit_handle(name))
        return TaskResult.ok(f"backed up {len(data.get('files') or [])} file(s) of {data.get('dir')}", **data)
    if not run_id:
        raise TaskFailed("autotune_cache restore needs run_id")
    data = ctx.payload.call("runner_change", ["--op", "cache-restore", "--run-id", str(run_id), "--state-dir",
                                              ctx.payload.state_dir, "--cache-dir", autotune_cache_dir(ctx, ctx.facts.unit_handle(name))],
                            timeout=300)
    put = [f["path"] for f in data.get("files") or [] if f.get("action") == "restored"]
    ctx.run.summary.autotune_cache = {"dir": data.get("dir"), "restored": len(put),
                                      "kept_new": len(data.get("kept_new") or [])}
    result = TaskResult.changed if put else TaskResult.ok
    return result(f"autotune cache {data.get('dir')}: {len(put)} file(s) restored, "
                  f"{len(data.get('kept_new') or [])} newer kept", **data)
