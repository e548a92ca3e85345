"""Tasks on the host's own run record and lock (``<state_dir>/runs/<run_id>/``, ``lock.json``).

``lock``: acquire (a second controller is refused with the holder's run id),
heartbeat or release the host lock. ``host_state``: record the step this run reached
on the host (``started``, ``stopped``, ``installed``, ``completed``, ``restored``,
``failed``) so ``orch runs`` and ``orch recover`` read the truth from the hosts.
"""

from __future__ import annotations

import json

from ..engine.results import TaskFailed, TaskResult


def lock(ctx, action: str = "acquire", stale_after: float = 600, force: bool = False) -> TaskResult:
    """Acquire, heartbeat or release this run's lock on the host."""
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    args = [action, "--run-id", ctx.options.run_id, "--state-dir", ctx.payload.state_dir]
    if action == "acquire":
        from .recover import controller_id

        args += ["--controller", controller_id(), "--stale-after", str(stale_after)]
    if action == "break" and force:
        args.append("--force")
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
    if action == "release":
        ctx.state["locked"] = False
    return TaskResult.ok(f"lock {action}", **data)


def host_state(ctx, state: str, action: str = "tune") -> TaskResult:
    """Record ``state`` for this run on the host (with the summary so far)."""
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    data = {"action": action, "summary": ctx.state.get("summary", {})}
    ctx.payload.call("runs", ["--set-state", ctx.options.run_id, state, "--data", json.dumps(data, default=str),
                              "--state-dir", ctx.payload.state_dir], timeout=60)
    ctx.state["host_state"] = state
    return TaskResult.ok(f"host record: {state}")
