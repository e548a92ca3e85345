"""Task ``deadman``: arm the host's dead-man before the unit is stopped (issue 32 rows 1 and 2).

A controller that dies (SIGKILL, its machine lost) or loses the link for good leaves a host whose
unit it stopped down until an operator runs ``orch recover``. The dead-man is the host's own
guard: the payload ``deadman`` (remote/host/deadman.py) runs as the transient unit
``orch-deadman-<run id>.service`` and watches the run's host lock, whose heartbeat this
controller renews every ``orch_lock_heartbeat_interval`` s (:class:`orchestrator.records.host.LockHeartbeat`).
When no heartbeat came for ``orch_host_deadline`` s it stops the run's tune, puts the earlier
files back and starts the unit, and records what it did in the run record; it ends by itself once
the run released its lock or recorded a final state (the ``lock`` task's release also stops it).

Its deadline must leave a controller that is still reconnecting time to give up first: past
``orch_reconnect_timeout`` (the engine's reconnect window), the heartbeat interval, the connect
timeout and :data:`orchestrator.host.deadman.NOTICE_S` (what the keep-alives take to call a
silent link dead). A shorter one is refused before anything is stopped, naming the variables.
"""

from __future__ import annotations

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import task
from ..host.deadman import NOTICE_S, disarm, shortest_deadline
from ..payload.transient import UnitUnavailable, unit_name


@task("deadman", rerun=True, aliases={"unit": "name", "service": "name"})
def deadman(ctx, name: str, enabled: bool = True, deadline: float = 900) -> TaskResult:
    """Arm the host's dead-man of this run (``orch-deadman-<run id>``): when no controller has
    renewed the run's lock for ``deadline`` s (``orch_host_deadline``), the host stops the run's
    tune, puts the earlier configs back and starts the unit ``name`` by itself. ``enabled``:
    ``orch_host_deadman``. Fails, before anything is stopped, when ``deadline`` is not past the
    controller's own reconnect window (:func:`orchestrator.host.deadman.shortest_deadline`). Not
    armed (and said) for a unit of a user's own manager, a rank of a multi-node server (its ranks
    start together), or where ``systemd-run`` cannot start a unit: then only ``orch recover``
    restores a host this run leaves."""
    if not enabled:
        return TaskResult.skipped("orch_host_deadman is off")
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    least = shortest_deadline(ctx.vars)
    if float(deadline) <= least:
        raise TaskFailed(f"orch_host_deadline {deadline:g} s is too short: it must exceed orch_reconnect_timeout + "
                         f"orch_lock_heartbeat_interval + orch_connect_timeout + {NOTICE_S:g} s = {least:g} s, or "
                         "the host could restore itself under a controller that is still reconnecting")
    if ctx.facts.unit_handle(name).user_scope:
        ctx.emit("deadman_unavailable", why="a unit of a user's manager")
        return TaskResult.ok("no dead-man: the unit belongs to a user's own manager (`orch recover` restores a "
                             "host this run leaves)")
    if ctx.facts.server_group is not None:
        # its ranks start together, rank 0 first (docs/multi-node.md): one rank's host cannot do that alone
        ctx.emit("deadman_unavailable", why="a rank of a multi-node server")
        return TaskResult.ok("no dead-man: a rank of a multi-node server starts with its other ranks (`orch recover` "
                             "restores them together)")
    if ctx.run.deadman:
        return TaskResult.ok(f"{ctx.run.deadman['unit']} armed already")
    rid = ctx.options.run_id
    unit = unit_name(rid, "deadman")
    service = name if "." in name else f"{name}.service"
    args = ["--run-id", rid, "--unit", service, "--deadline", f"{float(deadline):g}",
            "--state-dir", ctx.payload.state_dir, "--tune-unit", unit_name(rid)]
    try:
        ctx.payload.start_unit("deadman", args, unit)
    except UnitUnavailable as exc:
        ctx.emit("deadman_unavailable", why=str(exc))
        return TaskResult.ok(f"no dead-man on this host ({exc}); `orch recover` restores a host this run leaves")
    ctx.run.deadman = {"unit": unit, "deadline_s": float(deadline)}
    ctx.run.when_done(disarm)
    ctx.emit("deadman_armed", unit=unit, deadline_s=float(deadline))
    return TaskResult.changed(f"{unit}: restores the earlier configs and starts {service} if no controller checks in "
                              f"for {float(deadline):g} s (orch_host_deadline)")

