"""Builtin fused-MoE Triton kernel: grouped GEMM over expert-sorted token blocks.

Algorithm (the one SGLang's ``fused_moe_kernel`` implements, written independently):
1. ``moe_align_block_size`` sorts the M*top_k (token, expert) pairs by expert, padding
   each expert's run to a multiple of BLOCK_SIZE_M (``remote.tuning.kernel.align``).
2. up GEMM: for each block of BLOCK_SIZE_M sorted pairs (one expert), ``x[token] @ w1[e].T``
   -> ``[M*top_k, 2N]`` (rows indexed by pair).
3. SiLU-and-mul: ``silu(h[:, :N]) * h[:, N:]`` -> ``[M*top_k, N]`` (fp32 math).
4. down GEMM: ``act[pair] @ w2[e].T`` times the pair's routing weight -> ``[M*top_k, hidden]``.
5. sum over the top_k slots -> ``[M, hidden]``.

Meta-parameters are SGLang's config fields: BLOCK_SIZE_M/N/K, GROUP_SIZE_M (program-id
swizzle for L2 reuse), num_warps, num_stages. The up and down GEMMs may use different
configs but must share BLOCK_SIZE_M (one alignment), as in SGLang 0.5.23's ``_down`` files.
Other keys (``USE_TMA``, AMD-only fields) are accepted and ignored.

fp8_w8a8 (per-tensor and block [bn, bk]) uses the same kernel with fp8 e4m3 operands and
float32 scales (``remote.tuning.kernel.quant``); the scales are applied in the fp32 accumulator as
SGLang 0.5.23's ``fused_moe_kernel`` does (per K step for block scales, once at the end for
per-tensor ones).

fp8 accumulation on Hopper (:data:`FP8_ACCUMULATION`): Hopper's fp8 tensor-core MMA (wgmma)
adds products into an accumulator of reduced precision (about 13-14 mantissa bits, as
DeepSeek-V3's report measured), and Triton's default for sm_90 (``max_num_imprecise_acc``
= 2**30) leaves a whole ``tl.dot`` in it; ``acc = tl.dot(a, b, acc)`` even carries the
whole K loop there. Measured on the H200 with the per-tensor path that way: relative
errors 1.3-2.4e-2 against the float64 reference on the same quantized numbers (3e-4 on the
CPU), beyond the 1e-2 bar; the requantization of the activations between the GEMMs turns
small accumulation errors into fp8 rounding flips, which is why the block path (a fresh dot
per K step, as SGLang's kernel has it) still failed at small M. On sm_90 the kernel
therefore converts the fp8 operands to fp16 before the dot (exact for e4m3) so products
accumulate in fp32; other GPUs keep fp8 MMA (Triton's default is full precision there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .align import max_padded_tokens, moe_align_block_size

CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

#: How fp8 dots accumulate (module docstring): ``"auto"`` (``"exact"`` on compute capability
#: 9.x, ``"mma"`` elsewhere), ``"mma"`` (fp8 MMA, Triton's default accumulation),
#: ``"promote32"`` (fp8 MMA, partial sums added in fp32 after every 32 products:
#: ``max_num_imprecise_acc=32``), ``"exact"`` (operands converted to fp16, fp32 accumulation).
#: Settable for measurements (bench/sglang_kernel_h200.py compares them on the GPU).
FP8_ACCUMULATION = "auto"
_FP8_ACC_CODES = {"mma": 0, "promote32": 1, "exact": 2}
_CAPABILITY: dict = {}


def fp8_acc_code(device) -> int:
    """The ``FP8_ACC`` constexpr for fp8 launches on ``device`` (see :data:`FP8_ACCUMULATION`).
    Raises ValueError for an unknown setting."""
    mode = FP8_ACCUMULATION
    if mode == "auto":
        dev = torch.device(device)
        key = (dev.type, dev.index)
        if key not in _CAPABILITY:
            _CAPABILITY[key] = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
        cap = _CAPABILITY[key]
        mode = "exact" if cap is not None and cap[0] == 9 else "mma"
    if mode not in _FP8_ACC_CODES:
        raise ValueError(f"FP8_ACCUMULATION={FP8_ACCUMULATION!r}: one of auto, {', '.join(_FP8_ACC_CODES)}")
    return _FP8_ACC_CODES[mode]


@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, topk_weights_ptr,
    sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    a_scale_ptr, b_scale_ptr,
    N, K, EM, num_valid_tokens,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, A_ROW_DIV: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    EVEN_K: tl.constexpr, QUANT: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    FP8_ACC: tl.constexpr = 0,
):
    # QUANT: 0 = none (bf16/fp16/fp32 operands); 1 = fp8 per-tensor (a_scale [1], b_scale [E]),
    # applied once after the K loop; 2 = fp8 block [GROUP_N, GROUP_K] (a_scale [rows, K/GROUP_K]
    # per token group, b_scale [E, N/GROUP_N, K/GROUP_K]), applied per K step (BLOCK_SIZE_K
    # divides GROUP_K, so one K step sees one scale column). FP8_ACC (fp8 only): 0 = fp8 MMA with
    # Triton's default accumulation, 1 = fp8 MMA with partial sums promoted to fp32 every 32
    # products, 2 = operands converted to fp16 (exact for e4m3) and accumulated in fp32.
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

    if QUANT == 2:
        a_scale_ptrs = a_scale_ptr + (offs_token // A_ROW_DIV) * stride_asm
        b_scale_ptrs = b_scale_ptr + expert * stride_bse + (offs_bn // GROUP_N) * stride_bsn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=token_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_rem = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        if QUANT != 0 and FP8_ACC == 2:
            a = a.to(tl.float16)  # e4m3 -> fp16 is exact (3 of 10 mantissa bits, range 2^-9..448)
            b = b.to(tl.float16)
        if QUANT == 2:
            offs_ks = (k * BLOCK_SIZE_K) // GROUP_K
            a_s = tl.load(a_scale_ptrs + offs_ks * stride_ask, mask=token_mask, other=0.0)
            b_s = tl.load(b_scale_ptrs + offs_ks * stride_bsk)
            if FP8_ACC == 1:
                part = tl.dot(a, b, max_num_imprecise_acc=32)
            else:
                part = tl.dot(a, b)
            acc += part * a_s[:, None] * b_s[None, :]
        elif QUANT == 1 and FP8_ACC == 1:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=32)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if QUANT == 1:
        acc = acc * tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert)
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


def _quant_code(quant) -> int:
    if quant is None:
        return 0
    return 2 if quant.block_shape else 1


def _scale_strides(quant, a_scale, b_scale) -> tuple:
    """``(stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk)`` for the kernel."""
    if quant is None:
        return 0, 0, 0, 0, 0
    if not quant.block_shape:
        return 0, 0, 1, 0, 0
    return a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1), b_scale.stride(2)


def _check_quant_config(cfg: dict, quant) -> None:
    if quant is not None and quant.block_shape and quant.group_k % cfg["BLOCK_SIZE_K"]:
        raise ValueError(f"BLOCK_SIZE_K={cfg['BLOCK_SIZE_K']} must divide the fp8 block's {quant.group_k} "
                         "columns (one weight scale per K step)")


def _launch(a, w, c, topk_weights, sorted_ids, expert_ids, ntpp, num_valid_tokens, a_row_div,
            mul_routed_weight, cfg, a_scale=None, b_scale=None, quant=None):
    N, K = w.shape[1], w.shape[2]
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    EM = sorted_ids.shape[0]
    if quant is None:
        a_scale = b_scale = c  # placeholders: never read when QUANT == 0
    args = [a, w, c, topk_weights, sorted_ids, expert_ids, ntpp, a_scale, b_scale,
            N, K, EM, num_valid_tokens,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
            *_scale_strides(quant, a_scale, b_scale)]
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
                A_ROW_DIV=a_row_div, MUL_ROUTED_WEIGHT=mul_routed_weight, EVEN_K=(K % bk == 0),
                QUANT=_quant_code(quant), GROUP_N=quant.group_n if quant else 0,
                GROUP_K=quant.group_k if quant else 0, FP8_ACC=fp8_acc_code(a.device) if quant else 0,
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    grid = (triton.cdiv(EM, bm) * triton.cdiv(N, bn),)
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


def moe_gemm(kind: str, a, w, out, routing: Routing, config: dict, topk_weights=None, a_scale=None,
             w_scale=None, quant=None):
    """One grouped GEMM of the fused MoE.

    Args:
        kind: ``"up"`` (a = hidden states [M, hidden], w = w1 [E, 2N, hidden],
            out [M*top_k, 2N]) or ``"down"`` (a = activations [M*top_k, N],
            w = w2 [E, hidden, N], out [M*top_k, hidden], rows scaled by
            ``topk_weights`` flattened [M*top_k] float32).
        routing: from :func:`align`, with ``routing.block_m == config BLOCK_SIZE_M``.
        config: SGLang-style config dict (see :func:`normalize_config`).
        quant: ``None`` (a, w, out share one dtype) or a :class:`remote.tuning.kernel.quant.QuantSpec`
            for fp8_w8a8: ``a`` and ``w`` are ``torch.float8_e4m3fn``, ``a_scale``/``w_scale``
            float32 as made by :mod:`remote.tuning.kernel.quant` (per-tensor [1] / [E]; block
            [rows, K/bk] / [E, N/bn, K/bk]); ``out`` is bf16/fp16.

    Returns:
        ``out`` (written in place; rows of pairs only, every pair row is written).

    Raises:
        ValueError: BLOCK_SIZE_M differs from the routing's block size, bad ``kind``, missing
        scales, or (block fp8) a BLOCK_SIZE_K that does not divide the block's K.
        triton.runtime.errors.OutOfResources (or a compile error) for configs that do not
        fit the device: callers that search configs catch these.
    """
    cfg = normalize_config(config)
    if cfg["BLOCK_SIZE_M"] != routing.block_m:
        raise ValueError(f"BLOCK_SIZE_M {cfg['BLOCK_SIZE_M']} != routing block {routing.block_m}")
    _check_quant_config(cfg, quant)
    if quant is not None and fp8_acc_code(a.device) == 1 and cfg["BLOCK_SIZE_K"] < 32:
        raise ValueError(f"BLOCK_SIZE_K={cfg['BLOCK_SIZE_K']}: fp8 promotion every 32 products needs >= 32")
    if quant is not None and (a_scale is None or w_scale is None):
        raise ValueError("fp8 GEMM needs a_scale and w_scale")
    if kind == "up":
        return _launch(a, w, out, routing.sorted_ids, routing.sorted_ids, routing.expert_ids, routing.ntpp,
                       routing.num_valid_tokens, routing.top_k, False, cfg, a_scale, w_scale, quant)
    if kind == "down":
        if topk_weights is None:
            raise ValueError("down GEMM needs topk_weights")
        return _launch(a, w, out, topk_weights, routing.sorted_ids, routing.expert_ids, routing.ntpp,
                       routing.num_valid_tokens, 1, True, cfg, a_scale, w_scale, quant)
    raise ValueError(f"kind must be 'up' or 'down', got {kind!r}")


def precompile(kind: str, dtype: torch.dtype, E: int, N: int, hidden: int, top_k: int, config: dict,
               quant=None):
    """Compile (without launching) the GEMM kernel for one config, into Triton's cache.

    Uses the same signature and specialisation as :func:`moe_gemm` for contiguous
    tensors of ``dtype`` with w1 [E, 2N, hidden] and w2 [E, hidden, N] (fp8 operands and
    float32 scales when ``quant`` is a :class:`remote.tuning.kernel.quant.QuantSpec`; ``dtype`` is
    then the output dtype), so a later launch in any process sharing ``TRITON_CACHE_DIR``
    loads the binary instead of compiling. Needs a GPU (not meaningful under
    TRITON_INTERPRET). Raises what Triton raises, and ValueError as :func:`moe_gemm`.
    """
    from .quant import FP8_DTYPE

    cfg = normalize_config(config)
    _check_quant_config(cfg, quant)
    bm = cfg["BLOCK_SIZE_M"]
    if kind == "up":
        n_out, k_in = 2 * N, hidden
        a_stride, w_strides, row_div, mul = (hidden, 1), (2 * N * hidden, hidden, 1), top_k, False
    else:
        n_out, k_in = hidden, N
        a_stride, w_strides, row_div, mul = (N, 1), (hidden * N, N, 1), 1, True
    op = FP8_DTYPE if quant is not None else dtype
    if quant is None:
        scale_ptrs, scale_strides = [dtype, dtype], [0, 0, 0, 0, 0]
    elif not quant.block_shape:
        scale_ptrs, scale_strides = [torch.float32, torch.float32], [0, 0, 1, 0, 0]
    else:
        nk = -(-k_in // quant.group_k)
        nn = -(-n_out // quant.group_n)
        scale_ptrs, scale_strides = [torch.float32, torch.float32], [nk, 1, nn * nk, nk, 1]
    args = [op, op, dtype, torch.float32 if mul else torch.int32, torch.int32, torch.int32, torch.int32,
            *scale_ptrs, n_out, k_in, max_padded_tokens(top_k, E, bm), top_k,
            a_stride[0], a_stride[1], w_strides[0], w_strides[1], w_strides[2], n_out, 1, *scale_strides]
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"], BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"],
                GROUP_SIZE_M=cfg["GROUP_SIZE_M"], A_ROW_DIV=row_div, MUL_ROUTED_WEIGHT=mul,
                EVEN_K=(k_in % cfg["BLOCK_SIZE_K"] == 0), QUANT=_quant_code(quant),
                GROUP_N=quant.group_n if quant else 0, GROUP_K=quant.group_k if quant else 0,
                FP8_ACC=fp8_acc_code(torch.device("cuda", torch.cuda.current_device())) if quant else 0,
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
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
              buffers=None, routing: Routing | None = None, out=None, quant=None):
    """Fused MoE forward: ``sum_k w_k * silu_mul(x W1[e_k]^T) W2[e_k]^T``.

    Args:
        x: [M, hidden] fp16/bf16 (fp32 works too); w1: [E, 2N, hidden]; w2: [E, hidden, N],
            same dtype as x (or fp8 e4m3 with ``quant``), contiguous, same device.
        topk_weights: float32 [M, top_k]; topk_ids: int32 [M, top_k] in [0, E).
        config: up-GEMM config (SGLang fields); down_config: down-GEMM config (default:
            ``config``), must have the same BLOCK_SIZE_M.
        buffers: optional ``make_buffers`` tuple to reuse (e.g. inside a CUDA graph).
        routing: optional precomputed :func:`align` result for this BLOCK_SIZE_M.
        out: optional [M, hidden] output tensor.
        quant: ``None``, or a :class:`remote.tuning.kernel.quant.QuantWeights` (fp8_w8a8): w1/w2 are
            fp8 with its scales; x and the SiLU-and-mul activations are quantized
            dynamically as SGLang does (per-tensor, or per token and 128-column group for
            block [128, 128]); intermediate buffers and the output stay in ``x.dtype``.

    Returns:
        [M, hidden] tensor of ``x.dtype``.

    Raises:
        ValueError: mismatched BLOCK_SIZE_M or shapes, or a block fp8 BLOCK_SIZE_K that does
        not divide the block's K.
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
    flat_w = topk_weights.reshape(-1)
    if quant is None:
        moe_gemm("up", x, w1, h, routing, config)
        silu_and_mul(h, out=act)
        moe_gemm("down", act, w2, y, routing, down_config, topk_weights=flat_w)
    else:
        from .quant import quant_activation
        spec = quant.spec
        xq, xs = quant_activation(x, spec)
        moe_gemm("up", xq, w1, h, routing, config, a_scale=xs, w_scale=quant.w1_scale, quant=spec)
        silu_and_mul(h, out=act)
        aq, as_ = quant_activation(act, spec)
        moe_gemm("down", aq, w2, y, routing, down_config, topk_weights=flat_w, a_scale=as_,
                 w_scale=quant.w2_scale, quant=spec)
    r = y.view(M, top_k, hidden).sum(dim=1)
    if out is None:
        return r
    out.copy_(r)
    return out
