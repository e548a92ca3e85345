"""The fused-MoE shape one vLLM rank runs, from a model's ``config.json`` (standard library only).

vLLM 0.32.0-0.34.0 build a ``FusedMoE`` layer per MoE block (``vllm/model_executor/layers/fused_moe/layer.py``)
from the model file the architecture maps to (``vllm/model_executor/models/registry.py``); the
config keys each model file reads are in :data:`ARCHITECTURES` (held against the model files by
``tests/unit/remote/engines/vllm/test_shape_oracle.py``). Per rank:

- without expert parallelism, the experts are split along N over the flattened TP x DP ranks
  (``FusedMoEParallelConfig.make``, ``flatten_tp_across_dp_and_pcp``): ``N = intermediate // (TP x DP)``,
  ``E`` = every routed expert;
- with ``--enable-expert-parallel`` and TP x DP > 1 the experts are split instead
  (``expert_map_manager.py``, linear placement): ``E = experts // EP``, one more on the first
  ``experts % EP`` ranks, ``N`` whole;
- shared experts run as their own MLP on CUDA (fused into the routed experts only on ROCm with
  AITER), so ``E`` counts routed experts only;
- the file name's ``N`` is ``w2.shape[2]``, doubled for int4_w4a16 (``_moe_config_shape``): the
  unpacked intermediate size per rank, i.e. the same number as for 16-bit weights.

The weight format (:func:`weight_format`) comes from ``quantization_config`` (the checkpoint's) or
``--quantization``: fp8 with ``weight_block_size`` is ``fp8_w8a8`` with that block, fp8 without it
per-tensor ``fp8_w8a8``; ``mxfp4`` (gpt-oss) runs no Triton config file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...protocol import BadInput
from .naming import config_file_name, dtype_selector, reads_down_file


@dataclass(frozen=True)
class Arch:
    """How vLLM's model file for one architecture reads its MoE sizes: ``module`` (the file under
    ``vllm/model_executor/models/`` that reads them: the ``registry.py`` entry's module or one it
    imports, e.g. Qwen3.5's MoE block is ``qwen3_next``'s), ``experts``, ``intermediate``, ``topk``, ``hidden``: the
    config keys; ``shared``: the key of the shared-expert count or size (None: no shared expert);
    ``text_config``: the sizes sit under ``text_config`` (multimodal checkpoints)."""

    module: str
    experts: str
    intermediate: str
    topk: str
    hidden: str = "hidden_size"
    shared: str | None = None
    text_config: bool = False


#: Architectures of the models orch's tests carry (``tests/data/models``), as vLLM 0.34.0 reads them.
ARCHITECTURES: dict[str, Arch] = {
    "Qwen3MoeForCausalLM": Arch("qwen3_moe", "num_experts", "moe_intermediate_size", "num_experts_per_tok"),
    "Qwen3_5MoeForConditionalGeneration": Arch("qwen3_next", "num_experts", "moe_intermediate_size",
                                               "num_experts_per_tok", shared="shared_expert_intermediate_size",
                                               text_config=True),
    "DeepseekV3ForCausalLM": Arch("deepseek_v2", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
                                  shared="n_shared_experts"),
    "Glm4MoeForCausalLM": Arch("glm4_moe", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
                               shared="n_shared_experts"),
    "GlmMoeDsaForCausalLM": Arch("deepseek_v2", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
                                 shared="n_shared_experts"),
    "Ernie4_5_MoeForCausalLM": Arch("ernie45_moe", "moe_num_experts", "moe_intermediate_size", "moe_k",
                                    shared="moe_num_shared_experts"),
    "Gemma4ForConditionalGeneration": Arch("gemma4", "num_experts", "moe_intermediate_size", "top_k_experts",
                                           text_config=True),
    "Llama4ForConditionalGeneration": Arch("llama4", "num_local_experts", "intermediate_size", "num_experts_per_tok",
                                           text_config=True),
    "MixtralForCausalLM": Arch("mixtral", "num_local_experts", "intermediate_size", "num_experts_per_tok"),
    "GptOssForCausalLM": Arch("gpt_oss", "num_local_experts", "intermediate_size", "num_experts_per_tok"),
}


def weight_format(config: dict[str, Any], quantization: str | None = None) -> tuple[str | None, list[int] | None]:
    """``(format, block_shape)`` of a model's MoE weights as vLLM runs them: ``(None, None)`` for
    16-bit weights, ``("fp8_w8a8", [n, k])`` for fp8 with ``weight_block_size``, ``("fp8_w8a8",
    None)`` for per-tensor fp8 (a checkpoint's ``quantization_config.quant_method == "fp8"`` or
    ``--quantization fp8`` on 16-bit weights: vLLM quantizes them on load), ``("mxfp4", None)`` for
    gpt-oss's mxfp4. Raises :class:`remote.protocol.BadInput` for another quantization method
    (orch does not read its MoE format yet)."""
    qc = config.get("quantization_config") or {}
    method = (qc.get("quant_method") or quantization or "").lower()
    if not method:
        return None, None
    if method == "fp8":
        block = qc.get("weight_block_size")
        return "fp8_w8a8", ([int(x) for x in block] if block else None)
    if method == "mxfp4":
        return "mxfp4", None
    raise BadInput(f"quantization {method!r}: orch does not read vLLM's MoE weight format for it")


@dataclass
class VllmShape:
    """One rank's fused-MoE shape: ``E`` (experts on the rank), ``N`` (intermediate size per rank,
    the file name's N), ``hidden``, ``topk``; the model's ``experts``/``intermediate``; the
    deployment ``tp``, ``dp``, ``ep`` (1: no expert parallelism) and ``ep_rank``; ``shared``: the
    model's shared-expert key value (not in ``E``); ``weight_format``, ``block_shape``."""

    E: int
    N: int
    hidden: int
    topk: int
    experts: int
    intermediate: int
    architecture: str
    tp: int = 1
    dp: int = 1
    ep: int = 1
    ep_rank: int = 0
    shared: int | None = None
    weight_format: str | None = None
    block_shape: list[int] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (JSON-able)."""
        return asdict(self)

    @property
    def dtype(self) -> str | None:
        """vLLM's dtype selector of the file name (``naming.dtype_selector``)."""
        if self.weight_format == "mxfp4":
            return None
        return dtype_selector(self.weight_format)

    def file_names(self, device_name: str, release: str = "0.34.0") -> list[str]:
        """The config files vLLM ``release`` reads for this shape on ``device_name`` (vLLM's form of
        the GPU name): the one file, and ``_down.json`` where the release reads it; [] for a format
        that reads none (mxfp4)."""
        if self.weight_format == "mxfp4":
            return []
        names = [config_file_name(self.E, self.N, device_name, self.dtype, self.block_shape)]
        if reads_down_file(release, self.dtype, self.block_shape):
            names.append(config_file_name(self.E, self.N, device_name, self.dtype, self.block_shape, down=True))
        return names


def _int(cfg: dict, key: str, source: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise BadInput(f"{source}: {key} must be a positive integer, got {v!r}")
    return v


def model_shape(config: dict[str, Any], *, tp: int = 1, dp: int = 1, enable_expert_parallel: bool = False,
                ep_rank: int = 0, quantization: str | None = None, source: str = "config.json") -> VllmShape:
    """The :class:`VllmShape` vLLM's rank ``ep_rank`` runs for ``config`` (a ``config.json`` as a
    dict) with ``--tensor-parallel-size tp``, ``--data-parallel-size dp``,
    ``--enable-expert-parallel`` and ``--quantization`` (module docstring). Raises
    :class:`remote.protocol.BadInput` naming ``source`` for an architecture orch does not know, a
    missing or bad size, or an intermediate size that TP x DP does not divide."""
    archs = config.get("architectures") or []
    name = next((a for a in archs if a in ARCHITECTURES), None)
    if name is None:
        raise BadInput(f"{source}: architecture {archs!r} is not one whose vLLM MoE shape orch reads "
                       f"(known: {', '.join(sorted(ARCHITECTURES))})")
    arch = ARCHITECTURES[name]
    cfg = config.get("text_config") or config if arch.text_config else config
    experts = _int(cfg, arch.experts, source)
    inter = _int(cfg, arch.intermediate, source)
    topk = _int(cfg, arch.topk, source)
    hidden = _int(cfg, arch.hidden, source)
    if tp < 1 or dp < 1:
        raise BadInput(f"TP and DP must be at least 1, got TP={tp} DP={dp}")
    fmt, block = weight_format(config, quantization)
    flat = tp * dp
    if enable_expert_parallel and flat > 1:
        if not 0 <= ep_rank < flat:
            raise BadInput(f"EP rank {ep_rank} is outside 0..{flat - 1}")
        E = experts // flat + (1 if ep_rank < experts % flat else 0)
        N, ep = inter, flat
    else:
        if inter % flat:
            raise BadInput(f"{source}: {arch.intermediate}={inter} is not divisible by TP x DP = {flat}")
        E, N, ep = experts, inter // flat, 1
    shared = cfg.get(arch.shared) if arch.shared else None
    return VllmShape(E=E, N=N, hidden=hidden, topk=topk, experts=experts, intermediate=inter, architecture=name,
                     tp=tp, dp=dp, ep=ep, ep_rank=ep_rank if ep > 1 else 0, shared=shared, weight_format=fmt,
                     block_shape=block)
