"""GPU faults on the payload side (issue 21 rows 11, 12): Xid lines, queries under a deadline,
what MIG hosts print."""

from __future__ import annotations

import sys
import time

from remote.host.bounded import run_bounded
from remote.gpus.nvidia import FATAL_XIDS, parse_compute_apps, parse_mig_query, parse_xid_line, parse_xids
from remote.host.reap import in_unit_cgroup


def test_xid_lines_of_dmesg_kmsg_and_older_drivers():
    """dmesg's stamped line, a /dev/kmsg record and the older form without ``PCI:`` all parse."""
    x = parse_xid_line("[ 8123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, "
                       "GPU has fallen off the bus.")
    assert x == {"pci": "0000:18:00", "code": 79, "text": "pid=4242, name=python3, GPU has fallen off the bus.",
                 "time_s": 8123.456789, "fatal": True}
    k = parse_xid_line("4,1932,8123456789,-;NVRM: Xid (PCI:0000:2A:00): 13, pid=7, Graphics Exception")
    assert k["pci"] == "0000:2a:00" and k["code"] == 13 and k["time_s"] == 8123.456789 and not k["fatal"]
    old = parse_xid_line("NVRM: Xid (0000:3a:00): 48, An uncorrectable double bit error")
    assert old["code"] == 48 and old["fatal"] and old["time_s"] is None
    assert parse_xid_line("[  1.0] nvidia: module license 'NVIDIA' taints kernel.") is None


def test_parse_xids_keeps_order_and_fatal_set():
    text = ("[1.0] usb 1-1: new device\n[2.0] NVRM: Xid (PCI:0000:18:00): 31, pid=1, MMU Fault\n"
            "[3.0] NVRM: Xid (PCI:0000:18:00): 95, Uncontained ECC error\n")
    assert [(x["code"], x["fatal"]) for x in parse_xids(text)] == [(31, False), (95, True)]
    assert {48, 63, 64, 74, 79, 94, 95, 119, 120} == set(FATAL_XIDS)


def test_run_bounded_ok_failed_timeout():
    ok = run_bounded([sys.executable, "-c", "print('hi')"], 10)
    assert ok.state == "ok" and ok.stdout == "hi\n"
    bad = run_bounded([sys.executable, "-c", "import sys; sys.exit(3)"], 10)
    assert bad.state == "failed" and bad.returncode == 3
    t0 = time.monotonic()
    slow = run_bounded([sys.executable, "-c", "import time; time.sleep(60)"], 0.5, grace_s=5)
    assert slow.state == "timeout" and time.monotonic() - t0 < 10
    assert run_bounded(["/nonexistent/nvidia-smi"], 1).state == "missing"


def test_run_bounded_gives_up_on_a_process_that_keeps_its_output_open():
    """A process that SIGKILL does not end (D state) keeps its pipe open; stood in for here by a
    child in its own session holding stdout: the call returns "hung" within deadline + grace."""
    code = ("import os, time\n"
            "if os.fork() == 0:\n    os.setsid(); time.sleep(30); os._exit(0)\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    r = run_bounded([sys.executable, "-c", code], 0.5, grace_s=0.5)
    assert r.state == "hung" and "could not be ended" in r.reason
    assert time.monotonic() - t0 < 5


def test_mig_query_tolerates_na_and_permissions():
    text = ("0, GPU-3f0c1a2b-0000-0000-0000-000000000000, Enabled\n"
            "1, [Insufficient Permissions], [N/A]\n"
            "No devices were found\n2, GPU-aa, \n")
    assert parse_mig_query(text) == [
        {"index": 0, "uuid": "GPU-3f0c1a2b-0000-0000-0000-000000000000", "mig_mode": "Enabled"},
        {"index": 1, "uuid": None, "mig_mode": None},
        {"index": 2, "uuid": "GPU-aa", "mig_mode": None}]


def test_compute_apps_with_na_memory_and_mig_rows():
    text = "4242, python3, [N/A]\nMIG-8a1d, x, 1\n77, sglang::scheduler_TP0, 1024\n"
    assert parse_compute_apps(text) == [
        {"pid": 4242, "process_name": "python3", "used_memory_mib": None},
        {"pid": 77, "process_name": "sglang::scheduler_TP0", "used_memory_mib": 1024}]


def test_unit_cgroup_by_systemd_hierarchy_only():
    v2 = "0::/system.slice/sglang-a.service\n"
    assert in_unit_cgroup(v2, "sglang-a.service")
    assert not in_unit_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n", "sglang-a.service")
    v1 = "4:memory:/system.slice/sglang-a.service\n1:name=systemd:/user.slice/session-2.scope\n0::/\n"
    assert not in_unit_cgroup(v1, "sglang-a.service"), "a resource controller's path does not count"
    assert in_unit_cgroup("1:name=systemd:/bed/system.slice/sglang-a.service\n0::/\n", "sglang-a.service")
    assert not in_unit_cgroup(v2, None)
