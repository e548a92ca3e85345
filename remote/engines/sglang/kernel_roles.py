"""SGLang's fused-MoE entry points the ``sglang`` tuner provider drives, and whether this host has
them, decided without importing torch, triton or sglang (standard library only).

:data:`SGLANG_KERNEL_ROLES` is the kernel module layout of every covered release (the provider's
own knowledge: :class:`remote.engines.sglang.provider.SglangKernel` imports the first candidate of
each role that imports); :func:`sglang_entry_missing` is the probe's answer to "can the ``sglang``
provider run here" (``remote.tuning.support.resolve_provider_name``).
"""

from __future__ import annotations

from .lookup import sglang_module_file, sglang_package_dirs

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
