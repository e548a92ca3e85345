"""Multi-node SGLang servers (``--nnodes 2``) on the test bed: the ranks of one server are found
among the run's hosts before any change (orchestrator/cli/run.py find_servers,
orchestrator/facts/server_group.py). docs/multi-node.md says what is built and what is left."""

from __future__ import annotations

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
