"""serial and max_fail_percentage count multi-node servers, not hosts; the ranks' meeting points
(orchestrator/engine/batching.py server_batches, runner.py servers=, orchestrator/fleet.py ServerBarrier)."""

import threading

import pytest

from orchestrator.engine.batching import server_batches, servers_in
from orchestrator.fleet import BarrierBroken, ServerBarrier

from .test_runner import PB, H, make
from tests.waiting import CEILING_S  # a hang guard only: the waits end on their condition

SERVERS = {"a0": "ds@10.0.0.1:5000", "a1": "ds@10.0.0.1:5000", "b0": "ds@10.0.0.2:5000", "b1": "ds@10.0.0.2:5000"}


def test_ranks_of_a_server_share_a_batch_and_count_once():
    hosts = ["a0", "solo", "b0", "a1", "b1"]
    got = server_batches(hosts, 1, SERVERS.get)
    assert got == [["a0", "a1"], ["solo"], ["b0", "b1"]]
    assert server_batches(hosts, 2, SERVERS.get) == [["a0", "a1", "solo"], ["b0", "b1"]]
    assert server_batches(hosts, "50%", SERVERS.get) == [["a0", "a1"], ["solo"], ["b0", "b1"]]  # 50 % of 3 servers
    assert server_batches(hosts, None, SERVERS.get) == [["a0", "a1", "solo", "b0", "b1"]]
    assert servers_in(["a0", "solo", "a1"], SERVERS.get) == [["a0", "a1"], ["solo"]]


def test_a_failed_rank_fails_its_server_for_max_fail_percentage(tmp_path):
    eng, plays, calls, events = make(tmp_path, PB, fail_on=[("a1", "start")])
    hosts = [H("a0"), H("a1"), H("b0"), H("b1"), H("c"), H("d")]
    # 4 servers in one batch; 1 failed = 25 %: 25 goes on, so the run is not aborted
    eng.run_play(plays[0], hosts, lambda h: {}, max_fail_percentage=25, servers=SERVERS)
    end = [f for ev, f in events if ev == "batch_end"]
    assert end == [{"batch": 1, "failed": 1, "size": 4}]
    # serial 1: the server a (2 hosts) fails as one, and the rest is not started
    eng, plays, calls, events = make(tmp_path, PB, fail_on=[("a1", "start")])
    recaps = eng.run_play(plays[0], hosts, lambda h: {}, serial=1, servers=SERVERS)
    assert {c[0] for c in calls} == {"a0", "a1"}
    assert recaps["b0"].outcome == "not started"
    assert [f for ev, f in events if ev == "batch_end"] == [{"batch": 1, "failed": 1, "size": 1}]


def _run(fn, *args, **kw):
    out = {}

    def go():
        try:
            out["ok"] = fn(*args, **kw)
        except BarrierBroken as exc:
            out["err"] = str(exc)
    t = threading.Thread(target=go)
    t.start()
    return t, out


def test_barrier_waits_for_every_rank():
    b = ServerBarrier()
    b.set_servers({"a0": ["a0", "a1"], "a1": ["a0", "a1"]})
    b.start_batch(["a0", "a1"])
    t, out = _run(b.wait, "a0", "stopped", timeout=CEILING_S)
    t.join(0.2)
    assert t.is_alive()  # a1 has not stopped yet
    assert b.wait("a1", "stopped", timeout=CEILING_S) == ["a0"]
    t.join(CEILING_S)
    assert out == {"ok": ["a1"]}
    assert b.wait("solo", "stopped") == []  # a single-node host meets no one


def test_strict_barrier_breaks_when_a_rank_fails_and_loose_one_waits_for_the_living():
    b = ServerBarrier()
    b.set_servers({h: ["a0", "a1"] for h in ("a0", "a1")})
    b.start_batch(["a0", "a1"])
    t, out = _run(b.wait, "a0", "started", timeout=CEILING_S)
    b.fail("a1", "start: exit 1")
    t.join(CEILING_S)
    assert "a1 failed: start: exit 1" in out["err"]
    # the rollback meeting: a1 still runs its rescue, so a0 waits for it
    t, out = _run(b.wait, "a0", "restored", strict=False, timeout=CEILING_S)
    t.join(0.2)
    assert t.is_alive()
    b.wait("a1", "restored", strict=False, timeout=CEILING_S)
    t.join(CEILING_S)
    assert out == {"ok": ["a1"]}


def test_barrier_breaks_when_a_rank_ends_before_the_phase():
    b = ServerBarrier()
    b.set_servers({h: ["a0", "a1"] for h in ("a0", "a1")})
    b.start_batch(["a0", "a1"])
    b.host_done("a1")
    with pytest.raises(BarrierBroken, match="a1 ended before 'stopped'"):
        b.wait("a0", "stopped", timeout=CEILING_S)
    assert b.wait("a0", "restored", strict=False, timeout=CEILING_S) == ["a1"]


def test_engine_tells_the_barrier_of_a_failure_before_the_rescue(tmp_path):
    """A rank whose task fails breaks its peer's strict wait at once (the peer then runs its own
    rescue), and the rescues meet at a loose 'restored' barrier."""
    from orchestrator.engine.results import TaskFailed, TaskResult

    from .test_runner import replace_task

    eng, plays, calls, _ = make(tmp_path, PB)
    barrier = ServerBarrier()
    barrier.set_servers({h: ["a0", "a1"] for h in ("a0", "a1")})
    eng.options.hooks.append(barrier)
    seen = []

    def step(ctx, what, value=None):
        seen.append((ctx.name, what))
        if what == "stop" and ctx.name == "a1":
            raise TaskFailed("stop broke")
        if what == "install":  # a0 waits for a1 to have stopped: a1 failed instead
            try:
                barrier.wait(ctx.name, "stopped", timeout=CEILING_S)
            except BarrierBroken as exc:
                raise TaskFailed(str(exc)) from None
        if what == "restore":
            barrier.wait(ctx.name, "restored", strict=False, timeout=CEILING_S)
        return TaskResult.changed(what)

    replace_task(eng, "step", step)
    recaps = eng.run_play(plays[0], [H("a0"), H("a1")], lambda h: {}, forks=2,
                          servers={"a0": "ds@x:1", "a1": "ds@x:1"})
    assert recaps["a0"].outcome == recaps["a1"].outcome == "failed"
    assert "another rank of this server: a1 failed: step: stop broke" in recaps["a0"].cause
    assert ("a0", "restore") in seen and ("a1", "restore") in seen and ("a0", "start") not in seen
