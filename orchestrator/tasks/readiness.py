"""Readiness of a restarted SGLang server, and proof from its log that configs were loaded.

``/v1/models`` answers before the server can generate (sglang #33719): it is only
liveness. Ready means ``/health`` (``/health_generate`` in current releases) answers
200, or, where ``/health`` is absent (404), a real 1-token ``/generate`` completes.
Polling stops early when ``systemctl is-active`` says the unit failed.

Where to ask: the address ``plan`` found the server answering at, else the one its
``--host``/``--port`` give (:func:`orchestrator.host.endpoint.endpoint_of`).
"""

from __future__ import annotations

import time

from remote.sglang.moe_log import parse_moe_log, role_of, verify_loaded

from ..engine.results import Cancelled, TaskFailed, TaskResult
from ..engine.task import task
from ..facts.journal import text_since, unit_log
from ..facts.unit import is_active
from ..host.endpoint import ask, endpoint_of
from ..host.servers import meet, peer_failure

POLL_S = 1.0


def log_since_mark(ctx, unit: str) -> str:
    """Unit log lines written since the last start this run made (``ctx.run.log_mark``)."""
    return text_since(ctx.run.log_mark, unit_log(ctx.connection, unit))


@task("wait_ready", aliases={"unit": "name", "service": "name"})
def wait_ready(ctx, name: str, timeout: float, generate_check: bool = True) -> TaskResult:
    """Wait until the unit's server can generate: ``/v1/models`` (liveness) then ``/health``
    (or, where it is absent, a 1-token ``/generate``), at most ``timeout`` s. Fails early, with the
    log tail, when the unit becomes ``failed``/``inactive``. Reports the seconds it took.
    A rank >= 1 of a multi-node server (``orch_server_group``) is asked ``/health`` only: SGLang
    0.5.23 starts its dummy health server (srt/utils/common.py) once its schedulers are ready,
    that is once every rank joined and loaded the model (srt/entrypoints/engine.py).
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
    while True:
        state = is_active(ctx.connection, unit)
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
            status, last = ask(ctx, endpoint, "/health")
            if status == 200:
                break
            if status == 404 and generate_check and not health_only:
                g, last = ask(ctx, endpoint, "/generate", "POST", {"text": "ping", "sampling_params":
                                                                  {"max_new_tokens": 1, "temperature": 0}})
                if g == 200:
                    break
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
    took = round(time.monotonic() - start, 1)
    return TaskResult.ok(f"ready at {url} (from the {endpoint.via}) after {took} s", seconds=took, url=url)


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
    """
    text = log_since_mark(ctx, name)
    rep = parse_moe_log(text)
    expect = list(expect_paths or [])
    inferred = ctx.facts.probe.sglang.loader_rules_inferred if ctx.facts.probe is not None else None
    seen = {ln.role for ln in rep.lines if ln.role}
    unseen = [p for p in expect if inferred and role_of(p) == "down" and "down" not in seen]
    expect = [p for p in expect if p not in unseen]
    problems = verify_loaded(rep, expect) if expect else []
    if not expect and not allow_default and rep.suboptimal:
        problems = list(rep.suboptimal)
    data = {"loaded": rep.loaded, "default": rep.default, "fallback": rep.fallback,
            "down_missing": rep.down_missing, "suboptimal": rep.suboptimal, "not_looked_up": unseen}
    if problems:
        raise TaskFailed("; ".join(problems), data)
    meet(ctx, "verified")  # a multi-node server succeeds only when every rank loaded the files
    what = ", ".join(p.rsplit("/", 1)[-1] for p in rep.loaded) or "default config"
    if unseen:
        what += (f"; the server never looked up {', '.join(p.rsplit('/', 1)[-1] for p in unseen)} (not proven: "
                 f"this SGLang's lookup rules were inferred, {inferred})")
    return TaskResult.ok(f"log shows: {what}", **data)
