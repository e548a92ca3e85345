"""fp8 (e4m3) quantization for the fp8_w8a8 fused MoE: per-tensor and block-wise.

Two schemes, the ones SGLang 0.5.23 selects by file name (``dtype=fp8_w8a8`` with and
without ``,block_shape=[bn, bk]``):

- **per-tensor**: one float32 scale per expert for each weight tensor (``w1_scale`` [E],
  ``w2_scale`` [E]); the activations are quantized dynamically with one scale for the
  whole tensor (``scale = amax / 448``), before the up GEMM and again before the down GEMM.
- **block [bn, bk]** (DeepSeek-V3 style, [128, 128]): one scale per ``bn x bk`` tile of
  each expert's weight (``[E, ceil(rows / bn), ceil(cols / bk)]``); the activations are
  quantized per token and per group of ``bk`` columns (scales ``[rows, ceil(cols / bk)]``).

Dequantized value = fp8 value x scale. All scales are float32. 448 is the largest finite
``torch.float8_e4m3fn`` value. Quantization runs in torch (it is not what the tuner tunes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
_EPS = 1e-10  # floor for amax so an all-zero row/tensor gets a finite scale


@dataclass(frozen=True)
class QuantSpec:
    """How a fused MoE is quantized. ``block_shape``: ``None`` (per-tensor) or ``(bn, bk)``."""

    block_shape: tuple | None = None

    @property
    def group_n(self) -> int:
        """Rows of a weight scale tile (0 for per-tensor)."""
        return int(self.block_shape[0]) if self.block_shape else 0

    @property
    def group_k(self) -> int:
        """Columns of a weight scale tile and activation group size (0 for per-tensor)."""
        return int(self.block_shape[1]) if self.block_shape else 0


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quant_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor quantization: ``(x_fp8 same shape, scale float32 [1])``."""
    scale = (x.detach().abs().amax().float().clamp(min=_EPS) / FP8_MAX).reshape(1)
    return _to_fp8(x, scale), scale


def quant_per_token_group(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token and per ``group`` columns: x [rows, cols] -> ``(x_fp8 [rows, cols],
    scale float32 [rows, ceil(cols / group)])``. Raises ValueError for a non-2-D x."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    ng = -(-cols // group)
    pad = ng * group - cols
    xf = x.float()
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    g = xf.view(rows, ng, group)
    scale = g.abs().amax(dim=2).clamp(min=_EPS) / FP8_MAX
    q = (g / scale.unsqueeze(2)).clamp(-FP8_MAX, FP8_MAX).view(rows, ng * group)[:, :cols]
    return q.contiguous().to(FP8_DTYPE), scale.contiguous()


def quant_activation(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation quantization of ``spec``: per-tensor, or per token and ``group_k`` columns."""
    if spec.block_shape:
        return quant_per_token_group(x, spec.group_k)
    return quant_per_tensor(x)


def quant_weight(w: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize expert weights w [E, rows, cols]: ``(w_fp8, scale)`` with scale float32 [E]
    (per-tensor) or [E, ceil(rows / bn), ceil(cols / bk)] (block)."""
    E, rows, cols = w.shape
    if not spec.block_shape:
        scale = w.detach().abs().float().reshape(E, -1).amax(dim=1).clamp(min=_EPS) / FP8_MAX
        return _to_fp8(w, scale.view(E, 1, 1)), scale.contiguous()
    bn, bk = spec.group_n, spec.group_k
    nr, nc = -(-rows // bn), -(-cols // bk)
    wf = torch.nn.functional.pad(w.float(), (0, nc * bk - cols, 0, nr * bn - rows))
    tiles = wf.view(E, nr, bn, nc, bk)
    scale = tiles.abs().amax(dim=(2, 4)).clamp(min=_EPS) / FP8_MAX
    q = (tiles / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(E, nr * bn, nc * bk)[:, :rows, :cols]
    return q.contiguous().to(FP8_DTYPE), scale.contiguous()


def dequant_weight(wq: torch.Tensor, scale: torch.Tensor, spec: QuantSpec, dtype=torch.float64) -> torch.Tensor:
    """Inverse of :func:`quant_weight` in ``dtype`` (float64 by default, for references)."""
    E, rows, cols = wq.shape
    w = wq.to(dtype)
    if not spec.block_shape:
        return w * scale.to(dtype).view(E, 1, 1)
    s = scale.to(dtype).repeat_interleave(spec.group_n, 1)[:, :rows].repeat_interleave(spec.group_k, 2)[:, :, :cols]
    return w * s


def dequant_activation(xq: torch.Tensor, scale: torch.Tensor, spec: QuantSpec, dtype=torch.float64) -> torch.Tensor:
    """Inverse of :func:`quant_activation` in ``dtype``."""
    x = xq.to(dtype)
    if not spec.block_shape:
        return x * scale.to(dtype)
    return x * scale.to(dtype).repeat_interleave(spec.group_k, 1)[:, : x.shape[1]]


@dataclass(frozen=True)
class QuantWeights:
    """fp8 expert weights' scales for :func:`remote.tuning.kernel.fused_moe.fused_moe`.

    ``w1_scale``/``w2_scale``: float32, [E] (per-tensor) or [E, rows/bn, cols/bk] (block),
    from :func:`quant_weight` of w1 [E, 2N, hidden] and w2 [E, hidden, N].
    """

    spec: QuantSpec
    w1_scale: torch.Tensor
    w2_scale: torch.Tensor
