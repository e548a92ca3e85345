"""End to end: servers started in the other ways real fleets use (issue 19, launch forms).

One bed, three hosts, the Python that runs SGLang taken from each unit (no
``ansible_python_interpreter``), as on a real fleet:

- ``gpu-a``: SGLang's console script, ``ExecStart=-/opt/sglang/bin/sglang serve /models/tiny-moe ...``
  (model path positional; the interpreter is the script's shebang, read on the host);
- ``gpu-b``: ``/usr/bin/numactl --cpunodebind=0 --membind=0 conda run -n sglang --no-capture-output python -m
  sglang.launch_server ...`` (the conda stand-in, ``tests/testbed/conda_standin.py``, logs what it
  runs: the payload must run through the same wrappers);
- ``gpu-c``: a form orch does not know (``nohup``): refused at "Read the unit", nothing changed.

``orch tune``, ``orch doctor``, ``orch rollback`` and ``orch recover`` (after a controller killed
mid-tune) run on the first two.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from orchestrator.records import new_run_id
from tests.e2e.helpers import inventory, orch, ready_bed, recap
from tests.e2e.test_faults import LONG_TUNE, _events, _popen, _task_done, _wait_event
from tests.waiting import wait_process

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
ARGS = "--tp 1 --port 30000 --host 0.0.0.0"
HOSTS = {
    0: {"exec_start": "-{sglang} serve /models/tiny-moe " + ARGS},
    1: {"exec_start": "/usr/bin/numactl --cpunodebind=0 --membind=0 {conda} run -n sglang --no-capture-output "
                      "python -m sglang.launch_server --model-path /models/tiny-moe " + ARGS},
    2: {"exec_start": "/usr/bin/nohup {python} -m sglang.launch_server {args}"},
}


def _unit_python(path: Path, **group_vars) -> Path:
    """The bed's inventory without ``ansible_python_interpreter``: orch runs the unit's Python."""
    data = yaml.safe_load(path.read_text())
    for group in data["all"]["children"].values():
        group["vars"].pop("ansible_python_interpreter", None)
        group["vars"].update(group_vars)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _main_pid(h) -> int:
    return int(h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip().split("=", 1)[1] or 0)


def _conda_runs(h) -> list[list[str]]:
    res = h.sh("cat /opt/sglang/conda/run.log", check=False)
    return [json.loads(x) for x in res.stdout.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launchers")
    yield from ready_bed(tmp, 3, HOSTS)


def test_tune_doctor_rollback_on_sglang_serve_and_wrapped_units(bed):
    bed, tmp = bed
    a, b, c = bed.hosts
    before = {h.name: h.file_tree_hash(h.config_dir) for h in bed.hosts}
    pid_c = _main_pid(c)
    inv = _unit_python(inventory(bed, tmp / "hosts.yaml"))
    state = tmp / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    for h in (a, b):
        r = res["hosts"][h.name]
        assert r["outcome"] == "completed", (h.name, r, proc.stderr[-3000:])
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
        assert h.unit_state() == "active"
    # the payload ran through the unit's conda run (the environment's own python)
    payload = [cmd for cmd in _conda_runs(b) if cmd[:1] == ["env"] and "remote" in cmd]
    assert {cmd[cmd.index("remote") + 1] for cmd in payload} >= {"version", "probe"}, payload
    assert all(cmd[cmd.index("remote") - 2:cmd.index("remote")] == ["python", "-m"] for cmd in payload), payload
    # the unknown form: refused before anything changed, naming the forms orch knows
    rc = res["hosts"][c.name]
    assert rc["outcome"] == "failed", rc
    assert "is not an SGLang server" in rc["cause"] and "/usr/bin/nohup" in rc["cause"], rc
    assert "sglang serve" in rc["cause"] and "numactl" in rc["cause"], rc
    assert _main_pid(c) == pid_c and c.unit_state() == "active"
    assert c.file_tree_hash(c.config_dir) == before[c.name]

    doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--limit", f"{a.name},{b.name}", "--json",
               state_dir=state)
    assert doc.returncode == 0, doc.stdout[-3000:] + doc.stderr[-3000:]
    rows = recap(doc)
    for h in (a, b):
        assert rows[h.name]["verdict"] == "tuned", rows[h.name]
        assert f"{h.triton_dir}/{UP}" in rows[h.name]["log"]["loaded"], rows[h.name]

    rb = orch("rollback", str(inv), "--service", "sglang-qwen", "--limit", f"{a.name},{b.name}", "--json",
              state_dir=state)
    assert rb.returncode == 0, rb.stderr[-4000:]
    for h in (a, b):
        assert h.file_tree_hash(h.config_dir) == before[h.name], h.name
        assert h.unit_state() == "active"
        h.wait_http("/health")


def test_recover_after_a_controller_killed_mid_tune(bed):
    """For each launch form: a controller killed while the unit is stopped for the tune (after the
    reap), then ``orch recover`` puts the earlier files back and starts the unit."""
    bed, tmp = bed
    for h in bed.hosts[:2]:
        before = h.file_tree_hash(h.config_dir)
        inv = _unit_python(inventory(bed, tmp / f"hosts-recover-{h.name}.yaml", **LONG_TUNE))
        state, rid, log = tmp / f"state-kill-{h.name}", new_run_id("tune"), tmp / f"orch-{h.name}.log"
        proc = _popen(["tune", str(inv), "--service", "sglang-qwen", "--limit", h.name], state, rid, log,
                      new_session=True)
        try:
            _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
            os.killpg(proc.pid, signal.SIGKILL)
            wait_process(proc, "orch's end after SIGKILL")
        finally:
            if proc.poll() is None:
                proc.kill()
        assert h.unit_state() in ("inactive", "failed"), h.name
        rec = orch("recover", str(inv), "--service", "sglang-qwen", "--limit", h.name, "--json",
                   "--state-dir", str(tmp / f"state-rec-{h.name}"), state_dir=tmp / f"state-rec-{h.name}")
        assert rec.returncode == 0, rec.stdout[-3000:] + rec.stderr[-3000:]
        assert recap(rec)["hosts"][h.name]["outcome"] == "completed", recap(rec)["hosts"][h.name]
        assert h.unit_state() == "active" and h.file_tree_hash(h.config_dir) == before, h.name
        h.wait_http("/health")
