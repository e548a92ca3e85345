"""Fleet operations on the test bed: tune once per group, rolling batches, rollback, regression."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import flat, inventory, orch, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def _events(state, run_id):
    path = state / "runs" / run_id / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _tunings(events):
    return sorted(e["host"] for e in events if e["event"] == "task" and e["module"] == "tune"
                  and e["status"] == "changed")


def test_identical_hosts_tune_once_and_get_identical_files(testbed_factory, tmp_path):
    bed = testbed_factory(3, host_options={2: {"gpu_name": RTX}})
    a, b, c = bed.hosts
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    check = orch("tune", str(inv), "--service", "sglang-qwen", "--check", state_dir=state)
    assert check.returncode == 0, check.stderr[-3000:]
    text = flat(check.stderr)
    assert "would tune for group" in text and f"would reuse what {a.name} tunes" in text

    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    assert _tunings(_events(state, res["run_id"])) == [a.name, c.name]
    up_a = a.sh(f"cat {a.triton_dir + '/' + UP!r}").stdout
    assert up_a == b.sh(f"cat {b.triton_dir + '/' + UP!r}").stdout
    assert a.sh(f"cat {a.triton_dir + '/' + DOWN!r}").stdout == b.sh(f"cat {b.triton_dir + '/' + DOWN!r}").stdout
    rtx_up = "E=8,N=64,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"
    assert c.sh(f"test -f {c.triton_dir + '/' + rtx_up!r}", check=False).returncode == 0
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed"
        assert f"Using MoE kernel config from {h.triton_dir}/" in h.unit_log()
    # b reused a's files: its summary carries a's measured speedup, named as a's (terminal and HTML)
    sa, sb = res["hosts"][a.name]["summary"], res["hosts"][b.name]["summary"]
    assert sb["speedup_measured_on"] == a.name and "speedup_measured_on" not in sa
    assert sb["speedup_vs_default"] == sa["speedup_vs_default"] and sa["speedup_vs_default"]
    assert f"measured on {a.name}" in flat(proc.stderr)
    assert f"measured on {a.name}" in (state / "runs" / res["run_id"] / "report.html").read_text()

    # a later run reuses the store: no tuning at all
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "--limit", b.name, state_dir=state)
    assert again.returncode == 0, again.stderr[-4000:]
    assert _tunings(_events(state, recap(again)["run_id"])) == []
    assert "reusing stored result" in flat(again.stderr)
    assert recap(again)["hosts"][b.name]["summary"]["speedup_measured_on"].startswith(f"{a.name} (run ")
    listing = orch("configs", "list", "--json", "--state-dir", str(state), state_dir=state)
    assert len(json.loads(listing.stdout)) == 2


def test_failed_batch_leaves_later_hosts_untouched(testbed_factory, tmp_path):
    bed = testbed_factory(3, host_options={0: {"env": {"ORCH_STANDIN_FAULT_ON_CHANGE": "never_ready"}}})
    first, *rest = bed.hosts
    for h in bed.hosts:
        h.wait_http("/health")
    before = {h.name: (h.file_tree_hash("/opt/sglang"), h.sh(f"systemctl show -p MainPID {h.unit}").stdout)
              for h in rest}
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_ready_timeout=8)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--serial", "1", "--max-fail-percentage", "0",
                "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1
    res = recap(proc)["hosts"]
    assert res[first.name]["outcome"] == "failed"
    for h in rest:
        assert res[h.name]["outcome"] == "not started"
        assert (h.file_tree_hash("/opt/sglang"), h.sh(f"systemctl show -p MainPID {h.unit}").stdout) == before[h.name]
    assert first.unit_state() == "active"


def test_rollback_restores_either_earlier_state(testbed_factory, tmp_path):
    old_up = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                    "num_warps": 4, "num_stages": 2}}
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: old_up}}})
    h = bed.hosts[0]
    state = tmp_path / "state"
    s0 = h.file_tree_hash(h.config_dir)
    r1 = recap(orch("tune", str(inventory(bed, tmp_path / "h1.yaml")), "--service", "sglang-qwen", "--json",
                    state_dir=state))
    s1 = h.file_tree_hash(h.config_dir)
    r2 = recap(orch("tune", str(inventory(bed, tmp_path / "h2.yaml", orch_tune_batch_sizes=[1, 4, 8])),
                    "--service", "sglang-qwen", "--json", state_dir=state))
    s2 = h.file_tree_hash(h.config_dir)
    assert r1["hosts"][h.name]["outcome"] == r2["hosts"][h.name]["outcome"] == "completed"
    assert len({json.dumps(s, sort_keys=True) for s in (s0, s1, s2)}) == 3
    inv = str(inventory(bed, tmp_path / "h3.yaml"))
    # default target: the most recent run -> back to s1
    rb = orch("rollback", inv, "--service", "sglang-qwen", "--json", state_dir=state)
    assert rb.returncode == 0, rb.stderr[-4000:]
    assert h.file_tree_hash(h.config_dir) == s1
    assert h.unit_state() == "active"
    # back to the state before the first run: the pre-run bytes exactly
    rb = orch("rollback", inv, "--service", "sglang-qwen", "--to", r1["run_id"], "--json", state_dir=state)
    assert rb.returncode == 0, rb.stderr[-4000:]
    assert h.file_tree_hash(h.config_dir) == s0
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
    # a rollback is a run too: undo it
    last = recap(rb)["run_id"]
    rb = orch("rollback", inv, "--service", "sglang-qwen", "--to", last, "--json", state_dir=state)
    assert rb.returncode == 0, rb.stderr[-4000:]
    assert h.file_tree_hash(h.config_dir) == s1
    hist = orch("runs", inv, "--json", state_dir=state)
    runs = json.loads(hist.stdout)[h.name]["runs"]
    assert {r1["run_id"], r2["run_id"], last} <= {r["run_id"] for r in runs}


def test_throughput_regression_rolls_back(testbed_factory, tmp_path):
    bed = testbed_factory(1, host_options={0: {"env": {"ORCH_STANDIN_REGRESSION": "1"}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    tree = h.file_tree_hash(h.config_dir)
    proc = orch("tune", str(inventory(bed, tmp_path / "hosts.yaml", orch_regression_threshold=3)), "--service",
                "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed" and "throughput regression" in r["cause"]
    assert h.file_tree_hash(h.config_dir) == tree
    assert h.unit_state() == "active"


def test_shard_tuning_splits_batch_sizes_and_merges(testbed_factory, tmp_path):
    bed = testbed_factory(2)
    a, b = bed.hosts
    state = tmp_path / "state"
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_tune_batch_sizes=[1, 2, 4, 8])
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--shard-tuning", "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    events = _events(state, res["run_id"])
    tuned = {e["host"]: e["data"]["remote"]["batch_sizes"] for e in events
             if e["event"] == "task" and e["module"] == "tune" and e["status"] == "changed"}
    assert sorted(tuned) == [a.name, b.name]
    assert sorted(tuned[a.name] + tuned[b.name]) == [1, 2, 4, 8] and not set(tuned[a.name]) & set(tuned[b.name])
    files = [json.loads(h.sh(f"cat {h.triton_dir + '/' + UP!r}").stdout) for h in (a, b)]
    assert files[0] == files[1] and sorted(files[0], key=int) == ["1", "2", "4", "8"]
    for h in (a, b):
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
