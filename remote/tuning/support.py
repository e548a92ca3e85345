"""What the tuner can run on this host, decided without importing torch, triton or sglang.

The probe reports these answers before anything is stopped, and the ``tune`` command applies
the same functions, so the controller and the payload never decide twice:

- :func:`unsupported_reason`: the model's MoE weights the tuner's kernel cannot run
  (probe ``model.tuner_unsupported``);
- :func:`resolve_provider_name`: which kernel ``--provider auto`` times, SGLang's fused-MoE
  entry or orch's builtin one (probe ``tuner_provider``; the controller's store key names it).

Standard library only; importing this module imports neither torch nor the ``tune`` command.
"""

from __future__ import annotations

from ..protocol import PayloadError
from ..sglang.lookup import sglang_module_file, sglang_package_dirs

#: Names ``--provider`` accepts.
PROVIDER_NAMES = ("auto", "sglang", "builtin")

#: SGLang's fused-MoE entry the ``sglang`` provider drives: ``(module, attribute)`` pairs.
#: ``override_config`` forces a config, ``fused_moe`` runs the fused MoE. Both exist in SGLang
#: 0.4.10 to 0.5.8; 0.5.23 moved the kernel to ``moe_runner/triton_utils`` and no longer ships
#: ``fused_moe_triton/fused_moe.py`` (checked against the release wheels).
SGLANG_MOE_ENTRY = (
    ("sglang.srt.layers.moe.fused_moe_triton", "override_config"),
    ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "fused_moe"),
)


def unsupported_reason(naming: dict) -> str | None:
    """Why the tuner's kernel cannot run a model's MoE weights, or None when it can.

    ``naming``: the selectors of :class:`remote.sglang.model.MoeShape` (``dtype_selector``,
    ``weight_dtype``, ``per_channel_quant``, ``block_shape``; the probe reports them as
    ``model`` with this answer as ``model.tuner_unsupported``, so the controller refuses such a
    host before stopping it). Runs: bf16/fp16/fp32 weights, and fp8_w8a8 with e4m3 weights and
    per-tensor or block scales; not int8/int4, per-channel fp8 or fp8 e5m2, nor non-gated experts
    (``gated`` False: w1 ``[E, N, K]``, e.g. Nemotron-H's relu2 experts; the kernel runs ``[E, 2N, K]``).
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
    return (f"the model's MoE weights ({what}) are not a kind the tuner's kernel runs (bf16/fp16/fp32, "
            "fp8_w8a8 per-tensor or block); int8/int4 and per-channel fp8 are not implemented")


def sglang_entry_missing() -> str | None:
    """Why the ``sglang`` provider cannot run here, or None when SGLang's fused-MoE entry
    (:data:`SGLANG_MOE_ENTRY`) is installed for this interpreter.

    Read from disk (:func:`remote.sglang.lookup.sglang_module_file`), nothing is imported: the
    probe runs beside a serving unit and must not execute SGLang's ``__init__``.
    """
    try:
        if not sglang_package_dirs():
            return "sglang is not installed for this interpreter"
        for module, _attr in SGLANG_MOE_ENTRY:
            if sglang_module_file(module) is None:
                return (f"this SGLang has no {module} (the entry the sglang provider drives; "
                        "SGLang 0.5.23 does not ship it)")
    except OSError as exc:  # an unreadable site-packages folder
        return f"cannot look for SGLang's fused-MoE entry: {exc}"
    return None


def resolve_provider_name(name: str) -> tuple[str, str | None]:
    """The kernel provider ``--provider name`` tunes with: ``(resolved, reason)``.

    ``resolved`` is ``"sglang"`` or ``"builtin"``; ``reason`` says why ``auto`` fell back to
    ``builtin`` (None otherwise). ``auto`` is ``sglang`` exactly when :func:`sglang_entry_missing`
    finds nothing missing. Raises PayloadError ``bad_input`` for a name not in
    :data:`PROVIDER_NAMES`, ``not_found`` for ``sglang`` when its entry is missing.
    """
    if name == "builtin":
        return "builtin", None
    if name not in PROVIDER_NAMES:
        raise PayloadError("bad_input", f"unknown provider {name!r} (auto|sglang|builtin)")
    why = sglang_entry_missing()
    if why is None:
        return "sglang", None
    if name == "sglang":
        raise PayloadError("not_found", f"provider sglang unavailable: {why}")
    return "builtin", why
