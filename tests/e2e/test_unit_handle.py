"""End to end: the unit's handle (``orch_systemd_unit``, issue 28) on units that are not a plain
system unit logging to the journal: a unit of the login user's own manager (``systemctl --user``,
host option ``user_unit``) and a unit whose output goes to a file (``StandardOutput=append:``).

- A runner trial on a user unit writes its drop-in where the user's manager reads it
  (``~/.config/systemd/user/UNIT.d/``), reloads and restarts that manager (``systemctl --user``
  as the login user), never the system's through sudo; the rollback undoes it there.
- A re-run that would change nothing finds the last start in the log where the unit writes it
  (the user's journal, read as the user; the unit's log file) and stops and restarts nothing.

Before the handle, the runner trial restarted and daemon-reloaded the system manager for such a
unit (which has no such unit: every candidate failed to start and the trial kept nothing), and the
re-run read only the system journal through sudo, found no start, and restarted both units.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import inventory, orch, recap
from tests.testbed.bed import LOGIN_HOME, SUDO_LOG

pytestmark = pytest.mark.testbed

USER_UNITS = f"{LOGIN_HOME}/.config/systemd/user"
DROPIN_DIR = f"{USER_UNITS}/sglang-qwen.service.d"
DROPIN = DROPIN_DIR + "/orch-moe-runner.conf"
LOGFILE = "/var/log/sglang.log"


def _started(h) -> tuple[str, str]:
    """(MainPID, InvocationID) of the host's unit now: both change with every start."""
    props = dict(line.split("=", 1) for line in h.systemctl(f"show -p MainPID -p InvocationID {h.unit}")
                 .stdout.splitlines() if "=" in line)
    return props.get("MainPID", ""), props.get("InvocationID", "")


def _sudo_commands(h) -> list[str]:
    """Every command the login user ran through sudo on the host (its sudo log's COMMAND=)."""
    lines = h.sh(f"cat {SUDO_LOG}", check=False).stdout.splitlines()
    return [x.split("COMMAND=", 1)[1] for x in lines if "COMMAND=" in x]


def _about_the_unit(cmds: list[str], unit: str) -> list[str]:
    """The sudo commands that asked a manager or a journal about ``unit``: none may, for a user unit."""
    return [c for c in cmds if unit in c and ("systemctl" in c or "journalctl" in c)]


def _changed(state, run_id: str) -> list[str]:
    """``task: message`` of every task of the run that reported a change (its events)."""
    events = [json.loads(x) for x in (state / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    return [f"{e.get('task')}: {e.get('msg')}" for e in events if e.get("event") == "task"
            and e.get("status") == "changed"]


def _runner(h) -> str:
    """The runner the stand-in server runs (``standin_moe.runner`` of ``/get_server_info``)."""
    out = h.py("import sys,urllib.request;print(urllib.request.urlopen(sys.argv[1]).read().decode())",
               h.url + "/get_server_info").stdout
    return json.loads(out)["standin_moe"]["runner"]


#: the two unit shapes whose last start is not in the system journal
SHAPES = {"user_unit": {"user_unit": True},
          "log_file": {"service_lines": [f"StandardOutput=append:{LOGFILE}"]}}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rerun_changes_nothing_on_a_user_unit_and_on_a_unit_logging_to_a_file(testbed_factory, tmp_path, shape):
    bed = testbed_factory(1, host_options={0: SHAPES[shape]})
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_bench=False)
    state = tmp_path / "state"
    first = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    r = recap(first)["hosts"][h.name]
    assert r["outcome"] == "completed" and r["changed"] > 0, r
    if shape == "user_unit":  # its start was proven from its user's journal
        assert "ExecStart" in h.sh(f"cat {USER_UNITS}/sglang-qwen.service").stdout
        assert "Using MoE kernel config from" in h.unit_log()
    else:  # from its file: the journal has no SGLang line of it
        assert "Using MoE kernel config" not in h.unit_log()
        assert "Using MoE kernel config from" in h.sh(f"cat {LOGFILE}").stdout
    before = _started(h)
    assert before[0] not in ("", "0") and before[1], before
    sudo_before = len(_sudo_commands(h))

    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-6000:]
    r = recap(again)["hosts"][h.name]
    assert r["outcome"] == "completed" and r["changed"] == 0, _changed(state, recap(again)["run_id"])
    assert sorted(r["summary"]["unchanged"]), r["summary"]
    # not stopped, not restarted: the same main process of the same invocation
    assert _started(h) == before and h.unit_state() == "active"
    # nothing of the re-run asked the system manager or the system journal about a user's unit
    assert _about_the_unit(_sudo_commands(h)[sudo_before:], "sglang-qwen") == []


def test_runner_trial_on_a_user_unit_uses_the_users_own_manager(testbed_factory, tmp_path):
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5"}
    bed = testbed_factory(1, host_options={0: {"user_unit": True, "env": env}})
    h = bed.hosts[0]
    h.wait_http("/health")
    units_before = h.file_tree_hash("/etc/systemd/system")
    user_units_before = h.file_tree_hash(USER_UNITS)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"

    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "flashinfer_cutlass", "--json",
                state_dir=state)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    assert trial["kept"] == "flashinfer_cutlass" and trial["changed"], trial
    assert rows["flashinfer_cutlass"]["kept"] and rows["flashinfer_cutlass"]["agreement"] == 1.0, rows
    # the drop-in is where the user's manager reads it, and that manager started the unit with it
    text = h.sh(f"cat {DROPIN}").stdout
    assert "ExecStart=\n" in text and text.rstrip().endswith("--moe-runner-backend flashinfer_cutlass")
    assert h.file_tree_hash("/etc/systemd/system") == units_before  # the system manager's folder untouched
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
    assert "moe_runner_backend='flashinfer_cutlass'" in h.unit_log()
    # every restart and reload went to the user's own manager, as the user: none through sudo
    cmds = _sudo_commands(h)
    assert _about_the_unit(cmds, "sglang-qwen") == [] and not [c for c in cmds if "daemon-reload" in c], cmds

    back = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-6000:]
    assert recap(back)["hosts"][h.name]["outcome"] == "completed", recap(back)["hosts"][h.name]
    assert h.sh(f"test -e {DROPIN_DIR}", check=False).returncode != 0
    assert h.file_tree_hash(USER_UNITS) == user_units_before  # byte-identical, the drop-in folder gone
    assert h.unit_state() == "active" and _runner(h) == "triton"
    assert _about_the_unit(_sudo_commands(h), "sglang-qwen") == []
