"""The ``deadman`` task (issue 32 rows 1 and 2): its deadline must leave a reconnecting controller
time to give up first; it arms ``orch-deadman-<run id>`` through systemd-run; the lock's release
disarms it, a host the controller gave up on keeps it."""

from __future__ import annotations

import pytest

from orchestrator.engine.results import TaskFailed
from orchestrator.host.deadman import NOTICE_S, disarm, shortest_deadline
from orchestrator.payload.transient import UnitUnavailable
from orchestrator.tasks.deadman import deadman
from tests.fakes import RUN_ID, FakePayload, ScriptedConnection, make_ctx


class Payload(FakePayload):
    def __init__(self, refuse: str | None = None):
        super().__init__()
        self.started, self.refuse = [], refuse

    def start_unit(self, command, args, unit, **kw):
        if self.refuse:
            raise UnitUnavailable(self.refuse)
        self.started.append((command, args, unit))
        return {"unit": unit}


def test_the_deadline_must_pass_the_controllers_reconnect_window(tmp_path):
    v = {"orch_reconnect_timeout": 300, "orch_lock_heartbeat_interval": 60, "orch_connect_timeout": 10}
    assert shortest_deadline(v) == 300 + 60 + 10 + NOTICE_S
    ctx = make_ctx(tmp_path, v, payload=Payload())
    with pytest.raises(TaskFailed, match=r"orch_host_deadline 400 s is too short: .* = 410 s"):
        deadman.spec.fn(ctx, name="sglang-qwen", deadline=400)
    assert not ctx.payload.started


def test_armed_through_systemd_run_with_the_units_and_the_deadline(tmp_path):
    ctx = make_ctx(tmp_path, {}, payload=Payload())
    res = deadman.spec.fn(ctx, name="sglang-qwen", deadline=900)
    assert res.status == "changed" and "900 s" in res.msg
    (command, args, unit), = ctx.payload.started
    assert command == "deadman" and unit == f"orch-deadman-{RUN_ID}.service"
    assert args[args.index("--unit") + 1] == "sglang-qwen.service" and args[args.index("--deadline") + 1] == "900"
    assert args[args.index("--tune-unit") + 1] == f"orch-tune-{RUN_ID}.service"
    assert ctx.run.deadman == {"unit": unit, "deadline_s": 900.0}
    assert deadman.spec.fn(ctx, name="sglang-qwen", deadline=900).status == "ok"  # run again: armed once


def test_off_or_without_systemd_run_it_says_so_and_the_run_goes_on(tmp_path):
    ctx = make_ctx(tmp_path, {}, payload=Payload())
    assert deadman.spec.fn(ctx, name="u", enabled=False, deadline=900).status == "skipped"
    ctx = make_ctx(tmp_path, {}, payload=Payload(refuse="systemd-run could not start it: no systemd"))
    res = deadman.spec.fn(ctx, name="u", deadline=900)
    assert res.status == "ok" and "no dead-man on this host" in res.msg and "orch recover" in res.msg
    assert ctx.events[-1][0] == "deadman_unavailable" and ctx.run.deadman is None


def test_released_it_is_stopped_given_up_it_is_left_to_fire(tmp_path):
    unit = f"orch-deadman-{RUN_ID}.service"
    conn = ScriptedConnection([(r"^systemctl show ", (0, "LoadState=loaded\nActiveState=active\n", "")),
                               (r"^systemctl (stop|reset-failed) ", (0, "", ""))])
    ctx = make_ctx(tmp_path, {}, connection=conn)
    ctx.run.deadman, ctx.run.locked, ctx.run.link_given_up = {"unit": unit, "deadline_s": 900.0}, False, True
    disarm(ctx)
    assert not conn.calls  # the controller gave up on the host: the dead-man is what restores it
    ctx.run.link_given_up, ctx.run.locked = False, True
    disarm(ctx)
    assert not conn.calls  # the run still holds its lock
    ctx.run.locked = False
    disarm(ctx)
    assert f"systemctl stop {unit}" in conn.commands() and ctx.run.deadman is None
