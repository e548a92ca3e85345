"""The host's dead-man of a run, seen from the controller (issue 32 rows 1 and 2): how short its
deadline may be, and stopping it once the run is done with the host. Arming it is the ``deadman``
task (orchestrator/tasks/deadman.py); the dead-man itself is the payload's ``deadman``
(remote/host/deadman.py)."""

from __future__ import annotations

from ..connection.ssh import ALIVE_COUNT_MAX, KEEPALIVE_S
from ..inventory.variables import var
from ..payload.transient import stop_unit

#: seconds the controller may take to call a dead link dead (a keep-alive answered by nobody:
#: orchestrator.connection.ssh.ServerAlive closes it after ALIVE_COUNT_MAX intervals)
NOTICE_S = KEEPALIVE_S * (ALIVE_COUNT_MAX + 1)


def shortest_deadline(variables) -> float:
    """The least ``orch_host_deadline`` (s) that a host with ``variables`` may have: a controller
    still within its reconnect window must never find its host restored under it. Pure."""
    return (float(var(variables, "orch_reconnect_timeout")) + float(var(variables, "orch_lock_heartbeat_interval"))
            + float(var(variables, "orch_connect_timeout")) + NOTICE_S)


def disarm(ctx) -> None:
    """Stop this run's dead-man unit once the run released its lock (it ends by itself then; this
    saves its next look). Nothing when it was not armed, the run still holds the lock, or the
    controller gave up on the host: then the dead-man is what restores it."""
    dm, conn = ctx.run.deadman, ctx.connection
    if not dm or conn is None or ctx.run.link_given_up or ctx.run.locked:
        return
    ctx.run.deadman = None
    try:
        stop_unit(conn, dm["unit"])
    except Exception as exc:  # it ends by itself: a failure here is only noted
        ctx.emit("deadman_disarm_failed", unit=dm["unit"], error=f"{type(exc).__name__}: {str(exc)[:200]}")
