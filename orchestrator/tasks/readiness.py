"""Readiness of a restarted SGLang server, and proof from its log that configs were loaded.

``/v1/models`` answers before the server can generate (sglang #33719): it is only
liveness, and ``/health`` 200 is not readiness either (it does not generate in SGLang 0.5.23).
Ready means a real one-token ``/generate`` returned a token within its deadline
(:func:`wait_ready`).
Polling stops early when ``systemctl is-active`` says the unit failed.

Where to ask: the address ``plan`` found the server answering at, else the one its
``--host``/``--port`` give (:func:`orchestrator.host.endpoint.endpoint_of`).
"""

from __future__ import annotations

import time

from remote.engines.sglang.moe_log import parse_moe_log, role_of, verify_loaded

from ..engine.results import Cancelled, TaskFailed, TaskResult
from ..engine.task import task
from ..facts.journal import LogMark, StartLog, log_files, read_start
from ..facts.unit import is_active, scope_of
from ..host.answering import check_answering_process
from ..host.endpoint import ask, ask_json, endpoint_of
from ..host.servers import meet, peer_failure

POLL_S = 1.0


def start_log(ctx, unit: str) -> StartLog:
    """The log of the last start this run made (after ``ctx.run.start_mark``: by journal cursor,
    the files from their recorded sizes; without a mark, after the copy ``ctx.run.log_mark``),
    with its gaps. A gap not seen before is recorded once in the run summary (``log_gaps``), as a
    ``log_gap`` event and a warning line. Journal entries of another invocation of the unit that
    were dropped (an earlier start's straggler, :func:`orchestrator.facts.journal.split_invocations`)
    are recorded likewise, once per invocation ID: ``log_other_invocations`` in the summary, a
    ``log_other_invocation`` event and a line saying so."""
    mark = ctx.run.start_mark
    if mark is None and ctx.run.log_mark:
        mark = LogMark(text=ctx.run.log_mark)
    got = read_start(ctx.connection, unit, mark, scope=scope_of(ctx.vars), files=log_files(ctx))
    known = ctx.run.summary.log_gaps or []
    for gap in got.gaps:
        if gap not in known:
            known = known + [gap]
            ctx.emit("log_gap", unit=unit, gap=gap)
            ctx.say(f"WARNING: gap in the log of {unit}'s start: {gap}")
    if known:
        ctx.run.summary.log_gaps = known
    others = list(ctx.run.summary.log_other_invocations or [])
    seen = {o.get("invocation") for o in others}
    for o in got.other_invocations:
        if o["invocation"] in seen:
            continue
        others.append(dict(o, unit=unit, kept=list(got.invocations)))
        ctx.emit("log_other_invocation", unit=unit, invocation=o["invocation"], lines=o["lines"], first=o["first"],
                 kept=list(got.invocations))
        ctx.say(f"ignored {o['lines']} journal line(s) of another invocation of {unit} ({o['invocation']}) after "
                f"the start's cursor, e.g. {o['first'][:120]!r}")
    if others:
        ctx.run.summary.log_other_invocations = others
    return got


def log_since_mark(ctx, unit: str) -> str:
    """Unit log lines written since the last start this run made (:func:`start_log`)."""
    return start_log(ctx, unit).text


#: SGLang's native generation request (SGLang 0.5.23 srt/entrypoints/http_server.py ``/generate``,
#: ``GenerateReqInput``): one output token, greedy.
ONE_TOKEN = {"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


def tokens_of(answer) -> int:
    """Output tokens in a ``/generate`` answer (a dict; SGLang 0.5.23 puts the count in
    ``meta_info.completion_tokens`` and the ids in ``output_ids``); 0 for anything else."""
    if not isinstance(answer, dict):
        return 0
    meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
    count = meta.get("completion_tokens")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    ids = answer.get("output_ids")
    return len(ids) if isinstance(ids, list) else 0


@task("wait_ready", aliases={"unit": "name", "service": "name"})
def wait_ready(ctx, name: str, timeout: float, generate_timeout: float = 60.0,
               generate_check: bool = True) -> TaskResult:
    """Wait until the unit's server generates, at most ``timeout`` s: ``/v1/models`` (liveness),
    then ``/health``, then a real one-token ``/generate`` that must return a token within
    ``generate_timeout`` s. Ready only when that generation returned a token.

    ``/health`` 200 is not enough: SGLang 0.5.23's ``/health`` answers 200 without generating
    (srt/entrypoints/http_server.py ``health_generate``: only with
    ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``), so a server whose every completion hangs passes
    it (sglang #4191). A generation that gets no answer within ``generate_timeout`` while
    ``/health`` says 200 is a failed start (TaskFailed, the rescue restores the host).
    ``/health`` 503 is not a failure: SGLang answers it while ``ServerStatus.Starting`` (warm-up,
    a DeepGEMM JIT compile) or when its own probe waits behind a long chunked prefill
    (sglang #22511, #10856); orch keeps trying the generation until ``timeout``, and a generation
    that returns a token ends the wait then too (said in the result). ``/health`` 404 (releases
    without it) goes straight to the generation. Fails early, with the log tail, when the unit
    becomes ``failed``/``inactive``. ``generate_check: false`` only skips the generation where
    ``/health`` answers 200. Once ready, the process listening on the port must be the unit's
    main process, a new one since "Read the unit" (:func:`orchestrator.host.answering.check_answering_process`:
    a leaked server answering in its place fails the task). Reports the seconds it took and the
    last ``/health`` status. A rank >= 1 of a multi-node server (``orch_server_group``) is asked
    ``/health`` only: SGLang 0.5.23 starts its dummy health server (srt/utils/common.py) once its
    schedulers are ready, that is once every rank joined and loaded the model
    (srt/entrypoints/engine.py).
    """
    unit = name
    endpoint = endpoint_of(ctx)
    url = endpoint.url
    start = time.monotonic()
    deadline = ctx.deadline(timeout)
    group = ctx.facts.server_group
    health_only = group is not None and group.rank > 0
    stage = "health" if health_only else "liveness"
    last = ""
    health = None
    while True:
        state = is_active(ctx.connection, unit, scope_of(ctx.vars))
        if state in ("failed", "inactive"):
            tail = log_since_mark(ctx, unit).strip().splitlines()[-8:]
            raise TaskFailed(f"{unit} became {state} while waiting for readiness; log tail:\n" + "\n".join(tail),
                             {"log_tail": tail})
        if stage == "liveness":
            status, last = ask(ctx, endpoint, "/v1/models")
            if status == 200:
                stage = "health"
                continue
        else:
            health, last = ask(ctx, endpoint, "/health")
            if health == 200 and (not generate_check or health_only):
                break
            if health in (200, 404, 503) and not health_only:
                left = max(1.0, min(float(generate_timeout), deadline - time.monotonic()))
                g, answer, what = ask_json(ctx, endpoint, "/generate", "POST", ONE_TOKEN, timeout=left)
                n = tokens_of(answer) if g == 200 else 0
                if n >= 1:
                    break
                last = f"/health {health}, {what}" + (" without a token" if g == 200 else "")
                if health == 200 and g is None and "timeout" in what.lower():
                    raise TaskFailed(
                        f"{unit} answers /health 200 but a one-token /generate got no answer within "
                        f"{left:.0f} s at {url} (from the {endpoint.via}): the server cannot generate (a hung "
                        "generation is a failed start)", {"health": health, "generate": what})
        if ctx.cancelled():
            raise Cancelled()
        broken = peer_failure(ctx)
        if broken:  # the server cannot become ready without that rank
            raise TaskFailed(broken)
        if time.monotonic() > deadline:
            raise TaskFailed(f"{unit} not ready after {timeout:.0f} s at {url} (from the {endpoint.via}; "
                             f"last: {last})")
        ctx.progress(stage=f"waiting for {stage}", done=0, total=0)
        time.sleep(POLL_S)
    # a new main process is required only of a start this run made (a recover that found the
    # unit already running waits on the process it found)
    before = ctx.facts.unit.main_pid if ctx.facts.unit is not None and ctx.run.started_by_orch else None
    answering = check_answering_process(ctx, unit, "readiness", not_pid=before)
    took = round(time.monotonic() - start, 1)
    if ctx.run.started_by_orch:  # the end of the unit's downtime (orchestrator.facts.downtime)
        ctx.mark_phase("readiness")
    how = "" if health == 200 else f"; /health answered {health}, a one-token generation returned a token"
    return TaskResult.ok(f"ready at {url} (from the {endpoint.via}) after {took} s{how}", seconds=took, url=url,
                         health=health, answering=answering)


@task("verify_log", aliases={"unit": "name", "service": "name"})
def verify_log(ctx, name: str, expect_paths: list[str] | None = None, allow_default: bool = False) -> TaskResult:
    """Prove from the log lines of the unit's last start (by this run) which MoE configs SGLang
    loaded. ``expect_paths``: files that must appear in ``Using MoE kernel config from <path>.``;
    any sub-optimal line (fallback, default, down missing) for them fails the task.
    ``allow_default`` (rollback to a state with no file): the default line is expected.
    When the probe could not read the host's loader rules (``orch_probe.sglang.loader_rules_inferred``:
    a patched or vendored SGLang), a ``_down`` file the server never looked up is reported in
    ``not_looked_up``, not failed (such a loader may read none); the up file is always proven.
    On a rank of a multi-node server it then waits for every rank's proof, and fails when one
    of them failed (all ranks roll back together).

    A gap in the start's log (:func:`start_log`: journald's "Suppressed N messages" rate
    limiting, systemd #2913; a log file rotated during the start) makes a missing lookup line
    unproven, not absent: the task then succeeds with ``not_proven`` set and says "not proven (log
    gap)", and the benchmark after the start decides. What the log positively shows still fails
    with a gap (a fallback, the default config, a missing down file, another file).
    """
    got = start_log(ctx, name)
    text = got.text
    rep = parse_moe_log(text)
    expect = list(expect_paths or [])
    inferred = ctx.facts.probe.sglang.loader_rules_inferred if ctx.facts.probe is not None else None
    seen = {ln.role for ln in rep.lines if ln.role}
    unseen = [p for p in expect if inferred and role_of(p) == "down" and "down" not in seen]
    expect = [p for p in expect if p not in unseen]
    problems = verify_loaded(rep, expect) if expect else []
    if not expect and not allow_default and rep.suboptimal:
        problems = list(rep.suboptimal)
    # a line not found in a log with a hole may be in the hole: not proven, never read as absent
    absent = [p for p in expect if p not in rep.loaded] if got.gaps else []
    absent_says = {f"log does not show 'Using MoE kernel config from {p}.'" for p in absent}
    problems = [x for x in problems if x not in absent_says]
    data = {"loaded": rep.loaded, "default": rep.default, "fallback": rep.fallback,
            "down_missing": rep.down_missing, "suboptimal": rep.suboptimal, "not_looked_up": unseen,
            "not_proven": absent, "gaps": got.gaps, "by_cursor": got.by_cursor,
            "invocations": got.invocations, "other_invocations": got.other_invocations}
    if problems:
        raise TaskFailed("; ".join(problems) + (f" (the log has gaps: {'; '.join(got.gaps)})" if got.gaps else ""),
                         data)
    meet(ctx, "verified")  # a multi-node server succeeds only when every rank loaded the files
    what = ", ".join(p.rsplit("/", 1)[-1] for p in rep.loaded) or ("no lookup line" if absent else "default config")
    if unseen:
        what += (f"; the server never looked up {', '.join(p.rsplit('/', 1)[-1] for p in unseen)} (not proven: "
                 f"this SGLang's lookup rules were inferred, {inferred})")
    if absent:
        what += (f"; {', '.join(p.rsplit('/', 1)[-1] for p in absent)}: not proven (log gap: "
                 f"{'; '.join(got.gaps)}), the benchmark after the start decides")
    return TaskResult.ok(f"log shows: {what}", **data)
