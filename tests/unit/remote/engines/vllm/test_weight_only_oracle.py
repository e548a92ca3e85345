"""vLLM's int8/int4 weight-only MoE formats held against vLLM 0.32.0, 0.33.0 and 0.34.0.

Which quantization methods reach the Triton fused-MoE kernel with ``use_int8_w8a16`` /
``use_int4_w4a16``, which kernel the backend oracles pick instead, and which file they read:

- the method names (``quantization/__init__.py`` ``get_quantization_config``) orch maps to a format
  (:data:`remote.engines.vllm.shape.GPTQ_METHODS`, ``AWQ_METHODS``, ``experts_int8``, ``moe_wna16``);
- the format: the release's own ``int4_w4a16_moe_quant_config`` / ``int8_w8a16_moe_quant_config``
  (``fused_moe/config.py``, imported from the release's source) name the file's dtype selector and
  ``block_shape``; ``make_wna16_moe_quant_config`` and ``make_int8_moe_quant_config`` (the oracles,
  read with ``ast``: they import compressed-tensors) build them; ``get_config_file_name`` and
  ``_moe_config_shape`` give the name orch computes for real GPTQ/AWQ checkpoints;
- the kernel: the WNA16 and Int8 priority lists, Marlin's refusal of the MoeWNA16 layout, Triton's
  refusal of the AutoAWQ layout, Humming's preferred capability (read with ``ast``), against
  :func:`remote.engines.vllm.runner.triton_verdict`;
- the launch: orch's provider runs each release's kernel for the group and per-channel formats.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import ast
import json
import re
from pathlib import Path

import pytest

from remote.engines.vllm import runner, shape as vs_shape
from remote.engines.vllm.model_flags import vllm_moe_shape
from tests.vllm_releases import ORACLE_RELEASES, source_tree

MODELS = Path(__file__).resolve().parents[4] / "data" / "models"
ORACLE = "vllm/model_executor/layers/fused_moe/oracle"
QUANT = "vllm/model_executor/layers/quantization"


def _tree(version: str, rel: str) -> ast.Module:
    return ast.parse((source_tree(version) / rel).read_text())


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _model(name: str) -> dict:
    return json.loads((MODELS / "quantized" / name).read_text())


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_method_names_map_to_the_configs_orch_reads(version):
    """``get_quantization_config``'s table: every GPTQ/AWQ spelling orch maps is AutoGPTQConfig /
    AutoAWQConfig, and experts_int8 / moe_wna16 are their own configs."""
    fn = _function(_tree(version, f"{QUANT}/__init__.py"), "get_quantization_config")
    table = next(n.value for n in ast.walk(fn) if isinstance(n, ast.AnnAssign)
                 and ast.unparse(n.target) == "method_to_config")
    mapping = {k.value: ast.unparse(v) for k, v in zip(table.keys, table.values)}
    assert {m: mapping[m] for m in vs_shape.GPTQ_METHODS} == dict.fromkeys(vs_shape.GPTQ_METHODS, "AutoGPTQConfig")
    assert {m: mapping[m] for m in vs_shape.AWQ_METHODS} == dict.fromkeys(vs_shape.AWQ_METHODS, "AutoAWQConfig")
    assert mapping["experts_int8"] == "ExpertsInt8Config" and mapping["moe_wna16"] == "MoeWNA16Config"


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_moe_wna16_reads_the_checkpoint_keys_orch_reads(version):
    """``MoeWNA16Config.from_config`` (bits, group_size; GPTQ ``sym``, AWQ ``zero_point``), its
    override by ``--quantization moe_wna16``, and the group halving of ``create_weights``."""
    text = (source_tree(version) / f"{QUANT}/moe_wna16.py").read_text()
    for needle in ('get_from_keys(config, ["bits"])', 'get_from_keys(config, ["group_size"])',
                   'has_zp = not cls.get_from_keys(config, ["sym"])', 'has_zp = cls.get_from_keys(config, ["zero_point"])',
                   'if can_convert and user_quant == "moe_wna16"',
                   "while intermediate_size_per_partition % group_size or hidden_size % group_size:",
                   "group_size = group_size // 2", "assert group_size >= 32"):
        assert needle in text, needle
    gptq = _model("Qwen3-30B-A3B-GPTQ-Int4.json")
    assert vs_shape.quant_method(gptq, "moe_wna16") == "moe_wna16"
    assert vs_shape.quant_method(gptq, None) == "gptq"
    assert vs_shape.layer_group_size(128, 192, 2048) == 64  # 768 / TP 4: halved as create_weights does
    assert vs_shape.layer_group_size(128, 768, 2048) == 128


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_oracles_build_w8a16_and_w4a16_configs(version):
    """``make_wna16_moe_quant_config``: 4 bits -> int4_w4a16, 8 -> int8_w8a16, ``block_shape=[0,
    group]``; ``make_int8_moe_quant_config`` without activation scales (what ``Int8OnlineMoEMethod``,
    experts_int8, passes) -> ``int8_w8a16_moe_quant_config`` with no block."""
    wna = _function(_tree(version, f"{ORACLE}/int_wna16.py"), "make_wna16_moe_quant_config")
    src = ast.unparse(wna)
    assert "if num_bits == 4:\n        return int4_w4a16_moe_quant_config(" in src
    assert src.count("block_shape=[0, group_size]") == 2 and "int8_w8a16_moe_quant_config(" in src
    int8 = (source_tree(version) / f"{ORACLE}/int8.py").read_text()
    assert re.search(r"if scales_absent and not per_act_token_quant:\s+return int8_w8a16_moe_quant_config\(", int8)
    online = (source_tree(version) / f"{QUANT}/online/int8.py").read_text()
    call = online[online.index("return make_int8_moe_quant_config("):]
    call = call[:call.index(")")]
    assert "a1_scale" not in call and "per_act_token_quant" not in call
    assert "Int8OnlineMoEMethod(moe=layer.moe_config)" in (source_tree(version) / f"{QUANT}/experts_int8.py").read_text()


@pytest.fixture(scope="module", params=ORACLE_RELEASES)
def release(request):
    from tests import vllm_standins as vs

    fm = vs.fused_moe_module(source_tree(request.param), cpu=True)
    yield request.param, fm
    vs.uninstall()


def test_file_names_of_real_checkpoints_are_the_releases(release):
    """The release's quant-config constructors name the dtype and block; its ``_moe_config_shape`` and
    ``get_config_file_name`` give the file; orch's shape of the same checkpoint names the same file."""
    import sys

    import torch

    version, fm = release
    cfg = sys.modules["vllm.model_executor.layers.fused_moe.config"]
    one = torch.ones(1)
    cases = [("Qwen3-30B-A3B-GPTQ-Int4.json", "moe_wna16", 1, cfg.int4_w4a16_moe_quant_config(
                  w1_scale=one, w2_scale=one, w1_zp=None, w2_zp=None, block_shape=[0, 128]), 2),
             ("Qwen3-30B-A3B-AWQ.json", "moe_wna16", 4, cfg.int4_w4a16_moe_quant_config(
                  w1_scale=one, w2_scale=one, w1_zp=one, w2_zp=one, block_shape=[0, 64]), 2),
             (None, "experts_int8", 2, cfg.int8_w8a16_moe_quant_config(
                  w1_scale=one, w2_scale=one, w1_zp=None, w2_zp=None), 1)]
    base = json.loads((MODELS / "Qwen3-30B-A3B.json").read_text())
    for model, quantization, tp, qc, pack in cases:
        config = _model(model) if model else base
        shape = vllm_moe_shape(config, tp=tp, quantization=quantization)
        dtype = qc.config_name(torch.float16)
        assert dtype == shape.dtype_selector
        assert qc.block_shape == ([0, shape.group_size] if shape.group_size else None)
        w2 = (shape.E, shape.hidden, shape.N // pack)  # the layer's w2: [E, hidden, N / pack] uint8 or int8
        if hasattr(fm, "_moe_config_shape"):  # 0.34.0; before, the same lines in try_get_optimal_moe_config
            E, N = fm._moe_config_shape(w2, dtype)
        else:
            src = ast.unparse(next(n for n in ast.walk(ast.parse(Path(fm.__file__).read_text()))
                                   if isinstance(n, ast.FunctionDef) and n.name == "try_get_optimal_moe_config"))
            assert "E, _, N = w2_shape\n        if dtype == 'int4_w4a16':\n            N = N * 2" in src
            E, N = w2[0], w2[2] * (2 if dtype == "int4_w4a16" else 1)
        want = fm.get_config_file_name(E, N, dtype, qc.block_shape)
        assert shape.file_names("NVIDIA_H200")["up"] == want, (version, model)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_which_kernel_runs_each_weight_only_method(version):
    """The WNA16 list (Marlin before TRITON), Marlin refusing the MoeWNA16 layout, TRITON refusing
    AutoAWQ's and GPTQ desc_act, Humming moved ahead of Marlin on SM90 only; the Int8 list starting
    with TRITON: :func:`runner.triton_verdict` says the same."""
    tree = _tree(version, f"{ORACLE}/int_wna16.py")
    order = ast.unparse(_function(tree, "_get_priority_backends"))
    listed = re.findall(r"WNA16MoEBackend\.(\w+)", order[order.index("backends = ["):])
    assert listed == ["RDNA3", "FLASHINFER_TRTLLM", "MARLIN", "BATCHED_MARLIN", "TRITON", "HUMMING", "EMULATION"]
    assert "return prioritize_humming(backends)" in order
    reasons = ast.unparse(_function(tree, "_backend_incompatibility_reason"))
    assert "allow_marlin = not isinstance(quant_config, MoeWNA16Config)" in reasons
    assert "'the MoeWNA16 checkpoint layout is not supported'" in reasons
    assert "'the AutoAWQ weight layout is not supported'" in reasons
    assert "'GPTQ activation ordering is not supported'" in reasons
    prio = _tree(version, f"{QUANT}/utils/humming/priority.py")
    caps = next(n.value for n in ast.walk(prio) if isinstance(n, ast.Assign)
                and ast.unparse(n.targets[0]) == "_HUMMING_PREFERRED_CAPABILITIES")
    assert ast.unparse(caps) == "frozenset({90})"
    int8 = ast.unparse(_function(_tree(version, f"{ORACLE}/int8.py"), "_get_priority_backends"))
    assert int8.index("Int8MoeBackend.TRITON") < int8.index("Int8MoeBackend.HUMMING")
    v = runner.triton_verdict
    assert v("int4_w4a16", capability=(8, 0), method="moe_wna16")[0] is True
    assert v("int8_w8a16", capability=(8, 9), method="moe_wna16")[0] is True
    assert v("int4_w4a16", capability=(9, 0), method="moe_wna16")[0] is None  # Humming where installed
    assert v("int4_w4a16", capability=(10, 0), method="moe_wna16")[0] is None
    assert v("int4_w4a16", capability=(9, 0), method="gptq")[0] is None  # Marlin where it supports the layer
    assert v("int4_w4a16", capability=(8, 0), method="awq")[0] is None
    assert v("int8_w8a16", capability=(9, 0), method="experts_int8")[0] is True
    assert v("int4_w4a16", capability=(9, 0), method="moe_wna16", moe_backend="triton")[0] is True
    assert v("int4_w4a16", capability=(9, 0), method="gptq", moe_backend="marlin")[0] is False


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_wna16_backend_line_is_read(version):
    """0.32.0/0.33.0 log ``Using 'TRITON' WNA16 MoE backend.`` (their own ``_make_log_backend``);
    0.34.0 the oracles' shared line: both are read as the Triton kernel."""
    src = (source_tree(version) / f"{ORACLE}/int_wna16.py").read_text()
    if "Using '{backend.value}' WNA16 MoE backend." in src:
        line = "INFO 12-04 08:00:00 [int_wna16.py:1] Using 'TRITON' WNA16 MoE backend."
    else:
        base = (source_tree(version) / f"{ORACLE}/base.py").read_text()
        assert "MoE {lora}backend{available}" in base
        line = "INFO 12-04 08:00:00 [base.py:1] Using TRITON WNA16 MoE backend out of potential backends: ['MARLIN', 'TRITON']."
    got = runner.parse_backend_line(line)
    assert got["backend"] == "TRITON" and got["kind"] == "WNA16" and got["reads_triton_files"]
    assert not runner.parse_backend_line(line.replace("TRITON", "MARLIN", 1))["reads_triton_files"]


@pytest.mark.parametrize("quant", [dict(dtype="int4_w4a16", group_size=32, has_zp=True),
                                   dict(dtype="int8_w8a16", per_channel=True)], ids=["int4-g32-zp", "int8-channel"])
def test_the_provider_runs_each_releases_kernel(release, quant):
    """orch's provider times the release's own kernel for the group and per-channel formats; the
    result matches the float64 reference and the file it writes is read back by the release."""
    from remote.engines.vllm.provider import VllmProvider

    version, fm = release
    prov = VllmProvider()
    try:
        shape = dict(E=8, N=64, hidden=128, topk=2)
        cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 2}
        p = prov.make_problem(shape, 32, "float16", "cpu", 11, quant=quant)
        assert prov.check(p, cfg) < 2e-2, version
        configs = fm.get_moe_configs(8, 64, quant["dtype"], *(p.block_shape or [None, None]))
        assert configs == {32: dict(cfg, **prov.file_entry(quant))}
    finally:
        prov.close()


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_compiled_wna16_kernels_reach_is_the_releases(version):
    """When vLLM runs int4 weight-only MoE with its compiled moe_wna16_gemm instead of Triton: the
    release's own ``should_moe_wna16_use_cuda`` (fused_moe.py) against the bound the tuner holds file
    entries to (``VllmProvider.config_allowed``)."""
    from types import SimpleNamespace

    from remote.engines.vllm.provider import WNA16_CUDA_GROUPS, WNA16_CUDA_PAIRS_PER_EXPERT

    fn = _function(_tree(version, "vllm/model_executor/layers/fused_moe/fused_moe.py"), "should_moe_wna16_use_cuda")
    ns = {"envs": SimpleNamespace(VLLM_BATCH_INVARIANT=False),
          "current_platform": SimpleNamespace(is_cuda=lambda: True)}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), f"vllm {version} fused_moe.py", "exec"), ns)
    real = ns["should_moe_wna16_use_cuda"]
    for E in (8, 60, 128, 257):
        for topk in (2, 4, 8):
            for M in (1, 2, 3, 4, 6, 8, 12, 16, 24, 48, 90, 91, 96, 192, 200, 400):
                for group in (0, 32, 64, 128, 256):
                    for bit in (4, 8):
                        ours = (bit == 4 and group in WNA16_CUDA_GROUPS
                                and M * topk <= WNA16_CUDA_PAIRS_PER_EXPERT * E)
                        assert real(num_valid_tokens=M * topk, group_size=group, num_experts=E, bit=bit) == ours, \
                            (version, E, topk, M, group, bit)


@pytest.mark.parametrize("fmt,method", [("int4_w4a16", "moe_wna16"), ("int8_w8a16", "moe_wna16"),
                                        ("int8_w8a8", None), ("int8_w8a16", "experts_int8")])
def test_a_weight_only_or_int8_unit_on_an_unknown_gpu_is_undecided(fmt, method):
    """Without the GPU's capability the weight-only and int8 kernels vLLM picks are not known (on SM90
    Humming comes before Triton for moe_wna16, from SM100 FlashInfer TRT-LLM): the verdict is None,
    which leaves the unit running unless its log says Triton (orchestrator.tasks.probe), never True."""
    reads, why = runner.triton_verdict(fmt, [0, 128] if method == "moe_wna16" else None, None, method=method)
    assert reads is None and "compute capability" in why
    # a known pre-Hopper GPU keeps the rule's answer
    assert runner.triton_verdict(fmt, [0, 128] if method == "moe_wna16" else None, (8, 0), method=method)[0] is True
