"""The host's run records and lock, through this run's payload client, and the lock's heartbeat
(the lock and run_state tasks, recover, rollback, doctor)."""

from __future__ import annotations

from ..records.host import DEFAULT_HEARTBEAT_S, HostRecords, LockHeartbeat


def records(ctx) -> HostRecords:
    """The host's run records and lock, through this run's payload client."""
    return HostRecords(ctx.payload)


def start_heartbeat(ctx, interval: float | None = None) -> LockHeartbeat:
    """Start renewing this run's lock on the host every ``interval`` s (default
    :data:`~orchestrator.records.host.DEFAULT_HEARTBEAT_S`); an earlier heartbeat of this host is
    stopped first. It stops at the lock's release (:func:`stop_heartbeat`) and, at the latest,
    when the host's play ends."""
    stop_heartbeat(ctx)

    def lost(text: str) -> None:
        ctx.emit("lock_lost", error=text)
        ctx.say(f"WARNING: this run no longer holds the host lock: {text}")

    hb = LockHeartbeat(records(ctx), ctx.options.run_id, float(interval or DEFAULT_HEARTBEAT_S), name=ctx.name,
                       on_lost=lost, on_error=lambda text: ctx.emit("lock_heartbeat_failed", error=text))
    ctx.run.heartbeat = hb.start()
    ctx.run.when_done(stop_heartbeat)
    return hb


def stop_heartbeat(ctx) -> None:
    """Stop this host's lock heartbeat thread, if one runs."""
    hb, ctx.run.heartbeat = ctx.run.heartbeat, None
    if hb is not None:
        hb.stop()
