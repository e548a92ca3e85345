"""The MoE shape SGLang's fused-MoE kernel sees for a model, and its config file names (stdlib only).

``moe_shape`` turns a model's ``config.json`` dict (:mod:`remote.engines.sglang.model_config`), with the
server's ``--tp-size``/``--ep-size``/``--quantization``/``--dtype``, into a :class:`MoeShape`: the
per-rank E and N and the dtype/block/per-channel selectors that make up SGLang's config file name.

Which config fields give E, N and top-k, and whether the shared expert runs inside the routed
GEMM (E + 1), differs per architecture: :data:`remote.engines.sglang.architectures.ARCHITECTURES` holds
SGLang 0.5.23's rule for every architecture whose model code (``sglang/srt/models/*.py``) builds a
fused MoE; ``moe_shape`` interprets it and refuses an architecture it does not list. At run time
SGLang reads ``E, _, N = w2.shape`` with ``N = expert intermediate size / (tp / ep)`` and
``E = experts // ep`` plus the fused shared experts.

This module must not import torch or triton (the ``names`` command and the controller use it
without them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol import PayloadError
from ..triton_moe.shape import MoeShape as TritonMoeShape
from .architectures import RULES_BY_ARCH, ArchRule, Fusion
from .naming import config_file_name, sglang_device_name
from .quantization import activation_dtype, moe_layer_excluded, quant_rule, wna16_group_size


class MoeShape(TritonMoeShape):
    """The shared fused-MoE shape record (:class:`remote.engines.triton_moe.shape.MoeShape`) with
    SGLang's file names. ``family`` is the :class:`~remote.engines.sglang.architectures.ArchRule`
    family and ``source`` the SGLang 0.5.23 file:line that builds these experts."""

    def file_names(self, device_name: str, per_channel_selector: bool = True) -> dict[str, str]:
        """``{"up": ..., "down": ...}`` file names (SGLang 0.5.23 get_config_file_name).

        ``device_name`` may be the torch form (``"NVIDIA H200"``) or the SGLang form
        (``"NVIDIA_H200"``). ``per_channel_selector``: False for releases whose
        ``get_config_file_name`` has no ``,per_channel_quant=True`` selector (before SGLang
        0.5.4: ``remote.engines.sglang.lookup.loader_rules``). Raises ValueError for a hostile device name.
        """
        dev = sglang_device_name(device_name)
        kw = dict(dtype=self.dtype_selector, block_shape=self.block_shape,
                  per_channel_quant=self.per_channel_quant and per_channel_selector)
        return {
            "up": config_file_name(self.E, self.N, dev, **kw),
            "down": config_file_name(self.E, self.N, dev, down=True, **kw),
        }


def _pos_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise PayloadError("bad_input", f"{what} must be a positive integer, got {v!r}")
    return v



_MISSING = object()


def _moe_config(cfg: dict) -> tuple[dict, str]:
    """The sub-config SGLang's ``get_hf_text_config`` picks (utils/hf_transformers/common.py:547)
    and its key path (``""`` for the top level)."""
    thinker = cfg.get("thinker_config")
    if isinstance(thinker, dict):
        text = thinker.get("text_config")
        return (text, "thinker_config.text_config") if isinstance(text, dict) else (thinker, "thinker_config")
    for key in ("llm_config", "language_config", "text_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict):
            return sub, key
    return cfg, ""


def _lookup(spec: str, mc: dict, cfg: dict) -> Any:
    """Value of one field spec (see :class:`ArchRule`) from the MoE config, then the top level."""
    name, index = spec, None
    if spec.endswith("]") and "[" in spec:
        name, index = spec[:-1].split("[", 1)
    for src in (mc, cfg) if mc is not cfg else (mc,):
        v: Any = src
        for part in name.split("."):
            v = v.get(part, _MISSING) if isinstance(v, dict) else _MISSING
        if v is _MISSING or v is None:
            continue
        if index is None:
            return v
        if not isinstance(v, list):
            raise PayloadError("bad_input", f"model config: {name} is {v!r}, not the list SGLang's model code indexes "
                                            f"({spec})")
        i = int(index)
        return v[i] if -len(v) <= i < len(v) else _MISSING
    return _MISSING


def _field(specs: tuple[str, ...], mc: dict, cfg: dict, where: str, arch: str, what: str,
           default: int | None = None) -> tuple[str, int]:
    """First present field of ``specs`` as a positive int -> (field name, value).

    A per-layer list must hold one value. Raises PayloadError('bad_input') naming the fields
    looked for (under ``where``) when none is set or the value is not a positive integer.
    """
    for spec in specs:
        v = _lookup(spec, mc, cfg)
        if v is _MISSING:
            continue
        if isinstance(v, list):
            vals = set(v) if all(isinstance(x, int) and not isinstance(x, bool) for x in v) else None
            if not vals or len(vals) != 1:
                raise PayloadError(
                    "bad_input",
                    f"model config ({arch}): {_qualified(spec, where)} differs between layers ({v!r}): "
                    f"SGLang builds one fused-MoE shape per value; orch names one")
            v = next(iter(vals))
        return spec, _pos_int(v, f"model config ({arch}): {_qualified(spec, where)}")
    if default is not None:
        return f"{specs[0]} (SGLang default)", default
    raise PayloadError(
        "bad_input",
        f"model config ({arch}): no {what}: none of {', '.join(_qualified(s, where) for s in specs)} is set")


def _qualified(spec: str, where: str) -> str:
    return f"{where}.{spec}" if where else spec


def _moe_layer_count(rule_name: str | None, mc: dict, cfg: dict) -> int | None:
    """MoE layers of the model (MTP/NextN not counted), None when unknown.

    Rules: ``all``; ``first_k_dense`` (layer i >= first_k_dense_replace and i % moe_layer_freq
    == 0, models/deepseek_v2.py); ``qwen_sparse`` (i not in mlp_only_layers and (i + 1) %
    decoder_sparse_step == 0, models/qwen3_moe.py); ``interleave`` ((i + 1) %
    interleave_moe_layer_step == 0, models/llama4.py:441); ``ernie_range`` (moe_layer_start_index
    <= i <= moe_layer_end_index, every moe_layer_interval, models/ernie4.py:184); ``freq_list``
    (moe_layer_freq[i] truthy, models/mimo_v2.py:1007); ``pattern_E`` ('E' in
    hybrid_override_pattern, configs/nemotron_h.py:38); ``dense_prefix`` (i >= num_dense_layers);
    ``is_moe_layer`` (the list's true entries); ``mlp_layer_types`` (its ``"sparse"`` entries,
    models/mellum.py:438).
    """
    def get(name: str, default: Any = None) -> Any:
        v = _lookup(name, mc, cfg)
        return default if v is _MISSING else v

    L = get("num_hidden_layers")
    if rule_name == "pattern_E":
        pat = get("hybrid_override_pattern")
        return pat.count("E") if isinstance(pat, str) else None
    if rule_name in ("freq_list", "is_moe_layer"):
        seq = get("moe_layer_freq" if rule_name == "freq_list" else "is_moe_layer")
        return sum(1 for x in seq if x) if isinstance(seq, list) else None
    if rule_name == "mlp_layer_types":
        seq = get("mlp_layer_types")
        return sum(1 for x in seq if x == "sparse") if isinstance(seq, list) else None
    if rule_name is None or isinstance(L, bool) or not isinstance(L, int) or L <= 0:
        return None
    try:
        if rule_name == "all":
            return L
        if rule_name == "first_k_dense":
            k, freq = int(get("first_k_dense_replace", 0)), int(get("moe_layer_freq", 1) or 1)
            return sum(1 for i in range(L) if i >= k and i % freq == 0)
        if rule_name == "qwen_sparse":
            step, dense = int(get("decoder_sparse_step", 1) or 1), set(get("mlp_only_layers", []) or [])
            return sum(1 for i in range(L) if i not in dense and (i + 1) % step == 0)
        if rule_name == "interleave":
            step = int(get("interleave_moe_layer_step", 1))
            return L if step == 0 else sum(1 for i in range(L) if (i + 1) % step == 0)
        if rule_name == "ernie_range":
            start, end = int(get("moe_layer_start_index", L)), int(get("moe_layer_end_index", L - 1))
            step = int(get("moe_layer_interval", 1) or 1)
            return sum(1 for i in range(L) if start <= i <= end and (i - start) % step == 0)
        if rule_name == "dense_prefix":
            return sum(1 for i in range(L) if i >= int(get("num_dense_layers", 0)))
    except (TypeError, ValueError):
        return None
    return None


def _select_rule(arch: str, cfg: dict, depth: int = 0) -> tuple[ArchRule, dict, str, str]:
    """(rule, MoE config, its key path, architecture) for a config; follows ``delegate`` rules.

    Raises PayloadError('bad_input') for an architecture not in :data:`~remote.engines.sglang.architectures.ARCHITECTURES`.
    """
    mc, where = _moe_config(cfg)
    rules = RULES_BY_ARCH.get(arch)
    if not rules:
        raise PayloadError(
            "bad_input",
            f"model config: architecture {arch!r} is not one orch knows SGLang 0.5.23 to build a fused MoE for "
            f"(docs/sglang-models.md lists them); orch reads E, N and top-k per architecture from fields such as "
            f"num_experts / n_routed_experts / num_local_experts, moe_intermediate_size / intermediate_size and "
            f"num_experts_per_tok, and will not guess which apply to {arch}")
    for rule in rules:
        if rule.when is None or _lookup(rule.when[0], mc, cfg) == rule.when[1] or (
                _lookup(rule.when[0], mc, cfg) is _MISSING and rule.when[1] is None):
            break
    else:
        fields = ", ".join(f"{_qualified(r.when[0], where)} == {r.when[1]!r}" for r in rules if r.when)
        raise PayloadError("bad_input", f"model config ({arch}): SGLang builds no fused MoE unless {fields}")
    if rule.delegate:
        inner = mc.get("architectures") if mc is not cfg else None
        if not (isinstance(inner, list) and inner and isinstance(inner[0], str)) or depth:
            raise PayloadError(
                "bad_input", f"model config ({arch}): {_qualified('architectures', where)} does not name the "
                             f"language model ({rule.source} builds the one it names)")
        inner_rule, _, _, _ = _select_rule(inner[0], mc, depth + 1)
        return inner_rule, mc, where, f"{arch} ({inner[0]})"
    return rule, mc, where, arch


def _shared_count(f: Fusion, mc: dict, cfg: dict, inter: int) -> tuple[int, int | None]:
    """(shared-expert count, shared-expert size or None) per the fusion rule's count_rule."""
    n = next((v for v in (_lookup(c, mc, cfg) for c in f.count) if v is not _MISSING), None)
    size = _lookup(f.size, mc, cfg) if f.size else _MISSING
    size = None if size is _MISSING else size
    if f.count_rule == "qwen":  # models/qwen2_moe.py:125 get_num_shared_experts
        count = n if n is not None else (1 if isinstance(size, int) and size > 0 else 0)
    elif f.count_rule == "bailing":  # models/bailing_moe_v3.py:424 _get_bailing_num_shared_experts
        if size is None:
            count = n or 0
            size = inter * count
        else:
            count = max(1, n or 0) if size > 0 else 0
    else:
        count = n or 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise PayloadError("bad_input", f"shared-expert count {count!r} is not a non-negative integer")
    return count, size if isinstance(size, int) else None


def _fusion(f: Fusion, *, count: int, size: int | None, routed: int, inter: int, n_rank: int,
            moe_arch: str | None, ep: int, deepep: bool, capability: tuple[int, int] | None,
            quant: dict, disabled: bool) -> tuple[int, str]:
    """Shared experts fused into the routed GEMM (0 or ``count``) and why.

    Raises PayloadError('bad_input') where SGLang refuses to load (``one="error"``).
    """
    if count <= 0:
        return 0, "no shared expert in the config: nothing to fuse"
    if disabled:
        return 0, "--disable-shared-experts-fusion: the shared expert runs as a separate MLP"
    if f.arch is not None and moe_arch != f.arch:
        return 0, (f"shared-expert fusion off: SGLang's gate ({f.gate}) fuses only when architectures[0] is "
                   f"{f.arch}, not {moe_arch!r} (--enforce-shared-experts-fusion overrides)")
    if f.routed_in is not None and routed not in f.routed_in:
        return 0, f"shared-expert fusion off: {routed} routed experts is not in SGLang's allow-list {f.routed_in}"
    if f.same_size and size != inter:
        return 0, f"shared-expert fusion off: shared expert size {size!r} differs from the routed {inter}"
    if count != 1 and f.one == "off":
        return 0, f"shared-expert fusion off: {count} shared experts (SGLang fuses exactly one)"
    if ep > 1 and f.ep_off:
        return 0, "expert parallelism: shared-expert fusion off on NVIDIA"
    if deepep and f.deepep_off:
        return 0, "DeepEP all-to-all backend: shared-expert fusion off"
    if capability is not None and tuple(capability) < (8, 0) and f.sm80:
        return 0, f"compute capability {tuple(capability)}: shared-expert fusion needs sm80+"
    if quant.get("method") in f.quant_off:
        return 0, f"{quant['method']} quantization: shared-expert fusion off"
    if f.block_divides and quant.get("block") and any(n_rank % b for b in quant["block"]):
        return 0, f"block-FP8 {quant['block']} does not divide the per-rank N {n_rank}: shared-expert fusion off"
    if count != 1 and f.one == "error":
        raise PayloadError(
            "bad_input",
            f"{count} shared experts: SGLang 0.5.23 fuses exactly one for this architecture and refuses to load "
            f"with more ({f.gate}); serve it with --disable-shared-experts-fusion")
    return count, (f"shared expert fused into the routed GEMM (E + {count}, runtime top-k + {count}; {f.gate}); "
                   "off with --disable-shared-experts-fusion or the flashinfer_trtllm/cutedsl/LoRA MoE runners")


def _architecture(cfg: dict) -> str:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]:
        return archs[0]
    raise PayloadError(
        "bad_input",
        "model config has no architectures list: SGLang (and orch) pick the model code by architectures[0]")


def moe_shape(
    cfg: dict,
    tp: int = 1,
    ep: int = 1,
    quantization: str | None = None,
    dtype: str | None = None,
    disable_shared_experts_fusion: bool = False,
    *,
    capability: tuple[int, int] | None = None,
    deepep: bool = False,
) -> MoeShape:
    """The per-rank MoE shape and name selectors of a model served by SGLang 0.5.23.

    ``cfg``: a config.json dict. ``tp``/``ep``: the server's ``--tp-size``/``--ep-size``
    (moe_tp = tp / ep). ``quantization``: the server's ``--quantization`` (None: from the
    checkpoint's ``quantization_config``). ``dtype``: the server's ``--dtype`` (None/``auto``:
    from the config). ``disable_shared_experts_fusion``: the server flag. ``capability``: the
    GPU's CUDA capability when known (most fusion gates need sm80+). ``deepep``: a DeepEP-class
    all-to-all MoE backend.

    The architecture (``architectures[0]``) picks a rule of :data:`~remote.engines.sglang.architectures.ARCHITECTURES`: which fields
    hold the routed-expert count, the expert intermediate size and top-k, where they sit, and when
    the shared expert is fused. E = experts // ep (+ the fused shared experts); N = expert
    intermediate size / (tp / ep), as ``E, _, N = w2.shape`` (SGLang
    ``try_get_optimal_moe_config``, layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py:284);
    int4_w4a16 halves N (packed). Block FP8 needs N % block_n == 0 (SGLang ``fp8.py``).

    Raises PayloadError('bad_input') for an architecture not in the table (naming it), a
    config without the fields its rule reads (naming them), a non-MoE config, a bad or
    non-dividing TP/EP, an unsupported quantization, or block-FP8 with N not a multiple of the
    block.
    """
    if not isinstance(cfg, dict):
        raise PayloadError("bad_input", "model config is not an object")
    tp = _pos_int(tp, "--tp")
    ep = _pos_int(ep, "--ep")
    notes: list[str] = []
    arch, rule, mc, where = _model_rule(cfg, notes)
    d = _expert_dims(rule, mc, cfg, where, arch)
    moe_tp, local = _rank_split(rule, d, tp, ep, arch, notes)
    q = _layer_quant(rule, mc, cfg, quantization, arch, notes)
    act = activation_dtype(mc, cfg, dtype, notes)
    selector = q["selector"]
    if selector is None and act == "float32":
        selector = "float32"
    n_rank = d.inter // moe_tp
    if q["group_size"] and q["method"] == "moe_wna16":
        q = dict(q, group_size=wna16_group_size(q["group_size"], n_rank, d.hidden))
    _check_block(q, n_rank, d, tp, ep)
    fused = _fused_shared(rule, mc, cfg, d, n_rank, ep, deepep, capability, q, disable_shared_experts_fusion, notes)
    _rule_notes(rule, mc, cfg, ep, moe_tp, notes)

    return MoeShape(
        E=local + fused,
        N=n_rank // 2 if q["packed"] else n_rank,
        hidden=d.hidden,
        topk=d.topk,
        runtime_topk=d.topk + fused,
        num_experts=d.experts,
        shared_fused=fused > 0,
        dtype_selector=selector,
        block_shape=q["block"],
        per_channel_quant=bool(q["per_channel"]),
        weight_dtype=q["weight_dtype"] or act,
        moe_layers=_moe_layer_count(rule.layers, mc, cfg),
        architecture=arch,
        act_dtype=act,
        intermediate_size=d.inter,
        tp=tp,
        ep=ep,
        quant_method=q["method"],
        notes=notes,
        family=rule.family,
        source=rule.source,
        gated=rule.gated,
        group_size=int(q["group_size"]),
        has_zp=bool(q["has_zp"]),
    )


# --------------------------------------------------------------------------- the steps of moe_shape

@dataclass(frozen=True)
class _Dims:
    """The expert dimensions a rule reads: ``experts`` (routed, global) and ``inter`` (the expert
    intermediate size, gate+up halved where the field holds both) with the config fields they came
    from (``efield``, ``ifield``), ``hidden`` and ``topk``."""

    experts: int
    efield: str
    inter: int
    ifield: str
    hidden: int
    topk: int


def _model_rule(cfg: dict, notes: list[str]) -> tuple[str, ArchRule, dict, str]:
    """``(architecture, rule, the config holding the MoE fields, where it sits)``: the rule of
    ``architectures[0]`` (:func:`_select_rule`; a multimodal model's language model named in
    ``notes``). Raises PayloadError for an architecture the table refuses and for one whose rule is
    off in this config (dense MLPs) or that names no routed experts."""
    arch = _architecture(cfg)
    rule, mc, where, label = _select_rule(arch, cfg)
    if label != arch:
        notes.append(f"language model: {label[len(arch) + 2:-1]} ({_qualified('architectures', where)})")
    if rule.refuse:
        raise PayloadError("bad_input", f"model config ({arch}): {rule.refuse}")
    if rule.enabled_by and not _lookup(rule.enabled_by, mc, cfg) is True:
        raise PayloadError(
            "bad_input", f"model config ({arch}) is not an MoE model: {_qualified(rule.enabled_by, where)} is not "
                         f"true, so SGLang builds dense MLPs ({rule.source})")
    raw = next((v for v in (_lookup(s, mc, cfg) for s in rule.experts) if v is not _MISSING), _MISSING)
    if raw is _MISSING or raw == 0:
        raise PayloadError(
            "bad_input", f"model config ({arch}) is not an MoE model: none of "
                         f"{', '.join(_qualified(s, where) for s in rule.experts)} is set")
    return arch, rule, mc, where


def _expert_dims(rule: ArchRule, mc: dict, cfg: dict, where: str, arch: str) -> _Dims:
    """The routed-expert count, expert intermediate size, hidden size and top-k the rule reads
    (:func:`_field`). Raises PayloadError naming a missing or bad field, or an odd gate+up size."""
    efield, experts = _field(rule.experts, mc, cfg, where, arch, "routed-expert count")
    ifield, inter = _field(rule.intermediate, mc, cfg, where, arch, "expert intermediate size")
    if inter % rule.intermediate_div:
        raise PayloadError("bad_input", f"model config ({arch}): {ifield} {inter} is odd; it holds gate + up")
    inter //= rule.intermediate_div
    _, hidden = _field(rule.hidden, mc, cfg, where, arch, "hidden size")
    _, topk = _field(rule.topk, mc, cfg, where, arch, "top-k", default=rule.topk_default)
    return _Dims(experts, efield, inter, ifield, hidden, topk)


def _rank_split(rule: ArchRule, d: _Dims, tp: int, ep: int, arch: str, notes: list[str]) -> tuple[int, int]:
    """``(moe_tp, experts on one rank)``: moe_tp = tp / ep and experts // ep where the rule splits
    experts by EP, else TP over every expert (``notes`` says --ep does nothing). Raises
    PayloadError for an EP that does not divide TP or the experts, a rule that runs only at MoE-TP
    1, or an intermediate size moe_tp does not divide."""
    if tp % ep:
        raise PayloadError("bad_input", f"--ep {ep} does not divide --tp {tp} (SGLang needs moe_tp = tp / ep)")
    if rule.expert_parallel:
        moe_tp, local = tp // ep, d.experts // ep
        if d.experts % ep:
            raise PayloadError("bad_input", f"{d.efield} {d.experts} is not divisible by --ep {ep}")
    else:
        moe_tp, local = tp, d.experts
        if ep > 1:
            notes.append(f"--ep {ep} does not split this architecture's experts: N = size / TP {tp}")
    if rule.moe_tp1 and moe_tp != 1:
        raise PayloadError(
            "bad_input", f"model config ({arch}): SGLang runs these experts only with MoE-TP 1 ({rule.source}); "
                         f"serve with --ep-size equal to --tp-size (tp/ep is {moe_tp})")
    if d.inter % moe_tp:
        raise PayloadError("bad_input",
                           f"{d.ifield} {d.inter} is not divisible by tp/ep = {moe_tp} (TP {tp}, EP {ep})")
    return moe_tp, local


def _layer_quant(rule: ArchRule, mc: dict, cfg: dict, quantization: str | None, arch: str,
                 notes: list[str]) -> dict:
    """The MoE layers' quantization (:func:`remote.engines.sglang.quantization.quant_rule` of the
    checkpoint's ``quantization_config`` and ``--quantization``), unquantized where the checkpoint
    excludes every layer's experts (the partly excluded layers named in ``notes``). Raises
    PayloadError for a quantized checkpoint of a rule that runs its experts unquantized."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        qc = mc.get("quantization_config") if isinstance(mc.get("quantization_config"), dict) else None
    q = quant_rule(qc, quantization, notes)
    n_layers = _lookup("num_hidden_layers", mc, cfg)
    if q["method"] and isinstance(n_layers, int) and n_layers > 0:
        # the checkpoint's exclusions (ignore / modules_to_not_convert ...): such MoE layers run unquantized
        off = [i for i in range(n_layers)
               if any(moe_layer_excluded(qc, q["method"], f"model.layers.{i}.{m}.experts")
                      for m in ("mlp", "block_sparse_moe"))]
        if off and len(off) == n_layers:
            notes.append(f"quantization_config excludes every layer's experts: they run unquantized "
                         f"({q['method']} checkpoint, 16-bit MoE file names)")
            q = dict(method=None, selector=None, block=None, per_channel=False, weight_dtype=None, packed=False,
                     group_size=0, has_zp=False)
        elif off:
            notes.append(f"quantization_config excludes the experts of layers {off}: those run unquantized and read "
                         f"the 16-bit file name; orch names the quantized layers' file")
    if not rule.quantized and q["method"]:
        raise PayloadError(
            "bad_input", f"model config ({arch}): SGLang runs these experts through fused_moe without quantization "
                         f"({rule.source}); a {q['method']} checkpoint is not something orch can name")
    return q


def _check_block(q: dict, n_rank: int, d: _Dims, tp: int, ep: int) -> None:
    """Block-FP8 weights need the per-rank intermediate size ``n_rank`` to be a multiple of the
    block's N (SGLang fp8.py refuses to load otherwise): PayloadError naming both."""
    if q["block"]:
        bn = q["block"][0]
        if n_rank % bn:
            raise PayloadError(
                "bad_input",
                f"block-FP8 weights need the per-rank intermediate size to be a multiple of {bn}: "
                f"{d.ifield} {d.inter} / (TP {tp} / EP {ep}) = {n_rank} is not (SGLang fp8.py refuses to load; use a "
                f"smaller TP or EP)")


def _fused_shared(rule: ArchRule, mc: dict, cfg: dict, d: _Dims, n_rank: int, ep: int, deepep: bool,
                  capability: tuple[int, int] | None, q: dict, disabled: bool, notes: list[str]) -> int:
    """How many shared experts run inside the routed GEMM (added to E and to the runtime top-k):
    the rule's :class:`~remote.engines.sglang.architectures.Fusion` decided by :func:`_fusion`,
    its reason in ``notes``; 0 for a rule without one."""
    if rule.fusion is None:
        return 0
    count, size = _shared_count(rule.fusion, mc, cfg, d.inter)
    moe_archs = mc.get("architectures") if mc is not cfg else cfg.get("architectures")
    moe_arch = moe_archs[0] if isinstance(moe_archs, list) and moe_archs else None
    fused, why = _fusion(rule.fusion, count=count, size=size, routed=d.experts, inter=d.inter, n_rank=n_rank,
                         moe_arch=moe_arch, ep=ep, deepep=deepep, capability=capability, quant=q, disabled=disabled)
    notes.append(why)
    return fused


def _rule_notes(rule: ArchRule, mc: dict, cfg: dict, ep: int, moe_tp: int, notes: list[str]) -> None:
    """The rule's own caveats in ``notes``: a second expert group (files of its own), non-gated
    experts, and the notes the table keeps for it."""
    if rule.second is not None:
        e2 = _lookup(rule.second[0], mc, cfg)
        i2 = _lookup(rule.second[1], mc, cfg)
        if isinstance(e2, int) and isinstance(i2, int) and e2 % ep == 0 and i2 % moe_tp == 0:
            notes.append(f"{rule.second[2]}: E={e2 // ep},N={i2 // moe_tp} (files of their own; orch names the "
                         f"first expert group)")
    if not rule.gated:
        notes.append("non-gated experts: w1 is [E, N, K], not [E, 2N, K]")
    notes.extend(rule.notes)
