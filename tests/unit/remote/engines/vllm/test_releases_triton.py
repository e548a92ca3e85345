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
