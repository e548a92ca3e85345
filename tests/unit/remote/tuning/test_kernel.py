"""Builtin fused-MoE kernel (remote/tuning/kernel) on the CPU under TRITON_INTERPRET=1.

fp16 and fp32 only: under Triton's interpreter here bf16 loads/stores give wrong values
(fp32 exact), so bf16 is verified on the H200 by bench/tune_h200.py (docs/benchmarks.md).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before remote.tuning.kernel imports triton.jit

import pytest  # noqa: E402
import torch  # noqa: E402

from remote.tuning.kernel.align import max_padded_tokens, moe_align_block_size  # noqa: E402
from remote.tuning.kernel.fused_moe import fused_moe, make_buffers, normalize_config  # noqa: E402
from remote.tuning.kernel.reference import fused_moe_reference, relative_error, route  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="kernel tests run the Triton interpreter on CPU tensors")

CFG = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)


def _check_align(topk_ids, block_m, E):
    s, e, n = moe_align_block_size(topk_ids, block_m, E)
    flat = topk_ids.reshape(-1).tolist()
    P = len(flat)
    total = int(n.item())
    assert s.numel() == max_padded_tokens(P, E, block_m)
    assert total % block_m == 0
    counts = [flat.count(x) for x in range(E)]
    assert total == sum((c + block_m - 1) // block_m * block_m for c in counts)
    real = [v for v in s[:total].tolist() if v != P]
    assert sorted(real) == list(range(P)), "every (token, slot) pair appears exactly once"
    assert all(v == P for v in s[total:].tolist()), "entries past the padded total are the sentinel"
    for b in range(total // block_m):
        blk = s[b * block_m:(b + 1) * block_m].tolist()
        ex = int(e[b])
        assert all(flat[v] == ex for v in blk if v != P), "a block holds one expert's pairs"
        assert blk[0] != P, "no block is pure padding"
    used = {int(e[b]) for b in range(total // block_m)}
    assert used == {x for x in range(E) if counts[x]}, "idle experts get no block"
    return s, e, n


def test_align_uneven_and_idle_experts():
    ids = torch.tensor([[0, 3], [0, 1], [3, 0], [0, 3], [0, 1]], dtype=torch.int32)
    s, e, n = _check_align(ids, 4, 6)
    # expert 0 has pairs 0,2,5,6,8 (5 -> padded 8), expert 1 has 3,9 (-> 4), expert 3 has
    # 1,4,7 (-> 4); experts 2, 4, 5 have none; sentinel = 10 pairs
    assert int(n) == 16
    assert s[:16].tolist() == [0, 2, 5, 6, 8, 10, 10, 10, 3, 9, 10, 10, 1, 4, 7, 10]
    assert e[:4].tolist() == [0, 0, 1, 3]

def test_align_counts_generic():
    g = torch.Generator().manual_seed(0)
    for E, k, M, bm in ((8, 2, 13, 16), (1, 1, 7, 4), (16, 4, 40, 8)):
        _, ids = route(M, E, k, generator=g)
        _check_align(ids, bm, E)


def test_align_rejects_bad_args():
    with pytest.raises(ValueError):
        moe_align_block_size(torch.zeros(3, 2, dtype=torch.int32), 0, 4)
    with pytest.raises(ValueError):
        moe_align_block_size(torch.zeros(6, dtype=torch.int32), 16, 4)


def _run_case(dtype, E, N, H, k, M, logits=None, cfg=CFG, down=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    if logits is None:
        logits = torch.randn(M, E, generator=g)
    tw, ti = route(M, E, k, logits=logits)
    x = torch.randn(M, H, generator=g).to(dtype)
    w1 = (torch.randn(E, 2 * N, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, N, generator=g) / N ** 0.5).to(dtype)
    bufs = make_buffers(M, k, N, H, dtype, "cpu")  # NaN-poisoned
    assert torch.isnan(bufs[2]).all()
    out = torch.full((M, H), float("nan"), dtype=dtype)
    fused_moe(x, w1, w2, tw, ti, cfg, down, buffers=bufs, out=out)
    assert not torch.isnan(bufs[2]).any(), "every (token, slot) row of the down output was written"
    return relative_error(out, fused_moe_reference(x, w1, w2, tw, ti))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("case", ["uneven", "idle", "m_lt_block", "e1", "top1", "odd_k"])
def test_fused_moe_matches_float64_reference(dtype, case):
    g = torch.Generator().manual_seed(7)
    if case == "uneven":
        E, N, H, k, M = 8, 64, 128, 2, 21
        logits = torch.randn(M, E, generator=g) + torch.linspace(5, 0, E)
    elif case == "idle":
        E, N, H, k, M = 8, 32, 64, 2, 9
        logits = torch.randn(M, E, generator=g)
        logits[:, 4:] = -1e4
    elif case == "m_lt_block":
        E, N, H, k, M, logits = 4, 32, 64, 2, 3, None
    elif case == "e1":
        E, N, H, k, M, logits = 1, 32, 64, 1, 11, None
    elif case == "top1":
        E, N, H, k, M, logits = 4, 64, 64, 1, 10, None
    else:  # K (hidden) not a multiple of BLOCK_SIZE_K: the masked K loop
        E, N, H, k, M, logits = 4, 48, 72, 2, 6, None
    err = _run_case(dtype, E, N, H, k, M, logits)
    tol = 1e-2 if dtype == torch.float16 else 1e-5
    assert err < tol, f"{case} {dtype}: rel err {err}"


def test_separate_down_config_and_grouping():
    up = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=4, num_warps=4, num_stages=2)
    down = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=16, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert _run_case(torch.float32, 4, 32, 64, 2, 13, cfg=up, down=down) < 1e-5


def test_mismatched_block_m_and_bad_configs_raise():
    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        _run_case(torch.float32, 4, 32, 64, 2, 3, down=dict(CFG, BLOCK_SIZE_M=32))
    with pytest.raises(ValueError):
        normalize_config(dict(CFG, BLOCK_SIZE_N=48))
    with pytest.raises(KeyError):
        normalize_config({"BLOCK_SIZE_M": 16})
    assert normalize_config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                             "USE_TMA": True})["num_stages"] == 3


def test_relative_error_never_passes_nan():
    ref = torch.ones(3, 4, dtype=torch.float64)
    out = ref.clone()
    assert relative_error(out, ref) == 0.0
    out[1, 2] = float("nan")
    assert relative_error(out, ref) == float("inf")


# ------------------------------------------------------------------------------ fp8_w8a8
from remote.tuning.kernel.quant import (QuantSpec, QuantWeights, dequant_weight, quant_per_token_group,  # noqa: E402
                                 quant_weight)
from remote.tuning.kernel.reference import fused_moe_reference_fp8  # noqa: E402


def _run_fp8(block_shape, E, N, H, k, M, logits=None, cfg=None, seed=0, spoil=None):
    g = torch.Generator().manual_seed(seed)
    if logits is None:
        logits = torch.randn(M, E, generator=g)
    tw, ti = route(M, E, k, logits=logits)
    x = torch.randn(M, H, generator=g).to(torch.float16)
    w1 = torch.randn(E, 2 * N, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, N, generator=g) / N ** 0.5
    spec = QuantSpec(block_shape)
    w1q, s1 = quant_weight(w1, spec)
    w2q, s2 = quant_weight(w2, spec)
    assert w1q.dtype == torch.float8_e4m3fn and s1.dtype == torch.float32
    ref = fused_moe_reference_fp8(x, w1q, w2q, QuantWeights(spec, s1, s2), tw, ti)
    if spoil == "w1_scale":  # a kernel that read the wrong scale must fail the check
        s1 = s1.flip(0) if block_shape is None else s1.flip(1)
    cfg = cfg or dict(CFG, BLOCK_SIZE_K=64)
    bufs = make_buffers(M, k, N, H, torch.float16, "cpu")  # NaN-poisoned
    out = torch.full((M, H), float("nan"), dtype=torch.float16)
    fused_moe(x, w1q, w2q, tw, ti, cfg, buffers=bufs, out=out, quant=QuantWeights(spec, s1, s2))
    assert not torch.isnan(bufs[2]).any(), "every (token, slot) row of the down output was written"
    full_precision = fused_moe_reference(x, w1.half(), w2.half(), tw, ti)
    return relative_error(out, ref), relative_error(out, full_precision)


@pytest.mark.parametrize("block_shape", [None, (128, 128)], ids=["per_tensor", "block128"])
@pytest.mark.parametrize("case", ["uneven", "idle", "m_lt_block", "e1", "top1"])
def test_fp8_w8a8_matches_quantized_reference(block_shape, case):
    g = torch.Generator().manual_seed(11)
    E, N, H, k, M, logits = 4, 128, 256, 2, 9, None
    if case == "uneven":
        E, M = 8, 21
        logits = torch.randn(M, E, generator=g) + torch.linspace(5, 0, E)
    elif case == "idle":
        E = 8
        logits = torch.randn(M, E, generator=g)
        logits[:, 4:] = -1e4
    elif case == "m_lt_block":
        M = 3
    elif case == "e1":
        E, k, H = 1, 1, 128
    else:
        k = 1
    err, err_fp = _run_fp8(block_shape, E, N, H, k, M, logits)
    assert err < 1e-2, f"{case}: rel err {err} against the quantized float64 reference"
    # sanity of the quantization itself: fp8 e4m3 keeps ~3 mantissa bits
    assert err_fp < 0.15, f"{case}: rel err {err_fp} against the unquantized reference"


@pytest.mark.parametrize("block_shape", [None, (128, 128)], ids=["per_tensor", "block128"])
def test_fp8_wrong_scale_is_caught(block_shape):
    err, _ = _run_fp8(block_shape, 4, 128, 256, 2, 9, spoil="w1_scale")
    assert err > 1e-2


def test_fp8_block_needs_block_k_dividing_128():
    with pytest.raises(ValueError, match="BLOCK_SIZE_K"):
        _run_fp8((128, 128), 4, 128, 256, 2, 5, cfg=dict(CFG, BLOCK_SIZE_K=256))


def test_fp8_quantizers_round_trip():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 200, 136, generator=g)  # not multiples of the 128 block: partial tiles
    spec = QuantSpec((128, 128))
    wq, s = quant_weight(w, spec)
    assert tuple(s.shape) == (3, 2, 2)
    back = dequant_weight(wq, s, spec, torch.float32)
    assert (back - w).abs().max() <= w.abs().max() / 8  # within one e4m3 step of the tile's max
    x = torch.randn(5, 300, generator=g)
    xq, xs = quant_per_token_group(x, 128)
    assert tuple(xs.shape) == (5, 3) and xq.shape == x.shape
    assert torch.allclose(xs[:, 0], x[:, :128].abs().amax(1) / 448)


@pytest.mark.parametrize("mode", ["mma", "promote32", "exact"])
@pytest.mark.parametrize("block_shape", [None, (128, 128)], ids=["per_tensor", "block128"])
def test_fp8_accumulation_modes_compute_the_same_product(mode, block_shape, monkeypatch):
    # the three ways an fp8 dot may accumulate (remote.tuning.kernel.fused_moe.FP8_ACCUMULATION) are the
    # same arithmetic up to accumulation precision; the interpreter runs each code path
    import remote.tuning.kernel.fused_moe as fm
    monkeypatch.setattr(fm, "FP8_ACCUMULATION", mode)
    err, _ = _run_fp8(block_shape, 8, 128, 256, 2, 5)
    assert err < 1e-2, f"{mode}: rel err {err}"


def test_fp8_accumulation_auto_is_exact_on_hopper_only(monkeypatch):
    import remote.tuning.kernel.fused_moe as fm
    monkeypatch.setattr(fm, "_CAPABILITY", {("cuda", 0): (9, 0), ("cuda", 1): (10, 0), ("cuda", 2): (8, 9)})
    assert fm.fp8_acc_code("cuda:0") == 2, "sm_90: fp8 wgmma accumulates in reduced precision -> exact"
    assert fm.fp8_acc_code("cuda:1") == 0 and fm.fp8_acc_code("cuda:2") == 0
    assert fm.fp8_acc_code("cpu") == 0
    monkeypatch.setattr(fm, "FP8_ACCUMULATION", "fast")
    with pytest.raises(ValueError, match="FP8_ACCUMULATION"):
        fm.fp8_acc_code("cpu")
