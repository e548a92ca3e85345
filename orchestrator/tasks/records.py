"""Tasks on the host's own run records and lock (``<state_dir>/runs/<run_id>/``, ``lock.json``).

- ``lock``: acquire (a second controller is refused with the holder's run id and how to
  recover), heartbeat or release the host lock. While the run holds it, a background thread
  renews its heartbeat every ``heartbeat_interval`` seconds
  (:class:`orchestrator.records.host.LockHeartbeat`), so a live run is never mistaken for a
  stale one during a tune of hours.
- ``run_state``: record the step this run reached on the host (``started``, ``stopped``,
  ``installed``, ``completed``, ``restored``, ``failed``) so ``orch runs`` and ``orch recover``
  read the truth from the hosts. A run whose record still says ``started`` when it releases the
  lock, and which never stopped the unit, ended before changing anything: the release records
  it ``failed``.
- ``runs``: read the host's run records (``orch runs``).
- ``check_unfinished``: refuse to start while a run a dead controller left unfinished exists.
"""

from __future__ import annotations

from typing import Literal

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..host.deadman import disarm
from ..host.records import records, start_heartbeat, stop_heartbeat
from ..records.host import holder_gone


def recover_hint(ctx) -> str:
    """The command that brings this host back (``orch recover``)."""
    return f"run `orch recover INVENTORY --limit {ctx.name} --service {ctx.vars.get('service') or 'UNIT'}`"


@task("lock", rerun=True)
def lock(ctx, action: Literal["acquire", "heartbeat", "release"], stale_after: float = 600,
         heartbeat_interval: float | None = None) -> TaskResult:
    """Acquire, renew or release this run's lock on the host.

    ``stale_after`` (s): age of the last heartbeat after which a lock counts as stale (a hint in
    messages; a lock is never broken for it). After ``acquire``, the heartbeat is renewed every
    ``heartbeat_interval`` s until ``release``. Fails when another run holds the lock, naming the
    holder and how to recover.
    """
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    rec = records(ctx)
    rid = ctx.options.run_id
    if action == "release":
        stop_heartbeat(ctx)
        _finish_untouched_record(ctx)
        try:
            data = rec.release(rid)
        except TaskFailed as exc:
            if ctx.run.locked:
                raise
            # this run never took the lock here (refused at acquire: another run, or a state
            # folder of another host): nothing of ours to release, and nobody else's to touch
            return TaskResult.ok(f"no lock of this run to release ({exc.msg[:200]})")
        ctx.run.locked = False
        disarm(ctx)  # the run is done with the host: its dead-man has nothing to guard
        return TaskResult.ok("lock release", **data)
    if action == "heartbeat":
        return TaskResult.ok("lock heartbeat", **rec.heartbeat(rid))
    try:
        data = rec.acquire(rid, stale_after)
    except TaskFailed as exc:
        holder = (exc.data.get("detail") or {}).get("lock") or {}
        if not holder:
            raise
        hint = ("its controller is gone: " if holder_gone(holder.get("controller"))
                else "if that run is no longer running: ") + recover_hint(ctx) + " (add --break-lock if it refuses)"
        raise TaskFailed(f"{exc.msg}; {hint}", exc.data) from None
    ctx.run.locked = True
    start_heartbeat(ctx, heartbeat_interval)
    return TaskResult.ok("lock acquire", **data)


def _finish_untouched_record(ctx) -> None:
    """Before the lock is released: a record still at ``started`` of a run that never stopped
    the unit (it ended in the benchmark before, or was interrupted there) becomes ``failed``,
    so no record stays "in progress" forever. A run that stopped the unit keeps its state:
    if its rescue could not finish, ``orch recover`` must still see it."""
    if ctx.run.record_state != "started" or ctx.run.stopped_by_orch:
        return
    try:
        _set_state(ctx, "failed", ctx.run.record_action,
                   "ended before the unit was stopped; nothing on the host was changed")
    except Exception as exc:  # the release must still happen
        ctx.emit("host_record_failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")


def _set_state(ctx, state: str, action: str, note: str | None) -> None:
    data = {"action": action, "summary": ctx.run.summary.to_dict()}
    if note:
        data["note"] = note
    records(ctx).set_state(ctx.options.run_id, state, data)
    for sub in ctx.run.sub_runs:  # its own manifest, the same state: recover and rollback see both
        records(ctx).set_state(sub, state, dict(data, sub_run_of=ctx.options.run_id))
    ctx.run.record_state = state
    ctx.run.record_action = action


@task("run_state", rerun=True)
def run_state(ctx, state: Literal["started", "stopped", "installed", "completed", "restored", "failed"],
              action: Literal["tune", "rollback", "recover", "runner"] = "tune", note: str | None = None) -> TaskResult:
    """Record ``state`` for this run in the host's run record (with the summary so far and ``note``)."""
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    _set_state(ctx, state, action, note)
    return TaskResult.ok(f"host record: {state}")


@task("runs", rerun=True, check_mode=READ_ONLY)
def runs(ctx, limit: int = 0) -> TaskResult:
    """Read the host's run records (newest first; ``limit`` 0: all) into the host summary as ``runs``."""
    found = records(ctx).runs(limit)
    ctx.run.summary.runs = found
    return TaskResult.ok(f"{len(found)} run(s) recorded on the host", runs=found)


@task("check_unfinished", rerun=True, check_mode=READ_ONLY)
def check_unfinished(ctx) -> TaskResult:
    """Fail when the host has a run left unfinished by a controller that is gone (it stopped the
    unit or still holds the lock), naming it and offering ``orch recover``."""
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    rec = records(ctx)
    left = rec.unfinished(ctx.options.run_id, rec.holder())
    if left:
        desc = ", ".join(f"{r['run_id']} (state {r['state']})" for r in left)
        raise TaskFailed(f"the host has an unfinished orch run: {desc}; its controller stopped before "
                         f"restoring the host. {recover_hint(ctx)} first", {"unfinished": left})
    return TaskResult.ok("no unfinished run on the host")
