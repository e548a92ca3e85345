"""Server flags with which SGLang never reads the Triton fused-MoE config files orch tunes.

Two such flags, read in the real code of each covered release (docs/sglang-releases.md):

1. ``--enable-deterministic-inference``. From SGLang 0.5.5 on, ``get_moe_configs`` returns None
   before any lookup when the flag is set (0.5.5 ``srt/layers/moe/fused_moe_triton/
   fused_moe_triton_config.py``; 0.5.23 ``srt/layers/moe/moe_runner/triton_utils/
   fused_moe_triton_config.py``, ``if get_exec().deterministic.enable_deterministic_inference:``),
   logging ``Deterministic inference is enabled, using default MoE kernel config.``, and
   ``get_default_config`` returns one fixed tile for every batch size. 0.5.3 and 0.5.4 take the
   flag but still read the files (their ``get_moe_configs`` does not look at it).
2. KTransformers' CPU/GPU expert split (kt-kernel). 0.5.6 to 0.5.23, ``--kt-weight-path``:
   ``srt/layers/moe/fused_moe_triton/layer.py`` ``FusedMoE.__init__`` wraps the layer's method in
   ``srt/layers/moe/kt_ep_wrapper.py`` ``KTEPWrapperMethod`` (``create_kt_config_from_server_args``
   returns a config exactly when the path is set), whose ``create_weights`` gives the GPU only
   ``--kt-num-gpu-experts`` experts and whose ``apply`` masks the other experts' top-k ids to -1 and
   runs them on the CPU with ``kt_kernel``: the GPU GEMM's E is that count, not the model's, and
   its routing is one no tuner reproduces, so the files orch names from the model are never looked
   up. 0.5.4 and 0.5.5, ``--kt-amx-weight-path``: ``server_args.py``
   ``_handle_ktransformers_configs`` sets ``SGLANG_KT_MOE_AMX_WEIGHT_PATH``, and
   ``srt/layers/quantization/compressed_tensors/compressed_tensors_moe.py``
   ``CompressedTensorsMoEMethod.get_moe_method`` then returns ``CompressedTensorsWNA16AMXEPMoEMethod``
   (AMX on the CPU, Marlin on the GPU: no Triton file at all).

:func:`files_bypassed` gives the reason or None. ``tests/unit/remote/engines/sglang/
test_bypass_oracle.py`` holds both rules against every covered release's code. Standard library only.
"""

from __future__ import annotations

from .lookup import version_key

#: the first covered release whose ``get_moe_configs`` returns None under deterministic inference
DETERMINISTIC_SINCE = "0.5.5"
#: KTransformers' weight-path flag -> (first covered release with it, last covered release with it
#: or None while the newest has it, the SGLang code that takes the MoE away from the Triton files)
KT_FLAGS: dict[str, tuple[str, str | None, str]] = {
    "--kt-amx-weight-path": ("0.5.4", "0.5.5", "srt/layers/quantization/compressed_tensors/compressed_tensors_moe.py "
                                               "CompressedTensorsWNA16AMXEPMoEMethod (AMX experts on the CPU, the "
                                               "GPU's on Marlin)"),
    "--kt-weight-path": ("0.5.6", None, "srt/layers/moe/kt_ep_wrapper.py KTEPWrapperMethod (the GPU holds only "
                                        "--kt-num-gpu-experts experts, the rest run on the CPU in kt_kernel)"),
}


def flag_value(args: list[str], option: str) -> str | None:
    """The value of ``option`` in the launch arguments ``args`` (``--opt VALUE`` or ``--opt=VALUE``,
    the last one wins as in argparse); None when absent. Pure."""
    found = None
    for i, tok in enumerate(args):
        if tok == option and i + 1 < len(args):
            found = args[i + 1]
        elif tok.startswith(option + "="):
            found = tok.split("=", 1)[1]
    return found


def _at_least(version: str | None, since: str) -> bool:
    """``version`` is ``since`` or newer; an unknown version counts as the newest release."""
    if not version:
        return True
    try:
        return version_key(version) >= version_key(since)
    except ValueError:
        return True


def files_bypassed(launch_args: list[str], deterministic: bool, sglang_version: str | None) -> str | None:
    """Why SGLang ``sglang_version`` (None: unknown, taken as the newest rules) never reads the
    Triton MoE config files of the server started with ``launch_args`` (the flags after
    ``-m sglang.launch_server``, ``--config`` merged) and ``deterministic``
    (``--enable-deterministic-inference``), or None when it may read them (module docstring).
    The reason names the flag and the SGLang code. Pure."""
    for option, (since, _until, where) in KT_FLAGS.items():
        if flag_value(launch_args, option):
            experts = flag_value(launch_args, "--kt-num-gpu-experts")
            return (f"{option} is set: KTransformers' kt-kernel runs the MoE ({where}"
                    + (f"; --kt-num-gpu-experts {experts}" if experts else "")
                    + "), so the Triton config files orch would tune for the model's E are never looked up")
    if deterministic and _at_least(sglang_version, DETERMINISTIC_SINCE):
        return ("--enable-deterministic-inference is set: SGLang 0.5.5+ get_moe_configs returns no config file "
                "and get_default_config one fixed tile for every batch size "
                "(srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py in 0.5.23), so the Triton "
                "config files are never read")
    return None
