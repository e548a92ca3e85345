"""Tasks of the MoE runner trial (``orch tune --moe-runners``, ``playbooks/runner-trial.yaml``) and of
undoing a runner change (``playbooks/rollback.yaml``):

- ``runner_candidates`` (read-only): the runners to start, checked against the release's
  ``--moe-runner-backend`` choices and SGLang's rules for these weights on this GPU;
- ``runner_trial``: the unit's runner as the reference (greedy answers, benchmark), then each
  candidate through orch's drop-in (``daemon-reload``, restart, readiness, log proof, output check,
  benchmark), then the fastest passing candidate kept, or the unit put back as it was;
- ``daemon_reload``, ``verify_runner``, ``autotune_cache``: the steps a rollback (and a rescue) of a
  runner change adds. Definitions of the table: :mod:`orchestrator.facts.runner_trial`.
"""

from __future__ import annotations

from typing import Literal

from remote.protocol import PayloadError
from remote.sglang.runner import moe_runner, probe_inputs
from remote.sglang.runner_choices import parse_candidates

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.journal import last_start, text_since, unit_log
from ..facts.runner_trial import RunnerCandidate, RunnerTrial
from ..facts.schema import FactError
from ..host.endpoint import find_endpoint
from ..host.runner_trial import (agreement, autotune_cache_dir, backup_autotune_cache, bench, daemon_reload,
                                 dropin_text, greedy_answers, load_prompts, logged_runner, raw_exec_start,
                                 restart_ready, trial_group_key)
from ..payload.client import PayloadFailed


def _effective(ctx, backend: str) -> str | None:
    """The runner the server runs with ``--moe-runner-backend backend`` (SGLang's rules), None
    when it would refuse to start or orch cannot tell."""
    server, probe = ctx.facts.server, ctx.facts.probe
    found = moe_runner(backend=backend, quantization=server.quantization, ep=server.ep,
                       a2a_backend=server.moe_a2a_backend, **probe_inputs(probe.to_dict() if probe else {}))
    return found.runner if found.known else None


@task("runner_candidates", check_mode=READ_ONLY, sets=("orch_runner_candidates",))
def runner_candidates(ctx, runners: str) -> TaskResult:
    """The runners the trial starts (``orch_runner_candidates``, ``list[str]``) from ``runners``
    (``--moe-runners``: names separated by commas, or ``auto``), checked against the host's SGLang
    release (:func:`remote.sglang.runner_choices.parse_candidates`). Fails naming the bad name."""
    probe = ctx.facts.probe
    version = probe.sglang.version if probe is not None else None
    try:
        names = parse_candidates(runners, version, lambda b: _effective(ctx, b))
    except PayloadError as exc:
        raise TaskFailed(exc.msg) from None
    server = ctx.facts.server
    ref = server.moe_runner_backend or "auto"
    ref_runner = _effective(ctx, ref) or ref
    msg = (f"unit runs --moe-runner-backend {ref} ({ref_runner}); candidates: {', '.join(names)}")
    return TaskResult.ok(msg, facts={"orch_runner_candidates": names}, candidates=names, reference=ref)


def _set_dropin(ctx, unit: str, text: str | None) -> dict:
    args = ["--op", "set-dropin", "--run-id", ctx.options.run_id, "--state-dir", ctx.payload.state_dir,
            "--unit", unit]
    ctx.run.install_attempted = True  # the rescue's restore puts the drop-in back
    if text is None:
        return ctx.payload.call("runner_change", args + ["--remove"], timeout=120)
    return ctx.payload.call("runner_change", args, request={"content": text}, timeout=120)


def _levels(result) -> dict[str, float | None]:
    return {str(lv.get("max_concurrency")): lv.get("output_throughput") if lv.get("valid", True) else None
            for lv in result.levels}


@task("runner_trial", sets=("orch_runner_trial",), aliases={"unit": "name", "service": "name"})
def runner_trial(ctx, name: str, candidates: list[str], concurrency: list[int], input_len: int, output_len: int,
                 start_timeout: float, ready_timeout: float, min_agreement: float = 90.0, min_gain: float = 3.0,
                 check_tokens: int = 32, prompts_file: str | None = None) -> TaskResult:
    """Start each of ``candidates`` in turn and keep the fastest whose answers agree (module docstring).

    ``concurrency``/``input_len``/``output_len``: the benchmark (output tokens/s per level);
    ``start_timeout``/``ready_timeout`` (s) per start (the ready time allows for FlashInfer's
    autotune); ``min_agreement`` (percent of check prompts whose greedy answer of ``check_tokens``
    tokens equals the reference's); ``min_gain`` (percent of output tokens/s at the highest level a
    passing candidate must beat the reference by to be kept); ``prompts_file`` (controller path;
    default the shipped set). Refuses a unit that is not running (the output check needs its
    answers). Sets ``orch_runner_trial``; ``changed`` when a drop-in now sets another runner."""
    unit_facts = ctx.facts.unit
    if unit_facts is None or unit_facts.active_state != "active":
        raise TaskFailed(f"{name} is not running: the runner trial compares against the answers and speed of the "
                         "unit's own runner, so start it first")
    prompts = load_prompts(prompts_file)
    server = ctx.facts.server
    ref_flag = server.moe_runner_backend or "auto"
    ref_runner = _effective(ctx, ref_flag) or ref_flag
    endpoint = find_endpoint(ctx)
    words = raw_exec_start(ctx.connection, name)
    trial = RunnerTrial(reference=ref_flag, min_agreement=float(min_agreement), min_gain_pct=float(min_gain),
                        prompts=len(prompts), max_new_tokens=int(check_tokens))
    last = last_start(unit_log(ctx.connection, name)) or ""
    backup_autotune_cache(ctx, name)
    groups = ctx.options.fleet
    settings = {"concurrency": [int(c) for c in concurrency], "input_len": int(input_len),
                "output_len": int(output_len), "check_tokens": int(check_tokens), "prompts": prompts,
                "min_agreement": float(min_agreement), "min_gain": float(min_gain)}
    gkey = trial_group_key(ctx, list(candidates), settings) if groups is not None else None
    role = None
    if gkey:
        groups.report_key(ctx.name, gkey)
        try:
            role = groups.assign(ctx.name, [1], cancel=ctx.options.cancel)
        except TimeoutError as exc:
            raise TaskFailed(str(exc)) from None
        if role.tuner and role.tuner != ctx.name:
            done = _reuse(ctx, name, trial, words, endpoint, role.tuner, gkey, prompts, float(min_agreement),
                          int(check_tokens), start_timeout, ready_timeout)
            if done is not None:
                return done
            role = None  # the measuring host failed before its verdict: this host measures for itself

    def measure(row: RunnerCandidate, label: str, reference_answers: list[dict] | None) -> list[dict]:
        answers = greedy_answers(ctx, endpoint, prompts, int(check_tokens))
        if reference_answers is not None:
            row.agreement = round(agreement(reference_answers, answers), 4)
            row.passed = row.agreement * 100.0 >= float(min_agreement)
        result = bench(ctx, endpoint.url, concurrency, input_len, output_len, label)
        row.tokens_per_s = _levels(result)
        return answers

    ref_row = RunnerCandidate(runner=ref_flag, reference=True, agreement=1.0, passed=True,
                              log_runner=logged_runner(last) if last else None)
    ctx.say(f"reference: --moe-runner-backend {ref_flag} ({ref_runner})")
    ref_answers = measure(ref_row, "runner_reference", None)
    trial.candidates.append(ref_row)
    for cand in candidates:
        if cand == ref_flag or (cand == ref_runner and ref_flag == "auto"):
            continue  # the reference row measures the unit's own runner
        row = RunnerCandidate(runner=cand)
        trial.candidates.append(row)
        ctx.say(f"candidate {cand}: drop-in, daemon-reload, restart")
        try:
            _set_dropin(ctx, name, dropin_text(words, cand, ctx.options.run_id))
            daemon_reload(ctx)
            row.ready_s, text = restart_ready(ctx, name, endpoint, start_timeout, ready_timeout)
            row.log_runner = logged_runner(text)
            if row.log_runner not in (cand, None):
                row.why = f"the start's log shows moe_runner_backend={row.log_runner}, not {cand}"
                continue
            measure(row, f"runner_{cand}", ref_answers)
        except (TaskFailed, PayloadFailed, FactError) as exc:
            row.why = f"did not run: {str(getattr(exc, 'msg', exc)).splitlines()[0][:200]}"
            ctx.emit("runner_candidate_failed", runner=cand, error=row.why)
            continue
        if not row.passed:
            row.why = (f"output check failed: {row.agreement:.0%} of {len(prompts)} prompts agree "
                       f"(needs {float(min_agreement):.0f}%)")
    ref_top = ref_row.top() or 0.0
    passing = [r for r in trial.candidates if not r.reference and r.passed and not r.why and r.top() is not None]
    best = max(passing, key=lambda r: r.top(), default=None)
    gain = ((best.top() - ref_top) / ref_top * 100.0) if best is not None and ref_top else None
    for r in passing:
        if r is not best:
            r.why = f"slower than {best.runner}"
    if best is not None and (gain is None or gain > float(min_gain)):
        best.kept, best.why = True, f"fastest passing: {gain:+.1f}% output tok/s" if gain is not None else "fastest"
        ref_row.why = f"replaced by {best.runner}"
        trial.kept, trial.changed = best.runner, True
        manifest = _set_dropin(ctx, name, dropin_text(words, best.runner, ctx.options.run_id))
        trial.dropin = (manifest.get("files") or [{}])[0].get("path", "")
        ctx.run.summary.installed = [trial.dropin] if trial.dropin else None
    else:
        if best is not None:
            best.why = f"{gain:+.1f}% output tok/s: within the {float(min_gain):g}% noise threshold"
        ref_row.kept, ref_row.why = True, "the unit keeps its runner"
        trial.kept = ref_flag
        if ctx.run.install_attempted:  # back to its bytes; the run's record then shows no change
            data = ctx.payload.call("runner_change", ["--op", "set-dropin", "--run-id", ctx.options.run_id,
                                                      "--state-dir", ctx.payload.state_dir, "--unit", name,
                                                      "--as-before"], timeout=120)
            ctx.run.summary.restored = data.get("files")
    ctx.run.summary.runner_trial = trial
    if ctx.run.install_attempted:
        daemon_reload(ctx)
        _ready, text = restart_ready(ctx, name, endpoint, start_timeout, ready_timeout)
        shown = logged_runner(text)
        want = trial.kept if trial.changed else ref_row.log_runner
        if want and shown != want:
            raise TaskFailed(f"after the trial {name} started with moe_runner_backend={shown}, not {want}")
        ctx.say(f"{name} runs --moe-runner-backend {trial.kept} (log: moe_runner_backend={shown})")
    if role is not None:  # the verdict for the other hosts of the group
        groups.publish(gkey, {"trial": trial.to_dict(), "host": ctx.name})
    rows = "; ".join(f"{r.runner}: {r.top() or 0:.1f} tok/s, agreement "
                     f"{'-' if r.agreement is None else f'{r.agreement:.0%}'}, "
                     f"{'kept' if r.kept else r.why}" for r in trial.candidates)
    result = TaskResult.changed if trial.changed else TaskResult.ok
    return result(f"kept {trial.kept}: {rows}", facts={"orch_runner_trial": trial}, **trial.to_dict())


def _reuse(ctx, name: str, trial: RunnerTrial, words: list[str], endpoint, tuner: str, gkey: str,
           prompts: list[str], min_agreement: float, check_tokens: int, start_timeout: float,
           ready_timeout: float) -> TaskResult | None:
    """Another host of this host's trial group (:func:`orchestrator.host.runner_trial.trial_group_key`)
    runs the trial: wait for its verdict while the server keeps serving, then apply it here. A kept
    runner is started through this host's own drop-in, and its own start is verified: the log must
    name the runner and the greedy answers must agree with this host's answers before the change
    (``min_agreement`` percent), else TaskFailed (the rescue puts the drop-in back). A verdict that
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
    manifest = _set_dropin(ctx, name, dropin_text(words, trial.kept, ctx.options.run_id))
    trial.dropin = (manifest.get("files") or [{}])[0].get("path", "")
    ctx.run.summary.installed = [trial.dropin] if trial.dropin else None
    daemon_reload(ctx)
    _ready, text = restart_ready(ctx, name, endpoint, start_timeout, ready_timeout)
    shown = logged_runner(text)
    if shown != trial.kept:
        raise TaskFailed(f"{name} started with moe_runner_backend={shown}, not {trial.kept} "
                         f"(the verdict of {trial.measured_on}'s trial)")
    share = agreement(before, greedy_answers(ctx, endpoint, prompts, check_tokens))
    if share * 100.0 < min_agreement:
        raise TaskFailed(f"{name} on {trial.kept}: {share:.0%} of {len(prompts)} check prompts agree with its "
                         f"answers before (needs {min_agreement:.0f}%); not kept here")
    ctx.say(f"{name} runs --moe-runner-backend {trial.kept} (log: moe_runner_backend={shown}; verdict of "
            f"{trial.measured_on}, answers {share:.0%} agree)")
    return TaskResult.changed(f"kept {trial.kept}: the verdict of {trial.measured_on}'s trial (same tuning group), "
                              f"started and verified here", facts={"orch_runner_trial": trial}, **trial.to_dict())


@task("daemon_reload")
def daemon_reload_task(ctx, only_if_changed: bool = False, when_dir: str | None = None,
                       when_any_dir: list | None = None) -> TaskResult:
    """``systemctl daemon-reload`` after orch changed a unit's drop-in (refused where running GPU
    containers of the NVIDIA container toolkit could lose their devices, see
    :func:`orchestrator.host.runner_trial.daemon_reload`). ``only_if_changed`` (rescue steps):
    skipped when this run wrote nothing. ``when_dir``: skipped unless it is a drop-in folder
    (``*.service.d``, e.g. the rollback target's ``dest_dir``); ``when_any_dir``: skipped unless one of
    them is (the ``dest_dir`` of each run ``orch recover`` restored)."""
    if only_if_changed and not ctx.run.install_attempted:
        return TaskResult.skipped("this run changed no unit file")
    if when_dir is not None and not str(when_dir).endswith(".service.d"):
        return TaskResult.skipped(f"{when_dir} is not a unit's drop-in folder")
    if when_any_dir is not None and not any(str(d or "").endswith(".service.d") for d in when_any_dir):
        return TaskResult.skipped("no unit drop-in was restored")
    check = daemon_reload(ctx)
    return TaskResult.changed("systemctl daemon-reload", **check)


@task("verify_runner", check_mode=READ_ONLY, aliases={"unit": "name", "service": "name"})
def verify_runner(ctx, name: str) -> TaskResult:
    """Prove from the log of the unit's last start (by this run) which MoE runner came up: the
    ``moe_runner_backend`` of the start's server-arguments line must be the one the unit's files
    now give (``--moe-runner-backend``, ``auto`` when absent: then any resolved runner is shown)."""
    text = text_since(ctx.run.log_mark, unit_log(ctx.connection, name))
    shown = logged_runner(text)
    words = raw_exec_start(ctx.connection, name)
    want = "auto"
    for i, w in enumerate(words):
        if w == "--moe-runner-backend" and i + 1 < len(words):
            want = words[i + 1]
        elif w.startswith("--moe-runner-backend="):
            want = w.split("=", 1)[1]
    if shown is None:
        raise TaskFailed(f"{name}: the start's log shows no server arguments line, so which runner came up is not proven")
    if want != "auto" and shown != want:
        raise TaskFailed(f"{name} came up with moe_runner_backend={shown}, but its unit says {want}")
    return TaskResult.ok(f"log shows moe_runner_backend={shown} (unit: {want})", runner=shown, expected=want)


@task("autotune_cache", aliases={"unit": "name", "service": "name"})
def autotune_cache(ctx, name: str, action: Literal["backup", "restore"], run_id: str | None = None) -> TaskResult:
    """FlashInfer's autotune cache (``$SGLANG_CACHE_DIR/flashinfer/autotune``) as host state:
    ``backup`` copies it into this run's folder on the host before a restart; ``restore`` puts the
    files run ``run_id`` backed up back to their bytes (files made since are kept: never deleted)."""
    if action == "backup":
        data = backup_autotune_cache(ctx, name)
        return TaskResult.ok(f"backed up {len(data.get('files') or [])} file(s) of {data.get('dir')}", **data)
    if not run_id:
        raise TaskFailed("autotune_cache restore needs run_id")
    data = ctx.payload.call("runner_change", ["--op", "cache-restore", "--run-id", str(run_id), "--state-dir",
                                              ctx.payload.state_dir, "--cache-dir", autotune_cache_dir(ctx, name)],
                            timeout=300)
    put = [f["path"] for f in data.get("files") or [] if f.get("action") == "restored"]
    ctx.run.summary.autotune_cache = {"dir": data.get("dir"), "restored": len(put),
                                      "kept_new": len(data.get("kept_new") or [])}
    result = TaskResult.changed if put else TaskResult.ok
    return result(f"autotune cache {data.get('dir')}: {len(put)} file(s) restored, "
                  f"{len(data.get('kept_new') or [])} newer kept", **data)
