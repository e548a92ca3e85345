"""Stand-in for ``sglang.srt.layers.moe.topk`` (orch test bed): ``TopKOutput``, which the old
module ``fused_moe_triton/fused_moe.py`` (SGLang <= 0.5.1) imports for type hints only."""


class TopKOutput(tuple):
    """Placeholder of SGLang's top-k result type (never built by the stand-in)."""
