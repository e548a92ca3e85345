"""Tasks on the systemd unit: ``unit_facts`` (read-only) and ``service`` (stop/start).

``service`` waits for the state it asked for with a deadline, polling
``systemctl is-active``; a start that turns ``failed`` ends the wait at once.
"""

from __future__ import annotations

import time

from ..engine.results import TaskFailed, TaskResult
from ..facts.unit import UnitError, gather_unit, is_active

POLL_S = 0.5


def unit_facts(ctx, unit: str) -> TaskResult:
    """Gather the unit's facts into ``orch_unit`` and its interpreter into ``orch_interpreter``.

    ``ansible_python_interpreter`` overrides the interpreter parsed from ExecStart.
    Fails with a message naming the unit when it is missing or not an SGLang server.
    """
    try:
        facts = gather_unit(ctx.transport, unit)
    except UnitError as exc:
        raise TaskFailed(str(exc)) from None
    data = facts.to_dict()
    ctx.vars["orch_unit"] = data
    ctx.vars["orch_interpreter"] = ctx.vars.get("ansible_python_interpreter") or facts.server.interpreter
    ctx.state["unit"] = unit
    ctx.state["was_active"] = facts.active_state == "active"
    s = facts.server
    return TaskResult.ok(f"{unit}: {facts.active_state}, model {s.model_path}, tp {s.tp}, ep {s.ep}, "
                         f"port {s.port}, moe backend {s.moe_runner_backend}", **data)


unit_facts.check_safe = True


def _wait_state(ctx, unit: str, wanted: set[str], timeout: float, fail_on: set[str]) -> str:
    deadline = time.monotonic() + timeout
    state = is_active(ctx.transport, unit)
    while state not in wanted:
        if state in fail_on:
            return state
        if time.monotonic() > deadline:
            raise TaskFailed(f"{unit} still {state} after {timeout:.0f} s (wanted {'/'.join(sorted(wanted))})")
        time.sleep(POLL_S)
        state = is_active(ctx.transport, unit)
    return state


def service(ctx, unit: str, state: str, timeout: float = 300, only_if_stopped_by_orch: bool = False) -> TaskResult:
    """Bring ``unit`` to ``state`` (``stopped``, ``started`` or ``restarted``).

    ``timeout`` is in seconds. ``only_if_stopped_by_orch`` (rescue steps): start only a
    unit this run stopped, so orch never starts what the operator had stopped; with
    ``--leave-stopped`` rescue starts nothing. Before a start, the unit log is marked so
    ``verify_log`` reads only this start's lines.
    """
    t = ctx.transport
    if state == "stopped":
        current = is_active(t, unit)
        if current in ("inactive", "failed", "unknown"):
            return TaskResult.ok(f"{unit} already {current}")
        ctx.state["stopped_by_orch"] = True
        t.run(["systemctl", "stop", unit], become=True, timeout=timeout + 30)
        _wait_state(ctx, unit, {"inactive", "failed"}, timeout, set())
        ctx.emit("service_stopped", unit=unit)
        return TaskResult.changed(f"{unit} stopped")
    if state in ("started", "restarted"):
        touched = ctx.state.get("stopped_by_orch") or ctx.state.get("started_by_orch")
        if only_if_stopped_by_orch and (not touched or ctx.options.leave_stopped):
            return TaskResult.skipped("unit was not stopped by this run" if not ctx.options.leave_stopped
                                      else "--leave-stopped")
        from .readiness import mark_log

        if state == "started" and is_active(t, unit) == "active":
            return TaskResult.ok(f"{unit} already active")
        mark_log(ctx, unit)
        verb = "restart" if state == "restarted" else "start"
        res = t.run(["systemctl", verb, unit], become=True, timeout=timeout + 30, check=False)
        got = _wait_state(ctx, unit, {"active"}, timeout, {"failed"})
        if not res.ok or got != "active":
            raise TaskFailed(f"{unit} did not start ({got}): {(res.stderr or res.stdout).strip()[-300:]}")
        ctx.state["started_by_orch"] = True
        ctx.emit("service_started", unit=unit)
        return TaskResult.changed(f"{unit} {verb}ed")
    raise TaskFailed(f"service: unknown state {state!r} (stopped, started, restarted)")
