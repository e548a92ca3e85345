"""Which vLLM release the H200 bench runs (its Triton requirement), and the alignment stand-in's
outputs as vLLM's kernel reads them (docs/benchmarks.md 4.6: the M >= 8 failure on the H200)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from tests.vllm_releases import H200_RELEASE, ORACLE_RELEASES, TORCH_PINS, required_triton, source_tree, \
    triton_matches


def test_triton_requirements():
    assert required_triton(H200_RELEASE) == "3.6.0" and triton_matches(H200_RELEASE, "3.6.0")
    for r in ORACLE_RELEASES:  # none of them runs on the H200's Triton 3.6.0
        assert not triton_matches(r, "3.6.0"), r
    newer = [r for r in TORCH_PINS if tuple(map(int, r.split("."))) > tuple(map(int, H200_RELEASE.split(".")))]
    assert newer and all(not triton_matches(r, "3.6.0") for r in newer)
    assert triton_matches("0.34.0", "3.8.1") and triton_matches("0.32.0", "3.7.1+git0") and \
        not triton_matches("0.32.0", "3.7.0") and not triton_matches("9.9.9", "3.6.0")


@pytest.mark.parametrize("version", [H200_RELEASE, ORACLE_RELEASES[-1]])
def test_alignment_standin_fills_vllms_buffers(version):
    """vLLM's own ``moe_align_block_size`` (its buffers: int32) over the stand-in op: int32 out,
    every (token, slot) once, pads = numel, blocks of one expert each, the padded total a multiple
    of the block."""
    import torch

    from tests import vllm_standins as vs
    vs.fused_moe_module(source_tree(version), cpu=True)
    try:
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
        gen = torch.Generator().manual_seed(0)
        E, bs = 8, 16
        topk = torch.stack([torch.randperm(E, generator=gen)[:2] for _ in range(24)]).to(torch.int32)
        st, eid, ntpp = moe_align_block_size(topk, bs, E, None, ignore_invalid_experts=True)
        assert st.dtype == eid.dtype == ntpp.dtype == torch.int32
        total = int(ntpp[0])
        assert total % bs == 0 and total <= st.numel()
        body = st[:total]
        real = body[body < topk.numel()].tolist()
        assert sorted(real) == list(range(topk.numel()))
        flat = topk.reshape(-1)
        for b in range(total // bs):
            ids = [i for i in st[b * bs:(b + 1) * bs].tolist() if i < topk.numel()]
            assert all(int(flat[i]) == int(eid[b]) for i in ids), b
    finally:
        vs.uninstall()


def test_the_provider_runs_the_h200_release():
    """The vllm provider on vLLM 0.26.0's kernel (the H200 bench's release): bf16 and fp8 block
    [128, 128], the naive (M=1) and aligned (M=16) paths, within the reference bar."""
    from remote.engines.vllm.provider import VllmProvider
    from tests import vllm_standins as vs

    fm = vs.fused_moe_module(source_tree(H200_RELEASE), cpu=True)
    prov = VllmProvider()
    try:
        assert prov.k.version == H200_RELEASE or prov.k.version == "dev"
        fp8 = dict(dtype="fp8_w8a8", block_shape=[128, 128], per_channel=False, group_size=0, has_zp=False)
        for M in (1, 16):
            p = prov.make_problem(dict(E=8, N=64, hidden=128, topk=2), M, "float16", "cpu", 0)
            assert prov.check(p, prov.default_config(p)) < 1e-2
            q = prov.make_problem(dict(E=8, N=128, hidden=256, topk=2), M, "float16", "cpu", 0, quant=fp8)
            assert prov.check(q, prov.default_config(q)) < 1e-2
            assert prov.file_name(q, "NVIDIA H200") == fm.get_config_file_name(8, 128, "fp8_w8a8", [128, 128])
    finally:
        prov.close()
        vs.uninstall()
