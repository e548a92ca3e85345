"""remote.engines.sglang.model_config, .shape, .architectures, .docs: model configs -> MoE shape -> SGLang 0.5.23
file names.

README_TABLE is copied by hand from tests/data/models/README.md (E, N per TP, dtype selector);
ARCH_TABLE holds one config per architecture family (tests/data/models/architectures/) with the
E/N/top-k SGLang 0.5.23's model code gives it, each citing the file:line (under sglang/srt/) the
value comes from. Neither is computed with the code under test. The last tests hold the rule
table itself against the real SGLang 0.5.23 source (tests/sglang_releases.py).
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import pytest

from remote.engines.sglang.architectures import ARCHITECTURES, RULES_BY_ARCH
from scripts.sglang_docs import architecture_table_markdown
from remote.engines.sglang.model_config import hf_hub_dir, load_model_config, resolve_model_config_path
from remote.engines.sglang.shape import moe_shape
from remote.protocol import PayloadError
from tests.paths import DATA, REPO as _REPO
from tests.waiting import run_watched

MODELS = DATA / "models"
ARCH_MODELS = MODELS / "architectures"
REPO = _REPO

# (model, tp, up, down) on device "NVIDIA H200", default server flags
README_TABLE = [
    ("Qwen3-30B-A3B", 1, "E=128,N=768,device_name=NVIDIA_H200.json", "E=128,N=768,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-30B-A3B", 2, "E=128,N=384,device_name=NVIDIA_H200.json", "E=128,N=384,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-30B-A3B", 4, "E=128,N=192,device_name=NVIDIA_H200.json", "E=128,N=192,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-30B-A3B", 8, "E=128,N=96,device_name=NVIDIA_H200.json", "E=128,N=96,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-235B-A22B", 1, "E=128,N=1536,device_name=NVIDIA_H200.json", "E=128,N=1536,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-235B-A22B", 2, "E=128,N=768,device_name=NVIDIA_H200.json", "E=128,N=768,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-235B-A22B", 4, "E=128,N=384,device_name=NVIDIA_H200.json", "E=128,N=384,device_name=NVIDIA_H200_down.json"),
    ("Qwen3-235B-A22B", 8, "E=128,N=192,device_name=NVIDIA_H200.json", "E=128,N=192,device_name=NVIDIA_H200_down.json"),
    ("Qwen3.5-122B-A10B", 1, "E=256,N=1024,device_name=NVIDIA_H200.json", "E=256,N=1024,device_name=NVIDIA_H200_down.json"),
    ("Qwen3.5-122B-A10B", 2, "E=256,N=512,device_name=NVIDIA_H200.json", "E=256,N=512,device_name=NVIDIA_H200_down.json"),
    ("Qwen3.5-122B-A10B", 4, "E=256,N=256,device_name=NVIDIA_H200.json", "E=256,N=256,device_name=NVIDIA_H200_down.json"),
    ("Qwen3.5-122B-A10B", 8, "E=256,N=128,device_name=NVIDIA_H200.json", "E=256,N=128,device_name=NVIDIA_H200_down.json"),
    ("GLM-4.5", 1, "E=161,N=1536,device_name=NVIDIA_H200.json", "E=161,N=1536,device_name=NVIDIA_H200_down.json"),
    ("GLM-4.5", 2, "E=161,N=768,device_name=NVIDIA_H200.json", "E=161,N=768,device_name=NVIDIA_H200_down.json"),
    ("GLM-4.5", 4, "E=161,N=384,device_name=NVIDIA_H200.json", "E=161,N=384,device_name=NVIDIA_H200_down.json"),
    ("GLM-4.5", 8, "E=161,N=192,device_name=NVIDIA_H200.json", "E=161,N=192,device_name=NVIDIA_H200_down.json"),
    ("GLM-5", 1, "E=257,N=2048,device_name=NVIDIA_H200.json", "E=257,N=2048,device_name=NVIDIA_H200_down.json"),
    ("GLM-5", 2, "E=257,N=1024,device_name=NVIDIA_H200.json", "E=257,N=1024,device_name=NVIDIA_H200_down.json"),
    ("GLM-5", 4, "E=257,N=512,device_name=NVIDIA_H200.json", "E=257,N=512,device_name=NVIDIA_H200_down.json"),
    ("GLM-5", 8, "E=257,N=256,device_name=NVIDIA_H200.json", "E=257,N=256,device_name=NVIDIA_H200_down.json"),
    ("DeepSeek-V3", 1, "E=257,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json", "E=257,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"),
    ("DeepSeek-V3", 2, "E=257,N=1024,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json", "E=257,N=1024,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"),
    ("DeepSeek-V3", 4, "E=257,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json", "E=257,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"),
    ("DeepSeek-V3", 8, "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json", "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"),
    ("Mixtral-8x7B-Instruct-v0.1", 1, "E=8,N=14336,device_name=NVIDIA_H200.json", "E=8,N=14336,device_name=NVIDIA_H200_down.json"),
    ("Mixtral-8x7B-Instruct-v0.1", 2, "E=8,N=7168,device_name=NVIDIA_H200.json", "E=8,N=7168,device_name=NVIDIA_H200_down.json"),
    ("Mixtral-8x7B-Instruct-v0.1", 4, "E=8,N=3584,device_name=NVIDIA_H200.json", "E=8,N=3584,device_name=NVIDIA_H200_down.json"),
    ("Mixtral-8x7B-Instruct-v0.1", 8, "E=8,N=1792,device_name=NVIDIA_H200.json", "E=8,N=1792,device_name=NVIDIA_H200_down.json"),
    ("gpt-oss-120b", 1, "E=128,N=2880,device_name=NVIDIA_H200.json", "E=128,N=2880,device_name=NVIDIA_H200_down.json"),
    ("gpt-oss-120b", 2, "E=128,N=1440,device_name=NVIDIA_H200.json", "E=128,N=1440,device_name=NVIDIA_H200_down.json"),
    ("gpt-oss-120b", 4, "E=128,N=720,device_name=NVIDIA_H200.json", "E=128,N=720,device_name=NVIDIA_H200_down.json"),
    ("gpt-oss-120b", 8, "E=128,N=360,device_name=NVIDIA_H200.json", "E=128,N=360,device_name=NVIDIA_H200_down.json"),
    ("Llama-4-Scout-17B-16E", 1, "E=16,N=8192,device_name=NVIDIA_H200.json", "E=16,N=8192,device_name=NVIDIA_H200_down.json"),
    ("Llama-4-Scout-17B-16E", 2, "E=16,N=4096,device_name=NVIDIA_H200.json", "E=16,N=4096,device_name=NVIDIA_H200_down.json"),
    ("Llama-4-Scout-17B-16E", 4, "E=16,N=2048,device_name=NVIDIA_H200.json", "E=16,N=2048,device_name=NVIDIA_H200_down.json"),
    ("Llama-4-Scout-17B-16E", 8, "E=16,N=1024,device_name=NVIDIA_H200.json", "E=16,N=1024,device_name=NVIDIA_H200_down.json"),
    ("Gemma-4-26B-A4B", 1, "E=128,N=704,device_name=NVIDIA_H200.json", "E=128,N=704,device_name=NVIDIA_H200_down.json"),
    ("Gemma-4-26B-A4B", 2, "E=128,N=352,device_name=NVIDIA_H200.json", "E=128,N=352,device_name=NVIDIA_H200_down.json"),
    ("Gemma-4-26B-A4B", 4, "E=128,N=176,device_name=NVIDIA_H200.json", "E=128,N=176,device_name=NVIDIA_H200_down.json"),
    ("Gemma-4-26B-A4B", 8, "E=128,N=88,device_name=NVIDIA_H200.json", "E=128,N=88,device_name=NVIDIA_H200_down.json"),
    ("ERNIE-4.5-21B-A3B", 1, "E=64,N=1536,device_name=NVIDIA_H200.json", "E=64,N=1536,device_name=NVIDIA_H200_down.json"),
    ("ERNIE-4.5-21B-A3B", 2, "E=64,N=768,device_name=NVIDIA_H200.json", "E=64,N=768,device_name=NVIDIA_H200_down.json"),
    ("ERNIE-4.5-21B-A3B", 4, "E=64,N=384,device_name=NVIDIA_H200.json", "E=64,N=384,device_name=NVIDIA_H200_down.json"),
    ("ERNIE-4.5-21B-A3B", 8, "E=64,N=192,device_name=NVIDIA_H200.json", "E=64,N=192,device_name=NVIDIA_H200_down.json"),
]

# README "Layer counts" (MTP/NextN not counted), hidden and topk columns
README_FACTS = {
    "Qwen3-30B-A3B": dict(moe_layers=48, hidden=2048, topk=8, runtime_topk=8),
    "Qwen3-235B-A22B": dict(moe_layers=94, hidden=4096, topk=8, runtime_topk=8),
    "Qwen3.5-122B-A10B": dict(moe_layers=48, hidden=3072, topk=8, runtime_topk=8),
    "GLM-4.5": dict(moe_layers=89, hidden=5120, topk=8, runtime_topk=9),
    "GLM-5": dict(moe_layers=75, hidden=6144, topk=8, runtime_topk=9),
    "DeepSeek-V3": dict(moe_layers=58, hidden=7168, topk=8, runtime_topk=9),
    "Mixtral-8x7B-Instruct-v0.1": dict(moe_layers=32, hidden=4096, topk=2, runtime_topk=2),
    "gpt-oss-120b": dict(moe_layers=36, hidden=2880, topk=4, runtime_topk=4),
    "Llama-4-Scout-17B-16E": dict(moe_layers=48, hidden=5120, topk=1, runtime_topk=1),
    "Gemma-4-26B-A4B": dict(moe_layers=30, hidden=2816, topk=8, runtime_topk=8),
    "ERNIE-4.5-21B-A3B": dict(moe_layers=27, hidden=2560, topk=6, runtime_topk=6),
}


def cfg_of(model: str) -> dict:
    return load_model_config(str(MODELS / f"{model}.json"))


def test_table_covers_every_shared_model():
    assert {p.stem for p in MODELS.glob("*.json")} == {m for m, *_ in README_TABLE}


@pytest.mark.parametrize("model, tp, up, down", README_TABLE, ids=[f"{m}-tp{t}" for m, t, *_ in README_TABLE])
def test_readme_table_names(model, tp, up, down):
    shape = moe_shape(cfg_of(model), tp=tp)
    assert shape.file_names("NVIDIA H200") == {"up": up, "down": down}
    assert shape.file_names("NVIDIA_H200") == {"up": up, "down": down}


@pytest.mark.parametrize("model", sorted(README_FACTS))
def test_readme_layer_hidden_topk(model):
    s = moe_shape(cfg_of(model), tp=1)
    for k, v in README_FACTS[model].items():
        assert getattr(s, k) == v, k


def test_rtx_pro_6000_name():
    s = moe_shape(cfg_of("Qwen3-30B-A3B"), tp=1)
    assert s.file_names("NVIDIA RTX PRO 6000 Blackwell Server Edition") == {
        "up": "E=128,N=768,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json",
        "down": "E=128,N=768,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition_down.json",
    }


@pytest.mark.parametrize("hostile", ["../../etc/x", "a/b", "x\ny", "..", ""])
def test_file_names_refuse_hostile_device(hostile):
    with pytest.raises(ValueError):
        moe_shape(cfg_of("Qwen3-30B-A3B")).file_names(hostile)


def test_deepseek_shape_fields_and_dict():
    s = moe_shape(cfg_of("DeepSeek-V3"), tp=8)
    assert (s.E, s.N, s.num_experts, s.shared_fused) == (257, 256, 256, True)
    assert (s.dtype_selector, s.block_shape, s.per_channel_quant, s.weight_dtype) == ("fp8_w8a8", [128, 128], False, "fp8_e4m3")
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["E"] == 257 and d["architecture"] == "DeepseekV3ForCausalLM"


def test_disable_fusion_and_ep_drop_the_shared_expert():
    cfg = cfg_of("DeepSeek-V3")
    s = moe_shape(cfg, tp=8, disable_shared_experts_fusion=True)
    assert (s.E, s.N, s.runtime_topk) == (256, 256, 8)
    s = moe_shape(cfg, tp=8, ep=8)  # EP 8: 32 local experts, moe_tp 1, no fusion on NVIDIA
    assert (s.E, s.N, s.shared_fused) == (32, 2048, False)
    s = moe_shape(cfg, tp=8, ep=2)
    assert (s.E, s.N) == (128, 512)
    s = moe_shape(cfg_of("GLM-4.5"), tp=8, disable_shared_experts_fusion=True)
    assert s.file_names("NVIDIA H200")["up"] == "E=160,N=192,device_name=NVIDIA_H200.json"


def test_fusion_needs_sm80():
    s = moe_shape(cfg_of("DeepSeek-V3"), tp=8, capability=(7, 5))
    assert s.E == 256
    assert moe_shape(cfg_of("DeepSeek-V3"), tp=8, capability=(9, 0)).E == 257


def test_fusion_needs_one_shared_expert_and_256_routed_for_deepseek():
    cfg = cfg_of("DeepSeek-V3")
    two = copy.deepcopy(cfg)
    two["n_shared_experts"] = 2
    assert moe_shape(two, tp=8).E == 256
    small = copy.deepcopy(cfg)
    small["n_routed_experts"] = 64
    assert moe_shape(small, tp=8).E == 64


def test_qwen35_text_config_not_fused():
    s = moe_shape(cfg_of("Qwen3.5-122B-A10B"), tp=4)
    assert (s.E, s.N, s.shared_fused, s.hidden) == (256, 256, False, 3072)


def _with_fp8_block(model: str) -> dict:
    cfg = cfg_of(model)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    return cfg


def test_block_fp8_names_and_n_multiple_of_128():
    cfg = _with_fp8_block("Qwen3-30B-A3B")
    assert moe_shape(cfg, tp=2).file_names("NVIDIA H200")["up"] == (
        "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
    with pytest.raises(PayloadError) as ei:
        moe_shape(cfg, tp=4)
    assert ei.value.kind == "bad_input" and "TP 4" in ei.value.msg and "192" in ei.value.msg
    cfg = _with_fp8_block("Qwen3-235B-A22B")
    assert moe_shape(cfg, tp=4).N == 384
    with pytest.raises(PayloadError, match="TP 8"):
        moe_shape(cfg, tp=8)
    # EP makes it loadable again: moe_tp = 8 / 2 = 4 -> N = 384
    assert moe_shape(cfg, tp=8, ep=2).N == 384


def test_quantization_flag_online_fp8_per_tensor():
    s = moe_shape(cfg_of("Mixtral-8x7B-Instruct-v0.1"), tp=2, quantization="fp8")
    assert s.file_names("NVIDIA H200")["up"] == "E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    # --quantization fp8 on a block-FP8 checkpoint keeps the checkpoint's blocks
    s = moe_shape(cfg_of("DeepSeek-V3"), tp=8, quantization="fp8")
    assert s.block_shape == [128, 128]


def test_per_channel_fp8_glm():
    s = moe_shape(cfg_of("GLM-4.5"), tp=8, quantization="w8a8_fp8")
    assert s.file_names("NVIDIA H200")["up"] == (
        "E=161,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json")
    cfg = cfg_of("GLM-4.5")
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                      "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}},
    }
    assert moe_shape(cfg, tp=4).file_names("NVIDIA H200")["down"] == (
        "E=161,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True_down.json")


def test_int8_w8a8_and_float32_selectors():
    s = moe_shape(cfg_of("Qwen3-30B-A3B"), quantization="w8a8_int8")
    assert s.file_names("NVIDIA H200")["up"] == "E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json"
    s = moe_shape(cfg_of("Qwen3-30B-A3B"), dtype="float32")
    assert s.file_names("NVIDIA H200")["up"] == "E=128,N=768,device_name=NVIDIA_H200,dtype=float32.json"
    s = moe_shape(cfg_of("Qwen3-30B-A3B"), dtype="half")
    assert s.act_dtype == "float16" and s.dtype_selector is None


def test_moe_wna16_int4_uses_packed_n():
    cfg = cfg_of("Qwen3-30B-A3B")
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    with pytest.raises(PayloadError):
        moe_shape(cfg)  # GPTQ without --quantization moe_wna16: not the Triton path we name
    s = moe_shape(cfg, quantization="moe_wna16")
    assert s.file_names("NVIDIA H200")["up"] == "E=128,N=384,device_name=NVIDIA_H200,dtype=int4_w4a16.json"


def test_quantized_checkpoints_of_tests_data_models():
    """The quantized configs in tests/data/models: selectors, group size and zero points as SGLang's
    methods read them (the wheel's own code agrees: tests/unit/remote/engines/sglang/test_quant_oracle.py)."""
    s = moe_shape(cfg_of("quantized/Qwen3-30B-A3B-GPTQ-Int4"), quantization="moe_wna16")
    assert (s.dtype_selector, s.N, s.group_size, s.has_zp, s.weight_dtype) == ("int4_w4a16", 384, 128, False, "int4")
    s = moe_shape(cfg_of("quantized/Qwen3-30B-A3B-AWQ"), quantization="moe_wna16")
    assert (s.dtype_selector, s.group_size, s.has_zp) == ("int4_w4a16", 128, True)  # AWQ zero_point
    s = moe_shape(cfg_of("quantized/Qwen3-30B-A3B-quantized.w4a16"))
    assert (s.dtype_selector, s.N, s.group_size, s.has_zp) == ("int4_w4a16", 384, 128, False)
    assert any("Marlin" in n for n in s.notes)
    s = moe_shape(cfg_of("quantized/Qwen3-30B-A3B-FP8-dynamic"))
    assert s.file_names("NVIDIA H200")["up"] == (
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json")
    s = moe_shape(cfg_of("DeepSeek-V3"), tp=8, quantization="w8a8_int8")  # DeepSeek-R1-Channel-INT8's launch
    assert s.file_names("NVIDIA H200")["up"] == (
        "E=257,N=256,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json")
    cfg = cfg_of("DeepSeek-V3")
    cfg["quantization_config"] = {"quant_method": "blockwise_int8", "weight_block_size": [128, 128]}
    s = moe_shape(cfg, tp=8)
    assert (s.dtype_selector, s.block_shape, s.per_channel_quant) == ("int8_w8a8", [128, 128], False)


def test_wna16_group_size_is_halved_like_sglangs_layer():
    cfg = cfg_of("quantized/Qwen3-30B-A3B-GPTQ-Int4")
    s = moe_shape(cfg, tp=8, quantization="moe_wna16")  # N per rank 96: group 128 -> 32
    assert (s.N, s.group_size) == (48, 32)
    cfg["quantization_config"] = dict(cfg["quantization_config"], desc_act=True)
    with pytest.raises(PayloadError, match="desc_act"):
        moe_shape(cfg, quantization="moe_wna16")


def test_checkpoint_exclusions_leave_experts_unquantized():
    cfg = cfg_of("quantized/Qwen3-30B-A3B-quantized.w4a16")
    cfg["quantization_config"]["ignore"] = ["lm_head", "re:.*mlp\\.experts.*"]
    s = moe_shape(cfg)
    assert s.dtype_selector is None and s.weight_dtype == "bfloat16" and s.group_size == 0
    assert any("excludes every layer" in n for n in s.notes)
    cfg["quantization_config"]["ignore"] = ["re:model\\.layers\\.(0|1)\\.mlp\\.experts.*"]
    s = moe_shape(cfg)
    assert s.dtype_selector == "int4_w4a16" and any("layers [0, 1]" in n for n in s.notes)
    fp8 = cfg_of("DeepSeek-V3")
    fp8["quantization_config"] = dict(fp8["quantization_config"], modules_to_not_convert=["model.layers.5.mlp"])
    s = moe_shape(fp8, tp=8)
    assert s.dtype_selector == "fp8_w8a8" and any("layers [5]" in n for n in s.notes)


def test_gpt_oss_mxfp4_carries_a_backend_note():
    s = moe_shape(cfg_of("gpt-oss-120b"), tp=1)
    assert s.weight_dtype == "mxfp4" and s.dtype_selector is None
    assert any("triton_kernel" in n for n in s.notes)


@pytest.mark.parametrize(
    "mutate, tp, ep, words",
    [
        (lambda c: c.pop("num_experts"), 1, 1, "not an MoE"),
        (lambda c: c.update(num_experts=0), 1, 1, "not an MoE"),
        (lambda c: None, 5, 1, "not divisible"),
        (lambda c: None, 4, 3, "does not divide"),
        (lambda c: None, 0, 1, "--tp"),
        (lambda c: None, 8, 256, "does not divide"),
        (lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}), 1, 1, "bitsandbytes"),
        (lambda c: c.pop("hidden_size"), 1, 1, "hidden_size"),
    ],
)
def test_bad_inputs(mutate, tp, ep, words):
    cfg = cfg_of("Qwen3-30B-A3B")
    mutate(cfg)
    with pytest.raises(PayloadError) as ei:
        moe_shape(cfg, tp=tp, ep=ep)
    assert ei.value.kind == "bad_input"
    assert words in ei.value.msg


def test_experts_not_divisible_by_ep():
    cfg = cfg_of("Mixtral-8x7B-Instruct-v0.1")
    with pytest.raises(PayloadError, match="--ep 16"):
        moe_shape(cfg, tp=16, ep=16)


# --------------------------------------------------------------------------- issue 11 inputs

@pytest.mark.parametrize("model, tp, device, up", [
    # models/llama4.py:120 builds FusedMoE(num_experts=config.num_local_experts, intermediate_size=
    # config.intermediate_size); the shared expert is a LlamaMLP of its own (llama4.py:136)
    ("Llama-4-Scout-17B-16E", 4, "NVIDIA B200", "E=16,N=2048,device_name=NVIDIA_B200.json"),
    # models/gemma4_causal.py:287: num_experts, moe_intermediate_size, top_k_experts, under text_config
    ("Gemma-4-26B-A4B", 2, "NVIDIA H100 PCIe", "E=128,N=352,device_name=NVIDIA_H100_PCIe.json"),
    # models/ernie4.py:104: moe_num_experts, moe_intermediate_size, moe_k; shared experts: ernie4.py:115
    ("ERNIE-4.5-21B-A3B", 2, "NVIDIA L40S", "E=64,N=768,device_name=NVIDIA_L40S.json"),
])
def test_issue_11_inputs_give_the_names_sglang_looks_for(model, tp, device, up):
    names = moe_shape(cfg_of(model), tp=tp).file_names(device)
    assert names == {"up": up, "down": up[: -len(".json")] + "_down.json"}


def test_config_names_command_on_an_issue_11_input(capsys):
    from orchestrator.cli import main
    rc = main(["config-names", "--model-config", str(MODELS / "Llama-4-Scout-17B-16E.json"), "--tp", "4",
               "--device-name", "NVIDIA B200"])
    assert rc == 0
    assert capsys.readouterr().out.split() == ["E=16,N=2048,device_name=NVIDIA_B200.json",
                                               "E=16,N=2048,device_name=NVIDIA_B200_down.json"]


# --------------------------------------------------------------------------- one config per family

# (config in tests/data/models/architectures, tp, ep, E, N, top-k, runtime top-k, hidden K, where SGLang
# 0.5.23 decides it: file:line under sglang/srt/)
ARCH_TABLE = [
    ("DeepSeek-V3.2", 8, 1, 256, 256, 8, 8, 7168, "models/deepseek_v2.py:3358 gate compares architectures[0] with DeepseekV3ForCausalLM"),
    ("DeepSeek-V2", 2, 1, 64, 704, 6, 6, 4096, "models/deepseek_v2.py:3358 (not V3: no fusion), :753 n_routed_experts"),
    ("Kimi-K2", 8, 1, 384, 256, 8, 8, 7168, "models/deepseek_v2.py:3367 384 routed fuse only with quark"),
    ("Mistral-Large-3", 8, 1, 128, 512, 4, 4, 7168, "models/mistral_large_3.py:12 inherits the V3 gate; deepseek_v2.py:3358"),
    ("GLM-5-Next", 4, 1, 289, 512, 8, 9, 4096, "models/glm5_next.py:1352 gate, :748 DeepseekV2MoE on text_config"),
    ("DeepSeek-V4", 4, 1, 256, 512, 6, 6, 4096, "models/deepseek_v4.py:4883 fusion only when enforced"),
    ("HY-V4", 4, 1, 256, 192, 8, 8, 2816, "models/hunyuan_v4.py:741; configs/hy_v4.py:7 num_local_experts alias"),
    ("GigaChat-3.5", 2, 1, 64, 448, 6, 6, 1280, "arg_groups/model_overrides/gigachat35.py:17"),
    ("Kimi-K2.5", 8, 1, 384, 256, 8, 8, 7168, "models/kimi_k25.py:653 -> deepseek_v2.py:3367"),
    ("Kimi-VL-A3B", 2, 1, 64, 704, 6, 6, 2048, "models/kimi_vl.py:119 renames the text arch to DeepseekV2ForCausalLM"),
    ("dots.vlm1", 8, 1, 257, 256, 8, 9, 7168, "models/dots_vlm.py:50 -> deepseek_v2.py:3325 on language_config"),
    ("dots.vlm1", 8, 8, 32, 2048, 8, 8, 7168, "models/deepseek_v2.py:3385 EP turns fusion off on NVIDIA"),
    ("Pixtral-Mistral-Large-3", 8, 1, 128, 512, 4, 4, 7168, "models/pixtral.py:83; utils/hf_transformers/mistral_utils.py:82"),
    ("DeepSeek-VL2", 2, 1, 72, 768, 6, 6, 2560, "models/deepseek_vl2.py:217 use_mla -> DeepseekV2ForCausalLM"),
    ("DeepSeek-VL2-Tiny", 2, 2, 64, 448, 6, 6, 1280, "models/deepseek_vl2.py:220 -> deepseek.py:132 per-expert MLPs, TP only"),
    ("DeepSeek-OCR", 2, 1, 64, 448, 6, 6, 1280, "models/deepseek_ocr.py:1491 DeepseekForCausalLM"),
    ("DeepSeek-MoE-16B", 4, 1, 64, 352, 6, 6, 2048, "models/deepseek.py:132 per-expert MLPs, :215 fused_moe"),
    ("Dots3-Note", 2, 1, 128, 512, 6, 6, 2560, "models/dots3_common/modeling.py:1634 needs 256 routed"),
    ("LongCat-Flash", 8, 1, 512, 256, 12, 12, 6144, "configs/longcat_flash.py:87; models/longcat_flash.py:251-252"),
    ("MiMo-V2-Flash", 4, 1, 256, 512, 8, 8, 4096, "models/mimo_v2.py:452"),
    ("GLM-4.5V", 4, 1, 129, 352, 8, 9, 4096, "models/glm4v_moe.py:87; glm4_moe.py:437"),
    ("GLM-4-MoE-Lite", 2, 1, 65, 768, 4, 5, 2048, "models/glm4_moe_lite.py:732, :209"),
    ("Qwen1.5-MoE-A2.7B", 4, 1, 60, 352, 4, 4, 2048, "models/qwen2_moe.py:282 CUDA fusion needs enable_cuda_shared_expert_fusion"),
    ("Qwen3-VL-MoE", 2, 1, 60, 704, 4, 4, 2048, "models/qwen3_vl_moe.py:203 Qwen3MoeLLMModel"),
    ("Qwen3-Omni-MoE", 2, 1, 128, 384, 8, 8, 2048, "models/qwen3_omni_moe.py:551 thinker_config"),
    ("Qwen3-Next-80B-A3B", 4, 1, 513, 128, 10, 11, 2048, "models/qwen3_next.py:557; qwen2_moe.py:318"),
    ("Qwen3-Next-80B-A3B", 4, 2, 257, 256, 10, 11, 2048, "models/qwen2_moe.py:291 only per-rank slots (DeepEP) turn it off; fused_moe_triton/layer.py:415"),
    ("Mellum", 2, 1, 128, 384, 8, 8, 2048, "models/mellum.py:413"),
    ("Phi-3.5-MoE", 2, 1, 16, 3200, 2, 2, 4096, "models/phimoe.py:357"),
    ("Granite-MoE", 2, 1, 8, 5504, 2, 2, 4096, "models/granitemoe.py:326"),
    ("Grok-2", 8, 1, 8, 2048, 2, 2, 8192, "models/grok.py:515 moe_intermediate_size before intermediate_size"),
    ("MiniMax-M2", 4, 1, 256, 384, 8, 8, 3072, "models/minimax_m2.py:536"),
    ("MiniMax-M3", 4, 1, 129, 768, 4, 5, 6144, "models/minimax_m3.py:2023, :422"),
    ("MiniMax-M3", 4, 2, 64, 1536, 4, 4, 6144, "models/minimax_m3.py:2042 EP turns fusion off"),
    ("MiniMax-M3-VL", 4, 1, 129, 768, 4, 5, 6144, "models/minimax_m3_vl.py:166"),
    ("Muse-Spark", 8, 8, 32, 4096, 8, 8, 4096, "models/muse_spark.py:479 MoE-TP 1, :500 experts // ep"),
    ("ERNIE-4.5-VL", 2, 1, 64, 768, 6, 6, 2560, "models/ernie45_moe_vl.py:219 text experts [0]"),
    ("DBRX", 4, 2, 16, 2688, 4, 4, 6144, "models/dbrx.py:107-110 all experts, ffn_hidden_size // tp"),
    ("Hunyuan-A13B", 2, 1, 64, 1536, 8, 8, 4096, "models/hunyuan.py:134 per-layer moe_topk"),
    ("HY-V3", 2, 1, 192, 768, 8, 8, 4096, "models/hunyuan_v3.py:100"),
    ("Ling-mini-2.0", 2, 1, 256, 256, 8, 8, 2048, "models/bailing_moe.py:234, :312"),
    ("Ling-V2.5", 2, 1, 256, 256, 8, 8, 2048, "models/bailing_moe_linear.py:302"),
    ("Ling-V3", 2, 1, 257, 256, 8, 9, 2048, "models/bailing_moe_v3.py:1429, :569"),
    ("Ling-V3", 4, 2, 129, 256, 8, 9, 2048, "models/bailing_moe_v3.py:1438 only an A2A backend turns it off"),
    ("Beam", 4, 1, 256, 640, 8, 8, 5120, "models/beam.py:334"),
    ("Cohere2-MoE", 4, 1, 8, 5632, 2, 2, 8192, "models/cohere2_moe.py:289 intermediate_size"),
    ("EXAONE-MoE", 2, 1, 64, 512, 8, 8, 4096, "models/exaone_moe.py:161"),
    ("Inkling", 4, 1, 256, 768, 6, 6, 6144, "models/inkling_common/moe.py:800 intermediate_size, :830"),
    ("IQuest-Q1", 2, 1, 256, 768, 8, 8, 3072, "models/iquest_q1.py:216"),
    ("Kimi-Linear", 2, 1, 256, 512, 8, 8, 2304, "models/kimi_linear.py:116"),
    ("Kimi-K3", 4, 1, 512, 512, 8, 8, 3072, "models/kimi_k3.py:478 latent K"),
    ("Laguna", 2, 1, 256, 256, 8, 8, 2048, "models/laguna.py:154"),
    ("LFM2-MoE", 2, 1, 32, 896, 4, 4, 2048, "models/lfm2_moe.py:155"),
    ("LLaDA2-MoE", 2, 1, 256, 256, 8, 8, 2048, "models/llada2.py:605, :672"),
    ("Nemotron-H-MoE", 2, 1, 128, 928, 6, 6, 2688, "models/nemotron_h.py:276, :287 is_gated=False"),
    ("OLMoE", 2, 1, 64, 512, 8, 8, 2048, "models/olmoe.py:225"),
    ("Step3-VL", 8, 1, 48, 640, 3, 3, 7168, "models/step3_vl.py:139, :732 text_config"),
    ("Step-3.5", 4, 1, 288, 320, 8, 8, 4096, "models/step3p5.py:152"),
    ("Zaya", 2, 1, 16, 1024, 1, 1, 2048, "models/zaya.py:1204 top-k default 1, :1227 ffn_hidden_size // 2"),
    ("AFMoE", 2, 2, 64, 704, 6, 6, 2048, "models/afmoe.py:194 per-expert MLPs, :284 fused_moe"),
    ("XVERSE-MoE", 2, 1, 64, 864, 6, 6, 2560, "models/xverse_moe.py:105, :181"),
    ("InternVL-GPT-OSS", 2, 1, 32, 1440, 4, 4, 2880, "models/internvl.py:558 llm_config GptOssForCausalLM"),
    ("Intern-S1", 8, 1, 128, 192, 8, 8, 4096, "models/interns1.py:67 text_config Qwen3MoeForCausalLM"),
    ("Intern-S2-Mobius", 2, 1, 256, 256, 8, 8, 2048, "models/interns2_mobius.py:329"),
    ("Sarvam-MLA", 4, 1, 128, 256, 8, 8, 4096, "models/sarvam_moe.py:277"),
    ("SDAR-MoE", 2, 1, 128, 384, 8, 8, 2048, "models/sdar_moe.py:98"),
    ("K2-Horizon", 4, 1, 128, 384, 8, 8, 4096, "models/xllm.py:934"),
]


def arch_cfg(name: str) -> dict:
    return load_model_config(str(ARCH_MODELS / f"{name}.json"))


@pytest.mark.parametrize("name, tp, ep, E, N, topk, runtime_topk, hidden, why", ARCH_TABLE,
                         ids=[f"{r[0]}-tp{r[1]}ep{r[2]}" for r in ARCH_TABLE])
def test_architecture_family_shapes(name, tp, ep, E, N, topk, runtime_topk, hidden, why):
    s = moe_shape(arch_cfg(name), tp=tp, ep=ep)
    assert (s.E, s.N, s.topk, s.runtime_topk, s.hidden) == (E, N, topk, runtime_topk, hidden), why
    assert s.shared_fused == (runtime_topk > topk)
    assert s.file_names("NVIDIA H200")["up"] == f"E={E},N={N},device_name=NVIDIA_H200.json"


def test_every_family_config_is_in_the_table_and_every_rule_has_a_config():
    files = {p.stem for p in ARCH_MODELS.glob("*.json")}
    assert files - {"Nemotron-H-Puzzle"} == {r[0] for r in ARCH_TABLE}  # the Puzzle config is refused below
    used = set()
    for p in [*MODELS.glob("*.json"), *ARCH_MODELS.glob("*.json")]:
        cfg = load_model_config(str(p))
        used |= {r.family for r in RULES_BY_ARCH[cfg["architectures"][0]] if r.delegate}  # the wrapper's rule
        if "Puzzle" not in p.stem:
            used.add(moe_shape(cfg).family)
    families = [r.family for r in ARCHITECTURES]
    assert len(families) == len(set(families))
    # the DeepSeek-OCR branches and Nemotron-H Puzzle are exercised in tests below
    assert set(families) - used == {"DeepSeek-OCR (noaux_tc)", "DeepSeek-OCR (MLA)", "Nemotron-H Puzzle"}


def test_deepseek_ocr_branches_follow_the_text_config():
    cfg = arch_cfg("DeepSeek-OCR")
    cfg["language_config"]["use_mla"] = True  # models/deepseek_ocr.py:1497 DeepseekV2ForCausalLM
    s = moe_shape(cfg, tp=2, ep=2)
    assert (s.family, s.E, s.N) == ("DeepSeek-OCR (MLA)", 32, 896)
    cfg["language_config"].update(topk_method="noaux_tc", n_routed_experts=256, n_shared_experts=1,
                                  architectures=["DeepseekV3ForCausalLM"])  # deepseek_ocr.py:1485
    s = moe_shape(cfg, tp=2)
    assert (s.family, s.E, s.shared_fused) == ("DeepSeek-OCR (noaux_tc)", 257, True)


# --------------------------------------------------------------------------- fusion conditions

def test_qwen3_next_fusion_conditions():
    cfg = arch_cfg("Qwen3-Next-80B-A3B")
    assert moe_shape(cfg, tp=4, deepep=True).E == 512  # qwen2_moe.py:149 DeepEP: no fusion
    assert moe_shape(cfg, tp=4, disable_shared_experts_fusion=True).E == 512
    assert moe_shape(cfg, tp=4, capability=(7, 5)).E == 513  # no sm80 check in qwen2_moe.py:137
    other = dict(cfg, shared_expert_intermediate_size=1024)  # qwen2_moe.py:148 sizes must match
    assert moe_shape(other, tp=4).E == 512
    two = dict(cfg, n_shared_experts=2)  # qwen3_next.py:1062 more than one: ValueError at load
    with pytest.raises(PayloadError, match="2 shared experts.*refuses to load"):
        moe_shape(two, tp=4)


def test_bailing_v3_fusion_conditions():
    cfg = arch_cfg("Ling-V3")
    assert moe_shape(cfg, tp=2, deepep=True).E == 256  # bailing_moe_v3.py:1438
    assert moe_shape(cfg, tp=2, capability=(7, 5)).E == 256  # bailing_moe_v3.py:1446
    assert moe_shape(dict(cfg, moe_shared_expert_intermediate_size=1024), tp=2).E == 256  # :1488
    assert moe_shape(dict(cfg, moe_shared_expert_intermediate_size=512), tp=2).E == 257
    assert moe_shape(dict(cfg, num_shared_experts=0), tp=2).E == 256
    # two shared experts without a size field count as one expert of twice the size (:1483): no fusion
    assert moe_shape(dict(cfg, num_shared_experts=2), tp=2).E == 256
    with pytest.raises(PayloadError, match="refuses to load"):  # bailing_moe_v3.py:1525
        moe_shape(dict(cfg, num_shared_experts=2, moe_shared_expert_intermediate_size=512), tp=2)


def test_glm4_moe_fuses_every_shared_expert_and_minimax_m3_only_one():
    s = moe_shape(dict(cfg_of("GLM-4.5"), n_shared_experts=2), tp=8)  # glm4_moe.py:1033
    assert (s.E, s.runtime_topk) == (162, 10)
    with pytest.raises(PayloadError, match="refuses to load"):  # minimax_m3.py:2051 assert
        moe_shape(dict(arch_cfg("MiniMax-M3"), n_shared_experts=2), tp=4)
    assert moe_shape(dict(arch_cfg("MiniMax-M3"), n_shared_experts=0), tp=4).E == 128
    s = moe_shape(dict(arch_cfg("GLM-4-MoE-Lite"), n_shared_experts=2), tp=2)  # glm4_moe_lite.py:739
    assert s.E == 64


def test_deepseek_gate_follows_the_sub_configs_architecture():
    cfg = arch_cfg("Pixtral-Mistral-Large-3")
    cfg["text_config"].update(architectures=["DeepseekV3ForCausalLM"], n_routed_experts=256)
    assert moe_shape(cfg, tp=8).E == 257  # pixtral.py:83 asks the DeepSeek gate about text_config
    dots = moe_shape(arch_cfg("Dots3-Note") | {"n_routed_experts": 256}, tp=2)
    assert (dots.E, dots.shared_fused) == (257, True)  # dots3_common/modeling.py:1628
    assert moe_shape(arch_cfg("Dots3-Note") | {"n_routed_experts": 256}, tp=2, ep=2).E == 128


# --------------------------------------------------------------------------- refusals

def test_unknown_architecture_is_refused_by_name():
    cfg = dict(cfg_of("Qwen3-30B-A3B"), architectures=["NewMoeForCausalLM"])
    with pytest.raises(PayloadError) as ei:
        moe_shape(cfg)
    assert ei.value.kind == "bad_input"
    assert "'NewMoeForCausalLM'" in ei.value.msg and "num_experts" in ei.value.msg and "n_routed_experts" in ei.value.msg
    with pytest.raises(PayloadError, match="no architectures"):
        moe_shape({k: v for k, v in cfg_of("Qwen3-30B-A3B").items() if k != "architectures"})


def test_attribute_map_aliases():
    # transformers 5.19 Qwen3MoeConfig: attribute_map {"num_experts": "num_local_experts"}
    cfg = cfg_of("Qwen3-30B-A3B")
    cfg["num_local_experts"] = cfg.pop("num_experts")
    assert moe_shape(cfg, tp=2).E == 128
    # transformers 5.19 Ernie4_5_MoeConfig: {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"}
    cfg = cfg_of("ERNIE-4.5-21B-A3B")
    cfg["num_experts"], cfg["num_experts_per_tok"] = cfg.pop("moe_num_experts"), cfg.pop("moe_k")
    s = moe_shape(cfg, tp=2)
    assert (s.E, s.N, s.topk) == (64, 768, 6)


def test_missing_field_is_named_with_its_nesting():
    cfg = cfg_of("Gemma-4-26B-A4B")
    del cfg["text_config"]["top_k_experts"]
    with pytest.raises(PayloadError, match=r"no top-k: none of text_config\.top_k_experts is set"):
        moe_shape(cfg)


@pytest.mark.parametrize("name, mutate, words", [
    ("Gemma-4-26B-A4B", lambda c: c["text_config"].update(enable_moe_block=False), "enable_moe_block is not true"),
    ("Qwen3.5-122B-A10B", lambda c: c["text_config"].pop("num_experts"), "not an MoE model"),
    ("K2-Horizon", lambda c: c.update(num_experts=0), "not an MoE model"),
    ("AFMoE", lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
     "without quantization"),
    ("Nemotron-H-Puzzle", lambda c: None, "block_configs"),
    ("Hunyuan-A13B", lambda c: c.update(moe_topk=[8, 8, 6, 6]), "differs between layers"),
    ("ERNIE-4.5-VL", lambda c: c.update(moe_num_experts=64), "not the list"),
    ("InternVL-GPT-OSS", lambda c: c["llm_config"].update(architectures=["Qwen2ForCausalLM"]), "'Qwen2ForCausalLM'"),
    ("Pixtral-Mistral-Large-3", lambda c: c["text_config"].update(model_type="mistral"),
     "text_config.model_type == 'deepseek_v3'"),
])
def test_configs_sglang_builds_no_single_fused_moe_for(name, mutate, words):
    cfg = arch_cfg(name) if (ARCH_MODELS / f"{name}.json").exists() else cfg_of(name)
    mutate(cfg)
    with pytest.raises(PayloadError) as ei:
        moe_shape(cfg, tp=2)
    assert ei.value.kind == "bad_input" and words in ei.value.msg


def test_muse_spark_needs_moe_tp_1():
    with pytest.raises(PayloadError, match="--ep-size equal to --tp-size"):  # muse_spark.py:479
        moe_shape(arch_cfg("Muse-Spark"), tp=8, ep=2)


def test_packed_experts_ignore_ep():
    s = moe_shape(arch_cfg("DBRX"), tp=4, ep=2)
    assert (s.E, s.N) == (16, 2688) and any("--ep 2" in n for n in s.notes)


def test_non_gated_experts_are_refused_by_the_tuner():
    from remote.tuning.support import unsupported_reason
    s = moe_shape(arch_cfg("Nemotron-H-MoE"), tp=2)
    assert s.gated is False
    assert "not gated" in unsupported_reason(s.to_dict())
    assert unsupported_reason(moe_shape(cfg_of("Qwen3-30B-A3B")).to_dict()) is None


# --------------------------------------------------------------------------- docs

def test_docs_table_is_generated_from_the_rules():
    doc = (REPO / "docs" / "sglang-models.md").read_text()
    begin, end = "<!-- BEGIN architecture table -->\n", "<!-- END architecture table -->"
    assert begin in doc and end in doc
    table = doc.split(begin, 1)[1].split(end, 1)[0]
    assert table == architecture_table_markdown(), (
        "docs/sglang-models.md is stale: paste the output of "
        "python -c 'from scripts.sglang_docs import architecture_table_markdown as t; print(t(), end=\"\")'")


# --------------------------------------------------------------------------- against SGLang 0.5.23

#: EntryClass names of SGLang 0.5.23 model files that build a fused MoE but are not in the table.
NOT_IN_TABLE = {
    # drafts for speculative decoding: built from the target model's config
    "DFlashDraftModel": "draft", "DFlashLagunaForCausalLM": "draft", "MuseGlimmerAssistantModel": "draft",
    "DFlash2DraftModel": "draft", "DFlash2BeamDraftModel": "draft", "MiniMaxDFlash2DraftModel": "draft",
    "DeepseekV4ForCausalLMDSpark": "draft", "GlmMoeDsaForCausalLMNextN": "draft", "HYV3ForCausalLMNextN": "draft",
    "Qwen3_5ForCausalLMMTP": "draft", "Qwen3MoeForCausalLMMTP": "draft", "InklingForConditionalGenerationMTP": "draft",
    # dense siblings in a MoE model's file
    "Ernie4_5_ForCausalLM": "dense", "HunYuanDenseV1ForCausalLM": "dense",
    # SGLang's transformers backend (--model-impl transformers), never a config's architectures[0]
    **{n: "transformers backend" for n in (
        "TransformersForCausalLM", "TransformersMoEForCausalLM", "TransformersMultiModalForCausalLM",
        "TransformersMultiModalMoEForCausalLM", "TransformersEmbeddingModel", "TransformersMoEEmbeddingModel",
        "TransformersMultiModalEmbeddingModel", "TransformersMultiModalMoEEmbeddingModel",
        "TransformersForSequenceClassification", "TransformersMoEForSequenceClassification",
        "TransformersMultiModalForSequenceClassification", "TransformersMultiModalMoEForSequenceClassification")},
}
MOE_BUILDERS = re.compile(r"FusedMoE\(|get_moe_impl_class\(|\bfused_moe\(|fused_moe_method\(")


@pytest.fixture(scope="module")
def sglang_srt() -> Path:
    from tests.sglang_releases import source_tree
    return source_tree("0.5.23") / "sglang" / "srt"


def _entry_classes(text: str) -> list[str]:
    m = re.search(r"^EntryClass\s*=\s*(\[[^\]]*\]|\w+)", text, re.M)
    return re.findall(r"\w+", m.group(1)) if m else []


def test_every_table_architecture_is_an_sglang_entry_class(sglang_srt):
    names = set()
    for p in (sglang_srt / "models").rglob("*.py"):
        names.update(_entry_classes(p.read_text()))
    assert set(RULES_BY_ARCH) - names == set()


def test_every_sglang_model_building_a_fused_moe_is_in_the_table(sglang_srt):
    missing = {}
    for p in sorted((sglang_srt / "models").glob("*.py")):
        text = p.read_text()
        if MOE_BUILDERS.search(text):
            for name in _entry_classes(text):
                if name not in RULES_BY_ARCH and name not in NOT_IN_TABLE:
                    missing[name] = p.name
    assert missing == {}


def test_cited_lines_exist_and_hold_the_fields(sglang_srt):
    """Every file:line a rule cites exists in SGLang 0.5.23; every field a rule reads appears in one
    of the files it cites (or SGLang's config class of that name)."""
    for rule in ARCHITECTURES:
        texts = [rule.source, *rule.notes, rule.refuse or ""] + ([rule.fusion.gate] if rule.fusion else [])
        cited = set()
        for t in texts:
            for f, lines in re.findall(r"([a-z0-9_/]+\.py):([0-9,]+)", t):
                src = (sglang_srt / f).read_text().splitlines()
                for ln in lines.split(","):
                    assert 1 <= int(ln) <= len(src), (rule.family, f, ln)
                cited.add(f)
        body = "\n".join((sglang_srt / f).read_text() for f in cited)
        for specs in (rule.experts, rule.intermediate, rule.topk):
            if specs:
                names = [re.split(r"[.\[]", s)[-1] if "." in s else s.split("[")[0] for s in specs]
                assert any(re.search(rf"\b{n}\b", body) for n in names), (rule.family, specs)


# --------------------------------------------------------------------------- loading

def test_load_folder_and_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((MODELS / "GLM-5.json").read_text())
    assert load_model_config(str(tmp_path / "m"))["n_routed_experts"] == 256
    assert load_model_config(str(tmp_path / "m" / "config.json"))["n_routed_experts"] == 256


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(PayloadError) as ei:
        load_model_config(str(tmp_path / "nope.json"))
    assert ei.value.kind == "not_found" and "nope.json" in ei.value.msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(PayloadError) as ei:
        load_model_config(str(tmp_path / "empty"))
    assert ei.value.kind == "not_found" and "empty" in ei.value.msg
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PayloadError) as ei:
        load_model_config(str(bad))
    assert ei.value.kind == "bad_input" and str(bad) in ei.value.msg
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(PayloadError) as ei:
        load_model_config(str(arr))
    assert ei.value.kind == "bad_input" and "list" in ei.value.msg


def _fake_hf_cache(root: Path, repo: str, snapshots: dict[str, dict], main: str | None) -> Path:
    rd = root / "hub" / ("models--" + repo.replace("/", "--"))
    for rev, cfg in snapshots.items():
        blob = rd / "blobs" / f"blob-{rev}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_text(json.dumps(cfg))
        snap = rd / "snapshots" / rev
        snap.mkdir(parents=True)
        os.symlink(os.path.relpath(blob, snap), snap / "config.json")  # as huggingface_hub does
    if main:
        (rd / "refs").mkdir()
        (rd / "refs" / "main").write_text(main)
    return rd


def test_hf_cache_prefers_refs_main(tmp_path, monkeypatch):
    new = cfg_of("Qwen3-30B-A3B")
    old = dict(new, num_experts=64)
    rd = _fake_hf_cache(tmp_path, "Qwen/Qwen3-30B-A3B", {"aaaa1111": new, "bbbb2222": old}, main="aaaa1111")
    # make the non-main snapshot the newest on disk: refs/main must still win
    os.utime(rd / "snapshots" / "bbbb2222" / "config.json", (4e9, 4e9), follow_symlinks=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert resolve_model_config_path("Qwen/Qwen3-30B-A3B") == rd / "snapshots" / "aaaa1111" / "config.json"
    assert load_model_config("Qwen/Qwen3-30B-A3B")["num_experts"] == 128
    # explicit hf_home argument, env pointing elsewhere
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    assert load_model_config("Qwen/Qwen3-30B-A3B", hf_home=str(tmp_path))["num_experts"] == 128
    assert hf_hub_dir(str(tmp_path)) == tmp_path / "hub"


def test_hf_cache_without_refs_uses_a_snapshot(tmp_path):
    _fake_hf_cache(tmp_path, "org/m", {"cccc": cfg_of("GLM-5")}, main=None)
    assert load_model_config("org/m", hf_home=str(tmp_path))["n_routed_experts"] == 256


def test_hf_cache_miss_is_not_found(tmp_path):
    with pytest.raises(PayloadError) as ei:
        load_model_config("org/absent", hf_home=str(tmp_path))
    assert ei.value.kind == "not_found"
    assert "models--org--absent" in ei.value.msg and "offline" in ei.value.msg


def test_models_and_naming_do_not_import_torch():
    code = ("import sys; import remote.engines.sglang.model_config, remote.engines.sglang.shape, remote.engines.sglang.architectures, "
            "remote.engines.sglang.model_flags, remote.engines.sglang.naming, remote.names, remote.engines.triton_moe.configfile; "
            "bad = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = run_watched([sys.executable, "-c", code], cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_names_command(tmp_path):
    r = run_watched([sys.executable, "-m", "remote", "names", "--model-config", str(MODELS / "GLM-5.json"), "--tp", "8",
         "--device-name", "NVIDIA H200"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["type"] == "result"
    assert last["data"]["file_names"] == {"up": "E=257,N=256,device_name=NVIDIA_H200.json",
                                          "down": "E=257,N=256,device_name=NVIDIA_H200_down.json"}
    r = run_watched([sys.executable, "-m", "remote", "names", "--model-config", str(MODELS / "GLM-5.json"),
         "--device-name", "../evil"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["type"] == "error" and last["kind"] == "bad_input"
