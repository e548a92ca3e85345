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

from ..protocol import PROVIDER_NAMES, PayloadError
from ..engines.sglang.lookup import sglang_module_file, sglang_package_dirs

#: SGLang's fused-MoE entry points the ``sglang`` provider drives, by role: ``(module, attribute)``
#: candidates, newest layout first; the first that imports wins
#: (:class:`remote.engines.sglang.provider.SglangKernel`). Layouts, checked against the release
#: wheels: 0.5.16+ has the Triton GEMM in ``sglang.kernels.ops.moe`` and the rest in
#: ``moe_runner/triton_utils``; 0.5.12 has all of it in ``moe_runner/triton_utils``; 0.5.2-0.5.10
#: split ``fused_moe_triton/`` into modules; 0.4.x keeps it in ``fused_moe_triton/fused_moe.py``.
SGLANG_KERNEL_ROLES = {
    "invoke": (
        ("sglang.kernels.ops.moe.fused_moe_triton_kernels", "invoke_fused_moe_kernel"),
        ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_kernels", "invoke_fused_moe_kernel"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels", "invoke_fused_moe_kernel"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "invoke_fused_moe_kernel"),
    ),
    "fused_experts": (
        ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe", "fused_experts"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "fused_experts"),
    ),
    "align": (
        ("sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size", "moe_align_block_size"),
        ("sglang.srt.layers.moe.fused_moe_triton.moe_align_block_size", "moe_align_block_size"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "moe_align_block_size"),
    ),
    "get_moe_configs": (
        ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config", "get_moe_configs"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config", "get_moe_configs"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "get_moe_configs"),
    ),
    "get_default_config": (
        ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config", "get_default_config"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config", "get_default_config"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "get_default_config"),
    ),
    "get_config_file_name": (
        ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config", "get_config_file_name"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config", "get_config_file_name"),
        ("sglang.srt.layers.moe.fused_moe_triton.fused_moe", "get_config_file_name"),
    ),
    "topk_output": (("sglang.srt.layers.moe.topk", "StandardTopKOutput"),),
    "runner_config": (("sglang.srt.layers.moe.moe_runner", "MoeRunnerConfig"),),
    # forces one config for both GEMMs: the whole-kernel path of releases whose loader does not
    # read SGLANG_MOE_CONFIG_DIR (before 0.5.3; they read no _down file either)
    "override_config": (
        ("sglang.srt.layers.moe.moe_runner.triton_utils", "override_config"),
        ("sglang.srt.layers.moe.fused_moe_triton", "override_config"),
    ),
}
#: Roles the provider does without (older releases pass top-k tensors and flags instead; newer
#: ones read candidate files from SGLANG_MOE_CONFIG_DIR).
SGLANG_OPTIONAL_ROLES = ("topk_output", "runner_config", "override_config")


def unsupported_reason(naming: dict, provider: str | None = None) -> str | None:
    """Why the tuner's kernel cannot run a model's MoE weights, or None when it can.

    ``naming``: the selectors of :class:`remote.engines.sglang.shape.MoeShape` (``dtype_selector``,
    ``weight_dtype``, ``per_channel_quant``, ``block_shape``, ``group_size``, ``has_zp``; the
    probe reports them as ``model`` with this answer as ``model.tuner_unsupported``, so the
    controller refuses such a host before stopping it). ``provider``: the resolved provider
    (``sglang`` or ``builtin``; None: the narrower builtin answer).

    Both run bf16/fp16/fp32 weights and fp8_w8a8 with e4m3 weights and per-tensor or block
    scales. The ``sglang`` provider (SGLang's own kernel) also runs what its Triton fused MoE
    runs: ``int4_w4a16``/``int8_w8a16`` with a group size (GPTQ/AWQ through moe_wna16,
    compressed-tensors wNa16), ``int8_w8a8`` per-channel or block, per-channel fp8
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
    if provider == "sglang":
        try:
            quant_entry(naming)
        except ValueError as exc:
            return f"the model's MoE weights ({what}) are not a format SGLang's Triton fused MoE runs: {exc}"
        return None
    return (f"the model's MoE weights ({what}) are not a kind the builtin kernel runs (bf16/fp16/fp32, "
            "fp8_w8a8 per-tensor or block); int8/int4 and per-channel fp8 run with the sglang provider "
            "(SGLang's own kernel), not the builtin one")


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


def sglang_entry_missing() -> str | None:
    """Why the ``sglang`` provider cannot run here, or None when SGLang's fused-MoE entry points
    (:data:`SGLANG_KERNEL_ROLES`, every required role) are installed for this interpreter.

    Read from disk (:func:`remote.engines.sglang.lookup.sglang_module_file`: a module file of some
    candidate of each role exists), nothing is imported: the probe runs beside a serving unit
    and must not execute SGLang's ``__init__``. The provider's own import is authoritative.
    """
    try:
        if not sglang_package_dirs():
            return "sglang is not installed for this interpreter"
        for role, cands in SGLANG_KERNEL_ROLES.items():
            if role in SGLANG_OPTIONAL_ROLES:
                continue
            if not any(sglang_module_file(module) for module, _attr in cands):
                return (f"this SGLang has none of the modules of its fused-MoE {role} entry "
                        f"({', '.join(m for m, _ in cands)})")
    except OSError as exc:  # an unreadable site-packages folder
        return f"cannot look for SGLang's fused-MoE entry: {exc}"
    return None


def resolve_provider_name(name: str) -> tuple[str, str | None]:
    """The kernel provider ``--provider name`` tunes with: ``(resolved, reason)``.

    ``resolved`` is ``"sglang"`` or ``"builtin"``; ``reason`` says why ``auto`` fell back to
    ``builtin`` (None otherwise). ``auto`` is ``sglang`` exactly when :func:`sglang_entry_missing`
    finds nothing missing. Raises PayloadError ``bad_input`` for a name not in
    :data:`remote.protocol.PROVIDER_NAMES`, ``not_found`` for ``sglang`` when its entry is missing.
    """
    if name == "builtin":
        return "builtin", None
    if name not in PROVIDER_NAMES:
        raise PayloadError("bad_input", f"unknown provider {name!r} ({'|'.join(PROVIDER_NAMES)})")
    why = sglang_entry_missing()
    if why is None:
        return "sglang", None
    if name == "sglang":
        raise PayloadError("not_found", f"provider sglang unavailable: {why}")
    return "builtin", why
