"""SGLang 0.5.23 MoE-config log lines (orchestrator.facts.moe_log)."""

from orchestrator.facts.moe_log import parse_moe_log, verify_loaded

D = "/opt/sglang/sglang/srt/layers/moe/moe_runner/triton_utils/configs"
UP = f"{D}/triton_3_6_0/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
DOWN = UP[:-5] + "_down.json"
PFX = "[2026-11-29 10:00:00 TP0] "


def test_loaded_paths_with_spaces_and_brackets():
    log = f"{PFX}Using MoE kernel config from {UP}.\n{PFX}Using MoE kernel config from {DOWN}.\n" \
          f"{PFX}The server is fired up and ready to roll!\n"
    rep = parse_moe_log(log)
    assert rep.loaded == [UP, DOWN] and rep.ready and not rep.suboptimal
    assert verify_loaded(rep, [UP, DOWN]) == []


def test_default_fallback_and_down_missing_fail_verification():
    old = UP.replace("triton_3_6_0", "triton_3_5_1")
    log = (f"{PFX}Config file not found at {UP}. Fallback to triton version 3.5.1 and use MoE kernel config "
           f"from {old}. Performance might be sub-optimal!\n"
           f"{PFX}Down MoE config file not found at {DOWN}; reusing the tuned up-projection config without TMA. "
           "Performance might be sub-optimal.\n")
    rep = parse_moe_log(log)
    assert rep.fallback == [(UP, old, "3.5.1")] and rep.down_missing == [DOWN]
    problems = verify_loaded(rep, [UP, DOWN])
    assert any("fell back" in p for p in problems) and any("down config" in p for p in problems)
    log = (f"{PFX}Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {UP}, "
           "you can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n")
    rep = parse_moe_log(log)
    assert rep.default == [UP] and len(rep.suboptimal) == 1
    assert verify_loaded(rep, [UP]) and not rep.loaded


def test_other_file_loaded_is_not_proof():
    other = UP.replace("E=257", "E=256")
    rep = parse_moe_log(f"Using MoE kernel config from {other}.\n")
    assert verify_loaded(rep, [UP]) == [f"log does not show 'Using MoE kernel config from {UP}.'"]
