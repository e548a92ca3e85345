"""The inputs of a tune from its flags, shared by the payload commands ``tune`` and ``prepare``
(:mod:`remote.tuning.command`, :mod:`remote.tuning.prepare`): the batch sizes, the MoE shape and
file-name selectors of the model flags, the quantization entry of the tuner spec, and a shipped
config file given by path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines import shape_from_args
from ..protocol import PayloadError
from .support import quant_entry, unsupported_reason


def parse_batch_sizes(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (sorted, unique, each >= 1). Raises PayloadError bad_input."""
    try:
        vals = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise PayloadError("bad_input", f"--batch-sizes: not a list of integers: {text!r}") from None
    if not vals or vals[0] < 1:
        raise PayloadError("bad_input", f"--batch-sizes: need positive integers: {text!r}")
    return vals


def resolve_shape(args) -> tuple[dict, dict, Any]:
    """``(shape, naming, the engine's shape record)`` of the model flags (:func:`remote.engines.shape_from_args`,
    by ``--engine``'s rules): shape {E,N,hidden,topk}; naming {dtype_selector, block_shape,
    per_channel_quant, weight_dtype, act_dtype, shape_source, notes, group_size, has_zp, gated,
    shared_experts}."""
    ms, source = shape_from_args(args)
    # topk: the routed experts per token (num_experts_per_tok); where the engine fuses the shared
    # expert the routing adds it to every row (shared_experts, tune_routing): the server's
    # top-(k+1), where SGLang's own tuner counts it only when given recorded topk ids
    shape = dict(E=ms.E, N=ms.N, hidden=ms.hidden, topk=ms.topk)
    return shape, dict(dtype_selector=ms.dtype_selector, block_shape=ms.block_shape,
                       per_channel_quant=ms.per_channel_quant, weight_dtype=ms.weight_dtype,
                       act_dtype=ms.act_dtype, shape_source=source, notes=list(ms.notes),
                       group_size=ms.group_size, has_zp=ms.has_zp, gated=ms.gated,
                       shared_experts=max(0, ms.runtime_topk - ms.topk) if ms.shared_fused else 0), ms


def load_shipped(path: str | None) -> dict | None:
    """``--shipped-config``: ``{"up": {M: cfg}, "down": {M: cfg} | None, "path", "down_path"}`` (the
    ``_down`` twin beside it when present), None without a path. Raises PayloadError ``not_found``
    for a missing file."""
    if not path:
        return None
    from ..engines.triton_moe.configfile import load_config_file
    p = Path(path)
    if not p.is_file():
        raise PayloadError("not_found", f"--shipped-config {path}: no such file")
    up = load_config_file(p)
    down_path = p.with_name(p.name[: -len(".json")] + "_down.json")
    down = load_config_file(down_path) if down_path.is_file() else None
    return {"up": up, "down": down, "path": str(p), "down_path": str(down_path) if down else None}


def quant_of(naming: dict, provider: str):
    """The tuner spec's ``quant`` entry for the file's selectors: ``None`` (bf16/fp16/fp32
    weights) or :meth:`remote.tuning.kernel.formats.WeightFormat.to_dict` (``{"dtype",
    "block_shape", "per_channel", "group_size", "has_zp"}``). Raises PayloadError bad_input with
    :func:`unsupported_reason` for what ``provider``'s kernel does not run."""
    why = unsupported_reason(naming, provider)
    if why:
        raise PayloadError("bad_input", why)
    return quant_entry(naming)
