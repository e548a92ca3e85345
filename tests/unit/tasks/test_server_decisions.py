"""What the ranks of a multi-node server decide together (orchestrator/host/servers.py): whether
``orch recover`` restarts every rank, and whether ``orch rollback`` may undo their runs; and the
barrier carrying each rank's part of it (orchestrator/fleet.py ServerBarrier.shared)."""

from __future__ import annotations

import threading

from orchestrator.facts.server_group import ServerGroup
from orchestrator.fleet import ServerBarrier
from orchestrator.host.servers import RankRecovery, rollback_disagreement, server_restart
from tests.waiting import CEILING_S  # a hang guard only: the waits end on their condition

GROUP = ServerGroup(key="sglang-ds@gpu-a:5000", unit="sglang-ds", dist_init_addr="gpu-a:5000", nnodes=2,
                    hosts=["gpu-a", "gpu-b"], rank=0)


def test_recover_restarts_every_rank_once_a_run_stopped_one_or_a_rank_is_down():
    stopped = RankRecovery(runs=["r1 (stopped)"], past_start=True, active_state="inactive")
    # rank 1 still runs (it waits for rank 0): it is restarted with the others
    why = server_restart({"gpu-a": stopped, "gpu-b": RankRecovery(runs=["r1 (stopped)"], past_start=True,
                                                                   active_state="active")})
    assert why and "gpu-a: r1 (stopped)" in why and "gpu-a (inactive)" in why
    # a rank with nothing of its own to recover is restarted too
    assert server_restart({"gpu-a": stopped, "gpu-b": RankRecovery(active_state="active")})
    # a run still at `started` stopped nothing: nothing is restarted while every rank runs
    assert server_restart({"gpu-a": RankRecovery(runs=["r1 (started)"], active_state="active"),
                           "gpu-b": RankRecovery(active_state="active")}) is None
    assert server_restart({"gpu-a": RankRecovery(runs=["r1 (started)"], active_state="active"),
                           "gpu-b": RankRecovery(active_state="failed")})
    # no unfinished run anywhere: nothing to do, whatever the units' states
    assert server_restart({"gpu-a": RankRecovery(active_state="inactive"), "gpu-b": RankRecovery()}) is None


def test_rollback_refuses_ranks_that_would_undo_different_runs_or_nothing():
    assert rollback_disagreement(GROUP, {"gpu-a": "r1", "gpu-b": "r1"}) is None
    assert rollback_disagreement(GROUP, {"gpu-a": None, "gpu-b": None}) is None
    why = rollback_disagreement(GROUP, {"gpu-a": "r2", "gpu-b": "r1"})
    assert "rank 0 (gpu-a): r2" in why and "rank 1 (gpu-b): r1" in why and "Nothing was stopped" in why
    why = rollback_disagreement(GROUP, {"gpu-a": "r1", "gpu-b": None})
    assert "rank 1 (gpu-b): nothing to undo" in why and "sglang-ds@gpu-a:5000" in why


def test_each_rank_reads_what_every_rank_brought_to_a_meeting():
    barrier = ServerBarrier()
    barrier.set_servers({"gpu-a": ["gpu-a", "gpu-b"], "gpu-b": ["gpu-a", "gpu-b"]})
    got = {}

    def rank(host, value):
        barrier.wait(host, "chosen", timeout=CEILING_S, value=value)
        got[host] = barrier.shared(host, "chosen")

    threads = [threading.Thread(target=rank, args=(h, v)) for h, v in (("gpu-a", "r1"), ("gpu-b", None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {"gpu-a": {"gpu-a": "r1", "gpu-b": None}, "gpu-b": {"gpu-b": None, "gpu-a": "r1"}}
    barrier.start_batch(["gpu-a", "gpu-b"])  # a new batch forgets the values
    assert barrier.shared("gpu-a", "chosen") == {}


def test_a_rank_that_rank_0s_stop_ended_counts_as_stopped_by_the_run(tmp_path):
    """SGLang 0.5.23: rank 0's shutdown broadcast ends every rank, so rank 1's own stop finds it
    down. It was running when the play began, so this run stopped it: its rescue must start it
    again (else rank 0's rescue start waits for ever for it). A rank down before the run is not."""
    from orchestrator.tasks import TASKS
    from tests.fakes import ScriptedConnection, make_ctx

    rank1 = ServerGroup(key=GROUP.key, unit=GROUP.unit, dist_init_addr=GROUP.dist_init_addr, nnodes=2,
                        hosts=GROUP.hosts, rank=1)
    spec = TASKS["service"]
    for was_active, stopped in ((True, True), (False, False)):
        conn = ScriptedConnection([("^systemctl is-active sglang-ds", (3, "failed\n", ""))])
        ctx = make_ctx(tmp_path, {"orch_server_group": rank1}, connection=conn, name="gpu-b")
        ctx.run.was_active = was_active
        res = spec.fn(ctx, **spec.coerce(spec.bind({"name": "sglang-ds", "state": "stopped", "timeout": 5})))
        assert res.status == "ok" and "already failed" in res.msg
        assert ctx.run.stopped_by_orch is stopped
        assert not any("stop" in " ".join(argv) for argv, _ in conn.calls)
