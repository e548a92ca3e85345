"""Readiness of a restarted SGLang server, and proof from its log that configs were loaded.

``/v1/models`` answers before the server can generate (sglang #33719): it is only
liveness. Ready means ``/health`` (``/health_generate`` in current releases) answers
200, or, where ``/health`` is absent (404), a real 1-token ``/generate`` completes.
Polling stops early when ``systemctl is-active`` says the unit failed.

Where to ask: a server bound to loopback (SGLang's default ``--host`` is 127.0.0.1) or to one
NIC address answers only there. ``plan`` finds, while the server still runs, the address where it
answers (:func:`find_endpoint`, from its ``--host``/``--port``, asked ON THE HOST through the
payload's ``reach``, or ``orch_sglang_url`` from the controller) and refuses before anything is
stopped when none answers; readiness and both benchmarks then use that same address
(:func:`endpoint_of`).
"""

from __future__ import annotations

import json
import time

import httpx

from remote.sglang.moe_log import parse_moe_log, role_of, verify_loaded

from ..engine.results import Cancelled, TaskFailed, TaskResult
from ..engine.task import task
from ..facts.journal import text_since, unit_log
from ..facts.unit import is_active
from ..payload.client import PayloadFailed

POLL_S = 1.0


WILDCARDS = ("0.0.0.0", "", "*")


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def endpoint_candidates(server: dict) -> list[str]:
    """Base URLs where the server of ``server`` (``orch_unit.server``) answers ON ITS HOST, from its
    ``--host`` and ``--port`` (SGLang 0.5.23 defaults: 127.0.0.1 and 30000), most likely first:
    a wildcard bind (``0.0.0.0``) answers on 127.0.0.1; ``::`` on ``[::1]`` (and 127.0.0.1 when the
    socket is dual-stack); ``localhost`` on 127.0.0.1 and ``[::1]``; any other address or name
    only on itself. Pure."""
    port = int(server.get("port") or 30000)
    host = str(server.get("host") if server.get("host") is not None else "127.0.0.1").strip()
    if host in WILDCARDS:
        names = ["127.0.0.1"]
    elif host in ("::", "[::]"):
        names = ["::1", "127.0.0.1"]
    elif host == "localhost":
        names = ["127.0.0.1", "::1"]
    else:
        names = [host.strip("[]")]
    return [f"http://{_bracket(n)}:{port}" for n in names]


def endpoint_of(ctx) -> dict:
    """Where readiness is polled and the benchmark sent: ``orch_endpoint`` (found by ``plan``
    while the server ran, :func:`find_endpoint`) or, when no plan ran (rollback, recover, bench),
    ``orch_sglang_url`` polled from the controller, else the first of :func:`endpoint_candidates`
    polled on the host. ``{"url", "via": "host"|"controller", "checked": bool, "tried": [...]}``."""
    found = ctx.vars.get("orch_endpoint")
    if found:
        return found
    if ctx.vars.get("orch_sglang_url"):
        return {"url": str(ctx.vars["orch_sglang_url"]).rstrip("/"), "via": "controller", "checked": False,
                "tried": []}
    server = (ctx.vars.get("orch_unit") or {}).get("server") or {}
    return {"url": endpoint_candidates(server)[0], "via": "host", "checked": False, "tried": []}


def ask(ctx, endpoint: dict, path: str, method: str = "GET", body: dict | None = None,
        timeout: float = 10.0) -> tuple[int | None, str]:
    """One request to ``endpoint`` (:func:`endpoint_of`) + ``path``, from where it is reached:
    the controller (httpx) or the host (payload ``reach``). Returns ``(status or None, what
    happened)``; a connection failure is an answer, not an exception."""
    url = endpoint["url"]
    if endpoint.get("via") != "controller" and ctx.payload is None:
        # asking "127.0.0.1" from the controller would reach another machine's server
        raise TaskFailed(f"the server is asked on its host ({url}), which needs the payload: run the payload "
                         "task first, or set orch_sglang_url to where the controller reaches it")
    if endpoint.get("via") == "controller":
        try:
            with httpx.Client(timeout=timeout) as client:
                r = client.request(method, f"{url}{path}", json=body)
            return r.status_code, f"{path} {r.status_code}"
        except httpx.HTTPError as exc:
            return None, f"{path} {type(exc).__name__}"
    args = ["--url", url, "--path", path, "--method", method, "--timeout", str(timeout)]
    if body is not None:
        args += ["--json", json.dumps(body)]
    try:
        res = (ctx.payload.call("reach", args, timeout=timeout + 60).get("results") or [{}])[0]
    except PayloadFailed as exc:  # no answer this time (the caller polls again or reports it)
        return None, f"{path} not asked: {exc.msg[:160]}"
    status = res.get("status")
    return status, f"{path} {status if status is not None else res.get('error')}"


def find_endpoint(ctx) -> dict:
    """Before anything is stopped: the address where the RUNNING server answers ``/v1/models``
    200, tried in order: ``orch_sglang_url`` from the controller when set, else each of
    :func:`endpoint_candidates` on the host (through the payload). Raises TaskFailed naming every
    address tried and what each answered when none does. A unit that is not active cannot be
    asked: the first candidate is returned unchecked."""
    unit = ctx.vars.get("orch_unit") or {}
    if ctx.vars.get("orch_sglang_url"):
        cands = [{"url": str(ctx.vars["orch_sglang_url"]).rstrip("/"), "via": "controller"}]
    else:
        cands = [{"url": u, "via": "host"} for u in endpoint_candidates(unit.get("server") or {})]
    if unit.get("active_state") != "active":
        return dict(cands[0], checked=False, tried=[])
    tried = []
    for c in cands:
        status, what = ask(ctx, c, "/v1/models", timeout=10.0)
        tried.append(f"{c['url']} from the {c['via']}: {what}")
        if status == 200:
            return dict(c, checked=True, tried=tried)
    raise TaskFailed("the running server answers /v1/models at none of the addresses its --host/--port give "
                     f"({'; '.join(tried)}); orch could neither check readiness nor benchmark it, so nothing was "
                     "stopped. Set orch_sglang_url (as the controller reaches it) if it listens elsewhere",
                     {"tried": tried})


def log_since_mark(ctx, unit: str) -> str:
    """Unit log lines written since the last start this run made (``ctx.run.log_mark``)."""
    return text_since(ctx.run.log_mark, unit_log(ctx.connection, unit))


@task("wait_ready", aliases={"unit": "name", "service": "name"})
def wait_ready(ctx, name: str, timeout: float, generate_check: bool = True) -> TaskResult:
    """Wait until the unit's server can generate: ``/v1/models`` (liveness) then ``/health``
    (or, where it is absent, a 1-token ``/generate``), at most ``timeout`` s. Fails early, with the
    log tail, when the unit becomes ``failed``/``inactive``. Reports the seconds it took.
    """
    unit = name
    endpoint = endpoint_of(ctx)
    url = endpoint["url"]
    start = time.monotonic()
    deadline = ctx.deadline(timeout)
    stage = "liveness"
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
            if status == 404 and generate_check:
                g, last = ask(ctx, endpoint, "/generate", "POST", {"text": "ping", "sampling_params":
                                                                  {"max_new_tokens": 1, "temperature": 0}})
                if g == 200:
                    break
        if ctx.cancelled():
            raise Cancelled()
        if time.monotonic() > deadline:
            raise TaskFailed(f"{unit} not ready after {timeout:.0f} s at {url} (from the {endpoint['via']}; "
                             f"last: {last})")
        ctx.progress(stage=f"waiting for {stage}", done=0, total=0)
        time.sleep(POLL_S)
    took = round(time.monotonic() - start, 1)
    return TaskResult.ok(f"ready at {url} (from the {endpoint['via']}) after {took} s", seconds=took, url=url)


@task("verify_log", aliases={"unit": "name", "service": "name"})
def verify_log(ctx, name: str, expect_paths: list[str] | None = None, allow_default: bool = False) -> TaskResult:
    """Prove from the log lines of the unit's last start (by this run) which MoE configs SGLang
    loaded. ``expect_paths``: files that must appear in ``Using MoE kernel config from <path>.``;
    any sub-optimal line (fallback, default, down missing) for them fails the task.
    ``allow_default`` (rollback to a state with no file): the default line is expected.
    When the probe could not read the host's loader rules (``orch_probe.sglang.loader_rules_inferred``:
    a patched or vendored SGLang), a ``_down`` file the server never looked up is reported in
    ``not_looked_up``, not failed (such a loader may read none); the up file is always proven.
    """
    text = log_since_mark(ctx, name)
    rep = parse_moe_log(text)
    expect = list(expect_paths or [])
    inferred = ((ctx.vars.get("orch_probe") or {}).get("sglang") or {}).get("loader_rules_inferred")
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
    what = ", ".join(p.rsplit("/", 1)[-1] for p in rep.loaded) or "default config"
    if unseen:
        what += (f"; the server never looked up {', '.join(p.rsplit('/', 1)[-1] for p in unseen)} (not proven: "
                 f"this SGLang's lookup rules were inferred, {inferred})")
    return TaskResult.ok(f"log shows: {what}", **data)
