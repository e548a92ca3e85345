"""Which rolled-back runs changed a unit's MoE runner (``orchestrator.tasks.rollback._runner_change``):
a runner trial's drop-in or the unit's own file, not the drop-in that only points the unit at
orch's config folder (issue 29: vLLM units with no VLLM_TUNED_CONFIG_FOLDER)."""

from orchestrator.tasks.rollback import _runner_change

D = "/etc/systemd/system/u.service.d"


def test_runner_change():
    assert _runner_change({"dest_dir": D, "changed": [{"path": f"{D}/orch-moe-runner.conf"}]})
    assert _runner_change({"dest_dir": "/x", "unit_file": True})
    assert not _runner_change({"dest_dir": D, "changed": [{"path": f"{D}/orch-moe-configs.conf"}]})
    assert not _runner_change({"dest_dir": "/opt/sglang/configs/triton_3_5_1", "changed": [{"path": "/a.json"}]})
