"""The ``vllm`` provider on the CPU (TRITON_INTERPRET=1, tiny shapes): vLLM 0.34.0's own
``fused_experts_impl``, its Triton kernel and its config lookup, with the compiled ops of
``tests/vllm_standins.py`` (alignment, gated activation, top-k sum)."""

from __future__ import annotations

import os

# the interpreter before any Triton kernel is defined (vLLM's, and the stand-in activation)
os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import os

import pytest

from tests.vllm_releases import NEWEST, source_tree

SHAPE = dict(E=8, N=64, hidden=128, topk=2)
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 2}


@pytest.fixture(scope="module")
def provider():
    os.environ["TRITON_INTERPRET"] = "1"
    from tests import vllm_standins as vs
    from remote.engines.vllm.provider import VllmProvider

    vs.fused_moe_module(source_tree(NEWEST), cpu=True)
    prov = VllmProvider()
    yield prov
    prov.close()
    vs.uninstall()


@pytest.mark.parametrize("M", [1, 16])
def test_joint_and_whole_kernel_compute_the_moe(provider, M):
    """Forced (override_config) and file-read (VLLM_TUNED_CONFIG_FOLDER) runs agree with the
    float64 reference; the no-file run is vLLM's default config."""
    from remote.tuning.kernel.reference import fused_moe_reference, relative_error

    p = provider.make_problem(SHAPE, M, "float16", "cpu", 3)
    ref = fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids)
    assert relative_error(provider.gemm_fn(p, "joint", CFG)(), ref) < 1e-2
    assert provider.check(p, CFG) < 1e-2
    assert provider.check(p, None) < 1e-2


def test_the_file_the_whole_kernel_reads_is_vllms_name(provider, tmp_path):
    """full_fn writes a file under vLLM's own name into the folder it points vLLM at; vLLM loads it."""
    p = provider.make_problem(SHAPE, 4, "float16", "cpu", 5)
    provider.full_fn(p, CFG)()
    folder = os.environ["VLLM_TUNED_CONFIG_FOLDER"]
    name = provider.k.fm.get_config_file_name(8, 64, None, None)
    assert sorted(os.listdir(folder)) == [name]
    assert json.loads(open(os.path.join(folder, name)).read())["4"] == CFG
    assert provider.k.fm.get_moe_configs(8, 64, None) == {4: CFG}


def test_a_bad_kind_is_refused(provider):
    p = provider.make_problem(SHAPE, 1, "float16", "cpu", 0)
    with pytest.raises(ValueError, match="joint"):
        provider.gemm_fn(p, "up", CFG)


# weight-only formats: the WNA16 group path (MoeWNA16Method: fused_moe_kernel_gptq_awq, or at few tokens
# per expert for int4 the compiled moe_wna16_gemm, stood in by tests/vllm_standins.py) and experts_int8's
# per-channel int8 (fused_moe_kernel with use_int8_w8a16). float16: the CPU interpreter's bf16 dot is wrong.
WEIGHT_ONLY = [dict(dtype="int4_w4a16", group_size=32, has_zp=False), dict(dtype="int4_w4a16", group_size=64, has_zp=True),
               dict(dtype="int8_w8a16", group_size=64, has_zp=True), dict(dtype="int8_w8a16", per_channel=True)]


@pytest.mark.parametrize("quant", WEIGHT_ONLY, ids=lambda q: f"{q['dtype']}-g{q.get('group_size', 0)}")
@pytest.mark.parametrize("M", [1, 32])
def test_weight_only_formats_run_vllms_kernel(provider, quant, M):
    """Forced and file-read runs of vLLM's own kernel agree with the float64 reference on the same
    quantized numbers; the file is the one vLLM names for the format (no block selector for the group);
    a group file carries SPLIT_K, which vLLM's WNA16 launch requires."""
    p = provider.make_problem(SHAPE, M, "float16", "cpu", 7, quant=quant)
    assert provider.check(p, None) < 2e-2
    assert provider.check(p, CFG) < 2e-2
    name = provider.file_name(p, "NVIDIA H200")
    assert name == provider.k.fm.get_config_file_name(8, 64, quant["dtype"], p.block_shape)
    assert name.endswith(f",dtype={quant['dtype']}.json")
    folder = os.environ["VLLM_TUNED_CONFIG_FOLDER"]
    entry = json.loads(open(os.path.join(folder, name)).read())[str(M)]
    group = not quant.get("per_channel")
    assert p.block_shape == ([0, quant["group_size"]] if group else None)
    assert provider.file_entry(quant) == ({"SPLIT_K": 1} if group else {})
    assert entry == dict(CFG, **provider.file_entry(quant))


def test_a_wna16_entry_without_split_k_fails_vllms_launch(provider):
    """Why orch writes SPLIT_K into a WNA16 file: vLLM's invoke_fused_moe_wna16_triton_kernel hands the
    entry to fused_moe_kernel_gptq_awq as keywords, and the kernel requires it."""
    p = provider.make_problem(SHAPE, 32, "float16", "cpu", 7, quant=WEIGHT_ONLY[0])
    kw = provider._launch_kwargs(p, "up", CFG)
    provider._invoke(kw)
    kw["config"] = {k: v for k, v in kw["config"].items() if k != "SPLIT_K"}
    with pytest.raises(TypeError, match="SPLIT_K"):
        provider._invoke(kw)


@pytest.mark.parametrize("quant", WEIGHT_ONLY, ids=lambda q: f"{q['dtype']}-g{q.get('group_size', 0)}")
def test_weight_only_launches_compile_path(provider, quant):
    """The compile workers' launches (kernel_specs / compile_one) run vLLM's Triton launcher of the format."""
    p = provider.make_problem(SHAPE, 16, "float16", "cpu", 2, quant=quant)
    for gemm in ("up", "down"):
        provider._invoke(provider._launch_kwargs(p, gemm, CFG))


def test_default_config_of_a_group_is_complete(provider):
    """vLLM's default for a WNA16 group sets BLOCK_SIZE_M only; the launch adds N/K tiles
    (get_moe_wna16_block_config): the default the tuner times has all of them, as vLLM runs it."""
    for M, want in ((1, (32, 64)), (32, (64, 32))):
        p = provider.make_problem(SHAPE, M, "float16", "cpu", 0, quant=WEIGHT_ONLY[2])
        cfg = provider.default_config(p)
        assert (cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]) == want
        assert cfg["BLOCK_SIZE_M"] == {1: 16, 32: 32}[M] and "SPLIT_K" not in cfg


def test_unsupported_formats_are_refused(provider):
    from remote.engines.vllm.provider import VllmUnavailable
    with pytest.raises(VllmUnavailable, match="int8_w8a8"):
        provider.make_problem(SHAPE, 1, "float16", "cpu", 0, quant=dict(dtype="int8_w8a8", per_channel=True))


def test_the_compiled_wna16_kernels_checks_hold_every_key_it_can_reach(provider):
    """int4 with a group of 32/64/128: vLLM runs the compiled moe_wna16_gemm when M x top-k <= 6 E
    (should_moe_wna16_use_cuda) with the closest key's entry, and that kernel refuses entries its
    checks fail (csrc/moe/moe_wna16.cu; the stand-in makes them). So the tuner may write at such keys,
    and at the first key above them (up to twice the bound), only entries the kernel runs."""
    from remote.engines.vllm.provider import compiled_wna16_refusal

    g64 = WEIGHT_ONLY[1]
    bad_k = dict(CFG, BLOCK_SIZE_K=32)  # half a group of 64
    p = provider.make_problem(SHAPE, 1, "float16", "cpu", 7, quant=g64)  # 2 pairs over 8 experts: compiled
    with pytest.raises(RuntimeError, match="moe_wna16_gemm refuses"):
        provider.check(p, bad_k)
    assert provider.check(p, CFG) < 2e-2
    assert compiled_wna16_refusal(bad_k, 64, (128, 64)) == "BLOCK_SIZE_K 32 is not 1, 2, 4 or 8 groups of 64"
    assert compiled_wna16_refusal(dict(CFG, BLOCK_SIZE_M=128), 64, (128, 64)) == "BLOCK_SIZE_M 128 > 64"
    assert compiled_wna16_refusal(dict(CFG, BLOCK_SIZE_K=128), 64, (128, 64)) == \
        "K 64 is not divisible by BLOCK_SIZE_K 128"
    for M, held in ((1, True), (24, True), (48, True), (49, False), (256, False)):  # bound 6 E / top-k = 24
        p = provider.make_problem(SHAPE, M, "float16", "cpu", 0, quant=g64, empty_weights=True)
        assert provider.config_allowed(p, CFG)
        assert provider.config_allowed(p, bad_k) is not held, M
    # int8 groups and per-channel int8 never run the compiled kernel
    for q in (WEIGHT_ONLY[2], WEIGHT_ONLY[3]):
        p = provider.make_problem(SHAPE, 1, "float16", "cpu", 0, quant=q, empty_weights=True)
        assert provider.config_allowed(p, bad_k)
