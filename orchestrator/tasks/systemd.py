"""Tasks on the systemd unit: ``unit_facts`` (read-only) and ``service`` (stop/start).

``service`` waits for the state it asked for with a deadline, polling
``systemctl is-active``; a start that turns ``failed`` ends the wait at once.
"""

from __future__ import annotations

import json
import time
from typing import Literal

from remote.engines import LaunchError, engine_for, engine_named

from ..connection import CommandTimeout
from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.journal import mark_start, note_invocation
from ..facts.systemd_unit import Unit, scope_of
from ..facts.unit import UnitError, gather_unit
from ..host.container import end_leftover_container
from ..host.port_race import restart_after_port_race, wait_rendezvous
from ..host.servers import meet
from ..host.sigkill import note_sigkills
from ..payload.client import PayloadFailed

POLL_S = 0.5


@task("unit_facts", rerun=True, check_mode=READ_ONLY,
      sets=("orch_unit", "orch_engine", "orch_systemd_unit", "orch_interpreter", "orch_server_group"),
      aliases={"unit": "name", "service": "name"})
def unit_facts(ctx, name: str) -> TaskResult:
    """Read the unit: its state, main PID, environment (``Environment=`` overridden by its
    ``EnvironmentFile=`` files, as systemd does) and the parsed server command line (variables
    expanded, a server config file merged as the engine merges it) (``orch_unit``), which engine it
    runs (``orch_engine``: recognised from the command line, :func:`remote.engines.engine_for`, or
    the inventory's ``orch_engine``, which then asks that engine alone), the unit's handle
    (``orch_systemd_unit``, :class:`orchestrator.facts.systemd_unit.Unit`: its manager,
    ``orch_systemd_scope``, and its log files; every later ``systemctl``/``journalctl`` of the run
    goes through it), and the Python that runs it (``orch_interpreter``; ``ansible_python_interpreter``
    overrides it), with how ExecStart starts it (the engine's entry point, e.g. ``python -m
    sglang.launch_server``, behind wrappers: :mod:`remote.engines.launch`; an unknown form fails
    naming the forms orch knows).
    Fails naming the unit (and the file) when it is missing, runs no engine's server, or its start
    depends on a file systemd or the engine would refuse. A container unit (``docker run``/``podman
    run``, :mod:`orchestrator.facts.container`) is read from its run command line; the payload's
    host commands then run with the host's ``/usr/bin/python3`` (``orch_interpreter``), the
    probe and the tuner with the image's (``orch_unit.server.interpreter``); ``-d`` is refused.

    A rank of a multi-node server (``--nnodes N > 1``) gets ``orch_server_group``: the server's
    ranks among the run's hosts as found before the play (``RunOptions.servers``,
    :func:`orchestrator.facts.server_group.group_servers`)."""
    try:
        facts = gather_unit(ctx.connection, Unit(name, scope_of(ctx.vars)), engine=ctx.vars.get("orch_engine") or None)
    except UnitError as exc:
        raise TaskFailed(str(exc)) from None
    ctx.run.unit = name
    ctx.run.was_active = facts.active_state == "active"
    ctx.run.summary.engine = facts.engine
    s = facts.server
    # a container unit's server runs the image's Python; the payload's host commands need the host's
    interpreter = ctx.vars.get("ansible_python_interpreter") or ("/usr/bin/python3" if facts.container else
                                                                  s.interpreter)
    msg = (f"{name}: {facts.active_state}, model {s.model_path}, tp {s.tp}, ep {s.ep}, "
           f"host {s.host}, port {s.port}, moe backend {s.moe_backend}")
    plain = facts.launch is not None and len(facts.launch.forms) == 1 and facts.launch.forms[0].startswith("python -m ")
    if facts.launch is not None and not plain:
        msg += f"; started by {' > '.join(facts.launch.forms)} (Python {interpreter})"
    read = [f["path"] for f in facts.env_files if f["read"]]
    if read:
        msg += f"; environment files {', '.join(read)}"
    engine_name = facts.engine or ctx.facts.engine.name
    if s.config_file:
        msg += f"; flags from {engine_named(engine_name).config_flag} {s.config_file}"
    if facts.shape.describe():
        msg += f"; {facts.shape.describe()}"
    if facts.container is not None:
        c = facts.container
        msg += (f"; {c.runtime} container {c.name or '(unnamed)'} of image {c.image}, GPUs {c.gpus.how}"
                + (f" {','.join(c.gpus.devices)}" if c.gpus.devices else "")
                + (", host network" if c.host_network else ""))
    for w in facts.warnings:
        ctx.emit("unit_warning", warning=w)
        msg += f"; WARNING: {w}"
    out = {"orch_unit": facts, "orch_engine": engine_name, "orch_systemd_unit": facts.handle,
           "orch_interpreter": interpreter}
    group = (ctx.options.servers or {}).get(ctx.name)
    if group is not None and group.unit == name:
        out["orch_server_group"] = group
        msg += f"; rank {group.rank} of multi-node server {group.key} ({', '.join(group.hosts)})"
    return TaskResult.ok(msg, facts=out, **facts.to_dict())


def _wait_state(ctx, unit: Unit, wanted: set[str], timeout: float, fail_on: set[str]) -> str:
    deadline = ctx.deadline(timeout)
    state = unit.is_active(ctx.connection)
    while state not in wanted:
        if state in fail_on:
            return state
        if time.monotonic() > deadline:
            raise TaskFailed(f"{unit.name} still {state} after {timeout:.0f} s (wanted {'/'.join(sorted(wanted))})")
        time.sleep(POLL_S)
        state = unit.is_active(ctx.connection)
    return state


def free_port(ctx, unit: str) -> list[dict]:
    """Before starting the stopped unit: make sure nothing listens on its port (payload ``port``).

    A leftover of the unit itself (in its cgroup, or running its launch command line: a fork of
    the server) is ended; any other holder fails the task naming its PID and command line,
    before the start (which would die with "address already in use"). When the check itself
    fails (payload crash, link), it is only a warning: the start, perhaps a rescue's, is still
    tried. Returns the processes ended; nothing to do without a payload or a parsed server."""
    facts = ctx.facts.unit
    if ctx.payload is None or facts is None or facts.server is None or not facts.server.port:
        return []
    port = facts.server.port
    if facts.container is not None:
        # a container's processes are the runtime's: ended through it (end_leftover_container), and
        # its published port is the host's, so any holder left is named, never signalled by host PID
        if not facts.container.host_network:
            pub = facts.container.published_port(int(port))
            port = pub.host_port if pub is not None else None
        if not port:
            return []
        args = ["--port", str(int(port)), "--free"]
    else:
        args = ["--port", str(int(port)), "--free", "--unit", unit if "." in unit else f"{unit}.service"]
        if facts.launch is not None:
            args += ["--owner-args", json.dumps(facts.launch.entry_args)]
        else:  # facts made without the launch (tests, records): the ExecStart resolved here
            try:
                args += ["--owner-args", json.dumps(engine_for(list(facts.exec_start))[1].entry_args)]
            except LaunchError:
                pass
    try:
        data = ctx.payload.call("port", args, timeout=120)
    except PayloadFailed as exc:
        if ((exc.data or {}).get("detail") or {}).get("holders"):
            raise  # a holder that is not the unit's, or one that survived SIGKILL: named in the message
        # the check itself failed: the start (perhaps a rescue's) must still be tried
        ctx.emit("port_check_failed", error=exc.msg[:300])
        ctx.say(f"WARNING: could not check port {port} before starting {unit}: {exc.msg[:200]}")
        return []
    killed = data.get("killed") or []
    for k in killed:
        ctx.emit("port_holder_killed", pid=k.get("pid"), cmdline=k.get("cmdline"), signal=k.get("signal"),
                 port=port, why=k.get("why"))
        ctx.say(f"ended {k.get('pid')} ({str(k.get('cmdline'))[:80]}), a leftover of {unit} that held port "
                f"{port} ({k.get('why')})")
    if killed:
        ctx.run.summary.port_freed = (ctx.run.summary.port_freed or []) + killed
        note_sigkills(ctx, killed, "port")
    return killed


def mark_log(ctx, unit: Unit) -> None:
    """Mark the unit log as it is now (``ctx.run.start_mark``: its journal cursor, its log files'
    inodes and sizes, and a copy in ``ctx.run.log_mark``), so that only the lines of the next
    start are read afterwards (:func:`orchestrator.facts.journal.read_start`)."""
    ctx.run.start_mark = mark_start(ctx.connection, unit)
    ctx.run.log_mark = ctx.run.start_mark.text


#: seconds to wait for the unit's end after ``systemctl kill --signal=SIGKILL``
KILL_WAIT_S = 30


def _stop_with_own_deadline(ctx, unit: Unit, timeout: float) -> None:
    """Stop a unit whose ``TimeoutStopSec=infinity`` makes systemd wait for ever: ask for the stop
    without waiting on it (``--no-block``), wait ``timeout`` s (``orch_stop_timeout``), then end
    the unit's own processes through systemd (``systemctl kill --signal=SIGKILL``: its cgroup,
    never a host PID of orch's choosing) and wait :data:`KILL_WAIT_S` s more. Raises
    :class:`TaskFailed` when it is still not down."""
    try:
        unit.systemctl(ctx.connection, "stop", "--no-block")
    except CommandTimeout:  # a manager that waits despite --no-block: the stop is asked for all the same
        pass
    try:
        _wait_state(ctx, unit, {"inactive", "failed"}, timeout, set())
        return
    except TaskFailed:
        pass
    ctx.emit("service_stop_killed", unit=unit.name, after_s=timeout)
    ctx.say(f"{unit.name} did not stop within {timeout:.0f} s (TimeoutStopSec=infinity): ending its processes "
            "with systemctl kill --signal=SIGKILL")
    # a unit already gone by now makes kill fail: the wait below says whether it is down
    unit.systemctl(ctx.connection, "kill", "--signal=SIGKILL", check=False)
    _wait_state(ctx, unit, {"inactive", "failed"}, KILL_WAIT_S, set())


@task("service", rerun=True, aliases={"unit": "name", "service": "name"})
def service(ctx, name: str, state: Literal["stopped", "started", "restarted"], timeout: float,
            only_if_stopped_by_orch: bool = False, ranks: Literal["all", "running"] = "all") -> TaskResult:
    """Bring the unit ``name`` to ``state`` and wait at most ``timeout`` s for it.

    ``only_if_stopped_by_orch`` (rescue steps): start only a unit this run stopped, so orch never
    starts what the operator had stopped; with ``--leave-stopped`` rescue starts nothing. Before
    starting a stopped unit, its port must be free (:func:`free_port`: the unit's own leftovers are
    ended, another holder fails the task naming it), and the unit log is marked so ``verify_log``
    reads only this start's lines. A start that turns ``failed`` fails at once. For a container
    unit the stop is checked with the runtime: its container must be gone, and one left is ended
    through the runtime (:func:`end_leftover_container`), also before a start.

    On a rank of a multi-node server (``orch_server_group``) the ranks meet (:func:`meet`):
    a rank >= 1 stops only once rank 0 has stopped (SGLang 0.5.23 srt/entrypoints/engine.py: a
    rank >= 1 that gets SIGTERM waits for rank 0's shutdown broadcast); a rank >= 1 that was
    running at the start of the play and is found down then was ended by rank 0's stop, and counts
    as stopped by this run (a rescue starts it again); a start waits until every
    rank has stopped and installed, then rank 0 starts first and, once a process of its unit listens
    at ``--dist-init-addr`` (:func:`orchestrator.host.port_race.wait_rendezvous`), the other ranks
    start (a rank >= 1 started before rank 0's store listens fails, sglang #3099); a rescue's start
    waits for the ranks still rolling back, so the server restarts on the earlier files on every
    rank, rank 0 first. A start that dies of a port race (``Address already in use``) is started once
    more, the new files kept (:func:`orchestrator.host.port_race.restart_after_port_race`).
    ``ranks: running`` (``orch recover``) makes a start wait, as a rescue's does, only for the
    ranks whose play still runs: a rank with nothing to recover does not keep the others stopped.
    """
    conn = ctx.connection
    handle = ctx.facts.unit_handle(name)  # its manager: a user's own is asked as that user, never through sudo
    unit = name
    group = ctx.facts.server_group
    if group is not None and ctx.attempt > 1:
        # the ranks meet at fixed points (meet): a rank's second run would count twice there
        raise TaskFailed(f"the link to this rank was lost during the {state} of {unit}; a rank of a multi-node "
                         "server does not run it again alone (the other ranks' rescue restarts them together)")
    if state == "stopped":
        if group is not None and group.rank > 0:
            meet(ctx, "rank 0 stopped", among=[group.rank0])
        current = handle.is_active(conn)
        if current in ("inactive", "failed", "unknown"):
            if group is not None and group.rank == 0:
                meet(ctx, "rank 0 stopped", among=[])
            if group is not None and group.rank > 0 and ctx.run.was_active:
                # rank 0's stop ended it (its shutdown broadcast, or the rank's failed collective):
                # stopped by this run, so a rescue starts it again with the other ranks
                ctx.run.stopped_by_orch = True
                return TaskResult.ok(f"{unit} already {current}: rank 0's stop ended it")
            return TaskResult.ok(f"{unit} already {current}")
        ctx.run.stopped_by_orch = True
        shape = ctx.facts.unit.shape if ctx.facts.unit is not None else None
        if shape is not None and shape.stop_waits_forever:
            _stop_with_own_deadline(ctx, handle, timeout)
        else:
            handle.systemctl(conn, "stop", timeout=timeout + 30)
            _wait_state(ctx, handle, {"inactive", "failed"}, timeout, set())
        ended = end_leftover_container(ctx, unit, timeout)
        ctx.emit("service_stopped", unit=unit)
        ctx.mark_phase("stop")  # the unit's downtime starts with this step (orchestrator.facts.downtime)
        if group is not None and group.rank == 0:
            meet(ctx, "rank 0 stopped", among=[])
        return TaskResult.changed(f"{unit} stopped" + (f"; its container {' and '.join(ended)} through the runtime"
                                                      if ended else ""))
    rescue = only_if_stopped_by_orch or ranks == "running"
    up = "rank 0 up" + (" again" if rescue else "")  # a rescue's start meets apart from the run's own
    if group is not None:
        if rescue:
            meet(ctx, "restored", strict=False)
        else:
            meet(ctx, "installed")
        if group.rank > 0:  # rank 0 first, its store listening, then the others (issue 32 row 9)
            meet(ctx, up, strict=not rescue, among=[group.rank0])
    touched = ctx.run.stopped_by_orch or ctx.run.started_by_orch
    if only_if_stopped_by_orch and (not touched or ctx.options.leave_stopped):
        _rank0_up(ctx, up)
        return TaskResult.skipped("unit was not stopped by this run" if not ctx.options.leave_stopped
                                  else "--leave-stopped")
    current = handle.is_active(conn)
    if state == "started" and current == "active":
        _rank0_up(ctx, up)
        return TaskResult.ok(f"{unit} already active")
    if current != "active":
        end_leftover_container(ctx, unit, timeout)  # a leftover of the name makes `run --name` fail
        free_port(ctx, unit)
    mark_log(ctx, handle)
    verb = "restart" if state == "restarted" else "start"
    # a start that fails is reported below with the unit's state and systemctl's words
    res = handle.systemctl(conn, verb, timeout=timeout + 30, check=False)
    # the invocation this start made: the start's journal entries are kept to it (read_start)
    note_invocation(conn, ctx.run.start_mark, handle)
    got = _wait_state(ctx, handle, {"active"}, timeout, {"failed"})
    if got == "failed" and restart_after_port_race(ctx, unit, timeout):
        res, got = None, _wait_state(ctx, handle, {"active"}, timeout, {"failed"})
    if (res is not None and not res.ok) or got != "active":
        raise TaskFailed(f"{unit} did not start ({got}): {((res.stderr or res.stdout) if res else '').strip()[-300:]}")
    ctx.run.started_by_orch = True
    ctx.emit("service_started", unit=unit)
    seen = ""
    if group is not None and group.rank == 0:
        seen = "; " + wait_rendezvous(ctx, unit, timeout)
        _rank0_up(ctx, up)
    ctx.mark_phase("start")
    return TaskResult.changed(f"{unit} {verb}ed{seen}")


def _rank0_up(ctx, phase: str) -> None:
    """On rank 0 of a multi-node server: tell the other ranks they may start (``phase``)."""
    group = ctx.facts.server_group
    if group is not None and group.rank == 0:
        meet(ctx, phase, among=[])
