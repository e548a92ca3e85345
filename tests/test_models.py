"""remote.sglang.model: model configs -> MoE shape -> SGLang 0.5.23 file names.

The table below is copied by hand from tests/data/models/README.md (E, N per TP,
dtype selector); it is not computed with the code under test.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote.sglang.model import hf_hub_dir, load_model_config, moe_shape, resolve_model_config_path
from remote.protocol import PayloadError

MODELS = Path(__file__).resolve().parent / "data" / "models"
#: configs of issue 11 (architectures with other field names); their shapes are checked elsewhere
ISSUE_11_INPUTS = {"Llama-4-Scout-17B-16E", "Gemma-4-26B-A4B", "ERNIE-4.5-21B-A3B"}
REPO = Path(__file__).resolve().parents[1]

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
}


def cfg_of(model: str) -> dict:
    return load_model_config(str(MODELS / f"{model}.json"))


def test_table_covers_every_shared_model():
    assert {p.stem for p in MODELS.glob("*.json")} - ISSUE_11_INPUTS == {m for m, *_ in README_TABLE}


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
    code = ("import sys; import remote.sglang.model, remote.sglang.naming, remote.names, remote.sglang.configfile; "
            "bad = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_names_command(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "remote", "names", "--model-config", str(MODELS / "GLM-5.json"), "--tp", "8",
         "--device-name", "NVIDIA H200"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["type"] == "result"
    assert last["data"]["file_names"] == {"up": "E=257,N=256,device_name=NVIDIA_H200.json",
                                          "down": "E=257,N=256,device_name=NVIDIA_H200_down.json"}
    r = subprocess.run(
        [sys.executable, "-m", "remote", "names", "--model-config", str(MODELS / "GLM-5.json"),
         "--device-name", "../evil"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["type"] == "error" and last["kind"] == "bad_input"
