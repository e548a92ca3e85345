"""What the tuner can run on this host, decided without importing torch, triton or sglang.

The probe reports these answers before anything is stopped, and the ``tune`` command applies
the same functions, so the controller and the payload never decide twice:

- :func:`unsupported_reason`: the model's MoE weights the tuner's kernel cannot run
  (probe ``model.tuner_unsupported``);
- :func:`resolve_provider_name`: which kernel ``--provider auto`` times, the engine's own (its
  provider, ``Engine.provider_name``) or orch's builtin one (probe ``tuner_provider``; the
  controller's store key names it).

Standard library only; importing this module imports neither torch nor the ``tune`` command.
"""

from __future__ import annotations

from ..engines import ENGINES, engine_named
from ..protocol import DEFAULT_ENGINE, PROVIDER_NAMES, PayloadError
def unsupported_reason(naming: dict, provider: str | None = None) -> str | None:
    """Why the tuner's kernel cannot run a model's MoE weights, or None when it can.

    ``naming``: the selectors of :class:`remote.engines.sglang.shape.MoeShape` (``dtype_selector``,
    ``weight_dtype``, ``per_channel_quant``, ``block_shape``, ``group_size``, ``has_zp``; the
    probe reports them as ``model`` with this answer as ``model.tuner_unsupported``, so the
    controller refuses such a host before stopping it). ``provider``: the resolved provider (an
    engine's, ``Engine.provider_name``, or ``builtin``; None: the narrower builtin answer).

    Both run bf16/fp16/fp32 weights and fp8_w8a8 with e4m3 weights and per-tensor or block
    scales. An engine's provider (its own kernel, e.g. SGLang's) also runs what its Triton fused
    MoE runs: ``int4_w4a16``/``int8_w8a16`` with a group size (GPTQ/AWQ through moe_wna16,
    compressed-tensors wNa16), ``int8_w8a16`` per channel without a group (vLLM's ``experts_int8``),
    ``int8_w8a8`` per-channel or block, per-channel fp8
    (:mod:`remote.tuning.kernel.formats`). The builtin kernel does not implement int8/int4 or
    per-channel fp8. Neither runs fp8 e5m2 nor non-gated experts (``gated`` False: w1 ``[E, N, K]``,
    e.g. Nemotron-H's relu2 experts; the kernels run ``[E, 2N, K]``).
    """
    if naming.get("gated") is False:
        return ("the model's experts are not gated (w1 is [E, N, K]); the tuner's kernel times gated experts "
                "([E, 2N, K]), so its configs would be tuned for another GEMM")
    sel, wd = naming.get("dtype_selector"), naming.get("weight_dtype")
    if sel in (None, "float32") and wd in ("bfloat16", "float16", "float32"):
        return None
    if sel == "fp8_w8a8" and not naming.get("per_channel_quant") and wd == "fp8_e4m3":
        return None
    what = f"dtype={sel}" + (" per-channel" if naming.get("per_channel_quant") else "") + f", weights {wd}"
    owner = engine_of_provider(provider)
    if owner is not None:
        try:
            quant_entry(naming)
        except ValueError as exc:
            return f"the model's MoE weights ({what}) are not a format {owner.display_name}'s Triton fused MoE runs: {exc}"
        return None
    own = " or ".join(f"the {e.provider_name} provider ({e.display_name}'s own kernel)" for e in ENGINES.values()
                      if e.provider_name)
    return (f"the model's MoE weights ({what}) are not a kind the builtin kernel runs (bf16/fp16/fp32, "
            f"fp8_w8a8 per-tensor or block); int8/int4 and per-channel fp8 run with {own}, not the builtin one")


def quant_entry(naming: dict) -> dict | None:
    """The tuner spec's ``quant`` entry for the selectors in ``naming`` (see
    :func:`unsupported_reason`): None for 16/32-bit weights, else
    :meth:`remote.tuning.kernel.formats.WeightFormat.to_dict`-shaped ``{"dtype", "block_shape",
    "per_channel", "group_size", "has_zp"}``. Raises ValueError for a combination SGLang's kernel
    does not run (mirrors ``WeightFormat``'s checks without importing torch)."""
    sel, wd = naming.get("dtype_selector"), naming.get("weight_dtype")
    if sel in (None, "float32"):
        return None
    block = list(naming["block_shape"]) if naming.get("block_shape") else None
    per_channel = bool(naming.get("per_channel_quant"))
    group, has_zp = int(naming.get("group_size") or 0), bool(naming.get("has_zp"))
    if sel == "int8_w8a16" and per_channel and group <= 0:
        if has_zp or block:
            raise ValueError("per-channel int8_w8a16 has no zero points or block shape")
        return dict(dtype=sel, block_shape=None, per_channel=True, group_size=0, has_zp=False)
    if sel in ("int4_w4a16", "int8_w8a16"):
        if group <= 0:
            raise ValueError(f"{sel} without a group size")
        return dict(dtype=sel, block_shape=None, per_channel=False, group_size=group, has_zp=has_zp)
    if sel == "int8_w8a8":
        if not (per_channel or block):
            raise ValueError("int8_w8a8 runs per-channel or block scales only")
    elif sel == "fp8_w8a8":
        if wd not in (None, "fp8_e4m3"):
            raise ValueError(f"fp8 weights {wd}: the kernel runs e4m3")
    else:
        raise ValueError(f"dtype selector {sel!r}")
    if block and per_channel:
        raise ValueError("block and per-channel scales exclude each other")
    return dict(dtype=sel, block_shape=block, per_channel=per_channel, group_size=0, has_zp=False)


def engine_of_provider(provider: str | None):
    """The engine whose own kernel the provider ``provider`` times (``Engine.provider_name``), None
    for ``builtin``, ``auto`` and None."""
    return next((e for e in ENGINES.values() if e.provider_name and e.provider_name == provider), None)


def resolve_provider_name(name: str, engine: str | None = None) -> tuple[str, str | None]:
    """The kernel provider ``--provider name`` tunes with: ``(resolved, reason)``.

    ``resolved`` is an engine's provider (``Engine.provider_name``) or ``"builtin"``; ``reason``
    says why ``auto`` fell back to ``builtin`` (None otherwise). ``auto`` is the provider of
    ``engine`` (the unit's engine; None: :data:`remote.protocol.DEFAULT_ENGINE`) exactly when that
    engine finds nothing of it missing on this host (``Engine.provider_missing``, read from disk).
    Raises PayloadError ``bad_input`` for a name not in :data:`remote.protocol.PROVIDER_NAMES`,
    ``not_found`` for an engine's provider whose entry is missing.
    """
    if name == "builtin":
        return "builtin", None
    if name not in PROVIDER_NAMES:
        raise PayloadError("bad_input", f"unknown provider {name!r} ({'|'.join(PROVIDER_NAMES)})")
    owner = engine_named(engine or DEFAULT_ENGINE) if name == "auto" else engine_of_provider(name)
    if owner is None or owner.provider_name is None:
        return "builtin", "the engine has no kernel provider of its own"
    why = owner.provider_missing()
    if why is None:
        return owner.provider_name, None
    if name != "auto":
        raise PayloadError("not_found", f"provider {name} unavailable: {why}")
    return "builtin", why
