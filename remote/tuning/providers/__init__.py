"""Kernel providers for the tuner: what is timed for a candidate config.

- ``builtin`` (:mod:`remote.tuning.providers.builtin`): this payload's own Triton kernel
  (``remote.tuning.kernel``); the up and down GEMMs are timed separately (separable search).
- ``sglang`` (:mod:`remote.engines.sglang.provider`): SGLang's own Triton kernel as the host's
  SGLang has it (0.4.x-0.5.x layouts), timed per GEMM through its ``invoke_fused_moe_kernel`` and
  as the whole ``fused_experts`` reading candidate files, with ``USE_TMA`` searched where SGLang
  and the GPU support it.
- ``vllm`` (:mod:`remote.engines.vllm.provider`): vLLM's own Triton kernel (``fused_experts_impl``),
  one config for both GEMMs, candidate files read from ``VLLM_TUNED_CONFIG_FOLDER``.

Which one a name means is decided by :func:`remote.tuning.support.resolve_provider_name`, the
rule the probe reports as ``tuner_provider``; :func:`resolve_provider` builds that provider.

Each provider also owns its ahead-of-time compile job: ``compile_target`` (``"module:function"``
run in the compile workers of :class:`remote.tuning.tuner.compile.Compiler`), ``precompile_args``
and ``compile_per_batch`` (its kernel is specialised per batch size).
"""

from __future__ import annotations

from ...protocol import PayloadError, log
from ..support import resolve_provider_name


def resolve_provider(name: str = "auto"):
    """``(provider instance, reason)`` for ``name`` (``auto``, ``sglang`` or ``builtin``).

    The name is resolved by :func:`remote.tuning.support.resolve_provider_name` (``reason``:
    why ``auto`` fell back to builtin, else None). Raises PayloadError: ``bad_input`` for an
    unknown name; ``not_found`` for ``sglang`` when SGLang's fused-MoE entry is missing or does
    not import; ``runtime`` when ``auto`` resolved to ``sglang`` (the entry is installed, and
    the probe said so) but it does not import: falling back would tune another kernel than the
    one the controller's store key names.
    """
    if name == "vllm":
        # vLLM's kernel (issue 29): reachable below the tune command (bench/vllm_kernel_h200.py,
        # the tuner's driver); not yet a name of remote.protocol.PROVIDER_NAMES, which the
        # controller's inventory variable and store key use (the controller wiring comes with the
        # Engine seam)
        from ...engines.vllm.provider import VllmProvider, VllmUnavailable
        try:
            return VllmProvider(), None
        except VllmUnavailable as exc:
            raise PayloadError("not_found", f"provider vllm unavailable: {exc}") from None
    resolved, why = resolve_provider_name(name)
    if resolved == "builtin":
        from .builtin import BuiltinProvider

        return BuiltinProvider(), why
    try:
        from ...engines.sglang.provider import SglangProvider

        return SglangProvider(), None
    except Exception as exc:  # ImportError, or a broken install raising anything
        msg = f"SGLang's fused-MoE entry is installed but does not import: {type(exc).__name__}: {exc}"
        if name == "sglang":
            raise PayloadError("not_found", f"provider sglang unavailable: {msg}") from None
        raise PayloadError("runtime", f"provider auto resolved to sglang, but {msg}; "
                                      "tune with --provider builtin (orch_tune_provider: builtin)") from None


def get_provider(name: str = "auto"):
    """The provider instance for ``name`` (see :func:`resolve_provider`); logs why ``auto``
    fell back to the builtin kernel and keeps it as ``fallback_reason`` (None otherwise)."""
    provider, why = resolve_provider(name)
    provider.fallback_reason = why  # the tune report carries it
    if why:
        log(f"provider auto: SGLang not usable ({why}); using builtin kernel", "info")
    return provider
