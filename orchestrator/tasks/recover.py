"""Tasks for runs a controller left unfinished (killed with SIGKILL, machine lost, ...).

A run records on the host how far it got (``<state_dir>/runs/<id>/state.json``, payload
``runs --set-state``) and holds the host lock (``lock.json``) until its ``always`` step
releases it. A controller that dies without running those steps leaves the lock and a
state other than ``completed``/``restored``/``failed``/``rolled_back`` behind.

(``check_unfinished``, in :mod:`orchestrator.tasks.records`, refuses a tune while such a run
exists, naming it and offering ``orch recover``.)

- ``recover_select`` (``recover.yaml``): find the unfinished runs, take the lock over from
  a dead holder (its pid on this machine is gone, or ``--break-lock``), stop the leftover
  payload processes of those runs (their transient unit ``orch-tune-<run_id>``, found by name,
  and the processes tagged ``ORCH_TAG=<run_id>.`` of a tune run in the SSH session; nothing else).
- ``recover_restore``: put back the files of each unfinished run (payload ``restore``).
- ``recover_autotune_cache``: put FlashInfer's autotune cache back exactly as each unfinished run
  backed it up (payload ``runner_change --op cache-restore --exact``), with the unit stopped.
- ``recover_mark``: record ``restored`` for each once the unit runs again.
"""

from __future__ import annotations

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import AWARE, task
from ..host.container import end_payload_containers
from ..host.records import records, start_heartbeat
from ..host.servers import RankRecovery, meet, server_refusal, server_restart
from ..payload.client import PayloadFailed, stop_tagged
from ..payload.transient import RUNNING_STATES, stop_unit, unit_name
from ..records.host import holder_gone


@task("recover_select", check_mode=AWARE, sets=("orch_unfinished", "orch_recover_restart"))
def recover_select(ctx, break_lock: bool = False, stale_after: float = 600,
                   heartbeat_interval: float | None = None) -> TaskResult:
    """Find unfinished runs (``orch_unfinished``) and take the host lock for this run.

    A lock held by another run is broken when its holder is gone (:func:`holder_gone`) or with
    ``break_lock`` (``--break-lock``); else the task fails naming the holder (and its heartbeat
    age when older than ``stale_after`` s). Then the leftover ``tune``/``bench`` payload processes
    of the unfinished runs are stopped: the transient unit ``orch-tune-<run_id>.service`` by name
    (stopped if it runs, unloaded if it ended: ``tune_unit_stopped``/``tune_unit_collected``), and
    the commands tagged ``ORCH_TAG=<run_id>.`` (a tune run in the SSH session); other processes, such as
    a payload started by hand or by another run, are left alone; a container unit's payload
    containers of those runs are ended through the runtime. The lock's heartbeat is renewed
    every ``heartbeat_interval`` s while this run holds it
    (:func:`orchestrator.host.records.start_heartbeat`). Under ``--check`` it only reports.
    A rank of a multi-node server is refused first, before the lock is taken, when the server's
    ranks are not all among the run's hosts or disagree (:func:`server_refusal`): its ranks are
    started together (docs/multi-node.md). Its ranks then meet, before any of them breaks a lock,
    and share their unfinished runs and unit states; ``orch_recover_restart`` is set on every rank
    when the server must be restarted as a whole (:func:`orchestrator.host.servers.server_restart`):
    recover.yaml then stops every rank (rank 0 first), also one with nothing to recover or one that
    still runs, and starts them together. Otherwise ``orch_recover_restart`` is False.
    """
    why_not = server_refusal(ctx, "recover")
    if why_not:
        raise TaskFailed(why_not)
    rec = records(ctx)
    st = rec.lock_status(stale_after)
    lk = st.get("lock") or {}
    broken = None
    taken = st.get("held") and lk.get("run_id") != ctx.options.run_id
    gone = False
    if taken:
        gone = holder_gone(lk.get("controller"))
        if not (gone or break_lock):
            # stale is only a hint: a controller on another machine does not heartbeat during a long tune
            stale = f", no heartbeat for {st.get('heartbeat_age_s') or 0:.0f} s" if st.get("stale") else ""
            raise TaskFailed(f"host lock held by run {lk.get('run_id')} (controller {lk.get('controller')}"
                             f"{stale}), which may still be running; if it is gone, pass --break-lock")
    left = rec.unfinished(ctx.options.run_id, lk.get("run_id") if st.get("held") else None)
    restart = None
    if ctx.facts.server_group is not None:
        # the ranks decide together, before any of them changes anything (docs/multi-node.md)
        unit = ctx.facts.unit
        seen = meet(ctx, "recover: unfinished runs found",
                    value=RankRecovery(runs=[f"{r['run_id']} ({r['state']})" for r in left],
                                       past_start=any(r["state"] != "started" for r in left),
                                       autotune_cache=any(r.get("autotune_cache") for r in left),
                                       active_state=unit.active_state if unit is not None else "unknown"))
        restart = server_restart(seen)
    if taken:
        if ctx.check:
            broken = lk.get("run_id")
        else:
            rec.break_lock(ctx.options.run_id, lk.get("run_id"), stale_after)
            broken = lk.get("run_id") or "corrupt lock"
            ctx.emit("lock_broken", holder=lk.get("run_id"), controller=lk.get("controller"),
                     why="holder gone" if gone else "--break-lock")
    if not ctx.check:
        rec.acquire(ctx.options.run_id, stale_after)
        ctx.run.locked = True
        start_heartbeat(ctx, heartbeat_interval)
    units: list[str] = []
    if left and not ctx.check:
        # the dead controller's payload may still run (tune, bench); we hold the lock now
        for r in left:
            try:
                unit = unit_name(r["run_id"])
                stop_tagged(ctx.connection, r["run_id"])
            except ValueError as exc:  # a record whose name is no run id: nothing of it is signalled
                ctx.emit("recover_stop_skipped", run_id=r["run_id"], error=str(exc))
                continue
            # its tuner's transient unit, found by name (orchestrator.payload.transient)
            st = stop_unit(ctx.connection, unit)
            if st is not None:
                running = st.get("ActiveState") in RUNNING_STATES
                ctx.emit("tune_unit_stopped" if running else "tune_unit_collected", run_id=r["run_id"], unit=unit,
                         active_state=st.get("ActiveState"), result=st.get("Result"))
                units.append(f"{'stopped' if running else 'collected'} {unit} ({st.get('Result') or '?'})")
            unit = ctx.facts.unit
            if unit is not None and unit.container is not None:
                # its tuner in the unit's image: ended through the runtime, never by host PID
                ended = end_payload_containers(ctx.connection, unit.container, r["run_id"], 30)
                if ended:
                    ctx.emit("payload_containers_ended", run_id=r["run_id"], containers=ended)
    desc = ", ".join(f"{r['run_id']} ({r['state']})" for r in left) or "none"
    msg = f"unfinished runs: {desc}" + (f"; broke the lock of {broken}" if broken else "") \
        + "".join(f"; {u}" for u in units) + (f"; every rank is restarted: {restart}" if restart else "")
    return TaskResult.ok(msg, facts={"orch_unfinished": left, "orch_recover_restart": bool(restart)},
                         unfinished=left, broken_lock=broken, tune_units=units, server_restart=restart)


@task("recover_restore")
def recover_restore(ctx, runs: list[dict]) -> TaskResult:
    """Restore the files of every unfinished run in ``runs`` (``orch_unfinished``; a run that
    installed nothing has none), each from the host's own backup and manifest (payload ``restore``)."""
    pl = ctx.payload
    done = []
    for r in runs:
        try:
            data = pl.call("restore", ["--run-id", r["run_id"], "--state-dir", pl.state_dir, "--ignore-lock"],
                           timeout=300)
        except PayloadFailed as exc:
            if exc.kind != "not_found":
                raise
            done.append({"run_id": r["run_id"], "files": [], "note": "installed nothing"})
            continue
        done.append({"run_id": r["run_id"], "files": data.get("files") or []})
        ctx.emit("configs_restored", run_id=r["run_id"], files=data.get("files"))
    ctx.run.summary.recovered = done
    n = sum(1 for d in done for f in d["files"] if f.get("action") != "unchanged")
    if not runs:  # a rank restarted with its server, with nothing of its own to put back
        return TaskResult.ok("no unfinished run on this host: nothing to restore", runs=done)
    return TaskResult.changed(f"restored {n} file(s) of {len(done)} run(s)", runs=done)


@task("recover_autotune_cache")
def recover_autotune_cache(ctx, runs: list[dict]) -> TaskResult:
    """Put back FlashInfer's autotune cache (``$SGLANG_CACHE_DIR/flashinfer/autotune``) of every run
    in ``runs`` (``orch_unfinished``) that backed it up (its record's ``autotune_cache``: the
    folder), byte-identical to the backup: files that differ or are missing are written back and
    files created since are removed (payload ``runner_change --op cache-restore --exact``). Unlike
    a rollback, which keeps newer files, this is right here: the unfinished run held the host lock,
    so every start since its backup (each candidate of a runner trial, with its own autotune pass)
    was its own. Runs are taken newest first, so the oldest backup is the state left. Raises
    ``PayloadFailed`` for a damaged backup (nothing of that file written)."""
    done = []
    for r in runs:
        folder = r.get("autotune_cache")
        if not folder:
            continue
        data = ctx.payload.call("runner_change", ["--op", "cache-restore", "--run-id", r["run_id"], "--state-dir",
                                                  ctx.payload.state_dir, "--cache-dir", str(folder), "--exact"],
                                timeout=300)
        files = [f for f in data.get("files") or [] if f.get("action") != "unchanged"]
        done.append({"run_id": r["run_id"], "dir": folder, "files": files})
        ctx.emit("autotune_cache_restored", run_id=r["run_id"], dir=folder, files=files)
    ctx.run.summary.autotune_cache = {"recovered": done}
    n = sum(len(d["files"]) for d in done)
    result = TaskResult.changed if n else TaskResult.ok
    return result(f"autotune cache of {len(done)} run(s): {n} file(s) put back or removed", runs=done)


@task("recover_mark")
def recover_mark(ctx, runs: list[dict]) -> TaskResult:
    """Record state ``restored`` (with ``recovered_by``) for every run in ``runs`` (``orch_unfinished``)."""
    rec = records(ctx)
    for r in runs:
        rec.set_state(r["run_id"], "restored", {"recovered_by": ctx.options.run_id})
    return TaskResult.changed(f"marked {len(runs)} run(s) restored")
