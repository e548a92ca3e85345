"""Token sort/align by expert (the semantics of SGLang's ``moe_align_block_size``).

Pure torch, no host synchronisation, fixed output sizes, so it can run inside a CUDA
graph capture. SGLang uses a custom CUDA kernel for this step; this one is a functional
equivalent, not a performance equivalent (the tuner times the GEMMs with the alignment
precomputed, see ``remote.tuning.tuner.timing``).
"""

from __future__ import annotations

import torch


def max_padded_tokens(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of ``num_tokens_post_padded``: ``num_pairs + E * (block_m - 1)``.

    ``num_pairs`` = M * top_k (token/expert pairs). Same bound as SGLang's
    ``moe_align_block_size`` uses to size ``sorted_token_ids`` (sglang 0.5.x), so the
    kernel grid is static for a given (M, top_k, E, BLOCK_SIZE_M).
    """
    return num_pairs + num_experts * (block_m - 1)


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int):
    """Sort token/expert pairs by expert and pad every expert to a multiple of ``block_m``.

    Args:
        topk_ids: int tensor [M, top_k], expert index per (token, slot), values in
            ``[0, num_experts)``.
        block_m: BLOCK_SIZE_M of the kernel (positive int).
        num_experts: E.

    Returns:
        ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``:
        - ``sorted_token_ids``: int32 [max_padded_tokens]; entries are flat pair indices
          ``token * top_k + slot`` grouped by expert (stable order inside an expert),
          each expert's group padded to a multiple of ``block_m`` with the sentinel
          ``M * top_k``; entries past the padded total are also the sentinel.
        - ``expert_ids``: int32 [max_padded_tokens // block_m rounded up]; the expert of
          each block of ``block_m`` entries (blocks past the total: the last expert, never
          read by the kernel since it stops at ``num_tokens_post_padded``).
        - ``num_tokens_post_padded``: int32 [1], sum over experts of the padded counts.
        Experts with no tokens get no block at all (as in SGLang).

    Raises:
        ValueError: ``block_m < 1`` or ``topk_ids`` not 2-D.
    """
    if block_m < 1:
        raise ValueError(f"block_m must be positive, got {block_m}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [M, top_k], got shape {tuple(topk_ids.shape)}")
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    cap = max_padded_tokens(n, num_experts, block_m)
    n_blocks = (cap + block_m - 1) // block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    sorted_expert = flat[order]
    rank = torch.arange(n, device=device, dtype=torch.int64) - count_start[sorted_expert]
    dest = padded_start[sorted_expert] + rank
    sorted_ids = torch.full((cap,), n, dtype=torch.int64, device=device)
    sorted_ids.scatter_(0, dest, order)
    block_starts = torch.arange(n_blocks, device=device, dtype=torch.int64) * block_m
    expert_ids = torch.searchsorted(padded_end, block_starts, right=True)
    expert_ids = torch.clamp(expert_ids, max=num_experts - 1)
    total = padded_end[-1:].clone()
    return sorted_ids.to(torch.int32), expert_ids.to(torch.int32), total.to(torch.int32)
