"""MoE shape of a model as SGLang 0.5.23 sees it at run time (stand-in, orch test bed).

Rules: SGLang 0.5.23 (``E, _, N = w2.shape`` at run time; shared-expert fusion per model class),
summarised with the real model configs in ``tests/data/models/README.md``.
This is an independent small implementation (the stand-in must not import orch's ``remote``),
which also cross-checks ``remote.engines.sglang.shape``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

# Architectures whose shared expert SGLang fuses into the routed GEMM on NVIDIA by default
# (E + 1): DeepSeek-V3/V3.2, GLM-4-MoE, GLM-5 (GlmMoeDsa), Qwen3-Next, MistralLarge3, Llama4, MiniMax-M3.
FUSED_SHARED_ARCHS = {
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "Glm4MoeForCausalLM",
    "GlmMoeDsaForCausalLM",
    "Qwen3NextForCausalLM",
    "MistralLarge3ForCausalLM",
    "Llama4ForConditionalGeneration",
    "Llama4ForCausalLM",
    "MiniMaxM3ForCausalLM",
}
# Runners with which the shared expert is not fused (models/README.md).
NO_FUSION_BACKENDS = {"flashinfer_trtllm", "flashinfer_cutedsl"}


@dataclass
class MoeShape:
    """Per-rank MoE GEMM shape. ``E`` experts (incl. a fused shared one), ``N`` intermediate
    size per rank, ``hidden`` K, ``topk``, ``dtype`` selector (None for bf16/fp16),
    ``block_shape`` ``[bn, bk]`` or None."""

    E: int
    N: int
    hidden: int
    topk: int
    dtype: Optional[str]
    block_shape: Optional[List[int]]
    per_channel_quant: bool = False


def _env_true(name: str) -> bool:
    """SGLang 0.5.23 ``EnvBool``: true for ``true``, ``1``, ``yes``, ``y`` (any case)."""
    return os.environ.get(name, "false").lower() in ("true", "1", "yes", "y")


def resolve_model_path(model_path: str, download_dir: Optional[str] = None) -> str:
    """The folder SGLang 0.5.23 loads ``--model-path`` from (its ``handle_modelscope_paths``):
    a path that exists is used as is; with ``SGLANG_USE_MODELSCOPE`` true, else
    ``<root>/<model_path>`` where ``root`` is ModelScope's model cache root (modelscope 1.40
    ``get_model_cache_root``: ``$MODELSCOPE_CACHE/models``, default ``~/.cache/modelscope/hub/models``),
    else ``<download_dir>/<model_path>``. A miss would download from the hub: the stand-in raises
    FileNotFoundError instead. Without ModelScope the path is returned unchanged."""
    if not model_path or os.path.exists(model_path) or not _env_true("SGLANG_USE_MODELSCOPE"):
        return model_path
    cache = os.path.expanduser(os.environ.get("MODELSCOPE_CACHE") or os.path.join("~", ".cache", "modelscope", "hub"))
    tried = [os.path.join(cache, "models", model_path)]
    if download_dir:
        tried.append(os.path.join(download_dir, model_path))
    for cand in tried:
        if os.path.exists(cand):
            return cand
    raise FileNotFoundError(f"stand-in: {model_path} is in no ModelScope cache ({', '.join(tried)}); "
                            "SGLang would download it now")


def load_config(model_path: str) -> Dict[str, Any]:
    """Read ``<model_path>/config.json`` (dict). Raises FileNotFoundError / JSONDecodeError."""
    with open(os.path.join(model_path, "config.json")) as f:
        return json.load(f)


def _text_cfg(cfg: Dict[str, Any]) -> Dict[str, Any]:
    return cfg.get("text_config") or cfg


def moe_shape(
    cfg: Dict[str, Any],
    tp: int = 1,
    ep: int = 1,
    quantization: Optional[str] = None,
    dtype_flag: str = "auto",
    disable_shared_experts_fusion: bool = False,
    backend: str = "auto",
) -> MoeShape:
    """E, N and name selectors for ``cfg`` at TP ``tp`` / EP ``ep`` (SGLang 0.5.23 rules).

    E = experts // ep (+1 for a fused shared expert: listed architectures, n_shared_experts > 0,
    ep == 1, fusion not disabled, runner not flashinfer_trtllm/cutedsl);
    N = moe_intermediate_size // (tp // ep). Raises ValueError for a non-MoE config or a TP that
    does not divide the intermediate size.
    """
    text = _text_cfg(cfg)
    experts = None
    for key in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"):  # ERNIE 4.5: moe_num_experts
        if text.get(key):
            experts = int(text[key])
            break
    if experts is None:
        raise ValueError("not a MoE model: no num_experts / n_routed_experts / num_local_experts")
    inter = text.get("moe_intermediate_size") or text.get("intermediate_size")
    if not inter:
        raise ValueError("no moe_intermediate_size / intermediate_size")
    moe_tp = max(1, tp // max(1, ep))
    if int(inter) % moe_tp:
        raise ValueError(f"intermediate size {inter} not divisible by moe TP size {moe_tp}")
    N = int(inter) // moe_tp
    E = experts // max(1, ep)
    archs = set(cfg.get("architectures") or text.get("architectures") or [])
    shared = int(text.get("n_shared_experts") or 0)
    if (archs & FUSED_SHARED_ARCHS and shared > 0 and ep <= 1 and not disable_shared_experts_fusion
            and backend not in NO_FUSION_BACKENDS):
        E += 1
    qcfg = cfg.get("quantization_config") or text.get("quantization_config") or {}
    dtype_sel: Optional[str] = None
    block: Optional[List[int]] = None
    per_channel = False
    method = (quantization or qcfg.get("quant_method") or "").lower()
    if method.startswith("fp8") or method == "w8a8_fp8":
        dtype_sel = "fp8_w8a8"
        wbs = qcfg.get("weight_block_size")
        if wbs:
            block = [int(x) for x in wbs]
    elif method in ("w8a8_int8",):
        dtype_sel = "int8_w8a8"
        per_channel = True  # SGLang 0.5.23 quantization/w8a8_int8.py get_triton_quant_info
    elif dtype_flag in ("float32", "float"):
        dtype_sel = "float32"
    return MoeShape(
        E=E,
        N=N,
        hidden=int(text.get("hidden_size", 0)),
        topk=int(text.get("num_experts_per_tok", 0) or 0),
        dtype=dtype_sel,
        block_shape=block,
        per_channel_quant=per_channel,
    )
