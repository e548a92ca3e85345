"""Tasks for runs a controller left unfinished (killed with SIGKILL, machine lost, ...).

A run records on the host how far it got (``<state_dir>/runs/<id>/state.json``, payload
``runs --set-state``) and holds the host lock (``lock.json``) until its ``always`` step
releases it. A controller that dies without running those steps leaves the lock and a
state other than ``completed``/``restored``/``failed``/``rolled_back`` behind.

- ``check_unfinished`` (in ``tune.yaml`` after the lock): refuse to start while such a run
  exists, naming it and offering ``orch recover``.
- ``recover_select`` (``recover.yaml``): find the unfinished runs, take the lock over from
  a dead holder (its pid on this machine is gone, or ``--break-lock``), stop the leftover
  payload processes of those runs (tagged ``ORCH_TAG=<run_id>.``; nothing else).
- ``recover_restore``: put back the files of each unfinished run (payload ``restore``).
- ``recover_mark``: record ``restored`` for each once the unit runs again.
"""

from __future__ import annotations

import getpass
import os
import socket

from ..engine.results import TaskFailed, TaskResult
from .payload import PayloadFailed, stop_tagged

#: host run-record states of a run that ended (anything else was cut short)
FINISHED_STATES = ("completed", "restored", "failed", "rolled_back")


def controller_id() -> str:
    """``user@machine pid N``: who holds a host lock (shown to anyone refused by it)."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


def holder_gone(controller: str | None) -> bool:
    """True when ``controller`` (a :func:`controller_id` text) names a process of THIS machine
    that no longer exists. A holder on another machine, or an older text, is never judged gone."""
    if not isinstance(controller, str) or " pid " not in controller:
        return False
    who, _, pid = controller.rpartition(" pid ")
    if who.rpartition("@")[2] != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def lock_holder(ctx) -> str | None:
    """Run id holding the host lock (``None`` when free or corrupt)."""
    st = ctx.payload.call("lock", ["status", "--state-dir", ctx.payload.state_dir], timeout=60)
    return (st.get("lock") or {}).get("run_id") if st.get("held") else None


def unfinished_runs(ctx, holder: str | None) -> list[dict]:
    """Host run records (payload ``runs``) of runs other than this one that did not finish.

    A run counts when its state is not in :data:`FINISHED_STATES` and it went past
    ``started`` (it stopped the unit) or still holds the lock (``holder``): a run that
    failed before the stop and released its lock changed nothing (since the release records
    such a run ``failed``, only records of older controllers stay ``started``).
    """
    runs = ctx.payload.call("runs", ["--state-dir", ctx.payload.state_dir], timeout=60).get("runs") or []
    out = []
    for r in runs:
        st = (r.get("state") or {}).get("state") if isinstance(r.get("state"), dict) else None
        if (r.get("run_id") != ctx.options.run_id and st and st not in FINISHED_STATES
                and (st != "started" or r.get("run_id") == holder)):
            out.append({"run_id": r["run_id"], "state": st, "action": r.get("action"), "created": r.get("created")})
    return out


def recover_hint(ctx) -> str:
    """The command that brings this host back (``orch recover``)."""
    return f"run `orch recover INVENTORY --limit {ctx.name} --service {ctx.vars.get('service') or 'UNIT'}`"


def check_unfinished(ctx) -> TaskResult:
    """Fail when the host has a run left unfinished by a controller that is gone (see module doc)."""
    if ctx.payload is None:
        return TaskResult.skipped("payload not on host")
    left = unfinished_runs(ctx, lock_holder(ctx))
    if left:
        desc = ", ".join(f"{r['run_id']} (state {r['state']})" for r in left)
        raise TaskFailed(f"the host has an unfinished orch run: {desc}; its controller stopped before "
                         f"restoring the host. {recover_hint(ctx)} first", {"unfinished": left})
    return TaskResult.ok("no unfinished run on the host")


check_unfinished.check_safe = True


def recover_select(ctx, break_lock: bool = False, stale_after: float = 600) -> TaskResult:
    """Find unfinished runs (``orch_unfinished``) and take the host lock for this run.

    A lock held by another run is broken when its holder is gone (:func:`holder_gone`) or with
    ``break_lock`` (``--break-lock``); else the task fails naming the holder (and its heartbeat
    age when older than ``stale_after`` s). Then the leftover ``tune``/``bench`` payload processes
    of the unfinished runs (their ``ORCH_TAG=<run_id>.``) are stopped; other processes, such as
    a payload started by hand or by another run, are left alone. The lock's heartbeat is renewed
    while this run holds it (:func:`~orchestrator.tasks.hoststate.start_heartbeat`).
    """
    pl = ctx.payload
    st = pl.call("lock", ["status", "--state-dir", pl.state_dir, "--stale-after", str(stale_after)], timeout=60)
    lk = st.get("lock") or {}
    broken = None
    if st.get("held") and lk.get("run_id") != ctx.options.run_id:
        gone = holder_gone(lk.get("controller"))
        if not (gone or break_lock):
            # stale is only a hint: a controller on another machine does not heartbeat during a long tune
            stale = f", no heartbeat for {st.get('heartbeat_age_s') or 0:.0f} s" if st.get("stale") else ""
            raise TaskFailed(f"host lock held by run {lk.get('run_id')} (controller {lk.get('controller')}"
                             f"{stale}), which may still be running; if it is gone, pass --break-lock")
        if ctx.check:
            broken = lk.get("run_id")
        else:
            args = ["break", "--state-dir", pl.state_dir, "--run-id", ctx.options.run_id,
                    "--stale-after", str(stale_after), "--force"]
            if lk.get("run_id"):
                args += ["--holder", lk["run_id"]]
            pl.call("lock", args, timeout=60)
            broken = lk.get("run_id") or "corrupt lock"
            ctx.emit("lock_broken", holder=lk.get("run_id"), controller=lk.get("controller"),
                     why="holder gone" if gone else "--break-lock")
    left = unfinished_runs(ctx, lk.get("run_id") if st.get("held") else None)
    if not ctx.check:
        pl.call("lock", ["acquire", "--run-id", ctx.options.run_id, "--state-dir", pl.state_dir,
                         "--controller", controller_id(), "--stale-after", str(stale_after)], timeout=60)
        ctx.state["locked"] = True
        from .hoststate import start_heartbeat

        start_heartbeat(ctx)
    ctx.vars["orch_unfinished"] = left
    if left and not ctx.check:
        # the dead controller's payload may still run (tune, bench); we hold the lock now
        for r in left:
            try:
                stop_tagged(ctx.transport, r["run_id"])
            except ValueError as exc:  # a record whose name is no run id: nothing of it is signalled
                ctx.emit("recover_stop_skipped", run_id=r["run_id"], error=str(exc))
    desc = ", ".join(f"{r['run_id']} ({r['state']})" for r in left) or "none"
    msg = f"unfinished runs: {desc}" + (f"; broke the lock of {broken}" if broken else "")
    return TaskResult.ok(msg, unfinished=left, broken_lock=broken)


recover_select.check_safe = True


def recover_restore(ctx) -> TaskResult:
    """Restore the files of every run in ``orch_unfinished`` (a run that installed nothing has none)."""
    pl = ctx.payload
    done = []
    for r in ctx.vars.get("orch_unfinished") or []:
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
    ctx.state.setdefault("summary", {})["recovered"] = done
    n = sum(1 for d in done for f in d["files"] if f.get("action") != "unchanged")
    return TaskResult.changed(f"restored {n} file(s) of {len(done)} run(s)", runs=done)


def recover_mark(ctx) -> TaskResult:
    """Record state ``restored`` (with ``recovered_by``) for every run in ``orch_unfinished``."""
    import json

    pl = ctx.payload
    for r in ctx.vars.get("orch_unfinished") or []:
        pl.call("runs", ["--set-state", r["run_id"], "restored", "--data",
                         json.dumps({"recovered_by": ctx.options.run_id}), "--state-dir", pl.state_dir], timeout=60)
    return TaskResult.changed(f"marked {len(ctx.vars.get('orch_unfinished') or [])} run(s) restored")
