"""Kernel providers for the tuner: what is timed for a candidate config.

- ``builtin`` (:mod:`remote.tuning.providers.builtin`): this payload's own Triton kernel
  (``remote.tuning.kernel``); the up and down GEMMs are timed separately (separable search).
- ``sglang`` (:mod:`remote.tuning.providers.sglang`): SGLang's own ``fused_moe`` entry with a
  forced config, when ``import sglang`` works; up and down share one config (joint search).

:func:`get_provider` resolves ``auto``/``sglang``/``builtin``.
"""

from __future__ import annotations

from ...protocol import PayloadError, log


def get_provider(name: str = "auto"):
    """Return a provider instance for ``name`` (``auto``, ``sglang`` or ``builtin``).

    ``auto``: SGLang's when ``import sglang`` and its fused-MoE entry import, else builtin.
    ``sglang``: raises PayloadError('not_found') when SGLang is not importable.
    Raises PayloadError('bad_input') for an unknown name.
    """
    from .builtin import BuiltinProvider

    if name == "builtin":
        return BuiltinProvider()
    if name not in ("auto", "sglang"):
        raise PayloadError("bad_input", f"unknown provider {name!r} (auto|sglang|builtin)")
    from .sglang import SglangProvider, sglang_unavailable_reason

    why = sglang_unavailable_reason()
    if why is None:
        return SglangProvider()
    if name == "sglang":
        raise PayloadError("not_found", f"provider sglang unavailable: {why}")
    log(f"provider auto: SGLang not usable ({why}); using builtin kernel", "info")
    return BuiltinProvider()
