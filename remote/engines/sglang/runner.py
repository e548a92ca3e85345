"""Which MoE runner an SGLang server uses, and whether it reads the Triton fused-MoE config files.

Only the ``triton`` runner reads ``configs/triton_*/E=...json`` (its ``fused_experts`` asks
``try_get_optimal_moe_config``); every other runner (``flashinfer_trtllm``, ``flashinfer_cutlass``,
``flashinfer_mxfp4``, ``deep_gemm``, ``marlin``, ``triton_kernel``, ``cutlass``, ...) runs its own
kernels, so tuning those files changes nothing. :func:`moe_runner` is the one answer orch gives
(``orch tune``'s ``plan`` and ``orch doctor``'s ``classify`` both call it), with SGLang's reason.

It mirrors SGLang 0.5.23 (paths under ``sglang/srt/``), in SGLang's order:

1. server-argument resolution of ``--moe-runner-backend`` (``arg_groups/pipeline.py``): the
   model-family overrides (``arg_groups/model_overrides/*.py``; the DeepSeek family's sm100 rule in
   ``arg_groups/overrides.py`` ``_deepseek_moe_quant_resolution`` with ``_DEEPSEEK_FAMILY_ARCHS``),
   then ``_moe_runner_backend_quant_constraints`` (``overrides.py``) with the refusals of
   ``arg_groups/moe_hook.py`` ``handle_moe_kernel_config``, then the all-to-all backends
   (``moe_hook.py`` ``handle_a2a_moe``: pplx and DeepEP v2 -> ``deep_gemm``, FlashInfer MegaMoE);
2. what ``auto`` (still unresolved) or the resolved backend becomes in the layer's quantization
   method, ``create_moe_runner`` of ``layers/quantization/``: ``unquant.py``
   ``UnquantizedFusedMoEMethod``, ``fp8.py`` ``Fp8MoEMethod`` (fp8 and mxfp8), ``modelopt_quant.py``
   ``ModelOptFp8MoEMethod`` / ``ModelOptNvFp4FusedMoEMethod``, ``mxfp4.py`` ``Mxfp4MoEMethod``,
   ``w8a8_int8.py``, ``w8a8_fp8.py``, ``moe_wna16.py``, ``blockwise_int8.py`` (always Triton),
   ``w4afp8.py`` (CUTLASS W4A8), ``gptq/`` and ``awq/`` (Marlin), ``compressed_tensors/``
   (``get_moe_scheme``: W8A8 fp8 -> ``CompressedTensorsW8A8Fp8MoE``, W8A8 int8 NPU-only, WNA16 Marlin).

NVIDIA GPUs only (``capability`` is CUDA's, ``"9.0"``): ``is_sm100`` is major 10, ``is_sm110``
11, ``is_sm120`` 12 (``utils/common.py``; CUDA 12.8+ assumed there). Whatever it cannot resolve
(a rule it does not model, a fact not probed, a combination SGLang refuses at start) is an
answer with ``reads_triton_configs`` None and the reason, never a guess.

The log is ground truth when present (:func:`moe_runner` ``log``): a start that logged Triton
lookups read the files; a start that became ready without any read none; the start line's
resolved ``moe_runner_backend`` replaces step 1. A disagreement with the derived answer is
reported (``disagreement``). ``tests/unit/remote/engines/sglang/test_runner_oracle.py`` runs the wheel's own
step 1 (the modelled ``model_overrides/`` providers, ``_deepseek_moe_quant_resolution``,
``_moe_runner_backend_quant_constraints``) against orch's over a grid, and says how the rest is
checked. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...protocol import internal_error
from ..records import MoeLogReport, MoeRunner
from .autotune import runner_autotunes

#: SGLang 0.5.23 ``arg_groups/overrides.py`` ``_DEEPSEEK_FAMILY_ARCHS`` (line 745)
DEEPSEEK_FAMILY_ARCHS = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "Glm5NextForConditionalGeneration", "HYV4ForCausalLM", "HYV4ForCausalLMNextN", "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM",
})
#: ``model_overrides/qwen3_moe.py`` ``_qwen3_moe_family_overrides`` (line 38)
QWEN3_FAMILY_ARCHS = frozenset({
    "Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
})
GLM4_MOE_ARCHS = frozenset({"Glm4MoeForCausalLM"})  # model_overrides/glm4_moe.py:16
LLAMA4_ARCHS = frozenset({"Llama4ForConditionalGeneration", "Llama4ForCausalLM"})  # model_overrides/llama4.py:17
GEMMA4_ARCHS = frozenset({"Gemma4ForConditionalGeneration", "Gemma4ForCausalLM",  # model_overrides/gemma4.py:23
                          "Gemma4UnifiedForConditionalGeneration", "DiffusionGemmaForBlockDiffusion"})
GPT_OSS_ARCHS = frozenset({"GptOssForCausalLM"})  # model_overrides/gpt_oss.py:25
#: Architectures whose ``model_overrides/`` provider sets ``moe_runner_backend`` by a rule orch does
#: not model: file, and whether it also changes or refuses an explicit backend (else only ``auto``).
UNMODELLED_OVERRIDES: dict[str, tuple[str, bool]] = {
    "BailingMoeV3ForCausalLM": ("bailing_moe_v3.py", False),
    "BailingMoeV3VLForConditionalGeneration": ("bailing_moe_v3.py", False),
    "BeamForCausalLM": ("beam.py", False),
    "Cohere2MoeForCausalLM": ("cohere2_moe.py", False),
    "Cohere2VisionForConditionalGeneration": ("cohere2_moe.py", False),
    "DeepseekV4ForCausalLM": ("deepseek_v4.py", False),
    "InternS2MobiusForConditionalGeneration": ("interns2_mobius.py", False),
    "KimiK3ForConditionalGeneration": ("kimi_k3.py", False),
    "MiMoV2ForCausalLM": ("mimo_v2.py", False),
    "MiMoV2FlashForCausalLM": ("mimo_v2.py", False),
    "MiniMaxM2ForCausalLM": ("minimax_m2.py", False),
    "MiniMaxM3SparseForCausalLM": ("minimax_m3.py", True),
    "MiniMaxM3SparseForConditionalGeneration": ("minimax_m3.py", True),
    "NemotronHForCausalLM": ("nemotron_h.py", True),
    "NemotronHPuzzleForCausalLM": ("nemotron_h.py", True),
    "NemotronH_Omni_Reasoning_V3": ("nemotron_h.py", True),
}
#: Architectures whose MoE layer declares a routing method (``FusedMoE(routing_method_type=...)``:
#: ``models/deepseek_v2.py:762``, ``models/qwen3_moe.py:273``, ``models/glm4_moe.py:445``,
#: ``models/llama4.py:128``): ``ModelOptFp8MoEMethod`` runs ``flashinfer_trtllm`` only for them.
ROUTING_DECLARED_ARCHS = frozenset({"DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM",
                                    "Llama4ForConditionalGeneration", "Llama4ForCausalLM"})
#: Runners that read the Triton config files (``layers/moe/moe_runner/triton.py``).
TRITON_CONFIG_RUNNERS = frozenset({"triton"})
#: Runners known to run their own kernels (``layers/moe/utils.py`` ``MoeRunnerBackend``).
OTHER_RUNNERS = frozenset({"deep_gemm", "triton_kernel", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                           "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl", "flashinfer_megamoe",
                           "cutlass", "marlin", "cutlass_w4a8", "experimental_sgl_trtllm", "experimental_sgl_marlin",
                           "humming", "hpc_ops"})
_OV = "srt/arg_groups/overrides.py"
_MH = "srt/arg_groups/moe_hook.py"
_MO = "srt/arg_groups/model_overrides/"
_Q = "srt/layers/quantization/"


@internal_error("caught by moe_runner, which answers 'unknown' with its message")
class _Unknown(Exception):
    """Raised inside the rules: the answer cannot be told (the message says why)."""


@dataclass(frozen=True)
class _Server:
    """The inputs of the rules (see :func:`moe_runner`)."""

    backend: str
    flag: str | None
    a2a: str
    arch: str | None
    ckpt: str | None
    selector: str | None
    weight_dtype: str | None
    major: int | None
    minor: int | None
    ep: int
    triton_kernels: bool | None

    def sm(self, rule: str) -> int:
        """The GPU's major compute capability; raises :class:`_Unknown` naming ``rule`` when not probed."""
        if self.major is None:
            raise _Unknown(f"{rule} depends on the GPU generation, and the GPU's compute capability was not "
                           "probed (no CUDA GPU visible; set orch_gpu_capability)")
        return self.major

    @property
    def quant(self) -> str | None:
        """The quantization server-argument resolution starts from: the flag, else the checkpoint's."""
        return self.flag if self.flag is not None else self.ckpt

    @property
    def effective(self) -> str | None:
        """The quantization the model config resolves (``configs/model_config.py`` ``_verify_quantization``:
        the flag when given, else the checkpoint's, a GPTQ/AWQ checkpoint becoming its Marlin method
        through ``override_quantization_method``)."""
        if self.flag is not None:
            return self.flag
        return {"gptq": "gptq_marlin", "awq": "awq_marlin"}.get(self.ckpt, self.ckpt)


def _capability(capability: str | None) -> tuple[int | None, int | None]:
    if not capability:
        return None, None
    try:
        major, minor = (int(x) for x in str(capability).split(".", 1))
    except ValueError:
        return None, None
    return major, minor


# --------------------------------------------------------------------------- 1. server arguments

def _sm100_family(s: _Server, rule: str, trtllm: bool, declared_matters: bool) -> tuple[str | None, str | None, str]:
    """An override that acts only on sm100 (``if get_platform().is_sm100:``), where it declares the
    checkpoint's quantization (when no flag gives one, whatever the backend) and, when ``trtllm``
    and the backend is ``auto``, sets ``flashinfer_trtllm``. The GPU is asked only when the answer
    depends on it."""
    trtllm = trtllm and s.backend == "auto"
    if not (trtllm or declared_matters) or s.sm(rule) != 10:
        return None, None, ""
    declared = s.ckpt if s.flag is None else None
    if not trtllm:
        return None, declared, ""
    return "flashinfer_trtllm", declared, f"{rule} sets flashinfer_trtllm ({s.quant or 'bf16'} weights, sm100)"


def _declaration_matters(s: _Server) -> bool:
    """A declared quantization changes the later passes only for these (``_moe_runner_backend_quant_constraints``)."""
    return s.flag is None and s.ckpt in ("mxfp8", "nvfp4_online")


def _deepseek(s: _Server) -> tuple[str | None, str | None, str]:
    """``overrides.py`` ``_deepseek_moe_quant_resolution`` (line 764), plus the HYV4 MXFP8 rule of
    ``model_overrides/deepseek_v2.py`` ``_deepseek_family_overrides``."""
    if s.arch.startswith("HYV4") and "mxfp8" in (s.ckpt, s.flag):
        raise _Unknown(f"{s.arch} with MXFP8 weights: {_MO}deepseek_v2.py picks deep_gemm when DeepGEMM's JIT "
                       "is enabled on the host, which orch cannot see")
    rule = f"{_OV} _deepseek_moe_quant_resolution"
    eligible = s.a2a == "none" and not s.arch.startswith("LongcatFlash")
    if eligible and s.quant == "compressed-tensors" and s.weight_dtype not in ("int8", "fp8_e4m3") \
            and s.sm(rule) == 10:
        raise _Unknown(f"{s.arch} with compressed-tensors {s.weight_dtype or '?'} weights on sm100: {rule} picks "
                       "flashinfer_trtllm only for the Kimi K2 int4 group-32 recipe, which orch does not read")
    trtllm = eligible and s.quant in ("fp8", "modelopt_fp8", "modelopt_fp4", "modelopt_mixed", None)
    return _sm100_family(s, rule, trtllm, _declaration_matters(s))


def _qwen3(s: _Server) -> tuple[str | None, str | None, str]:
    """``model_overrides/qwen3_moe.py`` ``_qwen3_moe_family_overrides``."""
    rule = f"{_MO}qwen3_moe.py _qwen3_moe_family_overrides"
    if s.quant == "modelopt_mixed" and s.sm(rule) == 10:
        raise _Unknown(f"{s.arch} with modelopt_mixed weights on sm100: {rule} picks marlin or flashinfer_trtllm "
                       "by the checkpoint's per-layer algorithms, which orch does not read")
    trtllm = s.a2a == "none" and s.quant in ("fp8", "modelopt_fp4", None)
    return _sm100_family(s, rule, trtllm, _declaration_matters(s))


def _glm4(s: _Server) -> tuple[str | None, str | None, str]:
    """``model_overrides/glm4_moe.py`` ``_glm4_moe_overrides``."""
    trtllm = s.a2a == "none" and s.quant in ("modelopt_fp4", None)
    return _sm100_family(s, f"{_MO}glm4_moe.py _glm4_moe_overrides", trtllm, _declaration_matters(s))


def _llama4(s: _Server) -> tuple[str | None, str | None, str]:
    """``model_overrides/llama4.py`` ``_llama4_overrides`` (reads the flag only)."""
    rule = f"{_MO}llama4.py _llama4_overrides"
    if s.backend != "auto" or s.flag not in ("fp8", "modelopt_fp8") or s.sm(rule) != 10:
        return None, None, ""
    return "flashinfer_trtllm", None, f"{rule} sets flashinfer_trtllm (--quantization {s.flag}, sm100)"


def _gemma4(s: _Server) -> tuple[str | None, str | None, str]:
    """``model_overrides/gemma4.py`` ``_gemma4_overrides``."""
    rule = f"{_MO}gemma4.py _gemma4_overrides"
    if s.backend != "auto" or s.effective != "modelopt_fp4" or s.sm(rule) != 10:
        return None, None, ""
    return "flashinfer_trtllm", "modelopt_fp4", f"{rule} sets flashinfer_trtllm (modelopt_fp4, sm100)"


def _gpt_oss(s: _Server) -> tuple[str | None, str | None, str]:
    """``model_overrides/gpt_oss.py`` ``_gpt_oss_overrides`` (CUDA branches)."""
    rule = f"{_MO}gpt_oss.py _gpt_oss_overrides"
    if s.backend != "auto":
        return None, None, ""
    if s.ckpt == "mxfp4" and s.sm(rule) in (10, 12):
        return "flashinfer_mxfp4", None, f"{rule} sets flashinfer_mxfp4 (MXFP4 checkpoint, sm{s.major}0)"
    if s.ep != 1 or s.flag is not None:
        return None, None, ""
    if s.triton_kernels is None:
        raise _Unknown(f"gpt-oss: {rule} picks triton_kernel when the triton_kernels package is installed, "
                       "and the probe did not say")
    if not s.triton_kernels:
        return None, None, ""
    if s.sm(rule) in (10, 11, 12):
        raise _Unknown(f"gpt-oss on Blackwell: {rule} picks triton (NVIDIA driver 595+) or triton_kernel by the "
                       "driver version, which orch does not read")
    return "triton_kernel", None, f"{rule} sets triton_kernel (triton_kernels installed, --ep 1)"


_FAMILIES = ((DEEPSEEK_FAMILY_ARCHS, _deepseek), (QWEN3_FAMILY_ARCHS, _qwen3), (GLM4_MOE_ARCHS, _glm4),
             (LLAMA4_ARCHS, _llama4), (GEMMA4_ARCHS, _gemma4), (GPT_OSS_ARCHS, _gpt_oss))


def _model_override(s: _Server) -> tuple[str, str | None, str]:
    """Step 1a: the model-family override. ``(backend, declared quantization, reason)``."""
    if s.arch in UNMODELLED_OVERRIDES:
        path, any_backend = UNMODELLED_OVERRIDES[s.arch]
        if s.backend == "auto" or any_backend:
            raise _Unknown(f"{s.arch}: SGLang 0.5.23 {_MO}{path} sets the MoE runner by a rule orch does not model")
    for archs, rule in _FAMILIES:
        if s.arch in archs:
            backend, declared, why = rule(s)
            return backend or s.backend, declared if declared is not None else s.flag, why
    return s.backend, s.flag, ""


def _quant_constraints(backend: str, declared: str | None, s: _Server) -> tuple[str, str]:
    """Step 1b: ``overrides.py`` ``_moe_runner_backend_quant_constraints`` (line 1449) on CUDA."""
    rule = f"{_OV} _moe_runner_backend_quant_constraints"
    if declared == "nvfp4_online":
        if s.sm(rule) != 10:
            raise _Unknown(f"--quantization nvfp4_online off sm100: SGLang refuses to start ({rule})")
        if backend == "auto":
            return "flashinfer_trtllm", f"{rule} sets flashinfer_trtllm (nvfp4_online)"
        if backend not in ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutedsl"):
            raise _Unknown(f"--quantization nvfp4_online with --moe-runner-backend {backend}: SGLang refuses to start "
                           f"({rule})")
    if declared == "mxfp8" and backend not in ("cutlass", "deep_gemm", "flashinfer_megamoe", "flashinfer_trtllm",
                                               "flashinfer_trtllm_routed"):
        target = "flashinfer_megamoe" if s.a2a == "flashinfer_megamoe" else "flashinfer_trtllm"
        return target, f"{rule} sets {target} (mxfp8 with --moe-runner-backend {backend})"
    if backend == "auto" and declared == "modelopt_fp4" and s.sm(rule) in (11, 12):
        return "flashinfer_cutlass", f"{rule} sets flashinfer_cutlass (modelopt_fp4, sm{s.major}0)"
    return backend, ""


_ALLOWED_QUANT = {  # moe_hook.py handle_moe_kernel_config: the --quantization each FlashInfer runner accepts
    "flashinfer_cutlass": ("modelopt_fp4", "modelopt_fp8", "modelopt_mixed", None),
    "flashinfer_trtllm": ("modelopt_fp4", "nvfp4_online", "fp8", "mxfp8", "modelopt_fp8", "modelopt_mixed",
                          "compressed-tensors", None),
    "flashinfer_trtllm_routed": ("fp8", "mxfp8", "modelopt_fp4", "modelopt_mixed", "nvfp4_online",
                                 "minimax_m3_nvfp4", None),
    "flashinfer_cutedsl": ("modelopt_fp4", "modelopt_mixed", "nvfp4_online"),
}


def _refusals(backend: str, declared: str | None) -> None:
    """``moe_hook.py`` ``handle_moe_kernel_config`` (line 70): SGLang refuses to start."""
    allowed = _ALLOWED_QUANT.get("flashinfer_trtllm" if backend == "experimental_sgl_trtllm" else backend)
    if allowed is not None and declared not in allowed:
        raise _Unknown(f"--moe-runner-backend {backend} with --quantization {declared}: SGLang refuses to start "
                       f"({_MH} handle_moe_kernel_config)")


def _a2a(backend: str, s: _Server) -> tuple[str, str]:
    """Step 1c: ``moe_hook.py`` ``handle_a2a_moe`` (line 284)."""
    rule = f"{_MH} handle_a2a_moe"
    if s.a2a == "none":
        return backend, ""
    if s.a2a in ("pplx", "deepep_v2"):
        if backend == "auto":
            return "deep_gemm", f"{rule} sets deep_gemm (--moe-a2a-backend {s.a2a})"
        if backend != "deep_gemm":
            raise _Unknown(f"--moe-a2a-backend {s.a2a} with --moe-runner-backend {backend}: SGLang refuses to "
                           f"start ({rule})")
        return backend, ""
    if s.a2a == "flashinfer_megamoe":
        if backend not in ("auto", "flashinfer_megamoe"):
            raise _Unknown(f"--moe-a2a-backend flashinfer_megamoe with --moe-runner-backend {backend}: SGLang "
                           f"refuses to start ({rule})")
        return "flashinfer_megamoe", f"{rule} sets flashinfer_megamoe (--moe-a2a-backend flashinfer_megamoe)"
    if s.a2a == "flashinfer":
        if backend not in ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                           "deep_gemm"):
            raise _Unknown(f"--moe-a2a-backend flashinfer with --moe-runner-backend {backend}: SGLang refuses to "
                           f"start ({rule})")
        return backend, ""
    if backend == "auto":
        raise _Unknown(f"--moe-a2a-backend {s.a2a} with --moe-runner-backend auto: the quantization method picks "
                       "deep_gemm when DeepGEMM's JIT is enabled on the host, which orch cannot see")
    return backend, ""


# --------------------------------------------------------------------------- 2. the layer's method

def _unquantized(backend: str, s: _Server) -> str:
    """``unquant.py`` ``UnquantizedFusedMoEMethod.create_moe_runner`` (line 1169) on CUDA."""
    if backend.startswith("lora_"):
        raise _Unknown(f"--moe-runner-backend {backend}: LoRA MoE runners are not modelled")
    if backend in ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass", "deep_gemm",
                   "triton_kernel"):
        return backend
    return "triton"


def _fp8(backend: str, s: _Server) -> str:
    """``fp8.py`` ``Fp8MoEMethod.create_moe_runner`` (line 2941): fp8 and mxfp8 weights."""
    if backend == "auto":
        return "triton"  # DeepGEMM only with a DeepEP/Mooncake/NIXL all-to-all (refused above as unknown)
    if backend in ("flashinfer_cutlass", "flashinfer_cutedsl"):
        return "triton"  # "Fp8MoEMethod has no %s path; using triton for its fp8 experts."
    return backend


def _modelopt_fp8(backend: str, s: _Server) -> str:
    """``modelopt_quant.py`` ``ModelOptFp8MoEMethod.create_moe_runner`` (line 1343)."""
    if backend == "flashinfer_cutlass":
        return backend
    if backend == "flashinfer_trtllm":
        if s.arch in ROUTING_DECLARED_ARCHS:
            return backend
        raise _Unknown(f"modelopt_fp8 with flashinfer_trtllm: {_Q}modelopt_quant.py runs it only when the model's "
                       f"MoE declares a routing method, which orch has not read for {s.arch}")
    return "triton"


def _modelopt_fp4(backend: str, s: _Server) -> str:
    """``modelopt_quant.py`` ``ModelOptNvFp4FusedMoEMethod.create_moe_runner`` (line 3111)."""
    if backend == "cutlass":
        raise _Unknown(f"modelopt_fp4 with --moe-runner-backend cutlass: SGLang raises NotImplementedError ({_Q}"
                       "modelopt_quant.py)")
    if backend != "auto":
        return backend
    return "marlin" if 8 <= s.sm(f"{_Q}modelopt_quant.py ModelOptNvFp4FusedMoEMethod") < 10 else "flashinfer_trtllm"


def _mxfp4(backend: str, s: _Server) -> str:
    """``mxfp4.py`` ``Mxfp4MoEMethod.create_moe_runner`` (line 1433) on CUDA."""
    if backend == "auto":
        return "triton"  # use_triton_kernels only when the backend is triton_kernel
    if backend in ("triton", "triton_kernel", "marlin", "deep_gemm", "flashinfer_mxfp4"):
        return backend
    raise _Unknown(f"mxfp4 with --moe-runner-backend {backend}: not modelled ({_Q}mxfp4.py)")


def _always_triton(backend: str, s: _Server) -> str:
    """``w8a8_int8.py``, ``w8a8_fp8.py``, ``moe_wna16.py``, ``blockwise_int8.py``: ``MoeRunner(TRITON)``."""
    return "triton"


def _marlin(backend: str, s: _Server) -> str:
    """GPTQ/AWQ Marlin MoE (``hardware_backend/gpu/quantization/gptq_kernels.py`` ``GPTQMarlinMoEKernel``,
    ``awq/schemes/awq_moe.py`` ``AWQMoEScheme``): ``assert get_moe_runner_backend().is_auto()``, then
    ``MoeRunner(MARLIN)``."""
    if backend != "auto":
        raise _Unknown(f"{s.effective} with --moe-runner-backend {backend}: SGLang's Marlin MoE asserts the backend "
                       "is auto, so the server does not start")
    return "marlin"


def _cutlass_w4a8(backend: str, s: _Server) -> str:
    """``w4afp8.py`` ``W4AFp8MoEMethod``: builds no runner, ``apply`` calls ``cutlass_w4a8_moe``."""
    return "cutlass_w4a8"


def _compressed_tensors(backend: str, s: _Server) -> str:
    """``compressed_tensors/compressed_tensors.py`` ``get_moe_scheme`` (line 864) on CUDA."""
    if s.selector == "fp8_w8a8":  # CompressedTensorsW8A8Fp8MoE.create_moe_runner (line 341)
        if backend in ("auto", "triton"):
            return "triton"
        if backend in ("flashinfer_trtllm", "flashinfer_trtllm_routed"):
            return backend
        raise _Unknown(f"compressed-tensors fp8 with --moe-runner-backend {backend}: the scheme builds no runner")
    if s.selector == "int8_w8a8":
        raise _Unknown("compressed-tensors W8A8 int8 MoE: SGLang 0.5.23 implements it for NPU only "
                       "(NotImplementedError on CUDA; --quantization w8a8_int8 runs it on Triton)")
    if s.selector == "int8_w8a16" and backend == "auto":
        return "marlin"  # CompressedTensorsWNA16MoE; its Triton variant is INT4-only
    if s.selector == "int4_w4a16":
        # line 912: CompressedTensorsWNA16TritonMoE with --moe-runner-backend triton, or auto on sm100
        # (symmetric INT4, group 32/128, no actorder, else it raises); otherwise the Marlin scheme
        if backend == "triton":
            return "triton"
        if backend == "auto":
            return "triton" if s.sm("compressed-tensors W4A16 on auto") == 10 else "marlin"
        raise _Unknown(f"compressed-tensors W4A16 with --moe-runner-backend {backend}: not modelled")
    raise _Unknown(f"compressed-tensors {s.selector or '?'} weights with --moe-runner-backend {backend}: not modelled")


_METHODS = {
    None: (_unquantized, f"{_Q}unquant.py UnquantizedFusedMoEMethod.create_moe_runner"),
    "fp8": (_fp8, f"{_Q}fp8.py Fp8MoEMethod.create_moe_runner"),
    "mxfp8": (_fp8, f"{_Q}fp8.py Fp8MoEMethod.create_moe_runner"),
    "modelopt_fp8": (_modelopt_fp8, f"{_Q}modelopt_quant.py ModelOptFp8MoEMethod.create_moe_runner"),
    "modelopt": (_modelopt_fp8, f"{_Q}modelopt_quant.py ModelOptFp8MoEMethod.create_moe_runner"),
    "modelopt_fp4": (_modelopt_fp4, f"{_Q}modelopt_quant.py ModelOptNvFp4FusedMoEMethod.create_moe_runner"),
    "nvfp4_online": (_modelopt_fp4, f"{_Q}modelopt_quant.py ModelOptNvFp4FusedMoEMethod.create_moe_runner"),
    "mxfp4": (_mxfp4, f"{_Q}mxfp4.py Mxfp4MoEMethod.create_moe_runner"),
    "w8a8_int8": (_always_triton, f"{_Q}w8a8_int8.py W8A8Int8MoEMethod.create_moe_runner"),
    "w8a8_fp8": (_always_triton, f"{_Q}w8a8_fp8.py W8A8FP8MoEMethod.create_moe_runner"),
    "moe_wna16": (_always_triton, f"{_Q}moe_wna16.py MoeWNA16Method.create_moe_runner"),
    "blockwise_int8": (_always_triton, f"{_Q}blockwise_int8.py BlockInt8MoEMethod.create_moe_runner"),
    "gptq_marlin": (_marlin, "srt/hardware_backend/gpu/quantization/gptq_kernels.py "
                             "GPTQMarlinMoEKernel.create_moe_runner"),
    "awq_marlin": (_marlin, f"{_Q}awq/schemes/awq_moe.py AWQMoEScheme.create_moe_runner"),
    "compressed-tensors": (_compressed_tensors,
                           f"{_Q}compressed_tensors/compressed_tensors.py CompressedTensorsConfig.get_moe_scheme"),
    "w4afp8": (_cutlass_w4a8, f"{_Q}w4afp8.py W4AFp8MoEMethod.apply"),
}


def _layer(backend: str, s: _Server) -> tuple[str, str]:
    """Step 2: ``(runner, rule)`` of the layer's quantization method for the resolved ``backend``."""
    quant = s.effective
    if quant not in _METHODS:
        raise _Unknown(f"quantization {quant}: its MoE method is not modelled")
    fn, rule = _METHODS[quant]
    return fn(backend, s), rule


#: (flag, checkpoint) pairs ``_verify_quantization`` accepts though they differ (``configs/model_config.py``
#: ``compatible_quantization_methods``, and ``override_quantization_method`` of ``moe_wna16`` / Marlin)
_COMPATIBLE = {("modelopt_fp4", "fp8"), ("nvfp4_online", "fp8"), ("nvfp4_online", "modelopt_fp8"),
               ("w8a8_int8", "compressed-tensors"), ("w8a8_fp8", "compressed-tensors"), ("moe_wna16", "gptq"),
               ("moe_wna16", "awq"), ("gptq_marlin", "gptq"), ("marlin", "gptq"), ("awq_marlin", "awq")}


def _check_model(s: _Server) -> None:
    """The facts every rule needs: a model read, and a flag SGLang accepts for its checkpoint."""
    if s.arch is None:
        raise _Unknown("SGLang picks the runner by the model's architecture and quantization, and the probe read "
                       "no model config")
    if s.flag and s.ckpt and s.flag != s.ckpt and (s.flag, s.ckpt) not in _COMPATIBLE:
        raise _Unknown(f"--quantization {s.flag} on a {s.ckpt} checkpoint: SGLang refuses to start unless it "
                       "requantizes (configs/model_config.py _verify_quantization)")


def _derive(s: _Server, resolved: str | None = None) -> MoeRunner:
    """The answer from the unit, the model and the GPU; ``resolved``: the backend server-argument
    resolution chose (read from the log), instead of step 1. Raises :class:`_Unknown`."""
    _check_model(s)
    whys: list[str] = []
    if resolved is None:
        backend, declared, why = _model_override(s)
        backend, why2 = _quant_constraints(backend, declared, s)
        _refusals(backend, declared)
        backend, why3 = _a2a(backend, s)
        whys = [w for w in (why, why2, why3) if w]
    else:
        backend = resolved
    runner, rule = _layer(backend, s)
    if runner not in TRITON_CONFIG_RUNNERS | OTHER_RUNNERS:
        raise _Unknown(f"runner {runner}: not known to orch")
    reads = runner in TRITON_CONFIG_RUNNERS
    if not whys and s.backend == runner:
        return MoeRunner(runner, reads, _flag_reason(runner, reads, rule), "flag")
    tail = f"{rule} runs the {runner} runner" + (", which reads the Triton MoE config files" if reads
                                                 else ", which reads no Triton MoE config file")
    return MoeRunner(runner, reads, f"{_describe(s)}: " + "; ".join(whys + [tail]))


def _flag_reason(runner: str, reads: bool, rule: str) -> str:
    if reads:
        return f"--moe-runner-backend triton: the Triton runner reads the config files ({rule})"
    return f"--moe-runner-backend {runner}: Triton MoE config files are not used by this server"


def _describe(s: _Server) -> str:
    """``backend auto with --quantization modelopt_fp8 (DeepseekV3ForCausalLM, modelopt_fp8, sm90)``."""
    head = f"backend {s.backend}" + (f" with --quantization {s.flag}" if s.flag else "") + (
        f", --moe-a2a-backend {s.a2a}" if s.a2a != "none" else "")
    model = [s.arch, s.ckpt or "bf16"] if s.arch else []
    if s.major is not None:
        model.append(f"sm{s.major}{s.minor}")
    return head + (f" ({', '.join(model)})" if model else "")


def _from_log(s: _Server, log: MoeLogReport | None) -> MoeRunner | None:
    """The answer the last start's log gives, or None when it says nothing decisive: Triton lookups
    (the files were read), a ready start without any (none were), else the start line's resolved
    backend run through step 2."""
    if log is None:
        return None
    if log.any_lookup:
        return MoeRunner("triton", True, "the last start logged Triton MoE config lookups (the Triton runner "
                                         "reads the files)", "log")
    if log.ready:
        chosen = log.chosen_runner if log.chosen_runner not in (None, "auto", "triton") else None
        return MoeRunner(chosen, False, f"{_describe(s)}: the last start logged no Triton MoE config lookup, so it "
                                        "resolved to another runner", "log")
    if not log.start_runner:
        return None
    try:
        found = _derive(s, resolved=log.start_runner)
    except _Unknown:
        return None
    return replace(found, source="log", reason=f"the last start resolved moe_runner_backend={log.start_runner}: "
                                               + found.reason)


def moe_runner(*, backend: str | None = "auto", quantization: str | None = None, a2a_backend: str | None = "none",
               ep: int | None = 1, architecture: str | None = None, checkpoint_quant: str | None = None,
               dtype_selector: str | None = None, weight_dtype: str | None = None, capability: str | None = None,
               triton_kernels: bool | None = None, log: MoeLogReport | None = None) -> MoeRunner:
    """Which MoE runner the server uses and whether it reads the Triton config files (module docstring).

    From the unit: ``backend`` (``--moe-runner-backend``, None: ``auto``), ``quantization``
    (``--quantization``, None: not given), ``a2a_backend`` (``--moe-a2a-backend``, None:
    ``none``), ``ep``. From the probe (:func:`probe_inputs`): ``architecture``
    (``architectures[0]``, None: no model read), ``checkpoint_quant`` (the checkpoint's
    quantization method as SGLang's model config names it, :func:`checkpoint_quant_method`; None:
    16-bit weights), ``dtype_selector`` / ``weight_dtype`` (``MoeShape``'s, for compressed-tensors
    checkpoints), ``capability`` (GPU 0's CUDA compute capability, ``"9.0"``; None: not probed),
    ``triton_kernels`` (the ``triton_kernels`` package is importable; None: unknown). ``log``: the
    last start's :class:`~remote.engines.sglang.moe_log.MoeLogReport` (None: no start logged); where it is
    decisive it wins, and a derived answer that differs is kept in ``disagreement``. Returns a
    :class:`MoeRunner` (``autotunes``: :func:`remote.engines.sglang.autotune.runner_autotunes`);
    raises nothing. Pure.
    """
    found = _moe_runner(backend, quantization, a2a_backend, ep, architecture, checkpoint_quant, dtype_selector,
                        weight_dtype, capability, triton_kernels, log)
    return replace(found, autotunes=runner_autotunes(found.runner))


def _moe_runner(backend, quantization, a2a_backend, ep, architecture, checkpoint_quant, dtype_selector, weight_dtype,
                capability, triton_kernels, log) -> MoeRunner:
    """:func:`moe_runner` before ``autotunes`` is set."""
    major, minor = _capability(capability)
    s = _Server(backend or "auto", quantization or None, a2a_backend or "none", architecture, checkpoint_quant,
                dtype_selector, weight_dtype, major, minor, int(ep or 1), triton_kernels)
    try:
        derived = _derive(s)
    except _Unknown as exc:
        derived = MoeRunner(None, None, f"{_describe(s)}: {exc}")
    evidence = _from_log(s, log)
    if evidence is None:
        return derived
    if not derived.known:
        return evidence
    if derived.reads_triton_configs != evidence.reads_triton_configs:
        return replace(evidence, disagreement=f"orch's SGLang 0.5.23 rule says {derived.runner}: {derived.reason}")
    return derived


def probe_inputs(probe: dict) -> dict[str, Any]:
    """The :func:`moe_runner` keywords the payload's ``probe`` data gives (``remote.probe``:
    ``model.architecture``, ``model.checkpoint_quant_method``, ``model.dtype_selector``,
    ``model.weight_dtype``, ``capability``, ``triton_kernels``). Pure."""
    model = probe.get("model") or {}
    return {"architecture": model.get("architecture"), "checkpoint_quant": model.get("checkpoint_quant_method"),
            "dtype_selector": model.get("dtype_selector"), "weight_dtype": model.get("weight_dtype"),
            "capability": probe.get("capability"), "triton_kernels": probe.get("triton_kernels")}


def checkpoint_quant_method(config: dict, hf_quant_config: dict | None = None) -> str | None:
    """The quantization method SGLang's model config gives a checkpoint (``configs/model_config.py``
    ``_parse_quant_hf_config``, ``_parse_modelopt_quant_config``): ``config.json``'s
    ``quantization_config`` (else ``compression_config``; else the ``hf_quant_config.json`` beside
    it, ``hf_quant_config``), ``quant_method`` lowercased, a ModelOpt one (``modelopt`` or none)
    named by its ``quant_algo``: ``MIXED_PRECISION`` -> ``modelopt_mixed`` (with NVFP4 layers) or
    ``w4afp8``, ``*FP4*`` -> ``modelopt_fp4``, ``FP8`` -> ``modelopt_fp8``, ``MXFP8`` -> ``mxfp8``.
    None for 16-bit weights. Pure."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        qc = config.get("compression_config")
    if not isinstance(qc, dict):
        qc = hf_quant_config.get("quantization") if isinstance(hf_quant_config, dict) else None
        if not isinstance(qc, dict):
            return None
        qc = dict(qc, quant_method="modelopt")
    method = str(qc.get("quant_method") or "modelopt").lower()
    if method != "modelopt":
        return method
    algo = str(qc.get("quant_algo") or "").upper()
    if algo == "MIXED_PRECISION":
        layers = (qc.get("quantized_layers") or {}).values()
        nvfp4 = any(isinstance(v, dict) and str(v.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
                    for v in layers)
        return "modelopt_mixed" if nvfp4 else "w4afp8"
    if "FP4" in algo:
        return "modelopt_fp4"
    return {"FP8": "modelopt_fp8", "MXFP8": "mxfp8"}.get(algo, "modelopt")


def resolved_server_args(*, backend: str | None = "auto", quantization: str | None = None,
                         a2a_backend: str | None = "none", ep: int | None = 1, architecture: str | None = None,
                         checkpoint_quant: str | None = None, dtype_selector: str | None = None,
                         weight_dtype: str | None = None, capability: str | None = None,
                         triton_kernels: bool | None = None) -> tuple[str, str | None] | None:
    """``(moe_runner_backend, quantization)`` as SGLang 0.5.23's server-argument resolution leaves
    them (step 1 of the module docstring: what its start line logs, and what FlashInfer's autotune
    cache key hashes, :mod:`remote.engines.sglang.autotune`); the quantization is the flag, else the one a
    model-family override declares, else None. The keywords are :func:`moe_runner`'s. None when
    the rules cannot tell. Pure."""
    major, minor = _capability(capability)
    s = _Server(backend or "auto", quantization or None, a2a_backend or "none", architecture, checkpoint_quant,
                dtype_selector, weight_dtype, major, minor, int(ep or 1), triton_kernels)
    try:
        _check_model(s)
        resolved, declared, _why = _model_override(s)
        resolved, _why = _quant_constraints(resolved, declared, s)
        _refusals(resolved, declared)
        resolved, _why = _a2a(resolved, s)
    except _Unknown:
        return None
    return resolved, declared
