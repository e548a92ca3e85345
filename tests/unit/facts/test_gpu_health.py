"""The payload's ``xid`` answer as typed facts: a fatal Xid is new only when the probe had not seen it."""

from __future__ import annotations

from orchestrator.facts.gpu_health import GpuHealth
from remote.gpus.nvidia import NVIDIA, parse_xids

OLD = "[12.5] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
NEW = "[99.0] NVRM: Xid (PCI:0000:2a:00): 95, Uncontained ECC error\n"


def _health(text: str) -> GpuHealth:
    return GpuHealth.parse({"source": "dmesg", "source_problem": None, "xids": parse_xids(text),
                            "nvidia_smi": {"state": "ok", "reason": "", "mig": True,
                                           "gpus": [{"index": 0, "uuid": None, "mig_mode": "Enabled"}]}}, "xid")


def test_new_fatal_only_counts_lines_the_probe_had_not_read():
    before, after = _health(OLD), _health(OLD + "[50.0] NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception\n" + NEW)
    assert [x.code for x in before.fatal()] == [79]
    assert [x.describe(NVIDIA) for x in after.new_fatal(before)] == [
        "Xid 95 on 0000:2a:00 (at 99 s since boot): Uncontained ECC error"]
    assert [x.code for x in after.new_fatal(None)] == [79, 95]
    assert after.nvidia_smi.mig and not after.nvidia_smi.not_answering
