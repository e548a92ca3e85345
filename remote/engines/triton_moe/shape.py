"""The fused-MoE GEMM shape of one rank and the selectors of its config file name: the record every
engine that runs the fused-MoE Triton kernel fills by its own model rules (standard library only).

SGLang fills it in :func:`remote.engines.sglang.shape.moe_shape` (and names its files:
:class:`remote.engines.sglang.shape.MoeShape`); the controller reads it as the probe's ``model``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class MoeShape:
    """The fused-MoE GEMM shape of one rank and the selectors of its config file name.

    ``E``: experts on one rank incl. a fused shared expert (``w2.shape[0]``).
    ``N``: per-rank intermediate size used in the file name (``w2.shape[2]``; for
    int4_w4a16 the packed size, i.e. half the logical one, as SGLang 0.5.23 does).
    ``hidden``: model hidden size K (``w1.shape[2]``), elements.
    ``topk``: routed experts per token (``num_experts_per_tok``);
    ``runtime_topk``: top-k the kernel runs with (``topk + 1`` with a fused shared expert).
    ``num_experts``: global routed experts in the checkpoint.
    ``shared_fused``: a shared expert is fused into the routed GEMM (adds 1 to E).
    ``dtype_selector``: ``fp8_w8a8``/``int8_w8a8``/``int4_w4a16``/``int8_w8a16``/``float32``/None.
    ``block_shape``: ``[block_n, block_k]`` of block quantization, else None.
    ``per_channel_quant``: channel-wise weight scales.
    ``weight_dtype``: ``bfloat16``, ``float16``, ``float32``, ``fp8_e4m3``, ``int8``,
    ``int4``, ``mxfp4``.
    ``act_dtype``: activation dtype of the MoE input (``bfloat16``/``float16``/``float32``).
    ``moe_layers``: MoE layers in the model (MTP/NextN not counted), None if unknown.
    ``architecture``: ``architectures[0]``.
    ``notes``: human-readable caveats (e.g. the layer may not use Triton configs).
    ``family``: the engine's architecture family; ``source``: the engine release's file:line that
    builds these experts. ``gated``: w1 is ``[E, 2N, K]`` (gate and up); False: ``[E, N, K]``.
    ``group_size``: weight-only int4/int8 (``int4_w4a16``/``int8_w8a16``): K columns per scale
    the layer runs (SGLang's kernel gets ``block_shape=[0, group_size]``, which names no block);
    0 otherwise. ``has_zp``: those weights store zero points.
    """

    E: int
    N: int
    hidden: int
    topk: int
    runtime_topk: int
    num_experts: int
    shared_fused: bool
    dtype_selector: str | None
    block_shape: list[int] | None
    per_channel_quant: bool
    weight_dtype: str
    moe_layers: int | None
    architecture: str
    act_dtype: str = "bfloat16"
    intermediate_size: int = 0
    tp: int = 1
    ep: int = 1
    quant_method: str | None = None
    notes: list[str] = field(default_factory=list)
    family: str = ""
    source: str = ""
    gated: bool = True
    group_size: int = 0
    has_zp: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)
