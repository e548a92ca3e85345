"""End to end: unit shapes (issue 19) on one bed, each host a unit shaped as real fleets write them.

- ``gpu-a``: ``Restart=always``, ``KillMode=mixed``, ``TimeoutStopSec=infinity`` (orch's own stop
  deadline: ``systemctl stop --no-block``, then waiting), ``ExecStartPre=`` and ``ExecStopPost=``
  scripts (they log to ``/var/log/shape.log``);
- ``gpu-b``: ``Restart=on-failure``, ``KillMode=process`` (the stop leaves the stand-in's leftover
  children; the reap ends those on the unit's GPUs), ``ExecStop=`` script.

``orch tune`` completes on both, the units are running the new configs, systemd's hooks ran around
orch's stop and start, and after a rollback the old files are back.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import inventory, orch, ready_bed, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
LOG = "/var/log/shape.log"
HOSTS = {
    0: {"unit_lines": ["Restart=always", "KillMode=mixed", "TimeoutStopSec=infinity",
                       f"ExecStartPre=/bin/sh -c 'echo pre >> {LOG}'",
                       f"ExecStopPost=/bin/sh -c 'echo post >> {LOG}'"]},
    1: {"unit_lines": ["Restart=on-failure", "KillMode=process", f"ExecStop=/bin/sh -c 'echo stop >> {LOG}; "
                       "kill -TERM $MAINPID'"]},
}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    yield from ready_bed(tmp, 2, HOSTS)


def _events(state, run_id: str) -> list[dict]:
    path = state / "runs" / run_id / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _log(h) -> list[str]:
    return h.sh(f"cat {LOG}", check=False).stdout.split()


def test_tune_and_rollback_on_shaped_units(bed):
    bed, tmp = bed
    a, b = bed.hosts
    before = {h.name: h.file_tree_hash(h.config_dir) for h in bed.hosts}
    hooks = {h.name: _log(h) for h in bed.hosts}
    inv = inventory(bed, tmp / "hosts.yaml")
    state = tmp / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    for h in bed.hosts:
        r = res["hosts"][h.name]
        assert r["outcome"] == "completed", (h.name, r, proc.stderr[-3000:])
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
        assert h.unit_state() == "active"
    read = [e for e in _events(state, res["run_id"]) if e.get("event") == "task" and e.get("task") == "Read the unit"]
    msgs = {e["host"]: e["msg"] for e in read}
    assert "Restart=always, KillMode=mixed, TimeoutStopSec=infinity" in msgs[a.name], msgs
    assert "Restart=on-failure, KillMode=process, TimeoutStopSec=15, 1 ExecStop=" in msgs[b.name], msgs
    # systemd's own hooks ran around orch's stop and start
    assert _log(a)[len(hooks[a.name]):] == ["post", "pre"], _log(a)
    assert _log(b)[len(hooks[b.name]):] == ["stop"], _log(b)
    # KillMode=process left the leftovers holding the GPU; the reap ended them (and spared
    # nvidia-persistenced)
    assert res["hosts"][b.name]["summary"]["reaped"], res["hosts"][b.name]["summary"]
    rb = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert rb.returncode == 0, rb.stderr[-4000:]
    for h in bed.hosts:
        assert h.file_tree_hash(h.config_dir) == before[h.name] and h.unit_state() == "active"
