"""Tasks on the host's own run record and lock (``<state_dir>/runs/<run_id>/``, ``lock.json``).

``lock``: acquire (a second controller is refused with the holder's run id),
heartbeat or release the host lock. While the run holds the lock, a background thread
renews its heartbeat every ``orch_lock_heartbeat_interval`` seconds (:class:`LockHeartbeat`),
so a live run is never mistaken for a stale one during a tune of hours.
``host_state``: record the step this run reached on the host (``started``, ``stopped``,
``installed``, ``completed``, ``restored``, ``failed``) so ``orch runs`` and ``orch recover``
read the truth from the hosts. A run whose record still says ``started`` when it releases
the lock, and which never stopped the unit, ended before changing anything: the release
records it ``failed``.
"""

from __future__ import annotations

import json
import threading

from ..engine.results import TaskFailed, TaskResult

#: default seconds between two heartbeats of a held lock (``orch_lock_heartbeat_interval``)
DEFAULT_HEARTBEAT_S = 60.0


class LockHeartbeat:
    """Renews this run's host lock (payload ``lock heartbeat --run-id``) every ``interval``
    seconds from a daemon thread, until :meth:`stop`.

    ``ctx``: the host's context (its payload client and run id). A renewal that fails (link
    down, timeout) is recorded as the event ``lock_heartbeat_failed`` and retried at the next
    tick. A lock found gone or held by another run (``not_found``/``locked``: someone broke it)
    ends the heartbeats: event ``lock_lost`` and a warning line. ``beats`` counts the renewals.
    """

    def __init__(self, ctx, interval: float = DEFAULT_HEARTBEAT_S):
        if not interval > 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval!r}")
        self.ctx = ctx
        self.interval = float(interval)
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"orch-lock-heartbeat-{ctx.name}", daemon=True)

    def start(self) -> "LockHeartbeat":
        """Start the thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self, wait: float = 10.0) -> None:
        """Stop renewing; wait up to ``wait`` seconds for a renewal in flight to end."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)

    def _loop(self) -> None:
        from .payload import PayloadFailed

        ctx, pl = self.ctx, self.ctx.payload
        args = ["heartbeat", "--run-id", ctx.options.run_id, "--state-dir", pl.state_dir]
        while not self._stop.wait(self.interval):
            try:
                pl.call("lock", args, timeout=60)
                self.beats += 1
            except PayloadFailed as exc:
                if self._stop.is_set():
                    return
                if exc.kind in ("not_found", "locked"):
                    ctx.emit("lock_lost", error=exc.msg.splitlines()[0])
                    ctx.say(f"WARNING: this run no longer holds the host lock: {exc.msg.splitlines()[0]}")
                    return
                ctx.emit("lock_heartbeat_failed", error=exc.msg.splitlines()[0][:300])
            except Exception as exc:  # a lost link: the next tick tries again
                if self._stop.is_set():
                    return
                ctx.emit("lock_heartbeat_failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")


def start_heartbeat(ctx, interval: float | None = None) -> LockHeartbeat:
    """Start a :class:`LockHeartbeat` for ``ctx`` (``interval`` s, default the variable
    ``orch_lock_heartbeat_interval`` or :data:`DEFAULT_HEARTBEAT_S`); any earlier one of this
    host is stopped first. It is stopped by :func:`stop_heartbeat` (lock release) and, at the
    latest, when the host's play ends (``on_host_done``)."""
    stop_heartbeat(ctx)
    if interval is None:
        interval = ctx.vars.get("orch_lock_heartbeat_interval") or DEFAULT_HEARTBEAT_S
    hb = LockHeartbeat(ctx, float(interval)).start()
    ctx.state["lock_heartbeat"] = hb
    hooks = ctx.state.setdefault("on_host_done", [])
    if stop_heartbeat not in hooks:
        hooks.append(stop_heartbeat)
    return hb


def stop_heartbeat(ctx) -> None:
    """Stop this host's lock heartbeat thread, if one runs."""
    hb = ctx.state.pop("lock_heartbeat", None)
    if hb is not None:
        hb.stop()


def lock(ctx, action: str = "acquire", stale_after: float = 600, force: bool = False,
         heartbeat_interval: float | None = None) -> TaskResult:
    """Acquire, heartbeat or release this run's lock on the host.

    ``stale_after`` (s): age of the last heartbeat after which a lock counts as stale.
    After ``acquire``, the heartbeat is renewed every ``heartbeat_interval`` s (default
    ``orch_lock_heartbeat_interval``, 60) until ``release``. Raises :class:`TaskFailed` when
    another run holds the lock (with the holder and how to recover).
    """
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    args = [action, "--run-id", ctx.options.run_id, "--state-dir", ctx.payload.state_dir]
    if action == "acquire":
        from .recover import controller_id

        args += ["--controller", controller_id(), "--stale-after", str(stale_after)]
    if action == "break" and force:
        args.append("--force")
    if action == "release":
        stop_heartbeat(ctx)
        _finish_untouched_record(ctx)
    try:
        data = ctx.payload.call("lock", args, timeout=60)
    except TaskFailed as exc:
        holder = ((exc.data.get("detail") or {}).get("lock") or {}) if action == "acquire" else {}
        if not holder:
            raise
        from .recover import holder_gone, recover_hint

        hint = ("its controller is gone: " if holder_gone(holder.get("controller"))
                else "if that run is no longer running: ") + recover_hint(ctx) + " (add --break-lock if it refuses)"
        raise TaskFailed(f"{exc.msg}; {hint}", exc.data) from None
    if action == "acquire":
        ctx.state["locked"] = True
        start_heartbeat(ctx, heartbeat_interval)
    if action == "release":
        ctx.state["locked"] = False
    return TaskResult.ok(f"lock {action}", **data)


def _finish_untouched_record(ctx) -> None:
    """Before the lock is released: a record still at ``started`` of a run that never stopped
    the unit (it ended in the benchmark before, or was interrupted there) becomes ``failed``,
    so no record stays "in progress" forever. A run that stopped the unit keeps its state:
    if its rescue could not finish, ``orch recover`` must still see it."""
    if ctx.state.get("host_state") != "started" or ctx.state.get("stopped_by_orch"):
        return
    try:
        host_state(ctx, "failed", action=ctx.state.get("host_action", "tune"),
                   note="ended before the unit was stopped; nothing on the host was changed")
    except Exception as exc:  # the release must still happen
        ctx.emit("host_record_failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")


def host_state(ctx, state: str, action: str = "tune", note: str | None = None) -> TaskResult:
    """Record ``state`` for this run on the host (with the summary so far and ``note``)."""
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    data = {"action": action, "summary": ctx.state.get("summary", {})}
    if note:
        data["note"] = note
    ctx.payload.call("runs", ["--set-state", ctx.options.run_id, state, "--data", json.dumps(data, default=str),
                              "--state-dir", ctx.payload.state_dir], timeout=60)
    ctx.state["host_state"] = state
    ctx.state["host_action"] = action
    return TaskResult.ok(f"host record: {state}")
