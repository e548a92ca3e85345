"""End to end on hosts running other SGLang releases' real config-lookup code (issue 11): orch
writes and proves only the files the host's release reads, and says why a unit that died at start
runs no tuned kernel."""

from __future__ import annotations


import pytest

from tests.e2e.helpers import flat, inventory, orch, recap
from tests.waiting import files_state, wait_until

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


def test_release_without_down_lookup_gets_and_proves_only_the_up_file(testbed_factory, tmp_path):
    """SGLang 0.5.0rc2 never looks for ``_down`` files: the tune installs the up file only, the log
    proves it, and nothing is rolled back (it used to require a down file the release never reads)."""
    bed = testbed_factory(1, host_options={0: {"sglang_release": "0.5.0rc2"}})
    h = bed.hosts[0]
    # the bed's tree holds that release's fused_moe.py (its lookup lives there) but not the rest of
    # SGLang its kernel imports: tune orch's own kernel here (the provider is not under test)
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_tune_provider="builtin")
    check = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "state")
    assert check.returncode == 0, check.stderr[-4000:]
    assert "no down file: SGLang 0.5.0rc2 does not read one" in flat(check.stderr)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert r["summary"]["installed"] == [f"{h.triton_dir}/{UP}"]
    assert h.sh(f"test -e {h.triton_dir + '/' + DOWN!r}", check=False).returncode != 0, "no down file written"
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
    assert h.unit_state() == "active"


def test_unit_that_died_at_start_is_broken_with_its_cause_and_tune_fixes_it(testbed_factory, tmp_path):
    """A leftover holds the GPU, so the server exits at start (unit failed): doctor says ``broken``
    with the log's cause, not ``not-triton``; ``orch tune`` reaps the holder and the unit runs tuned."""
    bed = testbed_factory(1, host_options={0: {"gpu_exclusive": True}})
    h = bed.hosts[0]
    # the bed's stray scheduler holds /dev/nvidia0: a restart now dies at start
    h.sh(f"systemctl restart {h.unit}", check=False)
    # the server exits during its start-up, logging as it goes
    wait_until(lambda: h.unit_state() in ("failed", "inactive"), "the unit's death at start",
               progress=[lambda: files_state(h.local_path("/var/log"))])
    inv = inventory(bed, tmp_path / "hosts.yaml")
    doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    row = recap(doc)[h.name]
    assert row["verdict"] == "broken", row
    assert "before any MoE config lookup" in row["why"] and "memory capacity is unbalanced" in row["why"], row["why"]
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert recap(proc)["hosts"][h.name]["outcome"] == "completed"
    assert h.unit_state() == "active"
    doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert recap(doc)[h.name]["verdict"] == "tuned"
