"""The quantization and dtype of a model's MoE weights, as SGLang 0.5.23 names them (stdlib only).

:func:`quant_rule` reads the checkpoint's ``quantization_config`` with the server's
``--quantization``; :func:`activation_dtype` the MoE input's dtype with the server's ``--dtype``.
Both give the selectors of SGLang's config file name (``dtype=fp8_w8a8``, ``block_shape=[128,
128]``, ``per_channel_quant=True``) that :func:`remote.engines.sglang.shape.moe_shape` puts in a
:class:`~remote.engines.sglang.shape.MoeShape`.
"""

from __future__ import annotations

import re

from ...protocol import PayloadError

_DTYPE_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}


def activation_dtype(tc: dict, cfg: dict, dtype: str | None, notes: list[str]) -> str:
    """The dtype of the MoE input: ``bfloat16``, ``float16`` or ``float32``.

    ``dtype``: the server's ``--dtype`` (None/``auto``: from ``torch_dtype``/``dtype`` of the MoE
    config ``tc``, then of the top level ``cfg``; a float32 checkpoint runs in 16 bits, as SGLang's
    ``--dtype auto`` casts it). Caveats are appended to ``notes``. Raises PayloadError('bad_input')
    for a ``--dtype`` it does not know.
    """
    if dtype is not None and dtype != "auto":
        d = _DTYPE_ALIASES.get(str(dtype).lower())
        if d is None:
            raise PayloadError("bad_input", f"--dtype {dtype!r}: expected auto, bfloat16, float16/half or float32/float")
        return d
    raw = None
    for src in (tc, cfg):
        raw = src.get("torch_dtype") or src.get("dtype")
        if raw:
            break
    d = _DTYPE_ALIASES.get(str(raw).lower().replace("torch.", "")) if raw else None
    if d is None:
        if raw:
            notes.append(f"config dtype {raw!r} not understood; assumed bfloat16")
        return "bfloat16"
    if d == "float32":
        # --dtype auto never runs a float32 checkpoint in float32 (it is cast to 16 bits)
        notes.append("float32 checkpoint with --dtype auto runs in 16-bit; assumed bfloat16")
        return "bfloat16"
    return d


def quant_rule(qc: dict | None, flag: str | None, notes: list[str]) -> dict:
    """The quantization of the MoE weights and the file-name selectors it gives.

    ``qc``: the checkpoint's ``quantization_config`` (None: unquantized); ``flag``: the server's
    ``--quantization`` (None: from the checkpoint). Returns ``{method, selector, block, per_channel,
    weight_dtype, packed}``: ``selector`` is the ``dtype=`` part of SGLang's file name
    (``fp8_w8a8``, ``int8_w8a8``, ``int8_w8a16``, ``int4_w4a16`` or None), ``block`` the
    ``[block_n, block_k]`` of block quantization, ``packed`` True for int4 (N is halved),
    ``group_size`` (weight-only formats: K columns per scale, as the checkpoint states it; the
    layer may halve it, :func:`wna16_group_size`) and ``has_zp`` (they store zero points).
    Which MoE layers the checkpoint leaves unquantized: :func:`moe_layer_excluded`.
    Sources (SGLang 0.5.23 ``srt/layers/quantization/``): ``fp8.py`` ``Fp8Config``,
    ``w8a8_int8.py``, ``w8a8_fp8.py``, ``blockwise_int8.py``, ``moe_wna16.py``
    ``MoeWNA16Config.from_config``/``is_moe_wna16_compatible``, ``compressed_tensors/``.
    Caveats are appended to ``notes``. Raises PayloadError('bad_input') for a quantization orch
    cannot name (it may not use the Triton fused-MoE configs at all).
    """
    none = dict(method=None, selector=None, block=None, per_channel=False, weight_dtype=None, packed=False)
    out = _quant_rule(qc, flag, notes, none)
    out.setdefault("group_size", 0)
    out.setdefault("has_zp", False)
    return out


def _quant_rule(qc, flag, notes, none) -> dict:
    ck_method = str(qc.get("quant_method", "")).lower() if isinstance(qc, dict) else None
    flag = flag.lower() if flag else None
    if flag in ("none", ""):
        flag = None

    def fp8_ckpt() -> dict:
        wbs = qc.get("weight_block_size")
        fmt = str(qc.get("fmt") or "e4m3").lower()
        out = dict(method="fp8", selector="fp8_w8a8", block=None, per_channel=False,
                   weight_dtype=f"fp8_{fmt}", packed=False)
        if wbs:
            if not (isinstance(wbs, list) and len(wbs) == 2 and all(isinstance(x, int) and x > 0 for x in wbs)):
                raise PayloadError("bad_input", f"quantization_config.weight_block_size {wbs!r}: expected [block_n, block_k]")
            out["block"] = list(wbs)
        return out

    def compressed_tensors() -> dict:
        groups = qc.get("config_groups") or {}
        grp = next((g for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)), None)
        if grp is None:
            raise PayloadError("bad_input", "compressed-tensors quantization_config without config_groups[*].weights")
        w, a = grp["weights"], grp.get("input_activations")
        bits, typ, strat = w.get("num_bits"), str(w.get("type", "int")), str(w.get("strategy", "tensor"))
        if bits == 4 and typ == "int" and not a and strat in ("group", "channel"):
            # wNa16: Marlin on CUDA unless --moe-runner-backend triton (CompressedTensorsWNA16TritonMoE:
            # symmetric, group 32 or 128, no actorder); remote.engines.sglang.runner says which one runs
            gs = w.get("group_size")
            notes.append("compressed-tensors W4A16 MoE: SGLang runs Marlin unless --moe-runner-backend triton "
                         "(symmetric INT4, group 32/128, no actorder)")
            return dict(method="compressed-tensors", selector="int4_w4a16", block=None, per_channel=False,
                        weight_dtype="int4", packed=True, group_size=int(gs) if isinstance(gs, int) else 0,
                        has_zp=not bool(w.get("symmetric", True)))
        if bits != 8:
            raise PayloadError("bad_input", f"compressed-tensors {bits}-bit weights run through Marlin/other kernels, not the Triton fused-MoE configs orch tunes")
        if typ == "float":
            sel, wd = "fp8_w8a8", "fp8_e4m3"
        else:
            sel, wd = ("int8_w8a8" if a else "int8_w8a16"), "int8"
        out = dict(method="compressed-tensors", selector=sel, block=None, per_channel=strat == "channel",
                   weight_dtype=wd, packed=False)
        if strat == "block":
            bs = w.get("block_structure")
            if not (isinstance(bs, list) and len(bs) == 2):
                raise PayloadError("bad_input", f"compressed-tensors block strategy without block_structure [n, k]: {bs!r}")
            out["block"] = [int(x) for x in bs]
        return out

    def wna16() -> dict:
        # MoeWNA16Config.from_config / is_moe_wna16_compatible
        bits = qc.get("bits", qc.get("w_bit")) if isinstance(qc, dict) else None
        if bits not in (4, 8):
            raise PayloadError("bad_input", f"moe_wna16 needs a GPTQ/AWQ checkpoint with bits 4 or 8, got {bits!r}")
        if ck_method.startswith("awq") and bits != 4:
            raise PayloadError("bad_input", f"moe_wna16 runs AWQ checkpoints with bits 4 only, got {bits!r}")
        if ck_method.startswith("gptq") and qc.get("desc_act"):
            raise PayloadError("bad_input", "moe_wna16 does not run a GPTQ checkpoint with desc_act true (SGLang "
                                            "moe_wna16.py is_moe_wna16_compatible); it is served through Marlin")
        gs = qc.get("group_size", qc.get("q_group_size"))
        if not isinstance(gs, int) or isinstance(gs, bool) or gs <= 0:
            raise PayloadError("bad_input", f"quantization_config.group_size {gs!r}: moe_wna16 needs a positive "
                                            "group size (channel-wise GPTQ, -1, is not run by its Triton kernel)")
        has_zp = (not bool(qc.get("sym", True))) if ck_method.startswith("gptq") else bool(qc.get("zero_point", False))
        notes.append("int4/int8 weight-only names are version-specific (SGLang uses the packed N for int4; vLLM does not)")
        return dict(method="moe_wna16", selector="int4_w4a16" if bits == 4 else "int8_w8a16", block=None,
                    per_channel=False, weight_dtype=f"int{bits}", packed=bits == 4, group_size=gs, has_zp=has_zp)

    def mxfp4() -> dict:
        notes.append(
            "MXFP4 checkpoint: on Hopper/Blackwell SGLang 0.5.23 runs it with moe_runner_backend "
            "triton_kernel (or flashinfer_mxfp4), which does not read these config files; the names "
            "apply only when it runs through the Triton fused_moe path with bf16 weights")
        return dict(method="mxfp4", selector=None, block=None, per_channel=False, weight_dtype="mxfp4", packed=False)

    def from_checkpoint() -> dict:
        if not ck_method:
            return none
        if ck_method == "fp8":
            return fp8_ckpt()
        if ck_method == "compressed-tensors":
            return compressed_tensors()
        if ck_method == "mxfp4":
            return mxfp4()
        if ck_method == "blockwise_int8":  # blockwise_int8.py: BlockInt8MoEMethod, int8_w8a8 with block scales
            wbs = qc.get("weight_block_size")
            if not (isinstance(wbs, list) and len(wbs) == 2 and all(isinstance(x, int) and x > 0 for x in wbs)):
                raise PayloadError("bad_input", f"blockwise_int8 quantization_config.weight_block_size {wbs!r}: "
                                                "expected [block_n, block_k]")
            return dict(method="blockwise_int8", selector="int8_w8a8", block=list(wbs), per_channel=False,
                        weight_dtype="int8", packed=False)
        if ck_method in ("w8a8_fp8", "w8a8_int8"):
            sel = "fp8_w8a8" if ck_method == "w8a8_fp8" else "int8_w8a8"
            return dict(method=ck_method, selector=sel, block=None, per_channel=True,
                        weight_dtype="fp8_e4m3" if sel.startswith("fp8") else "int8", packed=False)
        if ck_method in ("modelopt", "modelopt_fp8") and "FP8" in str(qc.get("quant_algo", "FP8")).upper() \
                and "FP4" not in str(qc.get("quant_algo", "")).upper():
            return dict(method="modelopt_fp8", selector="fp8_w8a8", block=None, per_channel=False,
                        weight_dtype="fp8_e4m3", packed=False)
        raise PayloadError(
            "bad_input",
            f"checkpoint quantization {ck_method!r} is not supported by orch's naming (it may not use the "
            "Triton fused-MoE configs at all); for GPTQ/AWQ served with --quantization moe_wna16 pass that flag")

    if flag is None:
        return from_checkpoint()
    if flag == "fp8":
        if ck_method == "fp8":
            return fp8_ckpt()
        if ck_method:
            raise PayloadError("bad_input", f"--quantization fp8 on a {ck_method!r} checkpoint is not supported")
        notes.append("online FP8 quantization (per-tensor) of a 16-bit checkpoint")
        return dict(method="fp8", selector="fp8_w8a8", block=None, per_channel=False, weight_dtype="fp8_e4m3", packed=False)
    if flag in ("w8a8_fp8", "w8a8_int8"):
        sel = "fp8_w8a8" if flag == "w8a8_fp8" else "int8_w8a8"
        return dict(method=flag, selector=sel, block=None, per_channel=True,
                    weight_dtype="fp8_e4m3" if flag == "w8a8_fp8" else "int8", packed=False)
    if flag == "moe_wna16":
        if ck_method not in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
            raise PayloadError("bad_input", f"--quantization moe_wna16 needs a GPTQ/AWQ checkpoint, got {ck_method!r}")
        return wna16()
    if flag == "mxfp4":
        return mxfp4()
    if ck_method and flag.replace("_", "-") == ck_method.replace("_", "-"):
        return from_checkpoint()
    if flag in ("modelopt", "modelopt_fp8") and ck_method in ("modelopt", "modelopt_fp8"):
        return from_checkpoint()
    raise PayloadError("bad_input", f"--quantization {flag!r} is not supported by orch's naming")


def wna16_group_size(group: int, n_rank: int, hidden: int) -> int:
    """The group size SGLang's ``MoeWNA16Method.create_weights`` (0.5.23 ``moe_wna16.py``) runs:
    the checkpoint's ``group`` halved until it divides both the per-rank intermediate size and
    the hidden size (the scales are repeated to match). Raises PayloadError('bad_input') below 32,
    where SGLang's assertion stops the server."""
    g = int(group)
    while n_rank % g or hidden % g:
        g //= 2
        if g < 32:
            raise PayloadError("bad_input", f"moe_wna16: group size {group} cannot be reduced to divide N {n_rank} "
                                            f"and hidden {hidden} (SGLang asserts group >= 32)")
    return g


def _path_match(ignored: str, prefix: str) -> bool:
    # SGLang 0.5.23 srt/layers/quantization/utils.py _module_path_match: dotted-boundary match
    ignored, prefix = ignored.rstrip("."), prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or ("." + ignored + ".") in ("." + prefix + ".")


def _equal_or_regex(name: str, targets) -> bool:
    # compressed_tensors/utils.py check_equal_or_regex_match: "re:" regex (re.match), exact, or dotted suffix
    for t in targets:
        t = str(t)
        if t.startswith("re:"):
            if re.match(t[3:], name):
                return True
        elif t == name or name.endswith("." + t):
            return True
    return False


def moe_layer_excluded(qc: dict | None, method: str | None, prefix: str) -> bool:
    """Whether the checkpoint leaves the MoE layer at ``prefix`` (e.g. ``model.layers.3.mlp.experts``)
    unquantized, as SGLang 0.5.23 decides it per method (such a layer runs
    ``UnquantizedFusedMoEMethod`` and reads the 16-bit file names):

    - ``fp8`` (``fp8.py``): ``ignored_layers`` / ``modules_to_not_convert``, with and without the
      ``model.`` prefix, matched on dotted boundaries;
    - ``moe_wna16`` (``moe_wna16.py``): AWQ ``modules_to_not_convert`` as substrings of the prefix;
      GPTQ: never (``from_config`` sets none);
    - ``compressed-tensors``: ``ignore`` (exact, dotted suffix or ``re:`` regex) on the unfused
      ``<prefix>.0.gate_proj``;
    - ``w8a8_int8``/``w8a8_fp8``/``blockwise_int8`` and others: never for the MoE layer.
    """
    if not isinstance(qc, dict) or not method:
        return False
    if method == "fp8":
        lst = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
        names = set()
        for x in lst:
            base = str(x).removeprefix("model.")
            names.update((base, "model." + base))
        return any(_path_match(n, prefix) for n in names)
    if method == "moe_wna16":
        if str(qc.get("quant_method", "")).lower().startswith("awq"):
            return any(str(m) in prefix for m in (qc.get("modules_to_not_convert") or []))
        return False
    if method == "compressed-tensors":
        return _equal_or_regex(prefix + ".0.gate_proj", qc.get("ignore") or [])
    return False
