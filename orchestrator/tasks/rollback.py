"""Tasks ``rollback_select`` and ``rollback_restore``: undo a run from the host's own records.

The target is ``--to RUN_ID`` or, by default, the most recent run on the host that
changed files and was not already restored (a rollback is itself a run, so rolling
back twice returns to the tuned state). The restore is recorded on the host as a new
run (this run's id) with its own backups, so it can be rolled back too.
"""

from __future__ import annotations

from ..engine.results import TaskFailed, TaskResult


def rollback_select(ctx, to: str | None = None) -> TaskResult:
    """Pick the run to undo; store it as ``orch_rollback_target``."""
    runs = (ctx.payload.call("runs", ["--state-dir", ctx.payload.state_dir], timeout=60).get("runs")) or []
    runs = [r for r in runs if r.get("run_id") != ctx.options.run_id]
    if to:
        match = [r for r in runs if r.get("run_id") == to]
        if not match:
            raise TaskFailed(f"run {to} not found on this host (known: {', '.join(r['run_id'] for r in runs[:5]) or 'none'})")
        target = match[0]
    else:
        cands = [r for r in runs if r.get("changed") and not r.get("restores")
                 and ((r.get("state") or {}).get("state") not in ("restored", "failed"))]
        if not cands:
            return TaskResult.skipped("no run on this host changed files; nothing to roll back")
        target = cands[0]
    ctx.vars["orch_rollback_target"] = target
    files = ", ".join(c.get("path", "").rsplit("/", 1)[-1] for c in target.get("changed") or [])
    return TaskResult.ok(f"will undo run {target['run_id']} ({target.get('action')}): {files}", target=target)


rollback_select.check_safe = True


def rollback_restore(ctx) -> TaskResult:
    """Restore the target run's earlier files, recorded as this run; set ``orch_restored_paths``."""
    target = ctx.vars["orch_rollback_target"]
    data = ctx.payload.call("restore", ["--run-id", target["run_id"], "--state-dir", ctx.payload.state_dir,
                                        "--as-run-id", ctx.options.run_id], timeout=300)
    files = data.get("files") or []
    ctx.vars["orch_restored_paths"] = [f["path"] for f in files if f.get("action") in ("restored", "unchanged")
                                       and f.get("sha256")]
    ctx.vars["orch_deleted_paths"] = [f["path"] for f in files if f.get("action") == "deleted"]
    ctx.state["install_attempted"] = True  # this run's own record can be restored by rescue
    summary = ctx.state.setdefault("summary", {})
    summary["rolled_back"] = target["run_id"]
    summary["installed"] = ctx.vars["orch_restored_paths"]
    summary["deleted"] = ctx.vars["orch_deleted_paths"]
    return TaskResult.changed(f"restored the state before {target['run_id']}", **data)
