#!/usr/bin/env python3
"""Emulation (CPU, float64) of a reduced-precision fp8 accumulator, to see how the builtin fp8
kernel's error against the float64 reference depends on where partial sums are promoted to fp32.

Model (an assumption, not a measurement): each MMA step adds ``GROUP`` exact fp8 products to the
accumulator; every term is truncated toward zero at ``MBITS`` fraction bits below the largest
exponent among them (DeepSeek-V3's description of Hopper's fp8 adder, ~14 bits kept). Strategies:
``none`` (the whole K in that accumulator: orch's old per-tensor path), ``kstep`` (a fresh
accumulator per BLOCK_SIZE_K, added in fp32: the block path, SGLang's too), ``32`` (promotion after
every 32 products: ``max_num_imprecise_acc=32``), ``exact`` (fp32 accumulation: operands converted
to fp16 before the dot, the fix on sm_90). Everything else follows the kernel: activations quantized
as the kernel's caller does, intermediates rounded to bf16, per-K-step block scales.

    python3 bench/fp8_accumulation_emulation.py --seeds 16 --cases blk5 --modes kstep,32,exact
    python3 bench/fp8_accumulation_emulation.py --seeds 5 --cases pt1 --modes none,kstep,32,exact

Slow (minutes per seed for ``pt1``: E=128, N=768, hidden 2048). Results quoted in
docs/benchmarks.md (Not measured, fp8).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from remote.tuning.kernel.quant import QuantSpec, QuantWeights, quant_activation, quant_weight  # noqa: E402
from remote.tuning.kernel.reference import fused_moe_reference_fp8, relative_error, route  # noqa: E402

CASES = {"pt1": ("per-tensor M=1", 128, 768, 2048, 8, 1, "random", None),
         "pt20": ("per-tensor M=20", 128, 768, 2048, 8, 20, "random", None),
         "blk5": ("block idle M=5", 32, 128, 256, 2, 5, "idle", (128, 128))}


def _trunc(x, e_max, bits):
    q = torch.ldexp(torch.ones_like(x), (e_max - bits).to(torch.int32))
    return torch.trunc(x / q) * q


def hw_dot(A, B, promote: int, mbits: int, group: int):
    """A [r, K] @ B [K, n] (exact fp8 values in float64) through the modelled accumulator;
    ``promote``: add the partial sum to an fp32 accumulator every ``promote`` products (0: never)."""
    r, K = A.shape
    out = torch.zeros(r, B.shape[1], dtype=torch.float64)
    acc = torch.zeros_like(out)
    for k0 in range(0, K, group):
        if promote and k0 and k0 % promote == 0:
            out = (out + acc).float().double()
            acc.zero_()
        terms = torch.cat([acc[:, None, :], A[:, k0:k0 + group, None] * B[None, k0:k0 + group, :]], 1)
        e = torch.frexp(terms.abs().amax(1))[1]
        acc = _trunc(terms, e[:, None, :], mbits).sum(1).float().double()
    return (out + acc).float().double()


def gemm(a_q, a_s, w_q, w_s, spec, rows_tok, mode, bk, mbits, group):
    """One grouped GEMM of the kernel for the rows of one expert: fp32-emulated accumulation,
    per-K-step block scales or a per-tensor scale at the end."""
    a, w = a_q.double(), w_q.double()
    if mode == "exact":
        mbits, promote = 60, 0
    else:
        promote = {"none": 0, "kstep": bk}.get(mode, mode)
    if not spec.block_shape:
        return hw_dot(a, w.T, promote, mbits, group) * a_s.double() * w_s.double()
    acc = torch.zeros(a.shape[0], w.shape[0], dtype=torch.float64)
    for k0 in range(0, a.shape[1], bk):
        part = hw_dot(a[:, k0:k0 + bk], w[:, k0:k0 + bk].T, 0 if mode == "kstep" else promote, mbits, group)
        sa = a_s[:, k0 // spec.group_k].double()[:, None]
        sw = w_s[:, k0 // spec.group_k].double().repeat_interleave(spec.group_n)[: w.shape[0]][None, :]
        acc = (acc + (part * sa * sw).float().double()).float().double()
    return acc


def kernel(x, w1q, w2q, qw, tw, ti, mode, bk, mbits, group, dt=torch.bfloat16):
    spec = qw.spec
    M, H = x.shape
    N = w2q.shape[2]
    k = ti.shape[1]
    ids, tok = ti.reshape(-1).long(), torch.arange(M).repeat_interleave(k)
    xq, xs = quant_activation(x, spec)
    h = torch.empty(M * k, 2 * N, dtype=torch.float64)
    for e in ids.unique().tolist():
        rr = (ids == e).nonzero()[:, 0]
        a_s = xs if not spec.block_shape else xs[tok[rr]]
        h[rr] = gemm(xq[tok[rr]], a_s, w1q[e], qw.w1_scale[e], spec, rr, mode, bk, mbits, group)
    hb = h.to(dt).float()
    act = (torch.nn.functional.silu(hb[:, :N]) * hb[:, N:]).to(dt)
    aq, as_ = quant_activation(act, spec)
    y = torch.empty(M * k, H, dtype=torch.float64)
    for e in ids.unique().tolist():
        rr = (ids == e).nonzero()[:, 0]
        a_s = as_ if not spec.block_shape else as_[rr]
        y[rr] = gemm(aq[rr], a_s, w2q[e], qw.w2_scale[e], spec, rr, mode, bk, mbits, group)
    y = (y * tw.reshape(-1, 1).double()).to(dt)
    return y.view(M, k, H).float().sum(1).to(dt)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="blk5")
    ap.add_argument("--modes", default="kstep,32,exact")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--mbits", type=int, default=13)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--block-k", type=int, default=128, help="BLOCK_SIZE_K of the emulated config")
    args = ap.parse_args()
    torch.set_num_threads(2)
    modes = [int(m) if m.isdigit() else m for m in args.modes.split(",")]
    for seed in range(args.seeds):
        for c in args.cases.split(","):
            name, E, N, H, k, M, how, block = CASES[c]
            g = torch.Generator().manual_seed(seed)
            logits = torch.randn(M, E, generator=g)
            if how == "idle":
                logits[:, E // 2:] = -1e4
            tw, ti = route(M, E, k, logits=logits)
            x = torch.randn(M, H, generator=g).to(torch.bfloat16)
            spec = QuantSpec(block)
            (w1q, s1), (w2q, s2) = (quant_weight(torch.randn(E, 2 * N, H, generator=g) / H ** 0.5, spec),
                                    quant_weight(torch.randn(E, H, N, generator=g) / N ** 0.5, spec))
            qw = QuantWeights(spec, s1, s2)
            ref = fused_moe_reference_fp8(x, w1q, w2q, qw, tw, ti)
            errs = {m: relative_error(kernel(x, w1q, w2q, qw, tw, ti, m, args.block_k, args.mbits, args.group), ref)
                    for m in modes if not (block and m == "none")}
            print(name, "seed", seed, {str(m): f"{v:.2e}" for m, v in errs.items()}, flush=True)


if __name__ == "__main__":
    main()
