"""Markdown renderings of SGLang's rules for the documentation (stdlib only).

:func:`architecture_table_markdown` is the table of docs/sglang-models.md, rendered from
:data:`remote.sglang.architectures.ARCHITECTURES`; a test fails when the page and the data differ.
"""

from __future__ import annotations

import json

from .architectures import ARCHITECTURES, Fusion


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
    """The markdown table of :data:`~remote.sglang.architectures.ARCHITECTURES` that
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
