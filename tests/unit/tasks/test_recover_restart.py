"""`orch recover` on a single-node unit (issue 21): a running unit whose process an unfinished run
started (after its stop) is restarted on the restored files, and verify-log is told which files
that start must load; a unit whose process predates the runs is left running."""

from __future__ import annotations

from orchestrator.facts.unit import UnitFacts
from orchestrator.tasks.recover import loaded_after_restore, single_restart

RID = "20260101T000000Z-tune-0a0b0c"


def _unit(state: str) -> UnitFacts:
    return UnitFacts(unit="sglang.service", load_state="loaded", active_state=state, sub_state="running",
                     main_pid=42 if state == "active" else 0, control_group="/system.slice/sglang.service")


def test_a_running_unit_is_restarted_only_when_a_run_went_past_its_stop():
    for state in ("stopped", "installed", "restarted", "verified"):
        why = single_restart(_unit("active"), [{"run_id": RID, "state": state}])
        assert why and RID in why and "restored files" in why, state
    # died before its stop: the running process is the one from before the run
    assert single_restart(_unit("active"), [{"run_id": RID, "state": "started"}]) is None
    # nothing runs: recover.yaml starts it anyway, nothing to stop
    assert single_restart(_unit("inactive"), [{"run_id": RID, "state": "installed"}]) is None
    assert single_restart(_unit("failed"), [{"run_id": RID, "state": "installed"}]) is None
    assert single_restart(None, [{"run_id": RID, "state": "installed"}]) is None
    assert single_restart(_unit("active"), []) is None


def test_the_files_a_start_after_the_restore_must_load_and_must_not_find():
    up, down = "/t/E=8,N=64,device_name=H200.json", "/t/E=8,N=64,device_name=H200_down.json"
    done = [{"run_id": RID, "files": [{"path": up, "action": "restored", "sha256": "ab"},
                                      {"path": down, "action": "deleted", "sha256": None},
                                      {"path": "/etc/systemd/system/x.service.d/orch.conf", "action": "restored",
                                       "sha256": "cd"}]}]
    assert loaded_after_restore(done) == ([up], [down])
    # unchanged: present when it has bytes, absent when it never existed
    done = [{"run_id": RID, "files": [{"path": up, "action": "unchanged", "sha256": "ab"},
                                      {"path": down, "action": "unchanged", "sha256": None}]}]
    assert loaded_after_restore(done) == ([up], [down])
    # newest first: the oldest run's restore is what stays on disk
    done = [{"run_id": "newer", "files": [{"path": up, "action": "restored", "sha256": "ab"}]},
            {"run_id": "older", "files": [{"path": up, "action": "deleted", "sha256": None}]}]
    assert loaded_after_restore(done) == ([], [up])
    assert loaded_after_restore([{"run_id": RID, "files": []}]) == ([], [])
