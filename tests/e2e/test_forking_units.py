"""End to end: ``Type=forking`` SGLang units (issue 19), daemonized by Debian's real
``start-stop-daemon`` (start-stop-daemon(8)) as forking units are written, with ``PIDFile=``:

- ``gpu-a``: ``start-stop-daemon --start --background --make-pidfile --pidfile /run/sglang-qwen.pid
  --output /var/log/sglang-qwen.log --exec PYTHON -- -m sglang.launch_server ...``: the server's log
  is that file, not the unit's journal;
- ``gpu-b``: the same with ``--no-close`` instead of ``--output``: the server keeps the unit's
  output (the journal).

The unit's MainPID is the server's (systemd, and the bed's docker-systemctl-replacement, read it
from ``PIDFile=`` once start-stop-daemon has exited). ``orch tune`` completes on both, proves the
new files were read from the log where it is, ``orch doctor`` says tuned from the same log, and
``orch rollback`` puts the old files back; every time the unit runs a new server whose PID is the
PID file's.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import inventory, orch, ready_bed, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
PIDFILE = "/run/sglang-qwen.pid"
OUTPUT = "/var/log/sglang-qwen.log"
SSD = ("/usr/sbin/start-stop-daemon --start --background --make-pidfile --pidfile " + PIDFILE + " {how} "
       "--exec {{python}} -- -m sglang.launch_server {{args}}")
HOSTS = {
    0: {"exec_start": SSD.format(how="--output " + OUTPUT), "unit_lines": ["Type=forking", f"PIDFile={PIDFILE}"]},
    1: {"exec_start": SSD.format(how="--no-close"), "unit_lines": ["Type=forking", f"PIDFile={PIDFILE}"]},
}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forking")
    yield from ready_bed(tmp, 2, HOSTS)


def _server_log(h) -> str:
    return h.sh(f"cat {OUTPUT}").stdout if h.name == "gpu-a" else h.unit_log()


def _main_pid(h) -> int:
    """The unit's MainPID, checked to be the PID file's and a running server (not start-stop-daemon)."""
    pid = int(h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip().removeprefix("MainPID="))
    assert pid == int(h.sh(f"cat {PIDFILE}").stdout.strip())
    assert "-m sglang.launch_server" in h.sh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    return pid


def test_tune_doctor_rollback_on_forking_units(bed):
    bed, tmp = bed
    a, b = bed.hosts
    before = {h.name: h.file_tree_hash(h.config_dir) for h in bed.hosts}
    pids = {h.name: _main_pid(h) for h in bed.hosts}
    assert "Using MoE kernel config" not in a.unit_log()  # gpu-a's server logs to its --output file only
    inv = inventory(bed, tmp / "hosts.yaml")
    state = tmp / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    events = [json.loads(x) for x in (state / "runs" / res["run_id"] / "events.jsonl").read_text().splitlines()]
    read = {e["host"]: e["msg"] for e in events if e.get("event") == "task" and e.get("task") == "Read the unit"}
    for h in bed.hosts:
        r = res["hosts"][h.name]
        assert r["outcome"] == "completed", (h.name, r, proc.stderr[-3000:])
        assert "Type=forking" in read[h.name], read
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in _server_log(h), h.name
        assert h.unit_state() == "active"
        new = _main_pid(h)
        assert new != pids[h.name]  # orch's restart started a new server, which the PID file names
        pids[h.name] = new
    assert f"Using MoE kernel config from {a.triton_dir}/{UP}." not in a.unit_log()
    doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    rows = recap(doc)
    for h in bed.hosts:
        assert rows[h.name]["verdict"] == "tuned", rows[h.name]
    rb = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert rb.returncode == 0, rb.stderr[-4000:]
    for h in bed.hosts:
        assert recap(rb)["hosts"][h.name]["outcome"] == "completed"
        assert h.file_tree_hash(h.config_dir) == before[h.name] and h.unit_state() == "active"
        assert _main_pid(h) != pids[h.name]
