"""Builtin fused-MoE Triton kernel: grouped GEMM over expert-sorted token blocks.

Algorithm (the one SGLang's ``fused_moe_kernel`` implements, written independently):
1. ``moe_align_block_size`` sorts the M*top_k (token, expert) pairs by expert, padding
   each expert's run to a multiple of BLOCK_SIZE_M (``remote.kernel.align``).
2. up GEMM: for each block of BLOCK_SIZE_M sorted pairs (one expert), ``x[token] @ w1[e].T``
   -> ``[M*top_k, 2N]`` (rows indexed by pair).
3. SiLU-and-mul: ``silu(h[:, :N]) * h[:, N:]`` -> ``[M*top_k, N]`` (fp32 math).
4. down GEMM: ``act[pair] @ w2[e].T`` times the pair's routing weight -> ``[M*top_k, hidden]``.
5. sum over the top_k slots -> ``[M, hidden]``.

Meta-parameters are SGLang's config fields: BLOCK_SIZE_M/N/K, GROUP_SIZE_M (program-id
swizzle for L2 reuse), num_warps, num_stages. The up and down GEMMs may use different
configs but must share BLOCK_SIZE_M (one alignment), as in SGLang 0.5.23's ``_down`` files.
Other keys (``USE_TMA``, AMD-only fields) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .align import max_padded_tokens, moe_align_block_size

CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, topk_weights_ptr,
    sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    N, K, EM, num_valid_tokens,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, A_ROW_DIV: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    total = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= total:
        return
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_token = tl.load(sorted_token_ids_ptr + offs_m).to(tl.int64)
    token_mask = offs_token < num_valid_tokens
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // A_ROW_DIV) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=token_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_rem = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)
        acc = acc * w[:, None]
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_token[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=token_mask[:, None] & (offs_cn[None, :] < N))


def normalize_config(cfg: dict) -> dict:
    """Return the six kernel fields of an SGLang config dict as ints.

    Missing ``num_warps``/``num_stages`` take Triton's launch defaults (4 and 3), which is
    what SGLang's launch gets for its default bf16 config that omits them.

    Raises:
        KeyError: a BLOCK_SIZE_* or GROUP_SIZE_M field is missing.
        ValueError: a block size is not a power of two >= 16 (tl.dot needs it).
    """
    out = {k: int(cfg[k]) for k in CONFIG_KEYS[:4]}
    out["num_warps"] = int(cfg.get("num_warps", 4))
    out["num_stages"] = int(cfg.get("num_stages", 3))
    for k in CONFIG_KEYS[:3]:
        v = out[k]
        if v < 16 or v & (v - 1):
            raise ValueError(f"{k}={v}: must be a power of two >= 16")
    if out["GROUP_SIZE_M"] < 1:
        raise ValueError(f"GROUP_SIZE_M={out['GROUP_SIZE_M']}: must be >= 1")
    return out


def _launch(a, w, c, topk_weights, sorted_ids, expert_ids, ntpp, num_valid_tokens, a_row_div,
            mul_routed_weight, cfg, warmup=False):
    N, K = w.shape[1], w.shape[2]
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    EM = sorted_ids.shape[0]
    args = [a, w, c, topk_weights, sorted_ids, expert_ids, ntpp,
            N, K, EM, num_valid_tokens,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1)]
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
                A_ROW_DIV=a_row_div, MUL_ROUTED_WEIGHT=mul_routed_weight, EVEN_K=(K % bk == 0),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    grid = (triton.cdiv(EM, bm) * triton.cdiv(N, bn),)
    if warmup:
        args = [x.dtype if isinstance(x, torch.Tensor) else x for x in args]
        return _moe_gemm_kernel.warmup(*args, grid=grid, **meta)
    _moe_gemm_kernel[grid](*args, **meta)
    return c


@dataclass
class Routing:
    """Expert alignment for one BLOCK_SIZE_M: tensors from :func:`moe_align_block_size`.

    ``num_valid_tokens`` = M * top_k; ``top_k``; ``block_m``.
    """
    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    ntpp: torch.Tensor
    num_valid_tokens: int
    top_k: int
    block_m: int


def align(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> Routing:
    """Run :func:`moe_align_block_size` and wrap the result in a :class:`Routing`."""
    s, e, n = moe_align_block_size(topk_ids, block_m, num_experts)
    return Routing(s, e, n, topk_ids.numel(), topk_ids.shape[1], block_m)


def moe_gemm(kind: str, a, w, out, routing: Routing, config: dict, topk_weights=None):
    """One grouped GEMM of the fused MoE.

    Args:
        kind: ``"up"`` (a = hidden states [M, hidden], w = w1 [E, 2N, hidden],
            out [M*top_k, 2N]) or ``"down"`` (a = activations [M*top_k, N],
            w = w2 [E, hidden, N], out [M*top_k, hidden], rows scaled by
            ``topk_weights`` flattened [M*top_k] float32).
        routing: from :func:`align`, with ``routing.block_m == config BLOCK_SIZE_M``.
        config: SGLang-style config dict (see :func:`normalize_config`).

    Returns:
        ``out`` (written in place; rows of pairs only, every pair row is written).

    Raises:
        ValueError: BLOCK_SIZE_M differs from the routing's block size, or bad ``kind``.
        triton.runtime.errors.OutOfResources (or a compile error) for configs that do not
        fit the device: callers that search configs catch these.
    """
    cfg = normalize_config(config)
    if cfg["BLOCK_SIZE_M"] != routing.block_m:
        raise ValueError(f"BLOCK_SIZE_M {cfg['BLOCK_SIZE_M']} != routing block {routing.block_m}")
    if kind == "up":
        return _launch(a, w, out, routing.sorted_ids, routing.sorted_ids, routing.expert_ids, routing.ntpp,
                       routing.num_valid_tokens, routing.top_k, False, cfg)
    if kind == "down":
        if topk_weights is None:
            raise ValueError("down GEMM needs topk_weights")
        return _launch(a, w, out, topk_weights, routing.sorted_ids, routing.expert_ids, routing.ntpp,
                       routing.num_valid_tokens, 1, True, cfg)
    raise ValueError(f"kind must be 'up' or 'down', got {kind!r}")


def precompile(kind: str, dtype: torch.dtype, E: int, N: int, hidden: int, top_k: int, config: dict):
    """Compile (without launching) the GEMM kernel for one config, into Triton's cache.

    Uses the same signature and specialisation as :func:`moe_gemm` for contiguous
    tensors of ``dtype`` with w1 [E, 2N, hidden] and w2 [E, hidden, N], so a later launch
    in any process sharing ``TRITON_CACHE_DIR`` loads the binary instead of compiling.
    Needs a GPU (not meaningful under TRITON_INTERPRET). Raises what Triton raises.
    """
    cfg = normalize_config(config)
    bm = cfg["BLOCK_SIZE_M"]
    if kind == "up":
        n_out, k_in = 2 * N, hidden
        a_stride, w_strides, row_div, mul = (hidden, 1), (2 * N * hidden, hidden, 1), top_k, False
    else:
        n_out, k_in = hidden, N
        a_stride, w_strides, row_div, mul = (N, 1), (hidden * N, N, 1), 1, True
    args = [dtype, dtype, dtype, torch.float32 if mul else torch.int32, torch.int32, torch.int32, torch.int32,
            n_out, k_in, max_padded_tokens(top_k, E, bm), top_k,
            a_stride[0], a_stride[1], w_strides[0], w_strides[1], w_strides[2], n_out, 1]
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"], BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"],
                GROUP_SIZE_M=cfg["GROUP_SIZE_M"], A_ROW_DIV=row_div, MUL_ROUTED_WEIGHT=mul,
                EVEN_K=(k_in % cfg["BLOCK_SIZE_K"] == 0), num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"])
    return _moe_gemm_kernel.warmup(*args, grid=(1,), **meta)


def silu_and_mul(h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(h[:, :N]) * h[:, N:]`` computed in float32, stored in ``h.dtype``; h is [P, 2N]."""
    n = h.shape[1] // 2
    r = torch.nn.functional.silu(h[:, :n].float()) * h[:, n:].float()
    if out is None:
        return r.to(h.dtype)
    out.copy_(r)
    return out


def make_buffers(M: int, top_k: int, N: int, hidden: int, dtype, device, fill=float("nan")):
    """Intermediate buffers ``(h [M*top_k, 2N], act [M*top_k, N], y [M*top_k, hidden])``,
    filled with ``fill`` (NaN by default: unwritten rows then fail correctness checks)."""
    P = M * top_k
    return (torch.full((P, 2 * N), fill, dtype=dtype, device=device),
            torch.full((P, N), fill, dtype=dtype, device=device),
            torch.full((P, hidden), fill, dtype=dtype, device=device))


def fused_moe(x, w1, w2, topk_weights, topk_ids, config: dict, down_config: dict | None = None,
              buffers=None, routing: Routing | None = None, out=None):
    """Fused MoE forward: ``sum_k w_k * silu_mul(x W1[e_k]^T) W2[e_k]^T``.

    Args:
        x: [M, hidden] fp16/bf16 (fp32 works too); w1: [E, 2N, hidden]; w2: [E, hidden, N],
            same dtype, contiguous, same device.
        topk_weights: float32 [M, top_k]; topk_ids: int32 [M, top_k] in [0, E).
        config: up-GEMM config (SGLang fields); down_config: down-GEMM config (default:
            ``config``), must have the same BLOCK_SIZE_M.
        buffers: optional ``make_buffers`` tuple to reuse (e.g. inside a CUDA graph).
        routing: optional precomputed :func:`align` result for this BLOCK_SIZE_M.
        out: optional [M, hidden] output tensor.

    Returns:
        [M, hidden] tensor of ``x.dtype``.

    Raises:
        ValueError: mismatched BLOCK_SIZE_M or shapes.
    """
    M, hidden = x.shape
    E, two_n, hidden_w = w1.shape
    N = two_n // 2
    top_k = topk_ids.shape[1]
    if hidden_w != hidden or tuple(w2.shape) != (E, hidden, N):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}")
    down_config = config if down_config is None else down_config
    bm = int(config["BLOCK_SIZE_M"])
    if int(down_config["BLOCK_SIZE_M"]) != bm:
        raise ValueError("up and down configs must share BLOCK_SIZE_M")
    if routing is None:
        routing = align(topk_ids, bm, E)
    if buffers is None:
        buffers = make_buffers(M, top_k, N, hidden, x.dtype, x.device, fill=0.0)
    h, act, y = buffers
    moe_gemm("up", x, w1, h, routing, config)
    silu_and_mul(h, out=act)
    moe_gemm("down", act, w2, y, routing, down_config, topk_weights=topk_weights.reshape(-1))
    r = y.view(M, top_k, hidden).sum(dim=1)
    if out is None:
        return r
    out.copy_(r)
    return out
