"""Markdown renderings of SGLang's rules for the documentation (stdlib only): a maintainer's tool,
not shipped to hosts (it lived in ``remote/engines/sglang/`` until issue 28, part of the payload).

:func:`architecture_table_markdown` is the table of docs/sglang-models.md, rendered from
:data:`remote.engines.sglang.architectures.ARCHITECTURES`; a test fails when the page and the data differ.
:func:`runner_table_markdown` is the table of docs/runners.md, rendered from
:func:`remote.engines.sglang.runner.moe_runner` (the same check).

    python -m scripts.sglang_docs architectures   # the table of docs/sglang-models.md
    python -m scripts.sglang_docs runners         # the table of docs/runners.md
"""

from __future__ import annotations

import json

import sys

from remote.engines.sglang.architectures import ARCHITECTURES, Fusion


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _fusion_text(f: Fusion | None) -> str:
    if f is None:
        return "no"
    if f.count_rule == "qwen":
        count = f"{'/'.join(f.count)} (else 1 when {f.size} > 0)"
    elif f.count_rule == "bailing":
        count = f"{'/'.join(f.count)} (at least 1 when {f.size} > 0)"
    else:
        count = "/".join(f.count)
    when = []
    if f.arch:
        when.append(f"architectures[0] is {f.arch}")
    if f.routed_in:
        when.append(f"routed experts in {list(f.routed_in)}")
    if f.same_size:
        when.append(f"{f.size} equals the routed size")
    if f.one == "off":
        when.append("exactly 1 shared expert")
    if f.sm80:
        when.append("sm80+")
    if f.ep_off:
        when.append("no EP")
    if f.deepep_off:
        when.append("no DeepEP")
    if f.quant_off:
        when.append("not " + "/".join(f.quant_off))
    if f.block_divides:
        when.append("block FP8 divides N")
    text = f"yes, + {count}" + (f" when {', '.join(when)}" if when else "")
    if f.one == "error":
        text += "; more than 1 shared expert: SGLang refuses to load"
    return f"{text} ({f.gate})"


def architecture_table_markdown() -> str:
    """The markdown table of :data:`~remote.engines.sglang.architectures.ARCHITECTURES` that
    docs/sglang-models.md carries.

    One row per rule: family, ``architectures[0]`` names, where the fields sit, the fields of
    E, N and top-k, the shared-expert fusion rule, and the SGLang 0.5.23 source (paths relative
    to ``sglang/srt/``) with the rule's other conditions and notes.
    """
    head = ("| family | `architectures[0]` | fields at | E (routed experts) | N (expert intermediate size) "
            "| top-k | shared expert fused into the routed GEMM | SGLang 0.5.23 source, notes |")
    lines = [head, "|" + "---|" * 8]
    for r in ARCHITECTURES:
        archs = ", ".join(f"`{a}`" for a in r.archs)
        family = r.family + (f" (when `{r.when[0]}` is `{json.dumps(r.when[1])}`)" if r.when else "")
        if r.delegate:
            row = [family, archs, r.config_at, f"the rule of `{r.config_at}.architectures[0]`", "", "", "",
                   "; ".join([r.source, *r.notes])]
        else:
            e = " / ".join(f"`{s}`" for s in r.experts)
            if r.expert_parallel:
                e += " / EP"
            else:
                e += " (all on every rank)"
            n = " / ".join(f"`{s}`" for s in r.intermediate)
            n += (f" / {r.intermediate_div}" if r.intermediate_div != 1 else "")
            n += " / (TP / EP)" if r.expert_parallel else " / TP"
            if r.moe_tp1:
                n += "; needs TP / EP = 1"
            k = " / ".join(f"`{s}`" for s in r.topk) + (f" (default {r.topk_default})" if r.topk_default else "")
            extra = []
            if r.hidden != ("hidden_size",):
                extra.append("K: " + " / ".join(f"`{s}`" for s in r.hidden))
            if r.enabled_by:
                extra.append(f"MoE only when `{r.enabled_by}` is true")
            if not r.gated:
                extra.append("non-gated: w1 [E, N, K]")
            if not r.quantized:
                extra.append("unquantized fused_moe only")
            if r.refuse:
                extra.append("refused: " + r.refuse)
            extra.extend(r.notes)
            shared = _fusion_text(r.fusion)
            row = [family, archs, r.config_at or "top level", e, n, k, shared,
                   r.source + ("; " + "; ".join(extra) if extra else "")]
        lines.append("| " + " | ".join(_md(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


#: The combinations docs/runners.md lists: (family, architecture), (weights label, checkpoint
#: quantization method, ``--quantization``), (GPU label, compute capability).
RUNNER_FAMILIES = (("DeepSeek V3 / R1", "DeepseekV3ForCausalLM"), ("Kimi K2.5", "KimiK25ForConditionalGeneration"),
                   ("Qwen3 MoE", "Qwen3MoeForCausalLM"), ("Qwen3-Next", "Qwen3NextForCausalLM"),
                   ("GLM-4.5 / 4.6", "Glm4MoeForCausalLM"), ("Llama 4", "Llama4ForConditionalGeneration"),
                   ("Mixtral (families without an override)", "MixtralForCausalLM"))
RUNNER_WEIGHTS = (("bf16", None, None), ("fp8 (block)", "fp8", None), ("fp8, --quantization fp8", "fp8", "fp8"), ("ModelOpt FP8", "modelopt_fp8", None),
                  ("ModelOpt NVFP4", "modelopt_fp4", None), ("NVFP4, --quantization modelopt_fp4", "modelopt_fp4",
                                                           "modelopt_fp4"),
                  ("MXFP8", "mxfp8", None), ("W8A8 int8 (--quantization w8a8_int8)", "compressed-tensors",
                                             "w8a8_int8"))
RUNNER_GPUS = (("H100 / H200 (sm90)", "9.0"), ("B200 / GB200 (sm100)", "10.0"),
               ("RTX PRO 6000 / DGX Spark (sm120)", "12.0"))


#: The line of each SGLang 0.5.23 function the table cites (``def``), checked against the wheel by
#: ``tests/unit/remote/engines/sglang/test_runner_docs.py``.
SOURCE_LINES = {
    "srt/arg_groups/model_overrides/glm4_moe.py _glm4_moe_overrides": 16,
    "srt/arg_groups/model_overrides/llama4.py _llama4_overrides": 17,
    "srt/arg_groups/model_overrides/qwen3_moe.py _qwen3_moe_family_overrides": 38,
    "srt/arg_groups/overrides.py _deepseek_moe_quant_resolution": 764,
    "srt/arg_groups/overrides.py _moe_runner_backend_quant_constraints": 1449,
    "srt/layers/quantization/fp8.py Fp8MoEMethod.create_moe_runner": 2941,
    "srt/layers/quantization/modelopt_quant.py ModelOptFp8MoEMethod.create_moe_runner": 1343,
    "srt/layers/quantization/modelopt_quant.py ModelOptNvFp4FusedMoEMethod.create_moe_runner": 3111,
    "srt/layers/quantization/unquant.py UnquantizedFusedMoEMethod.create_moe_runner": 1169,
    "srt/layers/quantization/w8a8_int8.py W8A8Int8MoEMethod.create_moe_runner": 325,
}


def runner_table_markdown() -> str:
    """The table of docs/runners.md: for ``--moe-runner-backend auto`` (no all-to-all backend),
    which runner SGLang 0.5.23 runs for each (family, weights, GPU) of :data:`RUNNER_FAMILIES`,
    :data:`RUNNER_WEIGHTS` and :data:`RUNNER_GPUS`, according to orch
    (:func:`remote.engines.sglang.runner.moe_runner`), and the SGLang source it follows (file and function;
    their lines in the wheel are checked by ``tests/unit/remote/engines/sglang/test_runner_docs.py``)."""
    from remote.engines.sglang.runner import moe_runner  # noqa: PLC0415 (the table's one user)

    rows = ["| model family | weights | GPU | runner | reads Triton files | SGLang 0.5.23 source |",
            "|---|---|---|---|---|---|"]
    for family, arch in RUNNER_FAMILIES:
        for wlabel, ckpt, flag in RUNNER_WEIGHTS:
            for glabel, cap in RUNNER_GPUS:
                r = moe_runner(architecture=arch, checkpoint_quant=ckpt, quantization=flag, capability=cap,
                               weight_dtype="int8" if flag == "w8a8_int8" else None, triton_kernels=False)
                runner = r.runner or "unknown"
                reads = {True: "yes (orch tunes)", False: "no (orch skips)", None: "unknown (orch refuses)"}[
                    r.reads_triton_configs]
                source = source_of(r.reason) if r.runner else r.reason.split(": ", 1)[-1]
                rows.append(f"| {_md(family)} (`{arch}`) | {_md(wlabel)} | {glabel} | `{runner}` | {reads} | "
                            f"{_md(source)} |")
    return "\n".join(rows) + "\n"


def source_of(reason: str) -> str:
    """The SGLang files and functions a :class:`~remote.engines.sglang.runner.MoeRunner` reason cites
    (``srt/...py:LINE name``, the line from :data:`SOURCE_LINES`), joined by ``; ``, in order."""
    import re  # noqa: PLC0415

    found = re.findall(r"(srt/[\w/]+\.py) ([A-Za-z_][\w.]*)", reason)
    seen: list[str] = []
    for path, name in found:
        item = f"{path} {name}"
        if item in SOURCE_LINES:
            item = f"{path}:{SOURCE_LINES[item]} {name}"
        if item not in seen:
            seen.append(item)
    return "; ".join(seen) or reason


if __name__ == "__main__":
    tables = {"architectures": architecture_table_markdown, "runners": runner_table_markdown}
    if len(sys.argv) != 2 or sys.argv[1] not in tables:
        sys.exit(f"usage: python -m scripts.sglang_docs {'|'.join(tables)}")
    print(tables[sys.argv[1]](), end="")
