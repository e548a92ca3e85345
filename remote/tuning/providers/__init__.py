"""Kernel providers for the tuner: what is timed for a candidate config.

- ``builtin`` (:mod:`remote.tuning.providers.builtin`): this payload's own Triton kernel
  (``remote.tuning.kernel``); the up and down GEMMs are timed separately (separable search).
- an engine's own kernel: each engine names its provider (``Engine.provider_name``) and where it
  lives (``Engine.provider_target``), e.g. SGLang's (:mod:`remote.engines.sglang.provider`): its
  own Triton kernel as the host's SGLang has it, timed per GEMM and as the whole fused MoE.
  vLLM's (:mod:`remote.engines.vllm.provider`): its ``fused_experts_impl``, one config for both
  GEMMs, candidate files read from ``VLLM_TUNED_CONFIG_FOLDER``.

Which one a name means is decided by :func:`remote.tuning.support.resolve_provider_name`, the
rule the probe reports as ``tuner_provider``; :func:`resolve_provider` builds that provider.

Each provider also owns its ahead-of-time compile job: ``compile_target`` (``"module:function"``
run in the compile workers of :class:`remote.tuning.tuner.compile.Compiler`), ``precompile_args``
and ``compile_per_batch`` (its kernel is specialised per batch size).
"""

from __future__ import annotations

import importlib

from ...protocol import PayloadError, log
from ..support import engine_of_provider, resolve_provider_name


def resolve_provider(name: str = "auto", engine: str | None = None):
    """``(provider instance, reason)`` for ``name`` (``auto``, an engine's provider such as
    ``sglang``, or ``builtin``; ``engine``: the unit's engine, whose provider ``auto`` means).

    The name is resolved by :func:`remote.tuning.support.resolve_provider_name` (``reason``:
    why ``auto`` fell back to builtin, else None); an engine's provider is built from its
    ``Engine.provider_target`` (``module:Class``), imported only here. Raises PayloadError:
    ``bad_input`` for an unknown name; ``not_found`` for an engine's provider named explicitly
    whose kernel entry is missing or does not import; ``runtime`` when ``auto`` resolved to an
    engine's provider (the entry is installed, and the probe said so) but it does not import:
    falling back would tune another kernel than the one the controller's store key names.
    """
    resolved, why = resolve_provider_name(name, engine)
    if resolved == "builtin":
        from .builtin import BuiltinProvider

        return BuiltinProvider(), why
    owner = engine_of_provider(resolved)
    module, _, cls = owner.provider_target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)(), None
    except Exception as exc:  # ImportError, or a broken install raising anything
        msg = (f"{owner.display_name}'s fused-MoE entry is installed but does not import: "
               f"{type(exc).__name__}: {exc}")
        if name != "auto":
            raise PayloadError("not_found", f"provider {resolved} unavailable: {msg}") from None
        raise PayloadError("runtime", f"provider auto resolved to {resolved}, but {msg}; "
                                      "tune with --provider builtin (orch_tune_provider: builtin)") from None


def get_provider(name: str = "auto", engine: str | None = None):
    """The provider instance for ``name`` (see :func:`resolve_provider`); logs why ``auto``
    fell back to the builtin kernel and keeps it as ``fallback_reason`` (None otherwise)."""
    provider, why = resolve_provider(name, engine)
    provider.fallback_reason = why  # the tune report carries it
    if why:
        log(f"provider auto: the engine's own kernel is not usable ({why}); using builtin kernel", "info")
    return provider
