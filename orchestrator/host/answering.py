"""Which process answers on the unit's port: it must be the unit's own main server.

A leaked server (an earlier start that outlived its unit, one started by hand) can hold the
port and answer the health checks and the benchmark in place of the unit's server
(gujialiang123/end2end-optimization, RETRACTION_triton36_baseline_contamination.md: both arms
of an A/B measured the same server). SGLang 0.5.23 reports no process id over HTTP
(srt/entrypoints/http_server.py ``/server_info`` gives the server arguments, ``startup_time``,
``version``), so orch asks the host's kernel instead: the processes holding a LISTEN socket on
the port (payload ``port --main-pid``, from ``/proc/net/tcp{,6}`` and ``/proc/*/fd``) must all be
the unit's ``MainPID`` or its descendants (SGLang's HTTP server runs in the launch process; a
wrapper's child or a tokenizer worker is a descendant), or hold only copies of a socket the main
server holds (a re-parented fork of it: it cannot answer as another server).
"""

from __future__ import annotations

from ..engine.results import TaskFailed
from ..payload.client import PayloadFailed


def check_answering_process(ctx, unit: str, what: str, not_pid: int | None = None) -> dict:
    """Check that every listener on the unit's port is the unit's main process (or a descendant).

    ``what`` names the step in the message (``readiness``, ``the benchmark before``); ``not_pid``:
    a MainPID the server must no longer have (the one before this run's restart: the process
    answering must be the NEW main process). Returns ``{"checked": bool, "main_pid", "listeners"
    (PIDs), "why"?}``; ``checked`` is False, with ``why``, when it cannot be asked (no payload, no
    port, the server polled from the controller through ``orch_server_url``, the port check
    itself failed). Raises TaskFailed naming the PIDs and command lines of the listeners that are
    not the unit's main server, when the unit has no main process, or when it is still ``not_pid``.
    """
    facts = ctx.facts.unit
    port = facts.server.port if facts is not None and facts.server is not None else None
    endpoint = ctx.facts.endpoint
    if ctx.payload is None or not port:
        return {"checked": False, "why": "no payload or no port"}
    if ctx.vars.get("orch_server_url") or (endpoint is not None and endpoint.via == "controller"):
        return {"checked": False, "why": "the server is asked through orch_server_url"}
    if facts is not None and facts.container is not None:
        # a container unit's MainPID is the runtime client; the published port is held by the
        # runtime's own proxy (conmon, rootlessport, docker-proxy), never by the unit's processes
        return {"checked": False, "why": f"a {facts.container.runtime} container unit: the runtime holds the port"}
    pid = ctx.facts.unit_handle(unit).main_pid(ctx.connection)  # its manager's, as the unit's scope says
    if pid <= 0:
        raise TaskFailed(f"{unit} has no main process, yet something answers on port {port} ({what})")
    if not_pid and pid == not_pid:
        raise TaskFailed(f"{unit}'s main process is still {pid}, the one before the restart ({what}): "
                         "the server answering is not a new start")
    try:
        data = ctx.payload.call("port", ["--port", str(int(port)), "--main-pid", str(pid)], timeout=120)
    except PayloadFailed as exc:
        ctx.say(f"WARNING: could not check which process answers on port {port} ({what}): {exc.msg[:200]}")
        return {"checked": False, "why": exc.msg[:200], "main_pid": pid}
    holders = data.get("holders") or []
    # a holder with only copies of the main server's own socket (a fork that outlived its parent)
    # is no second server; ``free`` ends it after the stop (remote/host/port.py ``main_socket``)
    strangers = [h for h in holders if not h.get("main") and not h.get("main_socket")]
    if strangers:
        raise TaskFailed(
            f"port {port} is answered by process(es) that are not {unit}'s main server (MainPID {pid}) at {what}: "
            + "; ".join(f"{h.get('pid')} ({str(h.get('cmdline'))[:160]})" for h in strangers)
            + ": a leaked server would answer in its place", {"holders": holders, "main_pid": pid})
    if not holders:
        raise TaskFailed(f"nothing listens on port {port} although the server answered ({what}); "
                         f"{unit}'s main process is {pid}", {"main_pid": pid})
    return {"checked": True, "main_pid": pid, "listeners": [h.get("pid") for h in holders]}
