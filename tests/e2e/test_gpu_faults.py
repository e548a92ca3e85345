"""End to end: GPU faults real fleets report (issue 21 rows 11 and 12), over real SSH against
test-bed hosts whose ``nvidia-smi`` and ``dmesg`` are stand-ins (tests/testbed/README.md):

1. a GPU in MIG mode: another slice's process holds the same ``/dev/nvidia0``; only the unit's
   own cgroup is reaped (sglang #2933, vllm #55381);
2. ``nvidia-smi`` hangs (D state after an Xid, leptonai/gpud #117): the run does not hang, the
   host is refused before anything stops;
3. an Xid 79 (GPU fallen off the bus) logged during the tune: the host's rollout stops, the earlier
   files are back and the unit runs; the other host is tuned as the fleet policy says.

docs/reliability.md lists what orch does in each case.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.helpers import inventory, orch, recap
from tests.paths import REPO
from tests.testbed.bed import VENV_PYTHON

pytestmark = pytest.mark.testbed

HOLDER = "tests/testbed/holder.py"
XID_79 = "[ 9321.004217] NVRM: Xid (PCI:0000:18:00): 79, pid=1877, name=python3, GPU has fallen off the bus."


def _events(state, run_id: str) -> list:
    return [json.loads(x) for x in (state / "runs" / run_id / "events.jsonl").read_text().splitlines()]


def _alive(h, pid: int) -> bool:
    return h.sh(f"kill -0 {pid}", check=False).returncode == 0


def _cgroup_of(h, base: str, rel: str, pid: int) -> None:
    """Move ``pid`` (a host PID) into ``base/rel`` of systemd's v1 hierarchy, mounted in the host."""
    h.sh(f"mkdir -p {base}/{rel} && echo {pid} > {base}/{rel}/cgroup.procs")


def test_mig_host_reaps_only_the_units_own_cgroup(testbed_factory, tmp_path):
    """GPU 0 in MIG mode (two slices, memory fields ``[N/A]``). Holding ``/dev/nvidia0``: the unit's
    leftover ``sglang::scheduler_TP0`` (in the unit's cgroup) and another slice's CUDA process (in a
    user's session scope, listed by nvidia-smi as a compute app). The tune ends the leftover and
    leaves the other slice's process running, and says so."""
    bed = testbed_factory(1, {0: {"nvidia_smi": True, "mig": {0: ["3g.71gb", "3g.71gb"]}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    h.sh(f"cd {REPO} && {VENV_PYTHON} {HOLDER} --user tenant-b --comm python3 /dev/nvidia0 "
         "</dev/null >/dev/null 2>&1")
    holders = h.pids_holding("/dev/nvidia0")
    tenant = next(p for p, c in holders if "tenant-b" in c)
    stray = next(p for p, c in holders if c.startswith("sglang::scheduler_TP0"))
    # systemd's own hierarchy (name=systemd), as a real host has it: the bed's units get no cgroup
    # of their own from docker-systemctl-replacement, so the test puts the two holders there
    root = "/run/orchtb/cg"
    base = f"{root}/orchtb-mig-{tmp_path.name[-24:]}"
    h.sh(f"mkdir -p {root} && mount -t cgroup -o none,name=systemd orchtb-cg {root}")
    try:
        _cgroup_of(h, base, "system.slice/sglang-qwen.service", stray)
        _cgroup_of(h, base, "user.slice/user-1001.slice/session-7.scope", tenant)
        h.local_path("/run/orchtb/compute_apps.json").write_text(json.dumps([stray, tenant]))
        state = tmp_path / "state"
        proc = orch("tune", str(inventory(bed, tmp_path / "hosts.yaml")), "--service", "sglang-qwen", "--json",
                    state_dir=state)
        res = recap(proc)
        r = res["hosts"][h.name]
        assert r["outcome"] == "completed", r
        assert _alive(h, tenant), "another MIG slice's process was ended"
        assert not _alive(h, stray), "the unit's own leftover was not reaped"
        assert h.unit_state() == "active"
        left = [e for e in _events(state, res["run_id"]) if e.get("event") == "gpu_holders_left"]
        assert left and left[0]["why"] == "mig" and [p["pid"] for p in left[0]["holders"]] == [tenant], left
        health = [e for e in _events(state, res["run_id"]) if e.get("event") == "gpu_health"]
        assert health[0]["mig"] is True, health
    finally:
        h.sh(f"for d in $(find {base} -depth -type d); do cat $d/cgroup.procs > {root}/cgroup.procs 2>/dev/null; "
             f"rmdir $d; done; umount {root}", check=False)


def test_hanging_nvidia_smi_refuses_the_host_before_any_stop(testbed_factory, tmp_path):
    """Every nvidia-smi call blocks forever and cannot be ended (the hang knob). The run ends
    within its deadlines, the host is refused with a reason naming nvidia-smi, the unit was never
    stopped and no file changed."""
    bed = testbed_factory(1, {0: {"nvidia_smi": True}})
    h = bed.hosts[0]
    h.wait_http("/health")
    main_pid = h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip()
    before = h.file_tree_hash(h.config_dir)
    h.sh("touch /run/orchtb/nvidia-smi.hang")
    t0 = time.monotonic()
    proc = orch("tune", str(inventory(bed, tmp_path / "hosts.yaml")), "--service", "sglang-qwen", "--json",
                state_dir=tmp_path / "state")
    took = time.monotonic() - t0
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed" and "nvidia-smi did not answer" in r["cause"], r
    assert "Nothing was stopped" in r["cause"], r
    assert took < 300, took
    assert h.unit_state() == "active"
    assert h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip() == main_pid, "the unit was restarted"
    assert h.file_tree_hash(h.config_dir) == before


def test_xid_79_during_the_tune_stops_that_hosts_rollout(testbed_factory, tmp_path):
    """gpu-a's kernel log gets an Xid 79 between the probe's read and the read after the tune (the
    dmesg stand-in's ``later`` lines). gpu-a fails naming the Xid, its earlier files are back and
    its unit runs again (started as systemd can); gpu-b, whose log is clean, is tuned (the fleet's
    default policy runs every host; the failure counts for max_fail_percentage)."""
    bed = testbed_factory(2, {0: {"dmesg": True}, 1: {"dmesg": True}})
    a, b = bed.hosts
    for h in bed.hosts:
        h.wait_http("/health")
    a.local_path("/run/orchtb/dmesg.json").write_text(json.dumps({
        "lines": ["[    4.101010] nvidia: loading out-of-tree module taints kernel."],
        "later": [XID_79], "later_from_call": 2}))
    b.local_path("/run/orchtb/dmesg.json").write_text(json.dumps({"lines": []}))
    before = a.file_tree_hash(a.config_dir)
    proc = orch("tune", str(inventory(bed, tmp_path / "hosts.yaml")), "--service", "sglang-qwen", "--json",
                state_dir=tmp_path / "state")
    res = recap(proc)["hosts"]
    ra = res[a.name]
    assert ra["outcome"] == "failed" and "Xid 79 on 0000:18:00" in ra["cause"], ra
    assert "GPU has fallen off the bus" in ra["cause"] and ra["rescued"] == 1, ra
    assert ra["summary"]["gpu_lost"][0]["code"] == 79, ra
    assert a.unit_state() == "active"
    assert a.file_tree_hash(a.config_dir) == before
    assert res[b.name]["outcome"] == "completed", res[b.name]
    assert b.unit_state() == "active"
