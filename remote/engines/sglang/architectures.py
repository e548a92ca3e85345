"""SGLang 0.5.23's fused-MoE architectures, as data (stdlib only).

What SGLang 0.5.23 builds for each architecture. Each :class:`ArchRule` names the config fields
the model code reads (first present wins), where the MoE's config sits, whether the shared expert
runs as extra slots of the routed GEMM (:class:`Fusion`) and the SGLang file:line it comes from
(paths relative to ``sglang/srt/``). :func:`remote.engines.sglang.shape.moe_shape` interprets the table;
:func:`scripts.sglang_docs.architecture_table_markdown` renders it for docs/sglang-models.md. Read
it beside those files, not as a copy of them; the oracle tests
(``tests/unit/remote/engines/sglang/test_model.py``) hold it against the real 0.5.23 source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Fusion:
    """When SGLang 0.5.23 runs the shared expert(s) as extra slots of the routed fused-MoE GEMM.

    SGLang asks the model class's ``shared_experts_fusion_disable_reason`` and
    ``num_fusable_shared_experts`` hooks once, before the model is built
    (``resolve_shared_experts_config``, layers/moe/utils.py:600); Qwen-style blocks decide inside
    ``Qwen2MoeSparseMoeBlock`` (models/qwen2_moe.py:282). With fusion on, the MoE weights hold
    ``experts // ep + count`` experts on each rank (layers/moe/fused_moe_triton/layer.py:399-416)
    and the kernel runs top-k + count.

    ``gate``: SGLang file:line of the rule. ``count``: fields giving the shared-expert count,
    first present. ``count_rule``: ``"field"`` (that count; absent = 0), ``"qwen"``
    (``get_num_shared_experts``: the count, else 1 when the ``size`` field is > 0) or
    ``"bailing"`` (``_get_bailing_num_shared_experts``: with a ``size`` field, max(1, count) when it
    is > 0, else 0). ``size``: field of the shared expert's intermediate size. ``same_size``: fused
    only when that size equals the routed experts' (``qwen``: an absent size means no fusion;
    ``bailing``: an absent size counts as intermediate * count). ``arch``: ``architectures[0]`` of
    the config the MoE reads must be this name. ``routed_in``: allowed routed-expert counts.
    ``one``: what a count other than 1 does: ``"off"`` (no fusion), ``"error"`` (SGLang refuses to
    load the model), ``"any"`` (all of them fused). ``sm80``: needs compute capability 8.0+.
    ``ep_off``: expert parallelism (--ep-size > 1) turns it off. ``deepep_off``: a DeepEP-class
    all-to-all backend turns it off. ``quant_off``: quantization methods that turn it off.
    ``block_divides``: with block FP8 the per-rank N must be a multiple of the block's n and k.
    """

    gate: str
    count: tuple[str, ...] = ("n_shared_experts",)
    count_rule: str = "field"
    size: str | None = None
    same_size: bool = False
    arch: str | None = None
    routed_in: tuple[int, ...] | None = None
    one: str = "any"
    sm80: bool = True
    ep_off: bool = True
    deepep_off: bool = True
    quant_off: tuple[str, ...] = ()
    block_divides: bool = False


@dataclass(frozen=True)
class ArchRule:
    """How SGLang 0.5.23 builds the fused MoE of one architecture family.

    ``family``: display name. ``archs``: the ``architectures[0]`` names (SGLang ``EntryClass``).
    ``source``: SGLang file:line that builds the experts. ``config_at``: where the MoE's fields sit
    in config.json (``""`` top level, else the sub-config key path); SGLang finds it with
    ``get_hf_text_config`` (utils/hf_transformers/common.py:547, order thinker_config >
    llm_config > language_config > text_config) and also copies the text config's fields onto the
    top level (utils/hf_transformers/config.py:258), so a field is read from the sub-config first,
    then from the top level. ``experts``/``intermediate``/``topk``/``hidden``: field names, first
    present wins (later names: aliases the config class's ``attribute_map`` maps onto the first);
    ``a.b`` is a nested key, ``a[i]`` a list element; a per-layer list must hold one value.
    ``intermediate_div``: the field holds a multiple
    of the per-expert size (Zaya: gate+up). ``topk_default``: SGLang's default when no top-k
    field is set. ``expert_parallel``: False when each expert is a TP-sharded MLP packed into one
    tensor on every rank (E = all experts, N = size / TP; --ep-size has no effect).
    ``quantized``: False when SGLang calls ``fused_moe`` without quantization flags.
    ``moe_tp1``: the experts need MoE-TP 1 (--ep-size equal to --tp-size). ``gated``: w1 is
    ``[E, 2N, K]`` (gate and up); False: ``[E, N, K]``. ``fusion``: shared-expert fusion rule, None
    when the shared expert (if any) is a separate MLP. ``enabled_by``: a boolean field that must be
    true for the layers to be MoE. ``layers``: rule counting MoE layers (see ``_moe_layer_count``).
    ``when``: ``(field, value)``: the rule applies only when that field of the MoE config equals
    the value (branches of one architecture). ``delegate``: the MoE config's own
    ``architectures[0]`` names the language model whose rule applies. ``second``: ``(experts,
    intermediate, label)`` of a second expert group with files of its own. ``refuse``: SGLang builds
    a fused MoE but orch cannot name one shape for it (the reason). ``notes``: caveats copied
    into :attr:`MoeShape.notes`.
    """

    family: str
    archs: tuple[str, ...]
    source: str
    config_at: str = ""
    experts: tuple[str, ...] = ()
    intermediate: tuple[str, ...] = ()
    topk: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ("hidden_size",)
    intermediate_div: int = 1
    topk_default: int | None = None
    expert_parallel: bool = True
    quantized: bool = True
    moe_tp1: bool = False
    gated: bool = True
    fusion: Fusion | None = None
    enabled_by: str | None = None
    layers: str | None = "all"
    when: tuple[str, Any] | None = None
    delegate: bool = False
    second: tuple[str, str, str] | None = None
    refuse: str | None = None
    notes: tuple[str, ...] = ()


# Shared-expert fusion gates (SGLang 0.5.23).
_DEEPSEEK_V3_GATE = Fusion(
    gate="models/deepseek_v2.py:3325", arch="DeepseekV3ForCausalLM", routed_in=(256,), one="off",
    quant_off=("w4afp8",))
_GLM_DSA_GATE = Fusion(
    gate="models/deepseek_v2.py:3325 (fused_shared_experts_architecture, models/glm4_moe.py:1285)",
    arch="GlmMoeDsaForCausalLM", routed_in=(256,), one="off", quant_off=("w4afp8",))
_GLM4_MOE_GATE = Fusion(gate="models/glm4_moe.py:1012", quant_off=("w4afp8",))
_GLM4_MOE_LITE_GATE = Fusion(gate="models/glm4_moe_lite.py:732", arch="Glm4MoeLiteForCausalLM", one="off",
                             deepep_off=False)
_GLM4V_MOE_GATE = Fusion(gate="models/glm4v_moe.py:87", one="error")
_GLM5_NEXT_GATE = Fusion(gate="models/glm5_next.py:1352", one="off")
_MINIMAX_M3_GATE = Fusion(gate="models/minimax_m3.py:2023", one="error",
                          quant_off=("modelopt_mixed", "minimax_m3_nvfp4"))
_MINIMAX_M3_VL_GATE = Fusion(gate="models/minimax_m3_vl.py:166", one="error",
                             quant_off=("modelopt_mixed", "minimax_m3_nvfp4"))
_DOTS3_GATE = Fusion(gate="models/dots3_common/modeling.py:1628", arch="Dots3NoteForCausalLM", routed_in=(256,),
                     one="off", deepep_off=False, quant_off=("w4afp8",))
_QWEN3_NEXT_GATE = Fusion(
    gate="models/qwen2_moe.py:137,282 (enable_cuda_shared_expert_fusion=True, models/qwen3_next.py:557)",
    count_rule="qwen", size="shared_expert_intermediate_size", same_size=True, one="error", sm80=False,
    ep_off=False)
_BAILING_V3_GATE = Fusion(
    gate="models/bailing_moe_v3.py:1429", count=("num_shared_experts",), count_rule="bailing",
    size="moe_shared_expert_intermediate_size", same_size=True, arch="BailingMoeV3ForCausalLM", one="error",
    ep_off=False, quant_off=("w4afp8",), block_divides=True)

_DS_FIELDS = dict(experts=("n_routed_experts",), intermediate=("moe_intermediate_size",),
                  topk=("num_experts_per_tok",))
_QWEN_FIELDS = dict(experts=("num_experts",), intermediate=("moe_intermediate_size",),
                    topk=("num_experts_per_tok",))
#: transformers 5.19's Qwen3-MoE-style classes store the count as num_local_experts (attribute_map)
_QWEN3_FIELDS = dict(_QWEN_FIELDS, experts=("num_experts", "num_local_experts"))
_MIXTRAL_FIELDS = dict(experts=("num_local_experts",), intermediate=("intermediate_size",),
                       topk=("num_experts_per_tok",))
_NOT_V3 = ("SGLang's DeepSeek gate fuses the shared expert only when architectures[0] is "
           "DeepseekV3ForCausalLM (models/deepseek_v2.py:3358), unless --enforce-shared-experts-fusion",)
_PACKED = ("experts are TP-sharded MLPs packed into one tensor on every rank: --ep-size has no effect",)

#: Every architecture of SGLang 0.5.23 that builds a fused MoE (FusedMoE, get_moe_impl_class or a
#: direct fused_moe call), from ``sglang/srt/models/*.py``. Speculative-decoding drafts
#: (``*NextN``, ``*MTP``, DFlash/EAGLE heads) are left out: they are built from the target's config.
ARCHITECTURES: tuple[ArchRule, ...] = (
    # ---- DeepSeek MoE (DeepseekV2MoE) and the models that reuse it
    ArchRule("DeepSeek-V3 / R1, Kimi-K2", ("DeepseekV3ForCausalLM",), "models/deepseek_v2.py:753",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_DEEPSEEK_V3_GATE, layers="first_k_dense",
             notes=("384 routed experts (Kimi-K2.5) fuse only for a Quark MXFP4 checkpoint "
                    "(models/deepseek_v2.py:3359), which orch does not name",)),
    ArchRule("DeepSeek-V2 / V3.2, Mistral Large 3", ("DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM",
                                                    "MistralLarge3ForCausalLM"),
             "models/deepseek_v2.py:753", **_DS_FIELDS, layers="first_k_dense", notes=_NOT_V3),
    ArchRule("GLM-5 (GLM MoE DSA)", ("GlmMoeDsaForCausalLM",), "models/deepseek_v2.py:753",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM_DSA_GATE, layers="first_k_dense"),
    ArchRule("GLM-5-Next", ("Glm5NextForConditionalGeneration",),
             "models/glm5_next.py:748 -> models/deepseek_v2.py:753",
             config_at="text_config", **_DS_FIELDS, fusion=_GLM5_NEXT_GATE, layers="first_k_dense"),
    ArchRule("DeepSeek-V4", ("DeepseekV4ForCausalLM",),
             "models/deepseek_v4.py:3155 -> models/deepseek_v2.py:753 (DeepseekV2MoE)", **_DS_FIELDS,
             layers="first_k_dense",
             notes=("SGLang fuses DeepSeek-V4's shared expert only with --enforce-shared-experts-fusion "
                    "(models/deepseek_v4.py:4864)",)),
    ArchRule("Hunyuan V4", ("HYV4ForCausalLM",),
             "models/hunyuan_v4.py:625 -> models/deepseek_v2.py:753 (DeepseekV2MoE); configs/hy_v4.py:7",
             experts=("n_routed_experts", "num_local_experts"), intermediate=("moe_intermediate_size",),
             topk=("num_experts_per_tok",), layers="first_k_dense",
             notes=("fusion always off: the SwiGLU limit applies to routed experts only (models/hunyuan_v4.py:741)",)),
    ArchRule("GigaChat 3.5", ("GigaChat35ForCausalLM",),
             "models/gigachat35.py:350 -> models/deepseek_v2.py:753 (DeepseekV2MoE)", **_DS_FIELDS,
             layers="first_k_dense",
             notes=("SGLang forces --disable-shared-experts-fusion for it "
                    "(arg_groups/model_overrides/gigachat35.py:17)",)),
    ArchRule("Kimi-K2.5 (vision)", ("KimiK25ForConditionalGeneration",), "models/deepseek_v2.py:753",
             config_at="text_config", **_DS_FIELDS,
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/kimi_k25.py:653 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense",
             notes=("384 routed experts fuse only for a Quark MXFP4 checkpoint, which orch does not name",)),
    ArchRule("Kimi-VL", ("KimiVLForConditionalGeneration",), "models/deepseek_v2.py:753", config_at="text_config",
             **_DS_FIELDS, layers="first_k_dense",
             notes=("the text config is renamed DeepseekV2ForCausalLM before the DeepSeek gate "
                    "(models/kimi_vl.py:119): no fusion",)),
    ArchRule("dots.vlm1", ("DotsVLMForCausalLM",), "models/deepseek_v2.py:753", config_at="language_config",
             **_DS_FIELDS,
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/dots_vlm.py:50 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("Pixtral (Mistral Large 3 text)", ("PixtralForConditionalGeneration",), "models/deepseek_v2.py:753",
             config_at="text_config", **_DS_FIELDS, when=("model_type", "deepseek_v3"),
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/pixtral.py:83 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("DeepSeek-VL2", ("DeepseekVL2ForCausalLM",), "models/deepseek_vl2.py:217 -> models/deepseek_v2.py:753",
             config_at="language_config", **_DS_FIELDS, when=("use_mla", True),
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/deepseek_vl2.py:167 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("DeepSeek-VL2 (no MLA)", ("DeepseekVL2ForCausalLM",),
             "models/deepseek_vl2.py:220 -> models/deepseek.py:215",
             config_at="language_config", **_DS_FIELDS, expert_parallel=False, quantized=False,
             layers="first_k_dense", notes=_PACKED),
    ArchRule("DeepSeek-OCR (noaux_tc)", ("DeepseekOCRForCausalLM",),
             "models/deepseek_ocr.py:1485 -> models/deepseek_v2.py:753",
             config_at="language_config", **_DS_FIELDS, when=("topk_method", "noaux_tc"),
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/deepseek_ocr.py:1436 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("DeepSeek-OCR (no MLA)", ("DeepseekOCRForCausalLM",),
             "models/deepseek_ocr.py:1491 -> models/deepseek.py:215",
             config_at="language_config", **_DS_FIELDS, when=("use_mla", False), expert_parallel=False,
             quantized=False, layers="first_k_dense", notes=_PACKED),
    ArchRule("DeepSeek-OCR (MLA)", ("DeepseekOCRForCausalLM",),
             "models/deepseek_ocr.py:1497 -> models/deepseek_v2.py:753",
             config_at="language_config", **_DS_FIELDS, layers="first_k_dense"),
    ArchRule("DeepSeek-MoE (V1)", ("DeepseekForCausalLM",), "models/deepseek.py:215 (fused_moe)", **_DS_FIELDS,
             expert_parallel=False, quantized=False, layers="first_k_dense", notes=_PACKED),
    ArchRule("dots.llm3 (Dots3 Note)", ("Dots3NoteForCausalLM",), "models/dots3_common/modeling.py:299", **_DS_FIELDS,
             fusion=_DOTS3_GATE, layers="first_k_dense"),
    ArchRule("LongCat-Flash", ("LongcatFlashForCausalLM",), "models/longcat_flash.py:300",
             experts=("n_routed_experts",), intermediate=("expert_ffn_hidden_size",), topk=("moe_topk",),
             notes=("SGLang's LongcatFlashConfig reads the expert size from expert_ffn_hidden_size "
                    "(configs/longcat_flash.py:87); zero experts are not GEMM experts",)),
    ArchRule("MiMo-V2", ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM"), "models/mimo_v2.py:452",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             layers="freq_list"),
    # ---- GLM-4 MoE
    ArchRule("GLM-4.5 / 4.6 / 4.7 (GLM-4 MoE)", ("Glm4MoeForCausalLM",), "models/glm4_moe.py:436",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM4_MOE_GATE, layers="first_k_dense"),
    ArchRule("GLM-4.5V (GLM-4 MoE vision)", ("Glm4vMoeForConditionalGeneration",), "models/glm4_moe.py:436",
             config_at="text_config", **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM4V_MOE_GATE, layers="first_k_dense"),
    ArchRule("GLM-4 MoE Lite", ("Glm4MoeLiteForCausalLM",), "models/glm4_moe_lite.py:209",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM4_MOE_LITE_GATE, layers="first_k_dense"),
    # ---- Qwen MoE
    ArchRule("Qwen2-MoE / Qwen1.5-MoE", ("Qwen2MoeForCausalLM",), "models/qwen2_moe.py:318", **_QWEN_FIELDS,
             layers="qwen_sparse",
             notes=("the shared expert stays a separate MLP on CUDA (fusion only with ROCm aiter)",)),
    ArchRule("Qwen3-MoE", ("Qwen3MoeForCausalLM",), "models/qwen3_moe.py:265", **_QWEN3_FIELDS, layers="qwen_sparse"),
    ArchRule("Mellum", ("MellumForCausalLM",), "models/mellum.py:413 -> models/qwen3_moe.py:265", **_QWEN3_FIELDS,
             layers="mlp_layer_types"),
    ArchRule("Qwen3-VL-MoE, Intern-S1-Pro",
             ("Qwen3VLMoeForConditionalGeneration", "InternS1ProForConditionalGeneration"),
             "models/qwen3_moe.py:265", config_at="text_config", **_QWEN3_FIELDS, layers="qwen_sparse"),
    ArchRule("Qwen3-Omni-MoE (thinker)", ("Qwen3OmniMoeForConditionalGeneration",), "models/qwen3_moe.py:265",
             config_at="thinker_config.text_config", **_QWEN3_FIELDS, layers="qwen_sparse",
             notes=("SGLang serves the thinker only (models/qwen3_omni_moe.py:551)",)),
    ArchRule("Qwen3-Next", ("Qwen3NextForCausalLM",), "models/qwen2_moe.py:318", **_QWEN_FIELDS,
             fusion=_QWEN3_NEXT_GATE),
    ArchRule("Qwen3.5-MoE and its VLMs", ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                                         "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM",
                                         "InternS2PreviewForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
                                         "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration"),
             "models/qwen3_5.py:1148 -> models/qwen2_moe.py:318", config_at="text_config", **_QWEN_FIELDS,
             notes=("the shared expert stays a separate MLP on CUDA: qwen3_5.py never sets "
                    "enable_cuda_shared_expert_fusion; dense variants carry no num_experts",)),
    ArchRule("Intern-S2 Mobius", ("InternS2MobiusForConditionalGeneration",), "models/interns2_mobius.py:329",
             config_at="text_config", **_QWEN_FIELDS),
    # ---- Mixtral-style (num_local_experts / intermediate_size)
    ArchRule("Mixtral", ("MixtralForCausalLM",), "models/mixtral.py:100",
             **_MIXTRAL_FIELDS | dict(experts=("num_local_experts", "num_experts"))),
    ArchRule("Phi-3.5-MoE", ("PhiMoEForCausalLM",), "models/phimoe.py:208", **_MIXTRAL_FIELDS),
    ArchRule("Granite MoE", ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM", "GraniteMoeSWAForCausalLM",
                             "GraniteMoeHybridForCausalLM"),
             "models/granitemoe.py:142", **_MIXTRAL_FIELDS, layers=None,
             notes=("GraniteMoeShared's shared MLP is separate; hybrid variants without experts are dense",)),
    ArchRule("Grok-1", ("Grok1ForCausalLM", "Grok1ModelForCausalLM"), "models/grok.py:509",
             experts=("num_local_experts",), intermediate=("moe_intermediate_size", "intermediate_size"),
             topk=("num_experts_per_tok",)),
    ArchRule("gpt-oss", ("GptOssForCausalLM",), "models/gpt_oss.py:240",
             **_MIXTRAL_FIELDS | dict(experts=("num_local_experts", "num_experts"))),
    ArchRule("MiniMax-M2", ("MiniMaxM2ForCausalLM",), "models/minimax_m2.py:536",
             **_MIXTRAL_FIELDS | dict(experts=("num_local_experts", "num_experts"))),
    ArchRule("MiniMax-M3", ("MiniMaxM3SparseForCausalLM",), "models/minimax_m3.py:422", **_MIXTRAL_FIELDS,
             fusion=_MINIMAX_M3_GATE, layers=None),
    ArchRule("MiniMax-M3 (vision)", ("MiniMaxM3SparseForConditionalGeneration",), "models/minimax_m3.py:422",
             config_at="text_config", **_MIXTRAL_FIELDS, fusion=_MINIMAX_M3_VL_GATE, layers=None),
    ArchRule("Llama 4", ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"), "models/llama4.py:120",
             config_at="text_config", **_MIXTRAL_FIELDS, layers="interleave",
             notes=("the shared expert is a separate MLP (models/llama4.py:136): no E+1",)),
    ArchRule("Muse Spark", ("MuseSparkForConditionalGeneration",), "models/muse_spark.py:602",
             config_at="text_config", experts=("num_local_experts",), intermediate=("moe_intermediate_size",),
             topk=("num_experts_per_tok",), hidden=("moe_hidden_size",), moe_tp1=True, layers=None,
             notes=("bf16 experts run SGLang's Triton fused MoE only off SM10x; on SM10x FlashInfer TRT-LLM runs "
                    "them (layers/muse_spark/muse_spark_bf16_moe.py:191)",)),
    # ---- own field names
    ArchRule("Gemma 4", ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"), "models/gemma4_causal.py:287",
             config_at="text_config", experts=("num_experts",), intermediate=("moe_intermediate_size",),
             topk=("top_k_experts",), enabled_by="enable_moe_block"),
    ArchRule("ERNIE 4.5 MoE", ("Ernie4_5_MoeForCausalLM",), "models/ernie4.py:104",
             experts=("moe_num_experts", "num_experts"), intermediate=("moe_intermediate_size",),
             topk=("moe_k", "num_experts_per_tok"), layers="ernie_range",
             notes=("the shared experts are a separate MLP (models/ernie4.py:115): no E+1",)),
    ArchRule("ERNIE 4.5 VL MoE", ("Ernie4_5_VLMoeForConditionalGeneration",), "models/ernie45_moe_vl.py:218",
             experts=("moe_num_experts[0]",), intermediate=("moe_intermediate_size[0]",), topk=("moe_k",),
             second=("moe_num_experts[1]", "moe_intermediate_size[1]", "vision experts (models/ernie45_moe_vl.py:251)"),
             layers=None),
    ArchRule("DBRX", ("DbrxForCausalLM",), "models/dbrx.py:190 (fused_moe)",
             experts=("ffn_config.moe_num_experts",), intermediate=("ffn_config.ffn_hidden_size",),
             topk=("ffn_config.moe_top_k",), hidden=("d_model",), expert_parallel=False, quantized=False,
             notes=("every rank holds all experts (models/dbrx.py:110): --ep-size has no effect",)),
    ArchRule("Hunyuan MoE V1 (Hunyuan-A13B)", ("HunYuanMoEV1ForCausalLM",), "models/hunyuan.py:156",
             experts=("num_experts", "num_local_experts"), intermediate=("moe_intermediate_size", "intermediate_size"),
             topk=("moe_topk", "num_experts_per_tok"),
             notes=("moe_topk and moe_intermediate_size may be per-layer lists; they must hold one value",)),
    ArchRule("Hunyuan V3", ("HYV3ForCausalLM",), "models/hunyuan_v3.py:145", **_QWEN_FIELDS,
             layers="first_k_dense"),
    ArchRule("Ling / Bailing MoE (V1, V2), Sarvam-M MoE, Ming", ("BailingMoEForCausalLM", "BailingMoeForCausalLM",
                                                                "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM",
                                                                "BailingMMNativeForConditionalGeneration",
                                                                "BailingMM2NativeForConditionalGeneration"),
             "models/bailing_moe.py:312", config_at="llm_config (Ming only)", **_QWEN_FIELDS,
             layers="first_k_dense"),
    ArchRule("Ling V2.5 (linear attention)", ("BailingMoeV2_5ForCausalLM",), "models/bailing_moe_linear.py:302",
             **_QWEN_FIELDS, layers="first_k_dense"),
    ArchRule("Ling V3 (Bailing MoE V3)", ("BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration"),
             "models/bailing_moe_v3.py:568", config_at="text_config (VL only)", **_QWEN_FIELDS,
             fusion=_BAILING_V3_GATE, layers="first_k_dense"),
    ArchRule("Sarvam MLA", ("SarvamMLAForCausalLM",), "models/sarvam_moe.py:277", **_QWEN_FIELDS,
             layers="first_k_dense"),
    ArchRule("Beam", ("BeamForCausalLM",), "models/beam.py:334", **_QWEN_FIELDS, layers=None),
    ArchRule("Cohere2 MoE", ("Cohere2MoeForCausalLM", "Cohere2VisionForConditionalGeneration"),
             "models/cohere2_moe.py:285", config_at="text_config (vision only)", experts=("num_experts",),
             intermediate=("intermediate_size",), topk=("num_experts_per_tok",), layers=None),
    ArchRule("EXAONE MoE", ("ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM"), "models/exaone_moe.py:161",
             **_QWEN_FIELDS, layers="is_moe_layer"),
    ArchRule("Inkling", ("InklingForConditionalGeneration",), "models/inkling_common/moe.py:830",
             config_at="text_config", experts=("n_routed_experts",), intermediate=("intermediate_size",),
             topk=("num_experts_per_tok",), layers=None,
             notes=("shared 'sink' experts, when SGLang runs them as a FusedMoE, are a second expert group "
                    "(E = n_shared_experts, models/inkling_common/moe.py:648) with files of their own",)),
    ArchRule("IQuest Q1", ("IQuestQ1ForCausalLM",), "models/iquest_q1.py:215", experts=("num_experts",),
             intermediate=("intermediate_size",), topk=("num_experts_per_tok",), layers=None),
    ArchRule("Kimi Linear", ("KimiLinearForCausalLM",), "models/kimi_linear.py:115",
             experts=("num_experts",), intermediate=("moe_intermediate_size",),
             topk=("num_experts_per_token", "num_experts_per_tok"), layers="first_k_dense",
             notes=("SGLang's KimiLinearConfig (configs/kimi_linear.py:95) sets n_routed_experts from num_experts",)),
    ArchRule("Kimi K3", ("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM"), "models/kimi_k3.py:503",
             config_at="text_config (vision only)", experts=("num_experts",),
             intermediate=("moe_intermediate_size",), topk=("num_experts_per_token", "num_experts_per_tok"),
             hidden=("routed_expert_hidden_size", "hidden_size"), layers="first_k_dense",
             notes=("Latent MoE: the experts' K is routed_expert_hidden_size when set",)),
    ArchRule("Laguna", ("LagunaForCausalLM",), "models/laguna.py:154", **_QWEN_FIELDS, layers=None),
    ArchRule("LFM2-MoE", ("Lfm2MoeForCausalLM",), "models/lfm2_moe.py:155", **_QWEN_FIELDS, layers="dense_prefix"),
    ArchRule("LLaDA2 MoE", ("LLaDA2MoeModelLM",), "models/llada2.py:672", **_QWEN_FIELDS, layers="first_k_dense"),
    ArchRule("Nemotron-H (MoE)", ("NemotronHForCausalLM", "NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3",
                                  "NemotronH_Omni_Reasoning_V3"),
             "models/nemotron_h.py:276", config_at="llm_config (VL/Omni only)", **_DS_FIELDS,
             hidden=("moe_latent_size", "hidden_size"), gated=False, layers="pattern_E",
             notes=("relu2 experts; with moe_latent_size set the experts' K is that latent size "
                    "(models/nemotron_h.py:260)",)),
    ArchRule("Nemotron-H Puzzle", ("NemotronHPuzzleForCausalLM",), "models/nemotron_h.py:276", **_DS_FIELDS,
             gated=False,
             refuse="per-layer block_configs give each MoE layer its own expert count "
                    "(configs/nemotron_h.py:551): several fused-MoE shapes, not one"),
    ArchRule("OLMoE", ("OlmoeForCausalLM",), "models/olmoe.py:88", experts=("num_experts", "num_local_experts"),
             intermediate=("intermediate_size",), topk=("num_experts_per_tok",)),
    ArchRule("SDAR MoE", ("SDARMoeForCausalLM",), "models/sdar_moe.py:98", **_QWEN_FIELDS, layers="qwen_sparse"),
    ArchRule("Step3-VL", ("Step3VLForConditionalGeneration",), "models/step3_vl.py:139", config_at="text_config",
             experts=("moe_num_experts",), intermediate=("moe_intermediate_size",), topk=("moe_top_k",), layers=None,
             notes=("the shared expert is a separate MLP (num_fused_shared_experts = 0, models/step3_vl.py:301)",)),
    ArchRule("Step 3.5, Step 3.7", ("Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"), "models/step3p5.py:152",
             config_at="text_config (3.7 only)", experts=("moe_num_experts",), intermediate=("moe_intermediate_size",),
             topk=("moe_top_k",), layers=None),
    ArchRule("xLLM / K2 Horizon", ("XllmForCausalLM", "K2HorizonForCausalLM"), "models/xllm.py:934", **_QWEN_FIELDS,
             layers="qwen_sparse", notes=("MoVA value experts are not a fused MoE",)),
    ArchRule("Zaya", ("ZayaForCausalLM",), "models/zaya.py:1231", experts=("num_experts",),
             intermediate=("ffn_hidden_size",), intermediate_div=2,
             topk=("moe_router_topk",), topk_default=1, layers=None,
             notes=("ffn_hidden_size is gate + up: N = ffn_hidden_size / 2 / TP (models/zaya.py:1227)",)),
    ArchRule("AFMoE", ("AfmoeForCausalLM",), "models/afmoe.py:284 (fused_moe)", **_QWEN_FIELDS,
             expert_parallel=False, quantized=False, layers="dense_prefix", notes=_PACKED),
    ArchRule("XVERSE MoE", ("XverseMoeForCausalLM",), "models/xverse_moe.py:181 (fused_moe)", experts=("num_experts",),
             intermediate=("intermediate_size",), topk=("moe_top_k",), expert_parallel=False, quantized=False,
             notes=_PACKED),
    # ---- wrappers whose language model is named by the sub-config
    ArchRule("InternVL (chat)", ("InternVLChatModel",), "models/internvl.py:546", config_at="llm_config",
             delegate=True),
    ArchRule("Intern-S1", ("InternS1ForConditionalGeneration",), "models/interns1.py:63", config_at="text_config",
             delegate=True),
)


def _rules_by_arch() -> dict[str, tuple[ArchRule, ...]]:
    out: dict[str, list[ArchRule]] = {}
    for rule in ARCHITECTURES:
        for a in rule.archs:
            out.setdefault(a, []).append(rule)
    return {a: tuple(rs) for a, rs in out.items()}


#: ``architectures[0]`` -> its rules, in order (the first whose ``when`` holds applies).
RULES_BY_ARCH: dict[str, tuple[ArchRule, ...]] = _rules_by_arch()
