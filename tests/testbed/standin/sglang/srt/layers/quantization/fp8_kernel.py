"""Stand-in for ``sglang.srt.layers.quantization.fp8_kernel`` (orch test bed): the names the old module
``fused_moe_triton/fused_moe.py`` (SGLang <= 0.5.1) imports. Its quantized kernels never run in the
stand-in: each raises if called."""


def _not_simulated(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"{name}: not simulated by the orch test bed's stand-in")

    fn.__name__ = name
    return fn


per_token_group_quant_fp8 = _not_simulated("per_token_group_quant_fp8")
scaled_fp8_quant = _not_simulated("scaled_fp8_quant")
sglang_per_token_group_quant_fp8 = _not_simulated("sglang_per_token_group_quant_fp8")
