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


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` when ``out`` has NaN/inf (never passes)."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(o).all():
        return float("inf")
    denom = torch.linalg.norm(r).item()
    num = torch.linalg.norm(o - r).item()
    return num / denom if denom > 0 else num
