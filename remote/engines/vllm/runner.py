"""Which MoE kernel a vLLM server runs, and whether it reads the Triton config files (stdlib only).

vLLM 0.32.0-0.34.0 pick the MoE "backend" per weight format in
``vllm/model_executor/layers/fused_moe/oracle/<format>.py`` (``select_*_moe_backend``): the
``--moe-backend`` flag (``vllm/config/kernel.py`` ``KernelConfig.moe_backend``, default
``auto``) names one, else the first backend of the format's priority list
(``_get_priority_backends``) whose kernel class accepts the deployment
(``is_supported_config``: the GPU, the installed FlashInfer/DeepGEMM, the quantization scheme).
Only the Triton experts (``TritonExperts``, ``BatchedTritonExperts``, ``TritonWNA16Experts``) call
``try_get_optimal_moe_config``, i.e. read the files orch writes. The chosen backend is logged at
INFO by ``MoEKernelOracle.make_log_backend`` (0.34.0) or each oracle's ``_make_log_backend``
(0.32.0, 0.33.0): ``Using <backend> <Format> MoE backend out of potential backends: [...]``.

What can be told before the server starts (:func:`triton_verdict`), by weight format, on CUDA:

- the flag names a backend: ``triton``/``batched_triton`` read the files; any other backend
  reads none (``marlin``/``humming`` on unquantized weights fall through to ``auto``);
- ``auto``, unquantized weights: on the SM90 family (H100/H200/H20) the list is TRITON,
  BATCHED_TRITON, FlashInfer TRTLLM, FlashInfer CUTLASS (the FlashInfer ones moved back), so
  Triton; elsewhere (Blackwell) FlashInfer TRTLLM is first: it depends on FlashInfer;
- ``auto``, fp8 with block ``[128, 128]`` on SM90 (``is_device_capability(90)``), no expert
  parallelism: Triton is moved to the front; with EP, FlashInfer CUTLASS is;
- ``auto``, int8_w8a8 and ``experts_int8`` (int8_w8a16 per channel, ``Int8OnlineMoEMethod``):
  the Int8 list starts with TRITON (``oracle/int8.py``), whose ``TritonExperts`` take int8 from
  SM 7.5 on;
- ``auto``, ``moe_wna16`` (``MoeWNA16Method``, int4/int8 with a group): the WNA16 list
  (``oracle/int_wna16.py`` ``_get_priority_backends``) is RDNA3 (ROCm), FlashInfer TRT-LLM,
  Marlin, batched Marlin, TRITON, Humming, emulation; Marlin refuses the MoeWNA16 layout
  (``_backend_incompatibility_reason``), so Triton runs, except on SM90 where Humming is moved
  ahead of Marlin (``prioritize_humming``, ``_HUMMING_PREFERRED_CAPABILITIES = {90}``) and runs
  where the optional ``humming`` package is installed, and from SM100 on where FlashInfer's
  TRT-LLM mxint4 kernel may take it: undecided there;
- ``auto``, GPTQ/AWQ checkpoints without ``--quantization moe_wna16``: Marlin (or Humming on
  SM90) where it supports the layer, else the MoeWNA16 fallback (Triton) or, for GPTQ, Triton
  after Marlin (not with ``desc_act``; never the AutoAWQ layout): undecided before the start;
- ``auto``, other fp8 (per-tensor, per-channel): a non-Triton kernel comes first where the host's
  libraries support it: undecided before the start; the log line decides (:func:`parse_backend_line`).

The WNA16 log line of 0.32.0/0.33.0 quotes the backend (``Using 'TRITON' WNA16 MoE backend.``);
0.34.0 logs it as the other oracles do; :func:`parse_backend_line` reads both.
"""

from __future__ import annotations

import re

#: ``--moe-backend`` values (0.34.0 ``MoEBackend``) whose experts read the Triton config files.
TRITON_BACKENDS = ("triton", "batched_triton")
#: Backend values in the oracle log lines whose experts read the files.
TRITON_LOG_VALUES = ("TRITON", "BATCHED_TRITON")
#: The flag and its default (``vllm/engine/arg_utils.py`` ``kernel_group``).
MOE_BACKEND_FLAG, MOE_BACKEND_DEFAULT = "--moe-backend", "auto"

_LINE = re.compile(r"Using (?P<backend>.+?) (?P<kind>Unquantized|Fp8|Int8|WNA16|Mxfp4|Mxfp8|NvFp4|W4A8 Int8|W4A8)"
                   r" MoE (?:LoRA )?backend(?: out of potential backends: (?P<avail>\[.*?\]))?")


def triton_verdict(weight_format: str | None, block_shape=None, capability: tuple[int, int] | None = (9, 0),
                   moe_backend: str | None = None, ep_size: int = 1,
                   method: str | None = None) -> tuple[bool | None, str]:
    """``(reads_triton_files, reason)`` for a vLLM unit, before it starts (module docstring).

    ``weight_format``: None (bf16/fp16), ``fp8_w8a8``, ``int8_w8a8``, ``int4_w4a16``,
    ``int8_w8a16``, or another format name (mxfp4, nvfp4: never Triton files); ``block_shape``:
    the fp8 block (None for per-tensor/channel); ``capability``: the GPU's (major, minor), None
    when not known; ``moe_backend``: the unit's ``--moe-backend`` (None: ``auto``); ``ep_size``:
    expert-parallel size (``--enable-expert-parallel`` with TP x DP > 1); ``method``: the
    quantization method vLLM runs (``remote.engines.vllm.shape.quant_method``: ``moe_wna16``,
    ``experts_int8``, ``gptq``, ``awq``, ...), which decides the weight-only formats' list. ``None``
    as the verdict: it depends on the host's libraries; the server's ``Using ... MoE backend`` line
    decides.
    """
    flag = (moe_backend or MOE_BACKEND_DEFAULT).strip().lower()
    if flag != "auto" and not (weight_format is None and flag in ("marlin", "humming")):
        if flag in TRITON_BACKENDS:
            return True, f"--moe-backend {flag}: vLLM's Triton experts read the tuned config files"
        return False, f"--moe-backend {flag}: that kernel reads no Triton config file"
    sm90 = capability is not None and capability[0] == 9
    if weight_format is None:
        if sm90:
            return True, ("unquantized MoE on SM90: vLLM's priority list starts with TRITON (FlashInfer "
                          "moved back; oracle/unquantized.py _get_priority_backends)")
        return None, ("unquantized MoE off SM90: FlashInfer TRTLLM comes first where FlashInfer supports the "
                      "model; the server's 'Using ... Unquantized MoE backend' line decides")
    if weight_format == "fp8_w8a8" and block_shape and tuple(int(x) for x in block_shape) == (128, 128):
        if capability == (9, 0) and ep_size <= 1:
            return True, "fp8 block [128,128] on SM90 without EP: vLLM moves TRITON to the front (oracle/fp8.py)"
        if capability == (9, 0):
            return None, ("fp8 block [128,128] on SM90 with EP: FlashInfer CUTLASS comes first where FlashInfer "
                          "is installed; the server's 'Using ... Fp8 MoE backend' line decides")
    if capability is None and weight_format in ("int8_w8a8", "int4_w4a16", "int8_w8a16"):
        # which kernel runs depends on the GPU (below): without its capability orch cannot say, and a
        # guess of "Triton" could stop a unit whose kernel reads no Triton file
        return None, (f"{method or weight_format}: the kernel vLLM picks depends on the GPU's compute capability, "
                      "which is not known here; the server's 'Using ... MoE backend' line decides")
    if weight_format == "int8_w8a8" or (weight_format == "int8_w8a16" and method == "experts_int8"):
        if capability < (7, 5):
            return False, f"{method or weight_format}: vLLM's Triton int8 experts need SM 7.5 (TritonExperts)"
        return True, f"{method or weight_format}: vLLM's Int8 priority list starts with TRITON (oracle/int8.py)"
    if weight_format in ("int4_w4a16", "int8_w8a16") and method == "moe_wna16":
        if capability[0] == 9:
            return None, ("moe_wna16 on SM90: vLLM moves Humming ahead of Marlin (prioritize_humming), so it runs "
                          "before TRITON where the optional humming package is installed; the server's "
                          "'Using ... WNA16 MoE backend' line decides")
        if capability[0] >= 10:
            return None, ("moe_wna16 from SM100 on: FlashInfer TRT-LLM comes first where it takes the checkpoint; "
                          "the server's 'Using ... WNA16 MoE backend' line decides")
        return True, ("moe_wna16: Marlin refuses the MoeWNA16 layout, so vLLM's WNA16 list reaches TRITON "
                      "(oracle/int_wna16.py)")
    if weight_format in ("fp8_w8a8", "int4_w4a16", "int8_w8a16"):
        return None, (f"{method or weight_format}: kernels ahead of Triton in vLLM's list (FlashInfer, DeepGEMM, "
                      "CUTLASS, Marlin, Humming) run where the host supports them; the server's 'Using ... MoE "
                      "backend' line decides")
    return False, f"{weight_format}: vLLM runs no Triton fused-MoE kernel for this format"


def parse_backend_line(line: str) -> dict | None:
    """``{"backend", "kind", "available": [...], "reads_triton_files": bool}`` of a vLLM
    ``Using <backend> <Format> MoE backend ...`` line, else None."""
    m = _LINE.search(line)
    if not m:
        return None
    avail = re.findall(r"'([^']*)'", m["avail"]) if m["avail"] else []
    backend = m["backend"].strip("'")  # 0.32.0/0.33.0 WNA16: "Using 'TRITON' WNA16 MoE backend."
    return {"backend": backend, "kind": m["kind"], "available": avail,
            "reads_triton_files": backend in TRITON_LOG_VALUES}


#: log names of backends whose ``--moe-backend`` value is not the name lower-cased with ``_`` for
#: spaces (``oracle/fp8.py`` ``Fp8MoeBackend``: ``DEEPGEMM`` is ``deep_gemm``, ``VLLM_CUTLASS`` ``cutlass``)
_FLAG_OF_LOG = {"deepgemm": "deep_gemm", "vllm_cutlass": "cutlass"}


def backend_flag(log_name: str) -> str | None:
    """The ``--moe-backend`` value of a backend as a ``Using <backend> ... MoE backend`` line names it
    (``TRITON`` -> ``triton``, ``FlashInfer CUTLASS``/``FLASHINFER_CUTLASS`` -> ``flashinfer_cutlass``);
    None for one that is no :data:`BACKEND_CHOICES` value (``ROCm AITER``, ``BATCHED_DEEPGEMM``, ...)."""
    norm = log_name.strip("'").strip().lower().replace(" ", "_")
    norm = _FLAG_OF_LOG.get(norm, norm)
    return norm if norm in BACKEND_CHOICES else None


# --------------------------------------------------------------------------- the Engine's view

#: ``--moe-backend`` choices of 0.32.0-0.34.0 (``vllm/config/kernel.py`` ``MoEBackend``) a CUDA trial
#: can start (ROCm's ``aiter*``, ``flydsl`` and the XPU/CPU ones left out)
BACKEND_CHOICES = ("triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm",
                   "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl", "flashinfer_b12x", "b12x",
                   "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming", "triton_unfused")


def _capability(probe: dict) -> tuple[int, int] | None:
    cap = probe.get("capability")
    try:
        major, minor = str(cap).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def moe_runner(*, backend: str, probe: dict, ep: int, quantization: str | None, log=None):
    """The :class:`~remote.engines.records.MoeRunner` of a vLLM server run with ``--moe-backend
    backend`` (``auto`` when none), from the probe answer (``model``: its ``quant_method`` and
    ``block_shape``; ``capability``) and the last start's ``log`` (a
    :class:`~remote.engines.records.MoeLogReport`): its ``Using <backend> <Format> MoE backend``
    line decides where it has one (:func:`parse_backend_line`), else :func:`triton_verdict`."""
    from ..records import MoeRunner

    from .shape import quant_method

    model = probe.get("model") or {}
    fmt = model.get("quant_method")
    if fmt is None and (quantization or "").lower() == "fp8":
        fmt = "fp8_w8a8"
    ckpt = model.get("checkpoint_quant_method")
    method = quant_method({"quantization_config": {"quant_method": ckpt}} if ckpt else {}, quantization)
    flag = (backend or MOE_BACKEND_DEFAULT).strip().lower().replace("-", "_")
    reads, why = triton_verdict(fmt, model.get("block_shape"), _capability(probe), flag, ep, method)
    source = "flag" if flag != MOE_BACKEND_DEFAULT and reads is not None else "derived"
    lines = list(log.runner_lines) if log is not None else []
    if lines:
        last = lines[-1]
        said = last.runner in TRITON_LOG_VALUES
        disagree = None if reads is None or reads == said else f"orch's rule: {why}"
        verdict = ("reads the tuned Triton config files" if said else "reads no Triton config file")
        return MoeRunner(last.runner, said, f"the last start logged '{last.text.split('] ')[-1]}': vLLM's "
                         f"{last.runner} MoE kernel {verdict}", "log", disagree)
    runner = flag if source == "flag" else ("triton" if reads else None)
    return MoeRunner(runner, reads, why, source)


def parse_candidates(text: str, effective) -> list[str]:
    """The ``--moe-backend`` values a runner trial starts for ``--moe-runners text``: names separated
    by commas, each one of :data:`BACKEND_CHOICES`, or ``auto`` alone (``triton`` and each choice
    whose start ``effective(name)`` says runs that name). Raises ``PayloadError('bad_input')``."""
    from ...protocol import PayloadError

    words = [w.strip().lower().replace("-", "_") for w in str(text or "").split(",") if w.strip()]
    if not words:
        raise PayloadError("bad_input", "--moe-runners is empty: name vLLM --moe-backend values, or auto")
    if "auto" in words:
        if len(words) > 1:
            raise PayloadError("bad_input", "--moe-runners auto stands alone")
        return [c for c in BACKEND_CHOICES if c == "triton" or effective(c) == c]
    out: list[str] = []
    for w in words:
        if w not in BACKEND_CHOICES:
            raise PayloadError("bad_input", f"--moe-runners: {w!r} is not a vLLM --moe-backend orch tries "
                                            f"({', '.join(BACKEND_CHOICES)})")
        if w not in out:
            out.append(w)
    return [c for c in BACKEND_CHOICES if c in out]


def with_backend(words: list[str], backend: str) -> list[str]:
    """Command-line words with ``--moe-backend`` set to ``backend`` (each earlier spelling of it,
    ``--moe-backend X``, ``--moe-backend=X``, ``--moe_backend X``, removed; every other word kept)."""
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        name = w.split("=", 1)[0].replace("_", "-")
        if name == MOE_BACKEND_FLAG:
            skip = "=" not in w
            continue
        out.append(w)
    return out + [MOE_BACKEND_FLAG, backend]
