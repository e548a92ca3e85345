"""Task ``compare_installed`` (orchestrator/tasks/install.py): a re-run whose files are the
installed ones, loaded at the last start, changes nothing. Against a scripted host: the payload's
``install --dry-run`` answer and the unit's journal are given; the store is a real one."""

from __future__ import annotations

import json

import pytest

from orchestrator.store import ConfigStore, key_hash
from orchestrator.tasks import TASKS
from remote.engines.triton_moe.configfile import dumps_config
from tests.fakes import FakePayload, ScriptedConnection, make_ctx

DIR = "/opt/sg/configs/triton_3_9_0"
UP, DOWN = "E=8,N=64,device_name=NVIDIA_H200.json", "E=8,N=64,device_name=NVIDIA_H200_down.json"
CFG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 2}}
KEY = {"device_name": "NVIDIA_H200", "E": 8, "N": 64, "space": "smoke"}
START = "server_args=ServerArgs(model_path='/models/tiny-moe', moe_runner_backend='auto')\n"
LOADED = START + "".join(f"Using MoE kernel config from {DIR}/{n}.\n" for n in (UP, DOWN))


def _ctx(tmp_path, *, source="store", active="active", dry_run=None, journal=LOADED, check=False):
    src = tmp_path / "tuned"
    src.mkdir(exist_ok=True)
    (src / UP).write_text(json.dumps(CFG))
    (src / DOWN).write_text(json.dumps(CFG))
    state = tmp_path / "state"
    ConfigStore(state).put(KEY, {"up": src / UP, "down": src / DOWN}, None, {"host": "gpu-a", "run_id": "r0"})
    files = dry_run or [{"name": n, "path": f"{DIR}/{n}", "action": "unchanged"} for n in (DOWN, UP)]
    payload = FakePayload({"install": lambda args, req: {"dry_run": True, "files": files,
                                                         "unchanged": all(f["action"] == "unchanged" for f in files)}})
    conn = ScriptedConnection([("^journalctl -u sglang-qwen", journal)])
    ctx = make_ctx(tmp_path, {
        "orch_unit": {"unit": "sglang-qwen.service", "load_state": "loaded", "active_state": active,
                      "sub_state": "running", "main_pid": 42, "control_group": ""},
        "orch_plan": {"action": "tune", "reason": "", "backend": "auto", "install_dir": DIR,
                      "paths": {"up": f"{DIR}/{UP}", "down": f"{DIR}/{DOWN}"}},
        "orch_tuning_key": {"hash": key_hash(KEY), **KEY},
        "orch_config_source": source,
    }, connection=conn, payload=payload, state_dir=state, check=check)
    return ctx, payload, conn


def _run(ctx):
    return TASKS["compare_installed"].fn(ctx, name="sglang-qwen")


@pytest.mark.parametrize("check", [False, True])
def test_identical_and_loaded_is_unchanged(tmp_path, check):
    ctx, payload, conn = _ctx(tmp_path, check=check)
    res = _run(ctx)
    assert res.status == "ok" and res.facts == {"orch_unchanged": True}
    assert res.msg.startswith(f"unchanged: {DOWN}, {UP} already hold these bytes and the last start loaded them")
    assert ("nothing would be written, stopped" if check else "nothing is written, stopped") in res.msg
    assert ctx.run.summary.unchanged == [f"{DIR}/{DOWN}", f"{DIR}/{UP}"]
    (cmd, _, req), = payload.calls
    assert cmd == "install" and req["dry_run"] is True and req["dest_dir"] == DIR
    # the bytes compared are those the install would write (the store's files, as write_configs dumps them)
    assert {f["name"]: f["content"] for f in req["files"]} == {UP: dumps_config(CFG), DOWN: dumps_config(CFG)}


def test_other_bytes_installed_is_a_change(tmp_path):
    files = [{"name": DOWN, "action": "unchanged"}, {"name": UP, "action": "replaced"}]
    ctx, _, conn = _ctx(tmp_path, dry_run=files)
    res = _run(ctx)
    assert res.facts == {"orch_unchanged": False} and res.msg == f"would write {UP} (other bytes installed)"
    assert ctx.run.summary.unchanged is None and conn.calls == []  # no need to read the log


def test_not_loaded_at_the_last_start_is_a_change(tmp_path):
    log = START + f"Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {DIR}/{UP}\n"
    ctx, _, _ = _ctx(tmp_path, journal=log)
    res = _run(ctx)
    assert res.facts == {"orch_unchanged": False} and res.msg.startswith("the last start did not load them")
    ctx, _, _ = _ctx(tmp_path, journal="")
    assert "holds no start" in _run(ctx).msg


def test_a_stopped_unit_is_a_change(tmp_path):
    ctx, _, conn = _ctx(tmp_path, active="inactive")
    res = _run(ctx)
    assert res.facts == {"orch_unchanged": False} and res.msg == "the unit is inactive" and conn.calls == []


def test_files_known_only_after_the_tune(tmp_path):
    """This host tunes (no store result, or --retune): nothing to compare, no payload call."""
    ctx, payload, _ = _ctx(tmp_path, source="tune")
    res = _run(ctx)
    assert res.facts == {"orch_unchanged": False} and "known only after the tune" in res.msg
    assert payload.calls == []
