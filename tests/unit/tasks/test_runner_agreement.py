"""``orch tune``'s plan and ``orch doctor`` give one answer, SGLang's, on which MoE runner a server uses
(issue 17 "Done when").

A DeepSeek-V3 unit with ``--quantization modelopt_fp8`` and no ``--moe-runner-backend``: the payload's
real ``probe`` runs against a tree holding SGLang 0.5.23's own loader module (``tests/testbed/standin_tree.py``)
and a DeepSeek-V3 config whose ``quantization_config`` is the one ModelOpt writes for an FP8 export;
its data feeds ``plan`` (on a scripted host) and ``classify``. SGLang 0.5.23 runs that unit on the
Triton runner on an H200 (``ModelOptFp8MoEMethod.create_moe_runner``), which reads the config files,
and on ``flashinfer_trtllm`` on a B200 (``arg_groups/overrides.py`` ``_deepseek_moe_quant_resolution``),
which reads none: plan tunes on the first and skips the second (nothing stopped), doctor says the
same with the same reason. The rules themselves are held against the wheel in
``tests/unit/remote/engines/sglang/test_runner_oracle.py``.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.engine.results import SKIPPED
from orchestrator.tasks import TASKS
from orchestrator.tasks.diagnose import DoctorFacts, classify
from orchestrator.facts.probe import ProbeFacts
from orchestrator.facts.schema import from_dict
from orchestrator.facts.unit import UnitFacts
from tests.fakes import FakePayload, ScriptedConnection, make_ctx
from tests.paths import DATA
from tests.testbed import standin_tree
from tests.unit.remote.test_probe import probe

#: How ModelOpt marks an FP8 export in config.json (``configs/model_config.py`` ``_parse_modelopt_quant_config``).
MODELOPT_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
UNIT = {"active_state": "active", "main_pid": 812, "environment": {},
        "exec_start": ["/py", "-m", "sglang.launch_server", "--model-path", "/models/ds", "--tp", "8",
                       "--quantization", "modelopt_fp8"],
        "server": {"moe_runner_backend": "auto", "quantization": "modelopt_fp8", "tp": 8, "ep": 1,
                   "port": 30000, "host": "127.0.0.1"}}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A site folder with SGLang 0.5.23's real loader module, and the model config."""
    root = tmp_path_factory.mktemp("agree")
    standin_tree.make_tree(root / "site", None, "0.5.23")
    cfg = json.loads((DATA / "models" / "DeepSeek-V3.json").read_text())
    cfg["quantization_config"] = MODELOPT_FP8
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def probed(tree, gpu: str, capability: str) -> dict:
    rc, last = probe(tree, tree / "site", "--model-config", str(tree / "config.json"), "--tp", "8",
                     "--quantization", "modelopt_fp8", "--device-name", gpu, "--capability", capability)
    assert rc == 0 and last["type"] == "result", last
    return last["data"]


def plan_of(tmp_path, data: dict):
    conn = ScriptedConnection([(r"^journalctl -u sglang-ds", "")])
    payload = FakePayload({"reach": lambda args, request: {"results": [{"url": args[1], "path": "/v1/models",
                                                                        "status": 200, "error": None}]}})
    ctx = make_ctx(tmp_path, {"orch_unit": UNIT, "orch_probe": data}, connection=conn, payload=payload)
    return TASKS["plan"].fn(ctx, name="sglang-ds"), conn


def doctor_of(data: dict) -> dict:
    return classify(DoctorFacts(unit=from_dict(UnitFacts, UNIT), probe=ProbeFacts.parse(data, "probe"), log=None))


def test_h200_runs_the_triton_runner_plan_tunes_and_doctor_agrees(tree, tmp_path):
    data = probed(tree, "NVIDIA H200", "9.0")
    assert (data["capability"], data["model"]["architecture"], data["model"]["checkpoint_quant_method"]) == (
        "9.0", "DeepseekV3ForCausalLM", "modelopt_fp8")
    result, _conn = plan_of(tmp_path, data)
    row = doctor_of(data)
    plan = result.facts["orch_plan"].to_dict()
    assert result.status == "ok" and plan["action"] == "tune"
    assert plan["runner"] == row["runner"]
    assert plan["runner"]["runner"] == "triton" and plan["runner"]["reads_triton_configs"] is True
    assert "ModelOptFp8MoEMethod.create_moe_runner runs the triton runner" in plan["runner"]["reason"]
    assert row["verdict"] != "not-triton" and row["verdict"] == "default"
    assert f"MoE runner: {plan['runner']['reason']}" in result.msg


def test_b200_runs_flashinfer_trtllm_plan_skips_and_doctor_says_not_triton(tree, tmp_path):
    data = probed(tree, "NVIDIA B200", "10.0")
    result, conn = plan_of(tmp_path, data)
    row = doctor_of(data)
    plan = result.facts["orch_plan"].to_dict()
    assert result.status == SKIPPED and plan["action"] == "skip"
    assert plan["runner"] == row["runner"]
    assert plan["runner"]["runner"] == "flashinfer_trtllm" and plan["runner"]["reads_triton_configs"] is False
    reason = plan["runner"]["reason"]
    assert "srt/arg_groups/overrides.py _deepseek_moe_quant_resolution sets flashinfer_trtllm" in reason
    assert result.msg.startswith(reason) and row["why"].startswith(reason)
    assert row["verdict"] == "not-triton"
    assert [argv[0] for argv, _ in conn.calls] == ["journalctl"], "plan stops nothing"
