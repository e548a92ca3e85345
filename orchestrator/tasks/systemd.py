"""Tasks on the systemd unit: ``unit_facts`` (read-only) and ``service`` (stop/start).

``service`` waits for the state it asked for with a deadline, polling
``systemctl is-active``; a start that turns ``failed`` ends the wait at once.
"""

from __future__ import annotations

import time
from typing import Literal

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.journal import unit_log
from ..facts.unit import UnitError, gather_unit, is_active

POLL_S = 0.5


@task("unit_facts", check_mode=READ_ONLY, sets=("orch_unit", "orch_interpreter"),
      aliases={"unit": "name", "service": "name"})
def unit_facts(ctx, name: str) -> TaskResult:
    """Read the unit: its state, main PID, environment and the parsed ``sglang.launch_server``
    command line (``orch_unit``), and the Python that runs it (``orch_interpreter``;
    ``ansible_python_interpreter`` overrides it). Fails naming the unit when it is missing or not
    an SGLang server."""
    try:
        facts = gather_unit(ctx.connection, name)
    except UnitError as exc:
        raise TaskFailed(str(exc)) from None
    data = facts.to_dict()
    ctx.run.unit = name
    ctx.run.was_active = facts.active_state == "active"
    s = facts.server
    interpreter = ctx.vars.get("ansible_python_interpreter") or s.interpreter
    return TaskResult.ok(f"{name}: {facts.active_state}, model {s.model_path}, tp {s.tp}, ep {s.ep}, "
                         f"port {s.port}, moe backend {s.moe_runner_backend}",
                         facts={"orch_unit": data, "orch_interpreter": interpreter}, **data)


def _wait_state(ctx, unit: str, wanted: set[str], timeout: float, fail_on: set[str]) -> str:
    deadline = ctx.deadline(timeout)
    state = is_active(ctx.connection, unit)
    while state not in wanted:
        if state in fail_on:
            return state
        if time.monotonic() > deadline:
            raise TaskFailed(f"{unit} still {state} after {timeout:.0f} s (wanted {'/'.join(sorted(wanted))})")
        time.sleep(POLL_S)
        state = is_active(ctx.connection, unit)
    return state


def mark_log(ctx, unit: str) -> None:
    """Remember the unit log as it is now (``ctx.run.log_mark``), so that only the lines of the
    next start are read afterwards (:func:`orchestrator.facts.journal.text_since`)."""
    ctx.run.log_mark = unit_log(ctx.connection, unit)


@task("service", aliases={"unit": "name", "service": "name"})
def service(ctx, name: str, state: Literal["stopped", "started", "restarted"], timeout: float,
            only_if_stopped_by_orch: bool = False) -> TaskResult:
    """Bring the unit ``name`` to ``state`` and wait at most ``timeout`` s for it.

    ``only_if_stopped_by_orch`` (rescue steps): start only a unit this run stopped, so orch never
    starts what the operator had stopped; with ``--leave-stopped`` rescue starts nothing. Before
    a start, the unit log is marked so ``verify_log`` reads only this start's lines. A start that
    turns ``failed`` fails at once.
    """
    conn = ctx.connection
    unit = name
    if state == "stopped":
        current = is_active(conn, unit)
        if current in ("inactive", "failed", "unknown"):
            return TaskResult.ok(f"{unit} already {current}")
        ctx.run.stopped_by_orch = True
        conn.run(["systemctl", "stop", unit], become=True, timeout=timeout + 30)
        _wait_state(ctx, unit, {"inactive", "failed"}, timeout, set())
        ctx.emit("service_stopped", unit=unit)
        return TaskResult.changed(f"{unit} stopped")
    touched = ctx.run.stopped_by_orch or ctx.run.started_by_orch
    if only_if_stopped_by_orch and (not touched or ctx.options.leave_stopped):
        return TaskResult.skipped("unit was not stopped by this run" if not ctx.options.leave_stopped
                                  else "--leave-stopped")
    if state == "started" and is_active(conn, unit) == "active":
        return TaskResult.ok(f"{unit} already active")
    mark_log(ctx, unit)
    verb = "restart" if state == "restarted" else "start"
    res = conn.run(["systemctl", verb, unit], become=True, timeout=timeout + 30, check=False)
    got = _wait_state(ctx, unit, {"active"}, timeout, {"failed"})
    if not res.ok or got != "active":
        raise TaskFailed(f"{unit} did not start ({got}): {(res.stderr or res.stdout).strip()[-300:]}")
    ctx.run.started_by_orch = True
    ctx.emit("service_started", unit=unit)
    return TaskResult.changed(f"{unit} {verb}ed")
