"""Quantized expert weights in the layouts SGLang 0.5.23's Triton fused MoE reads, and their float64 inverse.

One :class:`WeightFormat` per selector of SGLang's ``get_config_dtype_str``
(``srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``), with the layout the
quantization method leaves in the layer after loading (what ``TritonMoeQuantInfo`` hands to
``fused_experts``):

- ``int4_w4a16`` (``srt/layers/quantization/moe_wna16.py`` for GPTQ/AWQ 4-bit; compressed-tensors
  wNa16 served by ``CompressedTensorsWNA16TritonMoE``, which views its int32 words as the same
  bytes): weights uint8 ``[E, rows, cols // 2]``, two 4-bit values per byte along K (low nibble =
  even column); scales in the activation dtype ``[E, rows, cols // group]``; zero points
  (``has_zp``: GPTQ ``sym`` false, AWQ ``zero_point``) uint8 ``[E, rows // 2, cols // group]``
  packed two per byte along N (low nibble = even row), else the kernel's implicit 8. The kernel
  gets ``block_shape=[0, group]``.
- ``int8_w8a16`` (``moe_wna16.py``, GPTQ 8-bit): weights uint8 ``[E, rows, cols]``; scales as
  int4; zero points uint8 ``[E, rows, cols // group]`` or the implicit 128. Per channel
  (``per_channel``, no group: vLLM's ``experts_int8``, ``quantization/online/int8.py``
  ``Int8OnlineMoEMethod``): weights int8 ``[E, rows, cols]`` (symmetric, ``amax / 127``), scales
  float32 ``[E, rows]``, no zero points; the kernel gets no ``block_shape``.
- ``int8_w8a8`` (``w8a8_int8.py``: per-channel; ``blockwise_int8.py``: block): weights int8; scales
  float32 ``[E, rows, 1]`` (per-channel, ``per_channel_quant=True``) or ``[E, ceil(rows / bn),
  ceil(cols / bk)]`` (block); activations quantized by SGLang's launch per token (``/ 127``) or per
  token and ``bk`` columns.
- ``fp8_w8a8`` per-channel (compressed-tensors fp8 ``strategy: channel``, ``w8a8_fp8``): weights
  e4m3, scales float32 ``[E, rows, 1]``; activations per token (``scaled_fp8_quant`` with
  ``use_per_token_if_dynamic``). Per-tensor and block fp8 are :mod:`remote.tuning.kernel.quant`.

Dequantized weight = (q - zero point) x scale. Quantization runs in torch on random weights (it is
not what the tuner tunes); the float64 reference (:func:`reference`) runs on the same quantized
numbers, with the activations quantized the way SGLang's launch quantizes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SELECTORS = ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16")
_EPS = 1e-10
FP8_MAX = 448.0


@dataclass(frozen=True)
class WeightFormat:
    """How SGLang's Triton fused MoE holds a model's expert weights.

    ``dtype``: one of :data:`SELECTORS`; ``block_shape``: ``(bn, bk)`` of block scales (fp8/int8
    w8a8) or None; ``per_channel``: one scale per output row (w8a8 formats); ``group_size``: K
    columns per scale of the weight-only formats (``int4_w4a16``/``int8_w8a16``); ``has_zp``: the
    weight-only format stores zero points. Raises ValueError for a combination SGLang does not run.
    """

    dtype: str
    block_shape: tuple | None = None
    per_channel: bool = False
    group_size: int = 0
    has_zp: bool = False

    def __post_init__(self):
        if self.dtype not in SELECTORS:
            raise ValueError(f"weight format dtype {self.dtype!r}: expected one of {SELECTORS}")
        if self.int8_per_channel:
            if self.has_zp or self.block_shape:
                raise ValueError("per-channel int8_w8a16 has no zero points or block shape")
        elif self.weight_only:
            if self.group_size <= 0 or self.block_shape or self.per_channel:
                raise ValueError(f"{self.dtype} needs a group size and no block shape / per-channel scales")
        elif self.has_zp or self.group_size:
            raise ValueError(f"{self.dtype} has no zero points or group size")
        if self.dtype == "int8_w8a8" and not (self.per_channel or self.block_shape):
            raise ValueError("int8_w8a8 runs per-channel or block scales only (the engine's kernel asserts per_channel_quant)")
        if self.block_shape and self.per_channel:
            raise ValueError("block and per-channel scales exclude each other")

    @property
    def weight_only(self) -> bool:
        """Activations stay 16-bit (``int4_w4a16``, ``int8_w8a16``)."""
        return self.dtype in ("int4_w4a16", "int8_w8a16")

    @property
    def int8_per_channel(self) -> bool:
        """``int8_w8a16`` with one scale per output row and no group (vLLM's ``experts_int8``)."""
        return self.dtype == "int8_w8a16" and self.per_channel and not self.group_size

    @property
    def packed(self) -> bool:
        """Two weights per byte along K (``int4_w4a16``): the stored K is half the real one."""
        return self.dtype == "int4_w4a16"

    @property
    def kernel_block_shape(self) -> list | None:
        """``block_shape`` as SGLang passes it to ``fused_experts``: ``[0, group]`` for the
        weight-only formats, ``[bn, bk]`` for block scales, else None (also per-channel int8_w8a16)."""
        if self.int8_per_channel:
            return None
        if self.weight_only:
            return [0, int(self.group_size)]
        return [int(v) for v in self.block_shape] if self.block_shape else None

    def flags(self) -> dict:
        """``fused_experts``/``invoke_fused_moe_kernel`` flags of this format."""
        return dict(use_fp8_w8a8=self.dtype == "fp8_w8a8", use_int8_w8a8=self.dtype == "int8_w8a8",
                    use_int8_w8a16=self.dtype == "int8_w8a16", use_int4_w4a16=self.dtype == "int4_w4a16",
                    per_channel_quant=bool(self.per_channel) and not self.weight_only)

    def to_dict(self) -> dict:
        """The tuner spec's ``quant`` entry for this format (see :func:`from_quant`)."""
        return dict(dtype=self.dtype, block_shape=list(self.block_shape) if self.block_shape else None,
                    per_channel=bool(self.per_channel), group_size=int(self.group_size), has_zp=bool(self.has_zp))


def from_quant(quant) -> WeightFormat | None:
    """The :class:`WeightFormat` of a tuner spec's ``quant`` entry: None (16/32-bit weights), or
    ``{"dtype": selector (default fp8_w8a8), "block_shape": None | [bn, bk], "per_channel": bool,
    "group_size": int, "has_zp": bool}``. Raises ValueError for an entry SGLang does not run."""
    if quant is None:
        return None
    if isinstance(quant, WeightFormat):
        return quant
    bs = quant.get("block_shape")
    return WeightFormat(dtype=str(quant.get("dtype") or "fp8_w8a8"),
                        block_shape=tuple(int(v) for v in bs) if bs else None,
                        per_channel=bool(quant.get("per_channel", False)),
                        group_size=int(quant.get("group_size") or 0), has_zp=bool(quant.get("has_zp", False)))


# --------------------------------------------------------------------------- weights


def _groups(w: torch.Tensor, group: int) -> torch.Tensor:
    E, rows, cols = w.shape
    if cols % group:
        raise ValueError(f"K {cols} is not a multiple of the group size {group}")
    return w.reshape(E, rows, cols // group, group)


def _block_scale(w: torch.Tensor, bn: int, bk: int, qmax: float):
    E, rows, cols = w.shape
    nr, nc = -(-rows // bn), -(-cols // bk)
    wf = torch.nn.functional.pad(w.float(), (0, nc * bk - cols, 0, nr * bn - rows))
    tiles = wf.view(E, nr, bn, nc, bk)
    scale = tiles.abs().amax(dim=(2, 4)).clamp(min=_EPS) / qmax
    full = scale.repeat_interleave(bn, 1)[:, :rows].repeat_interleave(bk, 2)[:, :, :cols]
    return scale.contiguous(), full


def quantize(w: torch.Tensor, fmt: WeightFormat, act_dtype: torch.dtype):
    """Quantize float expert weights ``w`` [E, rows, cols] into ``fmt``'s stored layout (module
    docstring): ``(stored, scale, zero_points | None)``. Raises ValueError when cols (or rows, for
    packed zero points) do not divide into the format's groups."""
    E, rows, cols = w.shape
    wf = w.float()
    if fmt.int8_per_channel:
        scale = wf.abs().amax(dim=2).clamp(min=_EPS) / 127.0
        q = torch.round(wf / scale.unsqueeze(2)).clamp(-127, 127).to(torch.int8)
        return q.contiguous(), scale.contiguous(), None
    if fmt.weight_only:
        g = _groups(wf, fmt.group_size)
        bits = 4 if fmt.packed else 8
        top = (1 << bits) - 1
        if fmt.has_zp:
            lo, hi = g.amin(dim=3), g.amax(dim=3)
            scale = ((hi - lo).clamp(min=_EPS) / top)
            zp = torch.round(-lo / scale).clamp(0, top)
        else:
            scale = g.abs().amax(dim=3).clamp(min=_EPS) / (top // 2)
            zp = torch.full_like(scale, float((top + 1) // 2))
        scale = scale.to(act_dtype)  # the layer's scales are params_dtype; quantize against the stored ones
        s = scale.float()
        q = (torch.round(g / s.unsqueeze(3)) + zp.unsqueeze(3)).clamp(0, top).to(torch.uint8).reshape(E, rows, cols)
        zq = zp.to(torch.uint8)
        if fmt.packed:
            q = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).contiguous()
            if fmt.has_zp:
                if rows % 2:
                    raise ValueError(f"packed zero points need an even row count, got {rows}")
                zq = (zq[:, 0::2, :] | (zq[:, 1::2, :] << 4)).contiguous()
        return q, scale.contiguous(), (zq.contiguous() if fmt.has_zp else None)
    if fmt.dtype == "int8_w8a8":
        if fmt.block_shape:
            scale, full = _block_scale(wf, fmt.block_shape[0], fmt.block_shape[1], 127.0)
        else:
            scale = wf.abs().amax(dim=2, keepdim=True).clamp(min=_EPS) / 127.0
            full = scale
        q = torch.round(wf / full).clamp(-128, 127).to(torch.int8)
        return q.contiguous(), scale.contiguous(), None
    if fmt.dtype == "fp8_w8a8":
        if fmt.block_shape:
            scale, full = _block_scale(wf, fmt.block_shape[0], fmt.block_shape[1], FP8_MAX)
        elif fmt.per_channel:
            scale = wf.abs().amax(dim=2, keepdim=True).clamp(min=_EPS) / FP8_MAX
            full = scale
        else:
            scale = wf.reshape(E, -1).abs().amax(dim=1).clamp(min=_EPS) / FP8_MAX
            full = scale.view(E, 1, 1)
        q = (wf / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q.contiguous(), scale.contiguous(), None
    raise ValueError(f"unknown format {fmt.dtype!r}")


def empty(E: int, rows: int, cols: int, fmt: WeightFormat, act_dtype: torch.dtype, device):
    """Uninitialised ``(stored, scale, zero_points | None)`` of :func:`quantize`'s shapes and
    dtypes for weights [E, rows, cols] (compiling only: values do not matter)."""
    if fmt.int8_per_channel:
        return (torch.empty(E, rows, cols, dtype=torch.int8, device=device),
                torch.ones(E, rows, device=device), None)
    if fmt.weight_only:
        g = fmt.group_size
        w = torch.empty(E, rows, cols // 2 if fmt.packed else cols, dtype=torch.uint8, device=device)
        s = torch.ones(E, rows, cols // g, dtype=act_dtype, device=device)
        z = (torch.zeros(E, rows // 2 if fmt.packed else rows, cols // g, dtype=torch.uint8, device=device)
             if fmt.has_zp else None)
        return w, s, z
    wd = torch.int8 if fmt.dtype == "int8_w8a8" else torch.float8_e4m3fn
    w = torch.empty(E, rows, cols, dtype=wd, device=device)
    if fmt.block_shape:
        bn, bk = fmt.block_shape
        s = torch.ones(E, -(-rows // bn), -(-cols // bk), device=device)
    elif fmt.per_channel:
        s = torch.ones(E, rows, 1, device=device)
    else:
        s = torch.ones(E, device=device)
    return w, s, None


def dequantize(stored: torch.Tensor, scale: torch.Tensor, zp, fmt: WeightFormat, dtype=torch.float64) -> torch.Tensor:
    """Inverse of :func:`quantize`: the weights [E, rows, cols] in ``dtype`` (float64 by default)."""
    if fmt.int8_per_channel:
        return stored.to(dtype) * scale.to(dtype).unsqueeze(2)
    if fmt.weight_only:
        q = stored
        if fmt.packed:
            q = torch.stack((q & 0xF, q >> 4), dim=3).reshape(q.shape[0], q.shape[1], -1)
        E, rows, cols = q.shape
        g = fmt.group_size
        if zp is None:
            z = torch.full((E, rows, cols // g), 8.0 if fmt.packed else 128.0, dtype=dtype, device=q.device)
        else:
            z = zp
            if fmt.packed:
                z = torch.stack((z & 0xF, z >> 4), dim=2).reshape(E, rows, -1)
            z = z.to(dtype)
        s = scale.to(dtype)
        return (q.to(dtype).reshape(E, rows, cols // g, g) - z.unsqueeze(3)).mul(s.unsqueeze(3)).reshape(E, rows, cols)
    E, rows, cols = stored.shape
    w = stored.to(dtype)
    s = scale.to(dtype)
    if fmt.block_shape:
        bn, bk = fmt.block_shape
        return w * s.repeat_interleave(bn, 1)[:, :rows].repeat_interleave(bk, 2)[:, :, :cols]
    if s.dim() == 1:
        return w * s.view(E, 1, 1)
    return w * s


def quantize_activation(x: torch.Tensor, fmt: WeightFormat | None, dtype=torch.float64) -> torch.Tensor:
    """The GEMM input [rows, cols] as SGLang's launch hands it to the kernel, dequantized into
    ``dtype``: unchanged for 16-bit activations; int8 per token (``amax / 127``, round) or per
    token and ``bk`` columns; fp8 per token (per-channel weights), per token and ``bk`` columns
    (block) or per tensor, ``amax / 448`` (``invoke_fused_moe_kernel``)."""
    if fmt is None or fmt.weight_only:
        return x.to(dtype)
    xf = x.float()
    rows, cols = xf.shape
    if fmt.block_shape:
        bk = fmt.block_shape[1]
        if cols % bk:
            raise ValueError(f"activation K {cols} is not a multiple of the block's K {bk}")
        xg = xf.view(rows, cols // bk, bk)
        amax = xg.abs().amax(dim=2, keepdim=True).clamp(min=_EPS)
    elif fmt.per_channel or fmt.dtype == "int8_w8a8":
        xg = xf.view(rows, 1, cols)
        amax = xg.abs().amax(dim=2, keepdim=True).clamp(min=_EPS)
    else:
        xg = xf.view(1, 1, rows * cols)
        amax = xg.abs().amax().clamp(min=_EPS).view(1, 1, 1)
    if fmt.dtype == "int8_w8a8":
        s = amax / 127.0
        q = torch.round(xg * (127.0 / amax)).clamp(-128, 127)
    else:
        s = amax / FP8_MAX
        q = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (q.to(dtype) * s.to(dtype)).reshape(rows, cols)


def reference(x, w1, w2, fmt: WeightFormat | None, topk_weights, topk_ids, scales=None, zps=None) -> torch.Tensor:
    """float64 fused MoE (SiLU-gated) on the same quantized numbers SGLang's kernel sees.

    ``x`` [M, hidden] (bf16/fp16); ``w1``/``w2``: the stored weights of ``fmt`` ([E, 2N, hidden]
    and [E, hidden, N] before packing) with ``scales=(w1_scale, w2_scale)`` and ``zps=(w1_zp,
    w2_zp)``, or 16-bit weights when ``fmt`` is None; ``topk_weights`` float32 / ``topk_ids``
    int [M, top_k]. Between the GEMMs the intermediates are rounded to ``x.dtype`` (the kernel's
    buffers) and the activation quantized again as SGLang's launch quantizes the down GEMM's input.
    Returns float64 [M, hidden] on the CPU.
    """
    dev = x.device
    M, top_k = topk_ids.shape
    if fmt is None:
        w1d, w2d = w1.to(torch.float64), w2.to(torch.float64)
    else:
        w1d = dequantize(w1, scales[0], zps[0] if zps else None, fmt)
        w2d = dequantize(w2, scales[1], zps[1] if zps else None, fmt)
    N = w2d.shape[2]
    xd = quantize_activation(x, fmt)
    ids = topk_ids.detach().to(dev, torch.int64).reshape(-1)
    tok = torch.arange(M, device=dev).repeat_interleave(top_k)
    h = torch.empty(M * top_k, 2 * N, dtype=torch.float64, device=dev)
    for e in torch.unique(ids).tolist():
        rows = torch.nonzero(ids == e, as_tuple=True)[0]
        h[rows] = xd[tok[rows]] @ w1d[e].T
    hb = h.to(x.dtype).float()
    act = (torch.nn.functional.silu(hb[:, :N]) * hb[:, N:]).to(x.dtype)
    ad = quantize_activation(act, fmt)
    tw = topk_weights.detach().to(dev, torch.float64).reshape(-1)
    out = torch.zeros(M, x.shape[1], dtype=torch.float64, device=dev)
    for e in torch.unique(ids).tolist():
        rows = torch.nonzero(ids == e, as_tuple=True)[0]
        out.index_add_(0, tok[rows], (ad[rows] @ w2d[e].T) * tw[rows].unsqueeze(1))
    return out.cpu()
