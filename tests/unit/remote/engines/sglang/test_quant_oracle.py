"""The real SGLang 0.5.23 is the judge of how orch reads quantized checkpoints (remote/engines/sglang/quantization.py).

In one fresh interpreter with SGLang 0.5.23 from its wheel (``tests/sglang_standins.py`` stands in
for the packages absent here), SGLang's own code answers, and orch must agree:

* ``MoeWNA16Config.from_config`` (bits, group size, zero points) and ``is_moe_wna16_compatible``
  for the GPTQ/AWQ configs; the quantization method's ``get_triton_quant_info`` (the flags,
  ``block_shape`` and ``per_channel_quant`` it hands to ``fused_experts``) for moe_wna16,
  w8a8_int8 and blockwise_int8;
* the file name: ``get_config_file_name(E, w2.shape[2], get_config_dtype_str(<those flags>),
  <that block_shape>, per_channel_quant=<that flag>)`` against ``moe_shape(...).file_names``, and the
  provider's :class:`remote.tuning.kernel.formats.WeightFormat` carrying the same flags;
* which MoE layers a checkpoint leaves unquantized: ``is_layer_skipped`` (fp8),
  ``is_layer_skipped_quant`` (moe_wna16/AWQ), ``should_ignore_layer`` (compressed-tensors) against
  :func:`remote.engines.sglang.quantization.moe_layer_excluded`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

from tests.paths import REPO
from tests.waiting import run_watched

MODELS = REPO / "tests" / "data" / "models"

BODY = r"""
import json, os, sys, types
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {root!r})
from tests.sglang_standins import prepare, release_tree
prepare(release_tree("0.5.23"))
import torch
import sglang.srt.layers.quantization.moe_wna16 as wna16
import sglang.srt.layers.quantization.w8a8_int8 as w8a8
import sglang.srt.layers.quantization.blockwise_int8 as bint8
import sglang.srt.layers.quantization.fp8 as fp8
import sglang.srt.layers.quantization.utils as qutils
import sglang.srt.layers.quantization.compressed_tensors.utils as ctutils
from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as cfgmod
from remote.engines.sglang.shape import moe_shape
from remote.engines.sglang.quantization import moe_layer_excluded, quant_rule
from remote.tuning.support import quant_entry
from remote.tuning.kernel.formats import from_quant

cfgmod.get_device_name = lambda device_id=0: "NVIDIA_H200"
wna16.get_device_capability = lambda device_id=0: (9, 0)  # AWQ's capability check; a CPU has none
MODELS = {models!r}
out = {{"names": [], "wna16": [], "skip": []}}

def load(name):
    return json.load(open(os.path.join(MODELS, name)))

def real_name(info, E, N):
    sel = cfgmod.get_config_dtype_str(torch.bfloat16, use_fp8_w8a8=info.use_fp8_w8a8, use_int8_w8a8=info.use_int8_w8a8,
                                      use_int8_w8a16=info.use_int8_w8a16, use_int4_w4a16=info.use_int4_w4a16)
    return cfgmod.get_config_file_name(E, N, sel, info.block_shape, per_channel_quant=info.per_channel_quant)

def flags_of(info):
    return dict(use_fp8_w8a8=info.use_fp8_w8a8, use_int8_w8a8=info.use_int8_w8a8, use_int8_w8a16=info.use_int8_w8a16,
                use_int4_w4a16=info.use_int4_w4a16, per_channel_quant=info.per_channel_quant)

def ours(ms):
    naming = dict(dtype_selector=ms.dtype_selector, block_shape=ms.block_shape, per_channel_quant=ms.per_channel_quant,
                  weight_dtype=ms.weight_dtype, group_size=ms.group_size, has_zp=ms.has_zp)
    fmt = from_quant(quant_entry(naming))
    return ms.file_names("NVIDIA H200")["up"], fmt.flags(), fmt.kernel_block_shape

# --- moe_wna16: GPTQ int4 (the real Qwen3-30B-A3B-GPTQ-Int4 config) and variants
gptq = load("quantized/Qwen3-30B-A3B-GPTQ-Int4.json")
variants = {{
    "gptq_int4_sym": gptq["quantization_config"],
    "gptq_int4_asym": dict(gptq["quantization_config"], sym=False),
    "gptq_int8": dict(gptq["quantization_config"], bits=8),
    "gptq_int4_g64": dict(gptq["quantization_config"], group_size=64),
    "awq_int4_zp": {{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
                     "modules_to_not_convert": ["mlp.gate"]}},
}}
for name, qc in variants.items():
    cfg = dict(gptq, quantization_config=qc)
    real = wna16.MoeWNA16Config.from_config(qc)
    ms = moe_shape(cfg, quantization="moe_wna16")
    # MoeWNA16Method.create_weights (group reduced to divide N and hidden) and get_triton_quant_info
    layer = types.SimpleNamespace(w13_qweight=None, w2_qweight=None, w13_scales=None, w2_scales=None,
                                  w13_qzeros=None, w2_qzeros=None, group_size=real.group_size)
    info = wna16.MoeWNA16Method(real).get_triton_quant_info(layer)
    N_file = ms.N
    name_o, flags_o, block_o = ours(ms)
    out["wna16"].append(dict(case=name, real=[real.weight_bits, real.group_size, real.has_zp,
                                                wna16.MoeWNA16Config.is_moe_wna16_compatible(qc)],
                             ours=[int(ms.weight_dtype[3:]), ms.group_size, ms.has_zp, True]))
    out["names"].append(dict(case=name, real=[real_name(info, ms.E, N_file), flags_of(info), info.block_shape],
                             ours=[name_o, flags_o, block_o]))
desc = dict(gptq["quantization_config"], desc_act=True)
out["desc_act"] = [wna16.MoeWNA16Config.is_moe_wna16_compatible(desc)]
try:
    moe_shape(dict(gptq, quantization_config=desc), quantization="moe_wna16")
    out["desc_act"].append("accepted")
except Exception as exc:
    out["desc_act"].append(type(exc).__name__)

# --- w8a8_int8 per-channel (DeepSeek-R1-Channel-INT8 served with --quantization w8a8_int8) and blockwise_int8
ds = load("DeepSeek-V3.json")
ms = moe_shape(ds, tp=8, quantization="w8a8_int8")
layer = types.SimpleNamespace(w13_weight=None, w2_weight=None, w13_weight_scale=None, w2_weight_scale=None,
                              w13_input_scale=None, w2_input_scale=None)
info = w8a8.W8A8Int8MoEMethod(w8a8.W8A8Int8Config({{}})).get_triton_quant_info(layer)
name_o, flags_o, block_o = ours(ms)
out["names"].append(dict(case="w8a8_int8", real=[real_name(info, ms.E, ms.N), flags_of(info), info.block_shape],
                         ours=[name_o, flags_o, block_o]))
bqc = {{"quant_method": "blockwise_int8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}
ms = moe_shape(dict(ds, quantization_config=bqc), tp=8)
bcfg = bint8.BlockInt8Config.from_config(bqc)
layer = types.SimpleNamespace(w13_weight=None, w2_weight=None, w13_weight_scale_inv=None, w2_weight_scale_inv=None,
                              w13_input_scale=None, w2_input_scale=None)
info = bint8.BlockInt8MoEMethod(bcfg).get_triton_quant_info(layer)
name_o, flags_o, block_o = ours(ms)
out["names"].append(dict(case="blockwise_int8", real=[real_name(info, ms.E, ms.N), flags_of(info), info.block_shape],
                         ours=[name_o, flags_o, block_o]))

# --- which MoE layers are left unquantized
prefixes = ["model.layers.0.mlp.experts", "model.layers.3.mlp.experts", "model.layers.12.mlp.experts",
            "model.layers.3.block_sparse_moe.experts"]
fp8_lists = [["model.layers.3.mlp.experts"], ["layers.3.mlp"], ["mlp.experts"], ["lm_head", "mlp.gate"],
             ["model.layers.1"], ["layers.12"]]
for lst in fp8_lists:
    qc = {{"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
           "modules_to_not_convert": lst}}
    real_cfg = fp8.Fp8Config.from_config(qc)
    for p in prefixes:
        out["skip"].append(dict(method="fp8", lst=lst, prefix=p,
                                real=bool(qutils.is_layer_skipped(p, real_cfg.ignored_layers,
                                                                  fused_mapping=real_cfg.packed_modules_mapping)),
                                ours=moe_layer_excluded(qc, "fp8", p)))
for lst in [["mlp.experts"], ["gate"], ["layers.3."], ["model.layers.12.mlp"]]:
    qc = dict(variants["awq_int4_zp"], modules_to_not_convert=lst)
    real_cfg = wna16.MoeWNA16Config.from_config(qc)
    for p in prefixes:
        out["skip"].append(dict(method="moe_wna16", lst=lst, prefix=p,
                                real=wna16.is_layer_skipped_quant(p, real_cfg.modules_to_not_convert),
                                ours=moe_layer_excluded(qc, "moe_wna16", p)))
for lst in [["re:.*mlp\\.experts.*"], ["re:model\\.layers\\.3\\..*"], ["lm_head"], ["model.layers.12.mlp.experts.0.gate_proj"],
            ["mlp.experts.0.gate_proj"]]:
    qc = {{"quant_method": "compressed-tensors", "ignore": lst}}
    for p in prefixes:
        out["skip"].append(dict(method="compressed-tensors", lst=lst, prefix=p,
                                real=bool(ctutils.should_ignore_layer(p + ".0.gate_proj", ignore=lst)),
                                ours=moe_layer_excluded(qc, "compressed-tensors", p)))
print("RESULT " + json.dumps(out, default=str))
"""


def _run() -> dict:
    code = textwrap.dedent(BODY.format(root=str(REPO), models=str(MODELS)))
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = run_watched([sys.executable, "-c", code], cwd=str(REPO), env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_quantized_checkpoints_read_and_named_as_sglang_does():
    r = _run()
    for case in r["wna16"]:
        assert case["real"] == case["ours"], case
    assert {c["case"] for c in r["names"]} >= {"gptq_int4_sym", "gptq_int4_asym", "gptq_int8", "awq_int4_zp",
                                               "w8a8_int8", "blockwise_int8"}
    for case in r["names"]:
        assert case["real"] == case["ours"], case
    names = {c["case"]: c["ours"][0] for c in r["names"]}
    assert names["gptq_int4_sym"] == "E=128,N=384,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    assert names["w8a8_int8"] == "E=257,N=256,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json"
    # desc_act GPTQ is not moe_wna16-compatible: SGLang does not run it there, orch refuses to name it
    assert r["desc_act"] == [False, "PayloadError"]
    skipped = [s for s in r["skip"] if s["real"]]
    assert skipped and len(skipped) < len(r["skip"])  # the cases tell skipped and kept layers apart
    for s in r["skip"]:
        assert s["real"] == s["ours"], s
