"""Where the unit's server answers, and one request to it (plan, readiness, bench).

A server bound to loopback (SGLang's default ``--host`` is 127.0.0.1) or to one NIC address
answers only there. ``plan`` finds, while the server still runs, the address where it answers
(:func:`find_endpoint`, from its ``--host``/``--port``, asked ON THE HOST through the payload's
``reach``, or ``orch_server_url`` from the controller) and refuses before anything is stopped when
none answers; readiness and both benchmarks then use that same address (:func:`endpoint_of`).
"""

from __future__ import annotations

import json

import httpx

from ..engine.results import TaskFailed
from ..facts.container import ContainerRun
from ..facts.plan import Endpoint
from ..facts.unit import ServerArgs
from ..payload.client import PayloadFailed

from remote.engines import engine_named

WILDCARDS = ("0.0.0.0", "", "*")


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def endpoint_candidates(server: ServerArgs, container: ContainerRun | None = None) -> list[str]:
    """Base URLs where the server of ``server`` (``orch_unit.server``) answers ON ITS HOST, from its
    ``host`` and ``port`` (the engine's defaults applied by its parser: SGLang 0.5.23's 127.0.0.1
    and 30000), most likely first:
    a wildcard bind (``0.0.0.0``) answers on 127.0.0.1; ``::`` on ``[::1]`` (and 127.0.0.1 when the
    socket is dual-stack); ``localhost`` on 127.0.0.1 and ``[::1]``; any other address or name
    only on itself. For a container unit (``container``, ``orch_unit.container``) off the host
    network, the port the runtime publishes for the server's (``-p [IP:]HOST_PORT:PORT``) on its
    host address (none published: []). Pure."""
    defaults = None if server.port and server.host is not None else engine_named(None).parse_server_args([])
    port = int(server.port or defaults.port)
    host = str(server.host if server.host is not None else defaults.host).strip()
    if container is not None and not container.host_network:
        pub = container.published_port(port)
        if pub is None or pub.host_port is None:
            return []
        port, host = pub.host_port, pub.host_ip or "0.0.0.0"
    if host in WILDCARDS:
        names = ["127.0.0.1"]
    elif host in ("::", "[::]"):
        names = ["::1", "127.0.0.1"]
    elif host == "localhost":
        names = ["127.0.0.1", "::1"]
    else:
        names = [host.strip("[]")]
    return [f"http://{_bracket(n)}:{port}" for n in names]


def endpoint_of(ctx) -> Endpoint:
    """Where readiness is polled and the benchmark sent: ``orch_endpoint`` (found by ``plan``
    while the server ran, :func:`find_endpoint`) or, when no plan ran (rollback, recover, bench),
    ``orch_server_url`` polled from the controller, else the first of :func:`endpoint_candidates`
    polled on the host."""
    found = ctx.facts.endpoint
    if found:
        return found
    if ctx.vars.get("orch_server_url"):
        return Endpoint(url=str(ctx.vars["orch_server_url"]).rstrip("/"), via="controller")
    cands = endpoint_candidates(ctx.facts.server, container_of(ctx))
    if not cands:
        raise TaskFailed(unreachable_container(ctx))
    return Endpoint(url=cands[0], via="host")


def container_of(ctx) -> ContainerRun | None:
    """The container unit's parsed run command (``orch_unit.container``), or None."""
    return ctx.facts.unit.container if ctx.facts.unit is not None else None


def unreachable_container(ctx) -> str:
    """Why a container unit's server cannot be asked from its host: its port is not published."""
    c, port = container_of(ctx), int(ctx.facts.server.port)
    return (f"the server listens on port {port} inside the {c.runtime if c else ''} container, which is not on the "
            f"host network and publishes no host port for it: orch cannot check readiness nor benchmark it. Add "
            f"-p 127.0.0.1:{port}:{port} (or --network host) to the unit's run command, or set orch_server_url; "
            "nothing was stopped")


def ask(ctx, endpoint: Endpoint, path: str, method: str = "GET", body: dict | None = None,
        timeout: float = 10.0) -> tuple[int | None, str]:
    """One request to ``endpoint`` (:func:`endpoint_of`) + ``path``, from where it is reached:
    the controller (httpx) or the host (payload ``reach``). Returns ``(status or None, what
    happened)``; a connection failure is an answer, not an exception."""
    status, _, what = ask_json(ctx, endpoint, path, method, body, timeout)
    return status, what


def ask_json(ctx, endpoint: Endpoint, path: str, method: str = "GET", body: dict | None = None,
             timeout: float = 10.0) -> tuple[int | None, object, str]:
    """:func:`ask`, also returning the answer's JSON body (None when it is not JSON, or over
    64 KiB when asked on the host): ``(status or None, json or None, what happened)``. An answer
    that takes longer than ``timeout`` s is no answer (``what`` names the timeout)."""
    url = endpoint.url
    if endpoint.via != "controller" and ctx.payload is None:
        # asking "127.0.0.1" from the controller would reach another machine's server
        raise TaskFailed(f"the server is asked on its host ({url}), which needs the payload: run the payload "
                         "task first, or set orch_server_url to where the controller reaches it")
    if endpoint.via == "controller":
        try:
            with httpx.Client(timeout=timeout) as client:
                r = client.request(method, f"{url}{path}", json=body)
            try:
                data = r.json()
            except ValueError:
                data = None
            return r.status_code, data, f"{path} {r.status_code}"
        except httpx.HTTPError as exc:
            return None, None, f"{path} {type(exc).__name__}"
    args = ["--url", url, "--path", path, "--method", method, "--timeout", str(timeout)]
    if body is not None:
        args += ["--json", json.dumps(body)]
    try:
        res = (ctx.payload.call("reach", args, timeout=timeout + 60).get("results") or [{}])[0]
    except PayloadFailed as exc:  # no answer this time (the caller polls again or reports it)
        return None, None, f"{path} not asked: {exc.msg[:160]}"
    status = res.get("status")
    return status, res.get("json"), f"{path} {status if status is not None else res.get('error')}"


def find_endpoint(ctx, health_only: bool = False) -> Endpoint:
    """Before anything is stopped: the address where the RUNNING server answers its liveness request
    (``Engine.liveness_path``: ``/v1/models``) 200, tried in order: ``orch_server_url`` from the controller when set, else each of
    :func:`endpoint_candidates` on the host (through the payload). Raises TaskFailed naming every
    address tried and what each answered when none does. A unit that is not active cannot be
    asked: the first candidate is returned unchecked. ``health_only``: ask the health request
    instead (``Engine.health_path``: a rank >= 1 of a multi-node server serves nothing else, SGLang
    0.5.23 srt/utils/common.py ``launch_dummy_health_check_server``)."""
    engine = ctx.facts.engine
    if ctx.vars.get("orch_server_url"):
        cands = [Endpoint(url=str(ctx.vars["orch_server_url"]).rstrip("/"), via="controller")]
    else:
        cands = [Endpoint(url=u, via="host") for u in endpoint_candidates(ctx.facts.server, container_of(ctx))]
        if not cands:
            raise TaskFailed(unreachable_container(ctx))
    unit = ctx.facts.unit
    if unit is None or unit.active_state != "active":
        return cands[0]
    tried = []
    for c in cands:
        status, what = ask(ctx, c, engine.health_path if health_only else engine.liveness_path, timeout=10.0)
        tried.append(f"{c.url} from the {c.via}: {what}")
        if status == 200:
            return Endpoint(url=c.url, via=c.via, checked=True, tried=tried)
    raise TaskFailed(f"the running server answers {engine.liveness_path} at none of the addresses its --host/--port give "
                     f"({'; '.join(tried)}); orch could neither check readiness nor benchmark it, so nothing was "
                     "stopped. Set orch_server_url (as the controller reaches it) if it listens elsewhere",
                     {"tried": tried})
