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

The weight format (:func:`weight_spec`) comes from ``quantization_config`` (the checkpoint's) and
``--quantization`` (:func:`quant_method`: the method vLLM runs): fp8 with ``weight_block_size`` is
``fp8_w8a8`` with that block, fp8 without it per-tensor ``fp8_w8a8``; ``mxfp4`` (gpt-oss) runs no
Triton config file; the weight-only formats (vLLM 0.32.0-0.34.0):

- ``experts_int8`` (``--quantization experts_int8``, ``quantization/experts_int8.py``
  ``Int8OnlineMoEMethod``): 16-bit weights quantized to int8 per output channel on load;
  ``oracle/int8.py`` ``make_int8_moe_quant_config`` without activation scales is
  ``int8_w8a16_moe_quant_config`` with no block: ``int8_w8a16``, per-channel scales, the
  ``fused_moe_kernel`` (file ``,dtype=int8_w8a16``);
- ``moe_wna16`` (``--quantization moe_wna16`` on a GPTQ 4/8-bit or AWQ 4-bit checkpoint,
  ``MoeWNA16Config.override_quantization_method``), ``gptq``/``gptq_marlin``/``auto_gptq`` and
  ``awq``/``awq_marlin``/``auto_awq`` checkpoints: ``int4_w4a16`` (``bits`` 4) or ``int8_w8a16``
  (``bits`` 8) with ``block_shape=[0, group_size]`` (``oracle/int_wna16.py``
  ``make_wna16_moe_quant_config``), which names no block in the file (``not all(block_shape)``);
  the group is halved until it divides both the per-rank intermediate size and the hidden size
  (``MoeWNA16Method.create_weights``); zero points: GPTQ ``sym`` false, AWQ ``zero_point``. Which
  kernel runs them (Marlin, Humming, Triton) is :func:`remote.engines.vllm.runner.triton_verdict`'s.
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


#: ``--quantization`` / ``quant_method`` names of vLLM's GPTQ and AWQ configs (``quantization/__init__.py``
#: ``get_quantization_config``: each maps to ``AutoGPTQConfig`` or ``AutoAWQConfig``)
GPTQ_METHODS = ("gptq", "gptq_marlin", "auto_gptq")
AWQ_METHODS = ("awq", "awq_marlin", "auto_awq")
#: methods whose MoE weights are int4/int8 with a group (WNA16: ``oracle/int_wna16.py``)
WNA16_METHODS = ("moe_wna16", *GPTQ_METHODS, *AWQ_METHODS)


@dataclass(frozen=True)
class WeightSpec:
    """How vLLM holds a model's MoE weights: ``format`` (None: 16-bit; ``fp8_w8a8``, ``int8_w8a16``,
    ``int4_w4a16``, ``mxfp4``), ``block_shape`` (fp8 block ``[n, k]``; None otherwise, also for the
    weight-only group, which vLLM passes as ``[0, group]``), ``method`` (the quantization method vLLM
    runs, :func:`quant_method`), ``group_size`` (WNA16: K columns per scale as in the checkpoint; 0:
    none, -1: per channel), ``has_zp`` (WNA16 zero points), ``desc_act`` (GPTQ activation order)."""

    format: str | None = None
    block_shape: list[int] | None = None
    method: str | None = None
    group_size: int = 0
    has_zp: bool = False
    desc_act: bool = False


def quant_method(config: dict[str, Any], quantization: str | None = None) -> str | None:
    """The quantization method vLLM runs for a checkpoint ``config`` served with ``--quantization``
    (lower case; None: none). The checkpoint's ``quantization_config.quant_method`` wins, except that
    ``--quantization moe_wna16`` takes over a GPTQ or AWQ checkpoint (``MoeWNA16Config.
    override_quantization_method``; vLLM refuses to start when the two disagree otherwise,
    ``ModelConfig._verify_quantization``)."""
    qc = config.get("quantization_config") or {}
    ckpt = str(qc.get("quant_method") or "").lower() or None
    user = (quantization or "").lower() or None
    if ckpt and user == "moe_wna16" and ckpt in ("gptq", "awq"):
        return "moe_wna16"
    return ckpt or user


def _wna16(qc: dict[str, Any], method: str, source: str) -> WeightSpec:
    """The WNA16 spec of a GPTQ/AWQ ``quantization_config`` (``MoeWNA16Config.from_config``: ``bits``,
    ``group_size``; GPTQ ``sym``, AWQ ``zero_point``; AutoAWQ also spells them ``w_bit``/``q_group_size``)."""
    linear = str(qc.get("quant_method") or "").lower()
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    if bits not in (4, 8) or isinstance(bits, bool):
        raise BadInput(f"{source}: quantization_config.bits must be 4 or 8 for vLLM's {method} MoE, got {bits!r}")
    if not isinstance(group, int) or isinstance(group, bool) or group == 0 or group < -1:
        raise BadInput(f"{source}: quantization_config.group_size must be a positive integer or -1, got {group!r}")
    awq = linear in AWQ_METHODS or (method in AWQ_METHODS)
    has_zp = bool(qc.get("zero_point", False)) if awq else not bool(qc.get("sym", True))
    return WeightSpec("int4_w4a16" if bits == 4 else "int8_w8a16", None, method, int(group), has_zp,
                      bool(qc.get("desc_act", False)))


def weight_spec(config: dict[str, Any], quantization: str | None = None, source: str = "config.json") -> WeightSpec:
    """The :class:`WeightSpec` of a model's MoE weights as vLLM runs them (module docstring). Raises
    :class:`remote.protocol.BadInput` for another quantization method (orch does not read its MoE
    format yet) or a WNA16 checkpoint without 4/8 bits and a group size."""
    qc = config.get("quantization_config") or {}
    method = quant_method(config, quantization)
    if not method:
        return WeightSpec()
    if method == "fp8":
        block = qc.get("weight_block_size")
        return WeightSpec("fp8_w8a8", [int(x) for x in block] if block else None, method)
    if method == "mxfp4":
        return WeightSpec("mxfp4", None, method)
    if method == "experts_int8":
        return WeightSpec("int8_w8a16", None, method, -1)
    if method in WNA16_METHODS:
        return _wna16(qc, method, source)
    raise BadInput(f"quantization {method!r}: orch does not read vLLM's MoE weight format for it")


def weight_format(config: dict[str, Any], quantization: str | None = None) -> tuple[str | None, list[int] | None]:
    """``(format, block_shape)`` of a model's MoE weights as vLLM runs them (:func:`weight_spec`):
    ``(None, None)`` for 16-bit weights, ``("fp8_w8a8", [n, k])`` for fp8 with ``weight_block_size``,
    ``("fp8_w8a8", None)`` for per-tensor fp8 (a checkpoint's ``quantization_config.quant_method ==
    "fp8"`` or ``--quantization fp8`` on 16-bit weights: vLLM quantizes them on load), ``("mxfp4",
    None)`` for gpt-oss's mxfp4, ``("int8_w8a16", None)`` / ``("int4_w4a16", None)`` for the
    weight-only formats. Raises :class:`remote.protocol.BadInput` for another quantization method."""
    spec = weight_spec(config, quantization)
    return spec.format, spec.block_shape


def layer_group_size(group: int, n_per_rank: int, hidden: int) -> int:
    """The WNA16 group the Triton layer runs (``MoeWNA16Method.create_weights``: halved while it does
    not divide the per-rank intermediate size and the hidden size); -1 (per channel) and 0 unchanged.
    Where halving would go below 32 (vLLM asserts ``group_size >= 32``: a server on the MoeWNA16 path
    does not start) the checkpoint's group is returned unchanged."""
    if group <= 0:
        return group
    g = group
    while n_per_rank % g or hidden % g:
        g //= 2
        if g < 32:
            return group
    return g


@dataclass
class VllmShape:
    """One rank's fused-MoE shape: ``E`` (experts on the rank), ``N`` (intermediate size per rank,
    the file name's N), ``hidden``, ``topk``; the model's ``experts``/``intermediate``; the
    deployment ``tp``, ``dp``, ``ep`` (1: no expert parallelism) and ``ep_rank``; ``shared``: the
    model's shared-expert key value (not in ``E``); ``weight_format``, ``block_shape``;
    ``quant_method`` (the method vLLM runs); ``group_size`` (WNA16: the layer's group,
    :func:`layer_group_size`; -1: per-channel int8 of ``experts_int8``; 0: none) and ``has_zp``."""

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
    quant_method: str | None = None
    group_size: int = 0
    has_zp: bool = False

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
    spec = weight_spec(config, quantization, source)
    fmt, block = spec.format, spec.block_shape
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
    group = layer_group_size(spec.group_size, N, hidden) if spec.method in WNA16_METHODS else spec.group_size
    return VllmShape(E=E, N=N, hidden=hidden, topk=topk, experts=experts, intermediate=inter, architecture=name,
                     tp=tp, dp=dp, ep=ep, ep_rank=ep_rank if ep > 1 else 0, shared=shared, weight_format=fmt,
                     block_shape=block, quant_method=spec.method, group_size=group, has_zp=spec.has_zp)
