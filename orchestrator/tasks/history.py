"""Task ``history``: read the host's own run records (``python -m remote runs``)."""

from __future__ import annotations

from ..engine.results import TaskResult


def history(ctx, limit: int = 0) -> TaskResult:
    """Store the host's runs (newest first) in the host summary as ``runs``."""
    args = ["--state-dir", ctx.payload.state_dir]
    if limit:
        args += ["--limit", str(int(limit))]
    runs = ctx.payload.call("runs", args, timeout=60).get("runs") or []
    ctx.state.setdefault("summary", {})["runs"] = runs
    return TaskResult.ok(f"{len(runs)} run(s) recorded on the host", runs=runs)


history.check_safe = True
