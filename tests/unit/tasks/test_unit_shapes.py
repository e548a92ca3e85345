"""Unit shapes (issue 19): Type=, Restart=, KillMode=, TimeoutStopSec=infinity, ExecStartPre=/ExecStop=/
ExecStopPost=, user units; what orch reads from the unit file and how its stop, reap and start treat them."""

import pytest

from orchestrator.engine.results import TaskFailed
from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.unit import UnitShape, gather_unit, parse_unit_settings
from orchestrator.tasks import TASKS
from tests.fakes import FakePayload, ScriptedConnection, make_ctx

SHAPED = """[Service]
Type=notify
ExecStartPre=/usr/bin/nvidia-smi -pm 1
ExecStartPre=-/usr/local/bin/warm-cache.sh
ExecStart=/opt/venv/bin/python3 -m sglang.launch_server --model-path /m
ExecStop=/usr/local/bin/drain.sh
ExecStopPost=/usr/local/bin/cleanup.sh
Restart=always
KillMode=mixed
TimeoutStopSec=infinity
"""


def test_unit_shape_is_read_from_the_unit_file():
    sh = parse_unit_settings(SHAPED).shape
    assert (sh.type, sh.restart, sh.kill_mode, sh.timeout_stop) == ("notify", "always", "mixed", "infinity")
    assert sh.exec_start_pre == ["/usr/bin/nvidia-smi -pm 1", "-/usr/local/bin/warm-cache.sh"]
    assert sh.exec_stop == ["/usr/local/bin/drain.sh"] and sh.exec_stop_post == ["/usr/local/bin/cleanup.sh"]
    assert sh.stop_waits_forever and sh.restarts
    assert "Type=notify" in sh.describe() and "2 ExecStartPre=" in sh.describe()
    # a drop-in resets a list with an empty assignment; TimeoutSec= sets the stop timeout too
    sh = parse_unit_settings(SHAPED + "ExecStartPre=\nTimeoutSec=30\nRestart=on-failure\n").shape
    assert sh.exec_start_pre == [] and sh.timeout_stop == "30" and not sh.stop_waits_forever
    assert sh.restart == "on-failure"
    plain = parse_unit_settings("[Service]\nExecStart=/p -m sglang.launch_server\n").shape
    assert plain == UnitShape() and plain.describe() == "" and not plain.restarts


def _unit(shape: dict | None = None) -> dict:
    return {"unit": "sglang-qwen", "active_state": "active", "shape": shape or {}}


class Manager:
    """A unit manager that stops only when told to kill (TimeoutStopSec=infinity, a server that
    ignores SIGTERM), or at once (``stops=True``)."""

    def __init__(self, stops: bool = False):
        self.state, self.stops = "active", stops

    def is_active(self, argv):
        return (0 if self.state == "active" else 3, self.state + "\n", "")

    def stop(self, argv):
        self.state = "inactive" if self.stops else "deactivating"
        return ""

    def kill(self, argv):
        self.state = "inactive"
        return ""


def test_stop_with_timeout_stop_infinity_uses_orchs_own_deadline_then_systemctl_kill(tmp_path):
    m = Manager()
    conn = ScriptedConnection([(r"^systemctl is-active", m.is_active), (r"^systemctl stop --no-block sglang-qwen$", m.stop),
                               (r"^systemctl kill --signal=SIGKILL sglang-qwen$", m.kill)])
    ctx = make_ctx(tmp_path, {"orch_unit": _unit({"timeout_stop": "infinity"})}, connection=conn)
    res = TASKS["service"].fn(ctx, name="sglang-qwen", state="stopped", timeout=1)
    assert res.status == "changed" and m.state == "inactive"
    ran = conn.commands()
    assert ran.index("systemctl stop --no-block sglang-qwen") < ran.index("systemctl kill --signal=SIGKILL sglang-qwen")
    assert any(ev == "service_stop_killed" for ev, _ in ctx.events)
    # a unit that stops in time is never killed
    m = Manager(stops=True)
    conn = ScriptedConnection([(r"^systemctl is-active", m.is_active), (r"^systemctl stop --no-block", m.stop)])
    ctx = make_ctx(tmp_path, {"orch_unit": _unit({"timeout_stop": "infinity"})}, connection=conn)
    TASKS["service"].fn(ctx, name="sglang-qwen", state="stopped", timeout=5)
    assert not any("kill" in c for c in conn.commands())


def test_user_units_use_the_users_own_manager_without_sudo(tmp_path):
    m = Manager(stops=True)
    conn = ScriptedConnection([(r"^systemctl --user is-active", m.is_active), (r"^systemctl --user stop sglang-qwen$", m.stop),
                               (r"^systemctl --user (re)?start", lambda argv: setattr(m, "state", "active") or ""),
                               (r"^journalctl --user-unit sglang-qwen", ""),
                               (r"^systemctl --user show -p InvocationID sglang-qwen$", "InvocationID=" + "a" * 32 + "\n")])
    ctx = make_ctx(tmp_path, {"orch_unit": _unit(), "orch_systemd_scope": "user"}, connection=conn)
    TASKS["service"].fn(ctx, name="sglang-qwen", state="stopped", timeout=5)
    TASKS["service"].fn(ctx, name="sglang-qwen", state="started", timeout=5)
    systemctl = [(argv, become) for argv, become in conn.calls if argv[0] == "systemctl"]
    assert systemctl and all(argv[1] == "--user" and not become for argv, become in systemctl), systemctl
    assert m.state == "active" and ctx.run.start_mark.invocation == "a" * 32


def test_gather_unit_of_a_user_unit_asks_systemctl_user(tmp_path):
    conn = ScriptedConnection([(r"^systemctl --user show", "LoadState=loaded\nActiveState=inactive\nMainPID=0\n"),
                               (r"^systemctl --user cat", SHAPED)])
    facts = gather_unit(conn, Unit("sglang-qwen", "user"))
    assert facts.shape.scope == "user" and facts.shape.type == "notify"
    assert all(argv[:2] == ["systemctl", "--user"] for argv, _ in conn.calls)


def _reap_ctx(tmp_path, state: str):
    conn = ScriptedConnection([(r"^systemctl is-active sglang-qwen", (0, state + "\n", ""))])
    payload = FakePayload({"reap": lambda args, request: {"killed": [], "protected": []}})
    ctx = make_ctx(tmp_path, {"orch_unit": {"unit": "sglang-qwen", "environment": {"CUDA_VISIBLE_DEVICES": "0"}}},
                   connection=conn, payload=payload)
    ctx.run.unit, ctx.run.stopped_by_orch = "sglang-qwen", True
    return ctx


def test_reap_checks_the_unit_is_still_held_stopped(tmp_path):
    ctx = _reap_ctx(tmp_path, "inactive")
    assert TASKS["reap"].fn(ctx, protected=[]).status == "ok"
    for state in ("active", "activating"):
        ctx = _reap_ctx(tmp_path, state)
        with pytest.raises(TaskFailed, match=f"sglang-qwen is {state} again while orch holds it stopped"):
            TASKS["reap"].fn(ctx, protected=[])
