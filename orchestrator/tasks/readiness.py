"""Readiness of a restarted server, and proof from its log that configs were loaded.

The liveness request (``Engine.liveness_path``: ``/v1/models``) answers before the server can
generate (sglang #33719), and the health request (``Engine.health_path``: ``/health``) 200 is not
readiness either (it does not generate in SGLang 0.5.23). Ready means a real one-token generation
(``Engine.generate_request``: SGLang's ``/generate``) returned a token within its deadline
(:func:`wait_ready`).
Polling stops early when ``systemctl is-active`` says the unit failed (after one more start when
the start died of a port race: :func:`orchestrator.host.port_race.restart_after_port_race`).

Where to ask: the address ``plan`` found the server answering at, else the one its
``--host``/``--port`` give (:func:`orchestrator.host.endpoint.endpoint_of`).
"""

from __future__ import annotations

import time

from ..engine.results import Cancelled, TaskFailed, TaskResult
from ..engine.task import task
from ..facts.journal import LogMark, StartLog, read_start
from ..host.answering import check_answering_process
from ..host.endpoint import ask, ask_json, endpoint_of
from ..host.port_race import restart_after_port_race
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
    got = read_start(ctx.connection, ctx.facts.unit_handle(unit), mark)
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


#: the prompt of readiness's one-token generation
PING = "ping"


@task("wait_ready", rerun=True, aliases={"unit": "name", "service": "name"})
def wait_ready(ctx, name: str, timeout: float, generate_timeout: float = 60.0,
               generate_check: bool = True) -> TaskResult:
    """Wait until the unit's server generates, at most ``timeout`` s: the engine's liveness request
    (``/v1/models``), then its health request (``/health``), then a real one-token generation
    (``Engine.generate_request``, SGLang's ``/generate``, answer read by ``Engine.parse_generation``)
    that must return a token within ``generate_timeout`` s. Ready only when that generation
    returned a token.

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
    engine = ctx.facts.engine
    one_token = engine.generate_request(PING, 1)
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
        state = ctx.facts.unit_handle(unit).is_active(ctx.connection)
        if state in ("failed", "inactive") and ctx.run.started_by_orch and restart_after_port_race(ctx, unit, timeout):
            continue  # a port race at bind time: started once more, the new files kept (issue 32 row 9)
        if state in ("failed", "inactive"):
            tail = log_since_mark(ctx, unit).strip().splitlines()[-8:]
            raise TaskFailed(f"{unit} became {state} while waiting for readiness; log tail:\n" + "\n".join(tail),
                             {"log_tail": tail})
        if stage == "liveness":
            status, last = ask(ctx, endpoint, engine.liveness_path)
            if status == 200:
                stage = "health"
                continue
        else:
            health, last = ask(ctx, endpoint, engine.health_path)
            if health == 200 and (not generate_check or health_only):
                break
            if health in (200, 404, 503) and not health_only:
                left = max(1.0, min(float(generate_timeout), deadline - time.monotonic()))
                g, answer, what = ask_json(ctx, endpoint, one_token.path, one_token.method, one_token.body,
                                           timeout=left)
                n = engine.parse_generation(answer).tokens if g == 200 else 0
                if n >= 1:
                    break
                last = f"{engine.health_path} {health}, {what}" + (" without a token" if g == 200 else "")
                if health == 200 and g is None and "timeout" in what.lower():
                    raise TaskFailed(
                        f"{unit} answers {engine.health_path} 200 but a one-token {one_token.path} got no answer within "
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
    how = "" if health == 200 else f"; {engine.health_path} answered {health}, a one-token generation returned a token"
    return TaskResult.ok(f"ready at {url} (from the {endpoint.via}) after {took} s{how}", seconds=took, url=url,
                         health=health, answering=answering)


@task("verify_log", rerun=True, aliases={"unit": "name", "service": "name"})
def verify_log(ctx, name: str, expect_paths: list[str] | None = None, allow_default: bool = False) -> TaskResult:
    """Prove from the log lines of the unit's last start (by this run) which MoE configs the engine
    loaded (``Engine.parse_log``, ``Engine.verify_loaded``). ``expect_paths``: files the start must
    show loaded (SGLang: ``Using MoE kernel config from <path>.``);
    any sub-optimal line (fallback, default, down missing) for them fails the task.
    ``allow_default`` (rollback to a state with no file): the default line is expected.
    When the probe could not read the host's loader rules (``orch_probe.engine.loader_rules_inferred``:
    a patched or vendored engine), a ``_down`` file the server never looked up is reported in
    ``not_looked_up``, not failed (such a loader may read none); the up file is always proven.
    On a rank of a multi-node server it then waits for every rank's proof, and fails when one
    of them failed (all ranks roll back together).

    A gap in the start's log (:func:`start_log`: journald's "Suppressed N messages" rate
    limiting, systemd #2913; a log file rotated during the start) makes a missing lookup line
    unproven, not absent: the task then succeeds with ``not_proven`` set and says "not proven (log
    gap)", and the benchmark after the start decides. What the log positively shows still fails
    with a gap (a fallback, the default config, a missing down file, another file).
    A server run with ``--log-level warning`` (or above) never logs the ``Using MoE kernel config
    from`` lines (INFO; SGLang 0.5.23 ``configure_logger`` sets every logger's level from the flag)
    while its fallback, default and missing-down lines (WARNING) stay: an expected file without a
    line is then ``not_proven`` as in a gap, and what the WARNING lines show still fails.
    """
    engine = ctx.facts.engine
    got = start_log(ctx, name)
    text = got.text
    rep = engine.parse_log(text)
    expect = list(expect_paths or [])
    inferred = ctx.facts.probe.engine.loader_rules_inferred if ctx.facts.probe is not None else None
    seen = {ln.role for ln in rep.lines if ln.role}
    unseen = [p for p in expect if inferred and engine.role_of(p) == "down" and "down" not in seen]
    expect = [p for p in expect if p not in unseen]
    problems = engine.verify_loaded(rep, expect) if expect else []
    if not expect and not allow_default and rep.suboptimal:
        problems = list(rep.suboptimal)
    # a line not found in a log with a hole may be in the hole: not proven, never read as absent;
    # so is one a server above INFO never logs (issue 32 row 18)
    quiet = engine.hidden_load_lines(ctx.facts.server)
    absent = [p for p in expect if p not in rep.loaded] if (got.gaps or quiet) else []
    absent_says = {x for p in absent for x in engine.verify_loaded(engine.parse_log(""), [p])}
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
                 f"this {engine.display_name}'s lookup rules were inferred, {inferred})")
    if absent:
        why = (f"log gap: {'; '.join(got.gaps)}" if got.gaps else
               f"{quiet}, and no WARNING line says one was missing")
        what += (f"; {', '.join(p.rsplit('/', 1)[-1] for p in absent)}: not proven ({why}), the benchmark after "
                 "the start decides")
    return TaskResult.ok(f"log shows: {what}", **data)
