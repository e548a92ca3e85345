"""Multi-node SGLang servers (``--nnodes 2``) on the test bed: the ranks of one server are found
among the run's hosts before any change (orchestrator/cli/run.py find_servers,
orchestrator/facts/server_group.py). docs/multi-node.md says what is built and what is left."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import inventory, orch, recap

pytestmark = pytest.mark.testbed


def _main_pid(host) -> int:
    out = host.sh(f"systemctl show -p MainPID {host.unit}").stdout.strip()
    return int(out.split("=", 1)[1] or 0)


def _two_ranks(testbed_factory):
    common = ["--nnodes", "2", "--dist-init-addr", "gpu-a:5000"]
    bed = testbed_factory(2, {0: {"extra_args": common + ["--node-rank", "0"]},
                              1: {"extra_args": common + ["--node-rank", "1"]}})
    for h in bed.hosts:
        h.wait_http("/health")
    return bed


def test_a_rank_left_out_by_limit_is_named_and_nothing_stops(testbed_factory, tmp_path):
    """``--limit gpu-a`` selects rank 0 only: the run is refused, naming rank 1 as missing, before
    anything is stopped; the unit keeps its process and no config file is written."""
    bed = _two_ranks(testbed_factory)
    rank0 = bed.hosts[0]
    pids = {h.name: _main_pid(h) for h in bed.hosts}
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "--limit", rank0.name,
                state_dir=tmp_path / "state")
    res = recap(proc)
    assert set(res["hosts"]) == {rank0.name}
    r = res["hosts"][rank0.name]
    assert r["outcome"] == "failed" and "Plan the files to write" in r["cause"], r
    assert "sglang-qwen@gpu-a:5000" in r["cause"] and "rank 1 of 2 is not a host of this run" in r["cause"], r["cause"]
    assert "Nothing was stopped" in r["cause"]
    for h in bed.hosts:
        assert _main_pid(h) == pids[h.name] and h.unit_state() == "active"
        assert h.sh(f"ls {h.triton_dir}", check=False).stdout.strip() == ""


UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


def _events(state, run_id) -> list:
    path = state / "runs" / run_id / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_ranks_tuned_once_installed_on_both_and_restarted_together(testbed_factory, tmp_path):
    """Rank 0 tunes; rank 1 takes the same bytes; both are stopped and restarted, both logs show
    the files loaded; readiness and the benchmark are at rank 0 only."""
    bed = _two_ranks(testbed_factory)
    rank0, rank1 = bed.hosts
    pids = {h.name: _main_pid(h) for h in bed.hosts}
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
        assert _main_pid(h) != pids[h.name] and h.unit_state() == "active"
        for name in (UP, DOWN):
            assert f"Using MoE kernel config from {h.triton_dir}/{name}." in h.unit_log()
    files = {h.name: [h.sh(f"cat {h.triton_dir}/{n}").stdout for n in (UP, DOWN)] for h in bed.hosts}
    assert files[rank0.name] == files[rank1.name] and all(files[rank0.name])
    events = _events(state, res["run_id"])
    tuned = {e["host"] for e in events if e.get("event") == "task" and e.get("module") == "tune"
             and e.get("status") == "changed"}
    assert tuned == {rank0.name}
    benched = {e["host"] for e in events if e.get("event") == "task" and e.get("module") == "bench"
               and e.get("status") in ("ok", "changed")}
    assert benched == {rank0.name}
    assert res["hosts"][rank1.name]["summary"]["config_source"]["source"] == "reuse"


def test_a_rank_that_fails_to_start_rolls_back_both(testbed_factory, tmp_path):
    """Rank 1's server crashes on the new files: both ranks fail, both get their earlier files
    back (none: the folder is empty again) and both units run again."""
    common = ["--nnodes", "2", "--dist-init-addr", "gpu-a:5000"]
    bed = testbed_factory(2, {0: {"extra_args": common + ["--node-rank", "0"]},
                              1: {"extra_args": common + ["--node-rank", "1"],
                                  "env": {"ORCH_STANDIN_FAULT_ON_CHANGE": "crash"}}})
    for h in bed.hosts:
        h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    res = recap(proc)
    rank0, rank1 = bed.hosts
    assert res["hosts"][rank1.name]["outcome"] == "failed", res["hosts"][rank1.name]
    assert res["hosts"][rank0.name]["outcome"] == "failed", res["hosts"][rank0.name]
    assert rank1.name in res["hosts"][rank0.name]["cause"], res["hosts"][rank0.name]["cause"]
    for h in bed.hosts:
        assert h.unit_state() == "active"
        assert h.sh(f"ls {h.triton_dir}", check=False).stdout.strip() == ""
