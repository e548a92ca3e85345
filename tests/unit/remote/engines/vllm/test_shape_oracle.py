"""orch's vLLM MoE shape per rank held against vLLM 0.32.0, 0.33.0 and 0.34.0.

- the config keys: every key :data:`remote.engines.vllm.shape.ARCHITECTURES` names is read by the
  model file the release's ``registry.py`` maps the architecture to (or a file it imports);
- the expert split under EP: the release's own ``determine_expert_map`` (run from its source,
  ``expert_map_manager.py``) gives each rank's expert count;
- the N split and when EP applies: ``FusedMoEParallelConfig.make`` / ``flatten_tp_across_dp_and_pcp``
  read from the release's ``config.py``;
- the real model configs of ``tests/data/models`` give the shapes below.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from remote.engines.vllm import shape as vs_shape
from remote.protocol import BadInput
from tests.vllm_releases import ORACLE_RELEASES, source_tree

MODELS = Path(__file__).resolve().parents[4] / "data" / "models"


def _registry(version: str) -> dict[str, str]:
    tree = ast.parse((source_tree(version) / "vllm/model_executor/models/registry.py").read_text())
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and v.elts and \
                        isinstance(v.elts[0], ast.Constant):
                    out[k.value] = v.elts[0].value
    return out


def _module_text(version: str, module: str) -> str:
    root = source_tree(version) / "vllm"
    if module.startswith("vllm."):
        folder = root.parent / Path(*module.split("."))
        files = [folder.with_suffix(".py")] if folder.with_suffix(".py").is_file() else sorted(folder.rglob("*.py"))
    else:
        files = [root / "model_executor/models" / f"{module}.py"]
    return "\n".join(f.read_text() for f in files if f.is_file())


@pytest.mark.parametrize("version", ORACLE_RELEASES)
@pytest.mark.parametrize("arch", sorted(vs_shape.ARCHITECTURES))
def test_model_files_read_the_keys(version, arch):
    reg = _registry(version)
    assert arch in reg, (version, arch)
    a = vs_shape.ARCHITECTURES[arch]
    mapped = _module_text(version, reg[arch])
    own = mapped if reg[arch].split(".")[-1] == a.module else _module_text(version, a.module)
    if reg[arch].split(".")[-1] != a.module:  # the registry's module imports the one orch names
        assert a.module in mapped, f"{reg[arch]} does not import {a.module}"
    for key in (a.experts, a.intermediate, a.topk, *([a.shared] if a.shared else [])):
        assert f".{key}" in own or f'"{key}"' in own, (version, arch, key)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_ep_and_tp_split_rules(version):
    cfg = (source_tree(version) / "vllm/model_executor/layers/fused_moe/config.py").read_text()
    assert "flatten_tp_size = dp_size * pcp_size * tp_size" in cfg
    assert "and vllm_parallel_config.enable_expert_parallel" in cfg and "ep_size = tp_size" in cfg
    path = source_tree(version) / "vllm/model_executor/layers/fused_moe/expert_map_manager.py"
    if not path.is_file():
        pytest.skip(f"vLLM {version} keeps determine_expert_map elsewhere")
    from tests import vllm_standins as vstand
    vstand.install(source_tree(version))
    try:
        spec = importlib.util.spec_from_file_location("_release_expert_map", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for experts, ep in ((128, 8), (257, 8), (160, 6), (16, 3)):
            for rank in range(ep):
                local = mod.determine_expert_map(ep, rank, experts)[0]
                config = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": experts,
                          "moe_intermediate_size": 768, "hidden_size": 2048, "num_experts_per_tok": 8}
                got = vs_shape.model_shape(config, tp=ep, enable_expert_parallel=True, ep_rank=rank)
                assert (got.E, got.N, got.ep) == (local, 768, ep), (version, experts, ep, rank)
    finally:
        vstand.uninstall()


@pytest.mark.parametrize("model,tp,ep,want", [
    ("Qwen3-30B-A3B.json", 1, False, (128, 768, 2048, 8)),
    ("Qwen3-30B-A3B.json", 4, False, (128, 192, 2048, 8)),
    ("Qwen3-30B-A3B.json", 4, True, (32, 768, 2048, 8)),
    ("Qwen3-235B-A22B.json", 8, False, (128, 192, 4096, 8)),
    ("DeepSeek-V3.json", 8, False, (256, 256, 7168, 8)),
    ("DeepSeek-V3.json", 8, True, (32, 2048, 7168, 8)),
    ("GLM-4.5.json", 8, False, (160, 192, 5120, 8)),
    ("GLM-5.json", 8, False, (256, 256, 6144, 8)),
    ("ERNIE-4.5-21B-A3B.json", 1, False, (64, 1536, 2560, 6)),
    ("Gemma-4-26B-A4B.json", 1, False, (128, 704, 2816, 8)),
    ("Llama-4-Scout-17B-16E.json", 4, False, (16, 2048, 5120, 1)),
    ("Mixtral-8x7B-Instruct-v0.1.json", 2, False, (8, 7168, 4096, 2)),
    ("Qwen3.5-122B-A10B.json", 4, False, (256, 256, 3072, 8)),
    ("gpt-oss-120b.json", 1, False, (128, 2880, 2880, 4)),
])
def test_real_model_configs(model, tp, ep, want):
    cfg = json.loads((MODELS / model).read_text())
    s = vs_shape.model_shape(cfg, tp=tp, enable_expert_parallel=ep, source=model)
    assert (s.E, s.N, s.hidden, s.topk) == want


def test_formats_and_file_names():
    cfg = json.loads((MODELS / "Qwen3-30B-A3B.json").read_text())
    s = vs_shape.model_shape(cfg)
    assert s.file_names("NVIDIA_H200") == ["E=128,N=768,device_name=NVIDIA_H200.json"]
    fp8 = dict(cfg, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    s8 = vs_shape.model_shape(fp8)
    assert s8.file_names("NVIDIA_H200") == [
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]_down.json"]
    assert len(s8.file_names("NVIDIA_H200", release="0.33.0")) == 1
    assert vs_shape.model_shape(cfg, quantization="fp8").block_shape is None
    oss = json.loads((MODELS / "gpt-oss-120b.json").read_text())
    if (oss.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        assert vs_shape.model_shape(oss).file_names("NVIDIA_H200") == []
    with pytest.raises(BadInput, match="not divisible"):
        vs_shape.model_shape(cfg, tp=5)
    with pytest.raises(BadInput, match="architecture"):
        vs_shape.model_shape({"architectures": ["Nope"]})


@pytest.mark.parametrize("model,quantization,tp,want", [
    # (dtype selector, layer group, zero points, file name)
    ("Qwen3-30B-A3B-GPTQ-Int4.json", None, 1, ("int4_w4a16", 128, False, "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json")),
    ("Qwen3-30B-A3B-GPTQ-Int4.json", "moe_wna16", 4, ("int4_w4a16", 64, False, "E=128,N=192,device_name=NVIDIA_H200,dtype=int4_w4a16.json")),
    ("Qwen3-30B-A3B-AWQ.json", "moe_wna16", 2, ("int4_w4a16", 128, True, "E=128,N=384,device_name=NVIDIA_H200,dtype=int4_w4a16.json")),
    (None, "experts_int8", 1, ("int8_w8a16", 0, False, "E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a16.json")),
])
def test_weight_only_checkpoints(model, quantization, tp, want):
    """GPTQ/AWQ checkpoints (real quantization_config blocks) and --quantization experts_int8: the
    format, the layer's group (halved as MoeWNA16Method does when it does not divide N per rank),
    the zero points and vLLM's file name (no block selector for [0, group]); the tuner spec's quant."""
    from remote.engines.vllm.model_flags import vllm_moe_shape
    from remote.tuning.support import quant_entry, unsupported_reason

    cfg = json.loads((MODELS / ("quantized/" + model if model else "Qwen3-30B-A3B.json")).read_text())
    ms = vllm_moe_shape(cfg, tp=tp, quantization=quantization)
    assert (ms.dtype_selector, ms.group_size, ms.has_zp, ms.file_names("NVIDIA_H200")["up"]) == want
    naming = dict(dtype_selector=ms.dtype_selector, block_shape=ms.block_shape, per_channel_quant=ms.per_channel_quant,
                  weight_dtype=ms.weight_dtype, group_size=ms.group_size, has_zp=ms.has_zp)
    q = quant_entry(naming)
    assert q["dtype"] == want[0] and q["per_channel"] == (quantization == "experts_int8")
    assert unsupported_reason(naming, "vllm") is None
    assert unsupported_reason(naming, "builtin")  # the builtin kernel runs no int8/int4


def test_weight_only_refusals():
    cfg = json.loads((MODELS / "quantized/Qwen3-30B-A3B-GPTQ-Int4.json").read_text())
    bad = dict(cfg, quantization_config=dict(cfg["quantization_config"], bits=3))
    with pytest.raises(BadInput, match="bits must be 4 or 8"):
        vs_shape.model_shape(bad)
    with pytest.raises(BadInput, match="quantization 'bitsandbytes'"):
        vs_shape.model_shape(dict(cfg, quantization_config={"quant_method": "bitsandbytes"}))
    # a group that cannot be halved to divide N stays as the checkpoint's (vLLM would refuse to start)
    assert vs_shape.layer_group_size(128, 80, 2048) == 128
    assert vs_shape.layer_group_size(128, 96, 2048) == 32
    assert vs_shape.quant_method({}, "Experts_Int8") == "experts_int8"


def test_runner_verdict_reads_the_probe_for_weight_only():
    """moe_runner: the probe's checkpoint method with --quantization moe_wna16 is the MoeWNA16 path
    (Triton off SM90, undecided on SM90); GPTQ alone is undecided (Marlin where it fits); a 0.32.0
    log line with the quoted backend decides."""
    from remote.engines.records import MoeLogReport
    from remote.engines.vllm import moe_log, runner

    probe = {"model": {"quant_method": "int4_w4a16", "checkpoint_quant_method": "gptq"}, "capability": "8.0"}
    assert runner.moe_runner(backend="auto", probe=probe, ep=1, quantization="moe_wna16").reads_triton_configs is True
    assert runner.moe_runner(backend="auto", probe=probe, ep=1, quantization=None).reads_triton_configs is None
    sm90 = dict(probe, capability="9.0")
    assert runner.moe_runner(backend="auto", probe=sm90, ep=1, quantization="moe_wna16").reads_triton_configs is None
    int8 = {"model": {"quant_method": "int8_w8a16"}, "capability": "9.0"}
    assert runner.moe_runner(backend="auto", probe=int8, ep=1, quantization="experts_int8").reads_triton_configs is True
    log = moe_log.parse_moe_log("(EngineCore pid=9) INFO 12-04 08:00:00 [int_wna16.py:420] Using 'TRITON' WNA16 MoE backend.\n")
    assert isinstance(log, MoeLogReport)
    got = runner.moe_runner(backend="auto", probe=sm90, ep=1, quantization="moe_wna16", log=log)
    assert got.reads_triton_configs is True and got.runner == "TRITON"


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_parallel_split_matches_each_releases_make(version, monkeypatch):
    """The release's own ``FusedMoEParallelConfig.make`` (imported from its ``config.py`` with the
    stand-ins; the DP group's rank answered per rank) gives the experts' TP and EP of every rank of a
    TP x DP deployment, with and without ``--enable-expert-parallel``; ``FusedMoEConfig`` divides the
    intermediate size by that TP (``intermediate_size // tp_size``) and ``determine_expert_map``
    splits the experts over that EP. orch's shape (and the payload's ``--tp``/``--dp``/``--ep``
    through :func:`remote.engines.vllm.model_flags.vllm_moe_shape`) gives the same N and E."""
    import sys
    import types

    from remote.engines.vllm.model_flags import vllm_moe_shape
    from tests import vllm_standins as vstand

    cfg_text = (source_tree(version) / "vllm/model_executor/layers/fused_moe/config.py").read_text()
    assert "self.intermediate_size_per_partition = self.intermediate_size // tp_size" in cfg_text
    vstand.fused_moe_module(source_tree(version), cpu=True)
    try:
        mod = sys.modules["vllm.model_executor.layers.fused_moe.config"]
        emap = importlib.util.spec_from_file_location(
            "_release_expert_map", source_tree(version) / "vllm/model_executor/layers/fused_moe/expert_map_manager.py")
        em = importlib.util.module_from_spec(emap)
        emap.loader.exec_module(em)
        for model in ("Qwen3-30B-A3B.json", "DeepSeek-V3.json"):
            config = json.loads((MODELS / model).read_text())
            arch = vs_shape.ARCHITECTURES[config["architectures"][0]]
            experts, inter = config[arch.experts], config[arch.intermediate]
            for tp, dp in ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2)):
                for ep_flag in (False, True):
                    for dp_rank in range(dp):
                        monkeypatch.setattr(mod, "get_dp_group", lambda r=dp_rank: types.SimpleNamespace(rank_in_group=r))
                        monkeypatch.setattr(mod, "get_tensor_model_parallel_rank", lambda: 0, raising=False)
                        par = types.SimpleNamespace(enable_expert_parallel=ep_flag, all2all_backend="allgather_reducescatter",
                                                    enable_eplb=False, mori_ep_v2=False)
                        got = mod.FusedMoEParallelConfig.make(tp_size_=tp, pcp_size_=1, dp_size_=dp, sp_size_=1,
                                                              vllm_parallel_config=par)
                        ep = tp * dp if ep_flag else 1
                        shape = vllm_moe_shape(config, tp=tp, dp=dp, ep=ep, source=model)
                        assert (got.tp_size, got.ep_size, got.use_ep) == ((1, tp * dp, True) if ep_flag
                                                                          else (tp * dp, 1, False))
                        assert shape.N == inter // got.tp_size, (version, model, tp, dp, ep_flag)
                        if ep_flag:
                            local = em.determine_expert_map(got.ep_size, got.ep_rank, experts)[0]
                            mine = vs_shape.model_shape(config, tp=tp, dp=dp, enable_expert_parallel=True,
                                                        ep_rank=got.ep_rank)
                            assert (mine.E, mine.N) == (local, inter)
                        else:
                            assert shape.E == experts
    finally:
        vstand.uninstall()
