"""float64 torch reference of the fused MoE and the routing used for test/tuning inputs."""

from __future__ import annotations

import torch


def route(num_tokens: int, num_experts: int, top_k: int, *, generator=None, device="cpu",
          logits: torch.Tensor | None = None):
    """Realistic routing: softmax over random logits, then top-k (renormalised).

    Args:
        num_tokens: M. num_experts: E. top_k: experts per token (<= E).
        generator: optional ``torch.Generator`` for the logits (on ``device``).
        logits: optional float tensor [M, E] to use instead of random ones (tests use it
            to force uneven loads or idle experts).

    Returns:
        ``(topk_weights float32 [M, top_k], topk_ids int32 [M, top_k])``. Weights sum to 1
        per token (Qwen3/Mixtral ``norm_topk_prob``).
    """
    if logits is None:
        logits = torch.randn(num_tokens, num_experts, generator=generator, device=device,
                             dtype=torch.float32)
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return w.to(torch.float32), ids.to(torch.int32)


def fused_moe_reference(x, w1, w2, topk_weights, topk_ids):
    """Fused MoE in float64: ``sum_k w_k * (silu(x W1g^T) * (x W1u^T)) W2^T``.

    Args:
        x: [M, hidden]; w1: [E, 2N, hidden] (rows 0..N-1 gate, N..2N-1 up);
        w2: [E, hidden, N]; topk_weights: [M, top_k] float; topk_ids: [M, top_k] int.
        Computed on ``x``'s device, one expert at a time (only the used experts' weights
        are converted to float64).

    Returns:
        float64 tensor [M, hidden] on the CPU.
    """
    dev = x.device
    xd = x.detach().to(torch.float64)
    tw = topk_weights.detach().to(dev, torch.float64)
    ids = topk_ids.detach().to(dev, torch.int64)
    N = w2.shape[2]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64, device=dev)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = xd[tok] @ w1[e].detach().to(dev, torch.float64).T
        act = torch.nn.functional.silu(h[:, :N]) * h[:, N:]
        y = act @ w2[e].detach().to(dev, torch.float64).T
        out.index_add_(0, tok, y * tw[tok, slot].unsqueeze(1))
    return out.cpu()


def fused_moe_reference_fp8(x, w1q, w2q, quant, topk_weights, topk_ids):
    """float64 reference of the fp8_w8a8 fused MoE on the *same quantized numbers* the kernel sees.

    Args:
        x: [M, hidden] bf16/fp16 (quantized here exactly as the kernel's caller does);
        w1q [E, 2N, hidden], w2q [E, hidden, N]: fp8 e4m3; quant: a
        :class:`remote.tuning.kernel.quant.QuantWeights`; topk_weights/topk_ids as in
        :func:`fused_moe_reference`.

    The GEMMs run in float64 on dequantized operands. Between them the intermediates are
    rounded to ``x.dtype`` (the kernel's buffers; SiLU-and-mul in float32) and the activation
    is quantized dynamically like the kernel's input (per-tensor over all M*top_k rows, or per
    token and 128-column group), so what is left is accumulation-order error only and the
    1e-2 bound of the bf16 kernel applies. Returns float64 [M, hidden] on the CPU.
    """
    from .quant import dequant_activation, dequant_weight, quant_activation

    spec = quant.spec
    dev = x.device
    M, top_k = topk_ids.shape
    N = w2q.shape[2]
    xq, xs = quant_activation(x, spec)
    xd = dequant_activation(xq, xs, spec)
    ids = topk_ids.detach().to(dev, torch.int64).reshape(-1)
    tok = torch.arange(M, device=dev).repeat_interleave(top_k)
    h = torch.empty(M * top_k, 2 * N, dtype=torch.float64, device=dev)
    for e in torch.unique(ids).tolist():
        rows = torch.nonzero(ids == e, as_tuple=True)[0]
        w1d = dequant_weight(w1q[e:e + 1], quant.w1_scale[e:e + 1], spec)[0]
        h[rows] = xd[tok[rows]] @ w1d.T
    hb = h.to(x.dtype).float()
    act = (torch.nn.functional.silu(hb[:, :N]) * hb[:, N:]).to(x.dtype)
    aq, as_ = quant_activation(act, spec)
    ad = dequant_activation(aq, as_, spec)
    tw = topk_weights.detach().to(dev, torch.float64).reshape(-1)
    out = torch.zeros(M, x.shape[1], dtype=torch.float64, device=dev)
    for e in torch.unique(ids).tolist():
        rows = torch.nonzero(ids == e, as_tuple=True)[0]
        w2d = dequant_weight(w2q[e:e + 1], quant.w2_scale[e:e + 1], spec)[0]
        out.index_add_(0, tok[rows], (ad[rows] @ w2d.T) * tw[rows].unsqueeze(1))
    return out.cpu()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` when ``out`` has NaN/inf (never passes)."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(o).all():
        return float("inf")
    denom = torch.linalg.norm(r).item()
    num = torch.linalg.norm(o - r).item()
    return num / denom if denom > 0 else num
