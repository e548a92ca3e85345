"""A patched or vendored SGLang whose loader rules cannot be read (issue 17, "a silent default").

The payload's real ``probe`` runs against fake trees in both layouts (``tests/unit/remote/test_probe.py``
``make_sglang``: loader modules whose source is no release's); the rules come from what the tree
shows (``remote.engines.sglang.lookup.inferred_rules``). ``plan`` then writes a ``_down`` file only where
those rules read one, and ``verify_log`` demands proof only of the lookups the server logged: a
``_down`` file it never looked up is reported, not failed (with rules read from the loader, it
still fails).
"""

from __future__ import annotations

import pytest

from orchestrator.engine.results import TaskFailed
from orchestrator.tasks import TASKS
from tests.fakes import FakePayload, ScriptedConnection, make_ctx
from tests.unit.remote.test_probe import CURRENT, OLD, QWEN, make_sglang, probe

UNIT = {"active_state": "inactive", "exec_start": ["/py", "-m", "sglang.launch_server"],
        "server": {"moe_runner_backend": "auto", "tp": 1, "ep": 1, "port": 30000}}


def probed(tmp_path, layout, version) -> dict:
    site = tmp_path / "site"
    make_sglang(site, (layout,), version=version)
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200",
                     "--capability", "9.0")
    assert rc == 0, last
    assert last["data"]["engine"]["loader_rules_inferred"], last["data"]["engine"]
    return last["data"]


def plan(tmp_path, data):
    conn = ScriptedConnection([(r"^journalctl", "")])
    ctx = make_ctx(tmp_path, {"orch_unit": UNIT, "orch_probe": data}, connection=conn, payload=FakePayload({}))
    return TASKS["plan"].fn(ctx, name="sglang-qwen")


@pytest.mark.parametrize("layout, version, roles", [(OLD, "0.5.4.post1", {"up"}),
                                                    (CURRENT, "0.5.23+vendor.1", {"up", "down"})])
def test_plan_writes_a_down_file_only_where_the_inferred_release_reads_one(tmp_path, layout, version, roles):
    result = plan(tmp_path, probed(tmp_path, layout, version))
    assert result.status == "ok" and set(result.facts["orch_plan"].paths) == roles
    assert ("no down file: SGLang 0.5.4.post1 does not read one" in result.msg) == (roles == {"up"})


def verify(tmp_path, data, log: str):
    conn = ScriptedConnection([(r"^journalctl", log)])
    ctx = make_ctx(tmp_path, {"orch_probe": data}, connection=conn)
    ctx.run.log_mark = ""
    paths = [f"{data['install_dir']}/{data['file_names'][r]}" for r in ("up", "down")]
    return TASKS["verify_log"].fn(ctx, name="sglang-qwen", expect_paths=paths), paths


def test_verify_log_reports_a_down_file_the_server_never_looked_up(tmp_path):
    data = probed(tmp_path, CURRENT, "0.5.23+vendor.1")
    up = f"{data['install_dir']}/{data['file_names']['up']}"
    log = f"x: server_args=ServerArgs(model_path='/m')\nx: Using MoE kernel config from {up}.\n"
    result, paths = verify(tmp_path, data, log)
    assert result.status == "ok" and result.data["not_looked_up"] == [paths[1]]
    assert "the server never looked up" in result.msg and "inferred" in result.msg


def test_verify_log_still_fails_without_inferred_rules_or_without_the_up_file(tmp_path):
    data = probed(tmp_path, CURRENT, "0.5.23+vendor.1")
    up = f"{data['install_dir']}/{data['file_names']['up']}"
    read = dict(data, engine=dict(data["engine"], loader_rules_inferred=None))
    with pytest.raises(TaskFailed, match="_down.json"):
        verify(tmp_path, read, f"x: Using MoE kernel config from {up}.\n")
    with pytest.raises(TaskFailed, match="log does not show 'Using MoE kernel config from"):
        verify(tmp_path, data, "x: server_args=ServerArgs(model_path='/m')\n")
