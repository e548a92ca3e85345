"""The MoE runners a release accepts (``--moe-runner-backend`` choices) and the candidates of a runner
trial (``orch tune --moe-runners``). Standard library only.

:data:`MOE_RUNNER_BACKEND_CHOICES` holds, per covered release, the list its argument parser
accepts: ``MOE_RUNNER_BACKEND_CHOICES`` in ``srt/server_args.py`` (0.5.8 ... 0.5.12) or
``srt/arg_groups/choices.py`` (0.5.23). ``tests/unit/remote/engines/sglang/test_runner_choices_oracle.py``
reads each list from the real wheel and compares.
"""

from __future__ import annotations

from typing import Callable

from ...protocol import PayloadError

_BASE = ("auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm")
#: release -> the ``--moe-runner-backend`` choices its parser accepts, in its order
MOE_RUNNER_BACKEND_CHOICES: dict[str, tuple[str, ...]] = {
    "0.5.8": _BASE + ("flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl", "cutlass"),
    "0.5.11": _BASE + ("flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
                       "cutlass", "aiter"),
    "0.5.12": _BASE + ("flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
                       "cutlass", "aiter", "marlin"),
    "0.5.23": _BASE + ("experimental_sgl_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass",
                       "flashinfer_mxfp4", "flashinfer_cutedsl", "flashinfer_megamoe", "cutlass", "aiter", "marlin",
                       "humming", "experimental_sgl_marlin", "lora_cutedsl", "lora_triton", "lora_marlin", "hpc_ops",
                       "megamoe", "intel_xpu"),
}
#: choices a trial never starts on a CUDA host: ``auto`` (a trial names runners), the LoRA runners
#: (need LoRA adapters), ``aiter`` (ROCm) and ``intel_xpu`` (Intel GPUs)
NOT_TRIED = frozenset({"auto", "aiter", "intel_xpu", "lora_cutedsl", "lora_triton", "lora_marlin"})


def release_choices(version: str | None) -> tuple[str, ...]:
    """The ``--moe-runner-backend`` choices of SGLang ``version`` (``0.5.23``; a local suffix such as
    ``0.5.23+cu129`` or ``.post1`` is ignored). Raises ``PayloadError('bad_input')`` for a release
    whose list orch does not hold (it cannot check names against it)."""
    base = str(version or "").split("+", 1)[0]
    for cand in (base, base.split(".post", 1)[0]):
        if cand in MOE_RUNNER_BACKEND_CHOICES:
            return MOE_RUNNER_BACKEND_CHOICES[cand]
    raise PayloadError("bad_input", f"SGLang {version or '(version unknown)'}: orch holds no list of its "
                                    f"--moe-runner-backend choices (known: {', '.join(MOE_RUNNER_BACKEND_CHOICES)}), "
                                    "so a runner trial cannot check the names")


def parse_candidates(text: str, version: str | None, effective: Callable[[str], str | None]) -> list[str]:
    """The runners a trial starts, from ``--moe-runners`` ``text``: names separated by commas, each
    one of the release's choices (:func:`release_choices`) and not in :data:`NOT_TRIED`, or ``auto``
    alone: every choice the release would really run for these weights on this GPU.

    ``effective(name)``: the runner the server ends up with for ``--moe-runner-backend name`` (the
    rules of :func:`remote.engines.sglang.runner.moe_runner`), None when SGLang would refuse to start or
    the answer is unknown. ``auto`` keeps the names whose effective runner is the name itself (a
    name the quantization method turns into another runner, e.g. ``flashinfer_cutlass`` on fp8
    weights running Triton, is the same candidate twice) and always ``triton``. Named candidates
    whose effective runner is another name are refused (the trial would measure the other one).
    Returns the names in the release's order, without repeats. Raises
    ``PayloadError('bad_input')`` naming the bad entry."""
    choices = release_choices(version)
    words = [w.strip() for w in str(text or "").split(",") if w.strip()]
    if not words:
        raise PayloadError("bad_input", "--moe-runners is empty: name runners separated by commas, or auto")
    if "auto" in words:
        if len(words) > 1:
            raise PayloadError("bad_input", "--moe-runners auto stands alone (it means every runner the release "
                                            "allows for these weights on this GPU)")
        return [c for c in choices if c not in NOT_TRIED and (c == "triton" or effective(c) == c)]
    out: list[str] = []
    for w in words:
        if w not in choices:
            raise PayloadError("bad_input", f"--moe-runners: {w!r} is not a --moe-runner-backend choice of SGLang "
                                            f"{version} (choices: {', '.join(c for c in choices if c != 'auto')})")
        if w in NOT_TRIED:
            raise PayloadError("bad_input", f"--moe-runners: {w} is not tried by orch (LoRA, ROCm and XPU runners "
                                            "need hardware or adapters a CUDA trial does not have)")
        got = effective(w)
        if got is None:
            raise PayloadError("bad_input", f"--moe-runners: SGLang {version} would not start with "
                                            f"--moe-runner-backend {w} for these weights on this GPU")
        if got != w:
            raise PayloadError("bad_input", f"--moe-runners: --moe-runner-backend {w} runs the {got} runner for "
                                            f"these weights (name {got} instead)")
        if w not in out:
            out.append(w)
    return [c for c in choices if c in out]
