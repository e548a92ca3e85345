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
- ``recover_collect``: collect what the unfinished runs' tunes left: a tune that finished in its
  transient unit has its files fetched into the controller's store (as a finished tune's are in a
  normal run), so the next ``orch tune`` reuses them; a stopped tune's checkpoint (finished batch
  sizes) stays in its work folder for the rerun to resume from, and the recap says which.
- ``recover_restore``: put back the files of each unfinished run (payload ``restore``), and say
  which config files a start must then load (``orch_restored_paths``/``orch_deleted_paths``).
- ``recover_autotune_cache``: put FlashInfer's autotune cache back exactly as each unfinished run
  backed it up (payload ``runner_change --op cache-restore --exact``), with the unit stopped.
- ``recover_mark``: record ``restored`` for each once the unit runs again.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from remote.protocol import CHECKPOINT_FILE

from .. import __version__
from ..engine.results import TaskFailed, TaskResult
from ..engine.task import AWARE, task
from ..facts.hostfiles import HostFileError, read_file
from ..host.container import end_payload_containers
from ..host.records import records, start_heartbeat
from ..host.servers import RankRecovery, meet, server_refusal, server_restart
from ..payload.client import PayloadFailed, stop_tagged
from ..payload.transient import RUNNING_STATES, last_result, stop_unit, unit_files, unit_name
from ..records.host import deadman_text, holder_gone
from ..records.layout import CONFIGS, TUNE_REPORT
from ..store import ConfigStore, key_hash


@task("recover_select", check_mode=AWARE, sets=("orch_unfinished", "orch_recover_restart"))
def recover_select(ctx, break_lock: bool = False, stale_after: float = 600,
                   heartbeat_interval: float | None = None) -> TaskResult:
    """Find unfinished runs (``orch_unfinished``) and take the host lock for this run.

    A lock held by another run is broken when its holder is gone (:func:`holder_gone`), when the
    host's dead-man took it over (remote/host/deadman.py: it says what it did, event
    ``deadman_fired``, summary ``deadman``), or with ``break_lock`` (``--break-lock``); else the task fails naming the holder (and its heartbeat
    age when older than ``stale_after`` s). Then the leftover ``tune``/``bench`` payload processes
    of the unfinished runs are stopped: the transient unit ``orch-tune-<run_id>.service`` by name
    (stopped if it runs, unloaded if it ended: ``tune_unit_stopped``/``tune_unit_collected``), and
    the commands tagged ``ORCH_TAG=<run_id>.`` (a tune run in the SSH session), and its dead-man
    ``orch-deadman-<run_id>.service``, so it cannot fire under this recover; other processes, such as
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
    still runs, and starts them together. On a single-node unit ``orch_recover_restart`` is set
    when the unit runs a process started after an unfinished run's stop (:func:`single_restart`):
    recover.yaml then restarts it on the restored files and proves them from its start's log
    (summary ``recover_restart``, event ``recover_restart``). Otherwise it is False.
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
        # a lock the host's dead-man marked: it ended its run (remote/host/deadman.py), nobody runs it
        gone = holder_gone(lk.get("controller")) or bool(lk.get("deadman"))
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
    else:
        restart = single_restart(ctx.facts.unit, left)
    if taken:
        if ctx.check:
            broken = lk.get("run_id")
        else:
            rec.break_lock(ctx.options.run_id, lk.get("run_id"), stale_after)
            broken = lk.get("run_id") or "corrupt lock"
            ctx.emit("lock_broken", holder=lk.get("run_id"), controller=lk.get("controller"),
                     why=("the host's dead-man took it over" if lk.get("deadman") else "holder gone") if gone
                     else "--break-lock")
    if not ctx.check:
        rec.acquire(ctx.options.run_id, stale_after)
        ctx.run.locked = True
        start_heartbeat(ctx, heartbeat_interval)
    units: list[str] = []
    if restart:
        ctx.run.summary.recover_restart = restart
        ctx.emit("recover_restart", why=restart)
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
            # its dead-man (it ends by itself now that the lock changed hands; stopped so it cannot fire now)
            guard = unit_name(r["run_id"], "deadman")
            st = stop_unit(ctx.connection, guard)
            if st is not None and st.get("ActiveState") in RUNNING_STATES:
                ctx.emit("deadman_stopped", run_id=r["run_id"], unit=guard)
                units.append(f"stopped {guard}")
            unit = ctx.facts.unit
            if unit is not None and unit.container is not None:
                # its tuner in the unit's image: ended through the runtime, never by host PID
                ended = end_payload_containers(ctx.connection, unit.container, r["run_id"], 30)
                if ended:
                    ctx.emit("payload_containers_ended", run_id=r["run_id"], containers=ended)
    fired = [dict(r["deadman"], run_id=r["run_id"]) for r in left if r.get("deadman")]
    for dm in fired:  # what the host did by itself before this recover (it is verified below)
        ctx.emit("deadman_fired", **{k: dm.get(k) for k in ("run_id", "fired_at", "heartbeat_age_s", "deadline_s",
                                                             "tune", "unit", "unit_state")},
                 files=[f.get("path") for f in dm.get("files") or [] if f.get("action") != "unchanged"])
    if fired:
        ctx.run.summary.deadman = fired
    desc = ", ".join(f"{r['run_id']} ({r['state']})" for r in left) or "none"
    msg = f"unfinished runs: {desc}" + (f"; broke the lock of {broken}" if broken else "") \
        + "".join(f"; run {dm['run_id']}: {deadman_text(dm)}" for dm in fired) \
        + "".join(f"; {u}" for u in units) + ((f"; every rank is restarted: {restart}" if ctx.facts.server_group is not None else f"; {restart}")
           if restart else "")
    return TaskResult.ok(msg, facts={"orch_unfinished": left, "orch_recover_restart": bool(restart)},
                         unfinished=left, broken_lock=broken, tune_units=units, server_restart=restart)


def single_restart(unit, left: list[dict]) -> str | None:
    """Why a single-node unit must be restarted after the restore (None: it need not be).

    ``unit``: :class:`orchestrator.facts.unit.UnitFacts` (or None); ``left``: ``orch_unfinished``.
    The unit is restarted when it runs and one of the unfinished runs went past ``started``:
    that run recorded ``stopped`` only after its stop of the unit succeeded (tune.yaml), and it
    held the host lock from before that stop until it died, so the unit's running main process
    was started after that stop: by the run itself (on the files it installed, e.g. killed in
    verify-log or the benchmark after), or by systemd's ``Restart=`` or an operator while the
    files may have been half replaced. Either way it may hold files the restore takes away, so
    only a new start on the restored files proves what the server runs. A unit whose process
    predates the runs (each is still at ``started``: it died before its stop) is left running:
    the restore changes none of its files, and a run that changes nothing restarts nothing.
    A unit that does not run is started by recover.yaml anyway."""
    if unit is None or unit.active_state != "active":
        return None
    past = [r for r in left if r.get("state") != "started"]
    if not past:
        return None
    runs = ", ".join(f"{r['run_id']} ({r['state']})" for r in past)
    return (f"{unit.unit} runs a process started after run {runs} stopped it (it may hold that run's files): "
            "restarted on the restored files")


def _cat(ctx, path: str) -> str | None:
    """The text of orch's own file ``path`` on the host (root's: read through sudo), None when it
    is missing or cannot be read."""
    try:
        return read_file(ctx.connection, path, become="root")
    except HostFileError:
        return None


def _checkpoint_sizes(ctx, work: str | None) -> list[int]:
    """The batch sizes a tune's checkpoint in its work folder holds (remote/tuning/tuner/checkpoint.py:
    ``results`` keyed by M); [] when there is none or it cannot be read."""
    text = _cat(ctx, posixpath.join(work, CHECKPOINT_FILE)) if work else None
    try:
        res = json.loads(text or "").get("results")
        return sorted(int(m) for m in res) if isinstance(res, dict) else []
    except (ValueError, TypeError, AttributeError):
        return []


def _mismatch(ticket: dict, data: dict) -> str | None:
    """Why the tune's result is not what its ticket's tuning key asks for (None: it is)."""
    key = ticket.get("tuning_key") or {}
    for k in ("space", "device_name", "triton_version", "provider"):
        if key.get(k) is not None and data.get(k) is not None and key[k] != data[k]:
            return f"the result's {k} is {data[k]!r}, its tuning key's {key[k]!r}"
    want = key.get("batch_sizes")
    if want and sorted(int(b) for b in data.get("batch_sizes") or []) != sorted(int(b) for b in want):
        return f"the result's batch sizes {data.get('batch_sizes')} are not its tuning key's {want}"
    return None


def collect_run(ctx, r: dict) -> dict:
    """What the unfinished run ``r`` (``orch_unfinished``) left of its tune, collected (see
    :func:`recover_collect`). Returns ``{"run_id", "state", "what", ...}``; ``state`` is
    ``collected``, ``stored already``, ``progress kept``, ``not collected`` or ``none``. Raises
    connection errors, :class:`StoreError`, ``OSError``; the caller records them."""
    rid = r["run_id"]
    unit = unit_name(rid)
    paths = unit_files(ctx.payload.state_dir, unit)
    out = {"run_id": rid, "unit": unit}
    text = _cat(ctx, paths["ticket"])
    if text is None:
        return dict(out, state="none", what="no tune of this run ran in a transient unit")
    ticket = json.loads(text)
    final = last_result(_cat(ctx, paths["out"]) or "")
    if final is None or final.get("type") != "result":
        done = _checkpoint_sizes(ctx, ticket.get("work"))
        how = "did not finish (stopped, or ended without a result)"
        if final is not None:
            how = f"failed ({final.get('kind')}: {str(final.get('msg'))[:120]})"
        if done:
            return dict(out, state="progress kept", batch_sizes=done, work=ticket.get("work"),
                        what=f"the tune {how}; its checkpoint keeps batch sizes {done}: the next orch tune "
                             "resumes from them")
        return dict(out, state="not collected", what=f"the tune {how} before finishing a batch size")
    data = final.get("data") or {}
    key = ticket.get("tuning_key")
    if ticket.get("source") == "shard":
        return dict(out, state="not collected", what="a shard's slice of its group's batch sizes (the group's "
                                                     "merge never happened)")
    if not key or not ctx.options.state_dir:
        return dict(out, state="not collected", what="no tuning key (or no controller store) to keep it under")
    why = _mismatch(ticket, data)
    files = {role: p for role, p in (data.get("files") or {}).items() if p}
    names = ticket.get("names") or {}
    for role, remote in files.items():
        if names.get(role) and posixpath.basename(remote) != names[role]:
            why = why or f"the tuner wrote {posixpath.basename(remote)}, the probe derived {names[role]}"
    if not files.get("up"):
        why = why or "the result names no up-projection file"
    if why:
        return dict(out, state="not collected", what=why)
    store = ConfigStore(ctx.options.state_dir)
    kh = key_hash(key)
    if store.get(key) is not None:
        return dict(out, state="stored already", key=kh, what=f"finished; the store already has {kh}")
    local = ctx.host_dir / CONFIGS / "collected" / rid
    local.mkdir(parents=True, exist_ok=True)
    fetched = {}
    for role, remote in files.items():
        dest = local / posixpath.basename(remote)
        ctx.connection.get(remote, str(dest), become=True)  # the tuner's folder is root-only
        fetched[role] = str(dest)
    report = None
    if data.get("report"):
        report = local / TUNE_REPORT
        ctx.connection.get(data["report"], str(report), become=True)
    entry = store.put(key, fetched, report, {"host": ticket.get("host") or ctx.name, "run_id": rid,
                                             "provider": data.get("provider"),
                                             "payload_version": ticket.get("payload_version"),
                                             "orch_version": ticket.get("orch_version") or __version__,
                                             "batch_sizes": ticket.get("batch_sizes"),
                                             "collected_by": ctx.options.run_id})
    return dict(out, state="collected", key=entry.hash, files=sorted(Path(p).name for p in fetched.values()),
                what=f"finished tune's {', '.join(sorted(fetched))} file(s) put in the store as {entry.hash}: the "
                     "next orch tune reuses them")


@task("recover_collect")
def recover_collect(ctx, runs: list[dict]) -> TaskResult:
    """Collect what the tunes of the unfinished runs in ``runs`` (``orch_unfinished``) left, after
    ``recover_select`` stopped their transient units (``orch-tune-<run id>``, found by name with
    its output file and ticket, :mod:`orchestrator.payload.transient`).

    A tune that finished (its unit's output ends in the payload's ``result`` line, its files in
    the host's work folder) has its files fetched into the controller's store under the tuning
    key its ticket names, validated as the store validates every entry, as a finished tune's are
    in a normal run (``orchestrator.host.sharing.publish_result``); the next ``orch tune`` with
    the same key reuses them instead of tuning. Nothing is installed: the host is still restored
    by the next steps. A tune that was stopped (or died) keeps its checkpoint (finished batch
    sizes, row 10 of docs/reliability.md) in its work folder, and the rerun resumes from it; the
    result says which batch sizes. Not collected, with the reason: a shard's slice, a result
    that does not match its ticket's key. An entry already in the store is left as it is. A
    failure to collect is recorded and never fails the recover (the host must still be
    restored). Sets the summary's ``collected``; events ``tune_result_collected`` and
    ``tune_progress_kept``."""
    done = []
    for r in runs:
        try:
            c = collect_run(ctx, r)
        except Exception as exc:  # noqa: BLE001 - the restore that follows must still run
            c = {"run_id": r.get("run_id"), "state": "not collected",
                 "what": f"collecting failed: {type(exc).__name__}: {str(exc)[:200]}"}
        if c["state"] == "none":
            continue
        done.append(c)
        if c["state"] == "collected":
            ctx.emit("tune_result_collected", run_id=c["run_id"], key=c.get("key"), files=c.get("files"))
        elif c["state"] == "progress kept":
            ctx.emit("tune_progress_kept", run_id=c["run_id"], batch_sizes=c.get("batch_sizes"), work=c.get("work"))
        else:
            ctx.emit("tune_not_collected", run_id=c["run_id"], why=c["what"])
    if done:
        ctx.run.summary.collected = done
    msg = "; ".join(f"run {c['run_id']}: {c['what']}" for c in done) or "no tune of these runs to collect"
    result = TaskResult.changed if any(c["state"] == "collected" for c in done) else TaskResult.ok
    return result(msg, collected=done)


def loaded_after_restore(done: list[dict]) -> tuple[list[str], list[str]]:
    """``(present, absent)``: the Triton config files (``*.json``) of the restored runs ``done``
    (:func:`recover_restore`'s list) that are on disk after the restore (put back, or unchanged
    and present), and those that are not (removed: the run created them; or unchanged and
    absent). A start on the restored files must load every present one, and shows SGLang's
    default config where the up file is absent (verify-log, as after a rollback). A drop-in
    (``*.conf`` of a runner trial) is no config file and is left out. The oldest run's state
    wins: ``done`` is newest first, so a later entry for the same path replaces an earlier one."""
    state: dict[str, bool] = {}
    for d in done:
        for f in d.get("files") or []:
            path = f.get("path") or ""
            if not path.endswith(".json"):
                continue
            act = f.get("action")
            state[path] = act == "restored" or (act == "unchanged" and bool(f.get("sha256")))
    return sorted(p for p, on in state.items() if on), sorted(p for p, on in state.items() if not on)


@task("recover_restore", sets=("orch_restored_paths", "orch_deleted_paths"))
def recover_restore(ctx, runs: list[dict]) -> TaskResult:
    """Restore the files of every unfinished run in ``runs`` (``orch_unfinished``; a run that
    installed nothing has none), each from the host's own backup and manifest (payload ``restore``).
    Sets ``orch_restored_paths`` and ``orch_deleted_paths`` (:func:`loaded_after_restore`: the
    config files a start must load, and those it must not find), which verify-log checks after
    recover restarted a unit whose process a run had started (recover.yaml)."""
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
    present, absent = loaded_after_restore(done)
    facts = {"orch_restored_paths": present, "orch_deleted_paths": absent}
    n = sum(1 for d in done for f in d["files"] if f.get("action") != "unchanged")
    if not runs:  # a rank restarted with its server, with nothing of its own to put back
        return TaskResult.ok("no unfinished run on this host: nothing to restore", facts=facts, runs=done)
    return TaskResult.changed(f"restored {n} file(s) of {len(done)} run(s)", facts=facts, runs=done)


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
