"""Tasks ``rollback_select`` and ``rollback_restore``: undo a run from the host's own records.

The target is ``--to RUN_ID`` or, by default, the most recent run on the host that
changed files and was not already restored (a rollback is itself a run, so rolling
back twice returns to the tuned state). The restore is recorded on the host as a new
run (this run's id) with its own backups, so it can be rolled back too.
"""

from __future__ import annotations

from remote.protocol import CONFIGS_DROPIN_NAME

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..host.records import records
from ..host.servers import meet, rollback_disagreement, server_refusal
from ..records.host import record_state


@task("rollback_select", check_mode=READ_ONLY, sets=("orch_rollback_target",))
def rollback_select(ctx, to: str | None = None) -> TaskResult:
    """Pick the run to undo (``orch_rollback_target``): ``to`` (a run id), or the newest run on the
    host that changed files and was not restored already. Skipped when there is none.

    A rank of a multi-node server is refused first, before anything changes, when the
    server's ranks are not all among the run's hosts or disagree (:func:`server_refusal`):
    the ranks are rolled back together (docs/multi-node.md). Its ranks then meet and compare the
    runs they chose: ranks that would undo different runs, or a rank with nothing to undo beside
    ranks with a run, fail every rank here, naming each rank and its run
    (:func:`orchestrator.host.servers.rollback_disagreement`), before any rank stops."""
    why_not = server_refusal(ctx, "roll back")
    if why_not:
        raise TaskFailed(why_not)
    runs = [r for r in records(ctx).runs() if r.get("run_id") != ctx.options.run_id]
    target = None
    if to:
        match = [r for r in runs if r.get("run_id") == to]
        if not match:
            raise TaskFailed(f"run {to} not found on this host (known: {', '.join(r['run_id'] for r in runs[:5]) or 'none'})")
        target = match[0]
    else:
        cands = [r for r in runs if r.get("changed") and not r.get("restores")
                 and record_state(r) not in ("restored", "failed")]
        target = cands[0] if cands else None
    if target is not None:
        target = _with_sub_run(target, runs, explicit=bool(to))
        target = dict(target, runner_change=_runner_change(target))
    group = ctx.facts.server_group
    if group is not None:
        # every rank must undo the same run, checked before any rank stops (docs/multi-node.md)
        seen = meet(ctx, "rollback: run chosen", value=target["run_id"] if target else None)
        why_not = rollback_disagreement(group, seen)
        if why_not:
            raise TaskFailed(why_not)
    if target is None:
        return TaskResult.skipped("no run on this host changed files; nothing to roll back")
    files = ", ".join(c.get("path", "").rsplit("/", 1)[-1] for c in target.get("changed") or [])
    if target.get("linked"):
        files += f" (and the Triton files of its sub-run {', '.join(target['linked'])})"
    return TaskResult.ok(f"will undo run {target['run_id']} ({target.get('action')}): {files}",
                         facts={"orch_rollback_target": target}, target=target)




def _runner_change(target: dict) -> bool:
    """Whether run ``target`` changed the unit's MoE runner (a runner trial's drop-in or the unit's own
    file): its rollback then proves the runner that comes up and puts FlashInfer's autotune cache
    back; a run whose drop-in only gives the engine's config-dir variable (with its config files in
    a sub-run) is proven by the configs its start loads instead."""
    if target.get("unit_file"):
        return True
    if not str(target.get("dest_dir") or "").endswith(".service.d"):
        return False
    names = {str(c.get("path") or "").rsplit("/", 1)[-1] for c in target.get("changed") or []}
    return not names or names != {CONFIGS_DROPIN_NAME}


def _undone(r: dict) -> bool:
    return bool(r.get("changed")) and record_state(r) not in ("restored", "failed")


def _with_sub_run(target: dict, runs: list[dict], explicit: bool) -> dict:
    """A runner trial that kept Triton on files it tuned changed two folders, one manifest each: the
    run (the drop-in) and its sub-run ``RUN.triton`` (the Triton files,
    :func:`orchestrator.host.runner_trial.triton_subrun`). Undo them together: the run's record with
    ``linked`` naming the sub-run, also when the sub-run was picked by default and its run changed
    the drop-in. A sub-run named with ``--to`` (``explicit``) is undone alone."""
    from remote.protocol import parent_run

    rid = target.get("run_id") or ""
    parent = parent_run(rid)
    if parent != rid:
        owner = next((r for r in runs if r.get("run_id") == parent and _undone(r)), None)
        if explicit or owner is None:
            return target
        target, rid = owner, parent
    subs = [r["run_id"] for r in runs if r.get("run_id") != rid and parent_run(r.get("run_id") or "") == rid
            and _undone(r)]
    return dict(target, linked=subs) if subs else target


@task("rollback_restore", sets=("orch_restored_paths", "orch_deleted_paths"))
def rollback_restore(ctx, run_id: str, linked: list | None = None) -> TaskResult:
    """Restore the files run ``run_id`` replaced (``orch_rollback_target.run_id``), recorded on the
    host as this run (so a rollback can be rolled back); ``linked``: sub-runs of ``run_id`` undone with
    it (``orch_rollback_target.linked``: a runner trial's Triton files), each recorded as a sub-run
    of this run. Sets ``orch_restored_paths`` (files put
    back) and ``orch_deleted_paths`` (files that did not exist before and were removed); for a
    container unit, as the server sees them (through its bind mounts)."""
    data = ctx.payload.call("restore", ["--run-id", run_id, "--state-dir", ctx.payload.state_dir,
                                        "--as-run-id", ctx.options.run_id], timeout=300)
    files = list(data.get("files") or [])
    for sub in linked or []:  # a runner trial's Triton files: recorded as this run's own sub-run
        mine = ctx.options.run_id + sub[len(run_id):] if sub.startswith(run_id) else ctx.options.run_id + ".triton"
        ctx.run.sub_runs.append(mine)
        got = ctx.payload.call("restore", ["--run-id", sub, "--state-dir", ctx.payload.state_dir,
                                           "--as-run-id", mine], timeout=300)
        files += got.get("files") or []
    restored = [f["path"] for f in files if f.get("action") in ("restored", "unchanged") and f.get("sha256")]
    deleted = [f["path"] for f in files if f.get("action") == "deleted"]
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        # files written on the host through a bind mount: the server's log names them as it sees them
        restored = [unit.container.container_path(p) or p for p in restored]
        deleted = [unit.container.container_path(p) or p for p in deleted]
    ctx.run.install_attempted = True  # this run's own record can be restored by rescue
    summary = ctx.run.summary
    summary.rolled_back, summary.installed, summary.deleted = run_id, restored, deleted
    return TaskResult.changed(f"restored the state before {run_id}",
                              facts={"orch_restored_paths": restored, "orch_deleted_paths": deleted}, **data)
