#!/usr/bin/env python3
"""Issue 30 on the H200: a slow int4 tune in bounded time, and DeepSeek-V3 fp8 with the server's routing.

One script, one device call (SGLang's wheel carried in, unpacked with the stand-ins of
``tests/sglang_standins.py`` as ``bench/sglang_kernel_h200.py`` does; its helpers are reused):

- ``mixtral``: ``python -m remote tune --provider sglang --space fast`` of Mixtral-8x7B GPTQ int4 at
  TP1 (``E=8,N=7168,device_name=NVIDIA_H200,dtype=int4_w4a16``: hidden 4096, top-k 2, group 128,
  served with ``--quantization moe_wna16``), all 18 batch sizes on one GPU, under the default budget
  (``--budget`` not given: ``remote.protocol.DEFAULT_TUNE_BUDGET_S``), a fresh process and the tuner's
  own fresh Triton cache: wall time, the tune's split (GPU timing, first launches, compile wait,
  second opinion, check), what the budget cut per batch size, and the second opinion's tuned/default
  ratio per batch size. Target: <= 5 minutes, >= default at every M.
- ``dsv3``: the same tune of DeepSeek-V3 fp8 block [128, 128] at TP8
  (``E=257,N=256,...,dtype=fp8_w8a8,block_shape=[128, 128]``, the fused shared expert in every row:
  top-9 over 257), from ``tests/data/models/DeepSeek-V3.json``; its baseline is what SGLang's own
  lookup (``get_moe_configs``) loads on this machine (SGLang 0.5.23 with Triton 3.6.0: the
  ``triton_3_5_1`` up and ``_down`` files, reached by the release fallback).
- ``dsv3cmp`` and ``mixtralcmp``: the independent timing: in this process (not the tune's), SGLang's
  ``fused_experts`` reading each config set from its own ``SGLANG_MOE_CONFIG_DIR`` (DeepSeek: SGLang's
  default, the looked-up files, orch's files; Mixtral: default, orch's), with the server's routing
  (the shared expert in every row for DeepSeek), inputs of another seed than the tune's, CUDA graphs,
  L2 flushed, ``--rounds`` interleaved rounds whose order rotates, median and spread per set. Target
  (DeepSeek): orch >= the looked-up file at every M within 0.5%.

Budget: each part checks the time left of ``--budget-s`` and is cut (fewer batch sizes compared)
or skipped with a message. Results: ``$OUT/issue30.json`` (rewritten after every part) and a table.

H200 (one call):
  python3 bench/issue30_h200.py --wheel WHEEL --budget-s 560
CPU check (TRITON_INTERPRET=1, tiny shapes: a GPTQ int4 Qwen3-MoE and an fp8 block GLM-4.5 with
its fused shared expert; numbers meaningless):
  python3 bench/issue30_h200.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.sglang_kernel_h200 as base  # noqa: E402 (the path above first)
from bench.sglang_kernel_h200 import _config_dir, compare_sets, run_tune, say, section_env, setup  # noqa: E402

BATCH_SIZES = base.SGLANG_BATCH_SIZES
DSV3 = ROOT / "tests" / "data" / "models" / "DeepSeek-V3.json"
MIXTRAL = ROOT / "tests" / "data" / "models" / "Mixtral-8x7B-Instruct-v0.1.json"
#: TheBloke-style GPTQ checkpoint of Mixtral-8x7B: 4 bits, groups of 128, no act-order, symmetric
GPTQ = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq"}
T0 = time.time()


def left(args) -> float:
    return args.budget_s - (time.time() - T0)


def _models(out: Path, smoke: bool) -> dict:
    """``{part: (config path, server flags, what)}``; the smoke models are tiny ones of the same chain."""
    out.mkdir(parents=True, exist_ok=True)
    if smoke:
        q = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "moe_intermediate_size": 128,
             "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2, "torch_dtype": "bfloat16",
             "quantization_config": dict(GPTQ, group_size=64)}
        g = json.loads((ROOT / "tests" / "data" / "models" / "GLM-4.5.json").read_text())
        g.update(hidden_size=256, moe_intermediate_size=256, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                 topk_group=1, num_hidden_layers=2, first_k_dense_replace=1)
        g["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128]}
        (out / "tiny-gptq.json").write_text(json.dumps(q))
        (out / "tiny-glm-fp8.json").write_text(json.dumps(g))
        return {"mixtral": (out / "tiny-gptq.json", ["--quantization", "moe_wna16"], "tiny GPTQ int4 (smoke)"),
                "dsv3": (out / "tiny-glm-fp8.json", [], "tiny GLM-4.5 fp8 block + fused shared expert (smoke)")}
    m = json.loads(MIXTRAL.read_text())
    m["quantization_config"] = GPTQ
    (out / "Mixtral-8x7B-GPTQ.json").write_text(json.dumps(m))
    return {"mixtral": (out / "Mixtral-8x7B-GPTQ.json", ["--tp", "1", "--quantization", "moe_wna16"],
                        "Mixtral-8x7B-Instruct GPTQ int4 (group 128) at TP1, --quantization moe_wna16"),
            "dsv3": (DSV3, ["--tp", "8"], "DeepSeek-V3 fp8 block [128, 128] at TP8, fused shared expert")}


def _tune_summary(r: dict) -> dict:
    """What the result JSON keeps of a tune (not its whole report)."""
    rep = r.get("report") or {}
    per = {}
    for M, b in sorted((rep.get("batch_sizes") or {}).items(), key=lambda kv: int(kv[0])):
        op = b.get("second_opinion") or {}
        per[M] = {"search_gpu_s": b.get("search_gpu_s"), "evaluated": b.get("evaluated"), "pick": b.get("pick"),
                  "budget": b.get("budget"), "routing": {k: (b.get("routing") or {}).get(k) for k in
                                                         ("kind", "describe", "top_k", "experts", "max_load",
                                                          "mean_load", "active_experts")},
                  "second_opinion": {k: op.get(k) for k in ("us", "spread_us", "ratio_to_tuned", "baseline",
                                                            "verdict")},
                  "speedup_vs_default": b.get("speedup_vs_default"), "speedup_vs_shipped": b.get("speedup_vs_shipped"),
                  "replaced": (b.get("replaced") or {}).get("by"), "wall_s": (b.get("time_split") or {}).get("wall"),
                  "up": b.get("up"), "down": b.get("down")}
    return {"cmd": " ".join(map(str, r.get("cmd", []))), "rc": r.get("rc"), "wall_s": r.get("wall_s"),
            "tune_wall_s": rep.get("wall_s"), "time_split": rep.get("time_split"), "budget": rep.get("budget"),
            "routing": rep.get("routing"), "files": r.get("files"), "per_m": per,
            "stderr_tail": None if rep else r.get("stderr_tail", "")[-1500:]}


def _print_tune(name: str, t: dict) -> None:
    sp = t.get("time_split") or {}
    say(f"\n{name}: tune {t['wall_s']} s wall (command {t.get('tune_wall_s')} s), rc {t['rc']}; split (s): "
        + ", ".join(f"{k} {v}" for k, v in sp.items()))
    b = t.get("budget") or {}
    say(f"  budget {b.get('seconds')} s per GPU; search GPU time {b.get('search_gpu_s')} s; routing: {t.get('routing')}")
    say(f"  {'M':>5} {'gpu_s':>6} {'limit':>6} {'floor':>5} {'budg':>5} {'race':>5} {'def/tun':>8} {'ship/tun':>8} "
        f"{'repl':>8}  stages cut / routing")
    for M, r in t["per_m"].items():
        bu = r.get("budget") or {}
        rt = r.get("routing") or {}
        say(f"  {M:>5} {r.get('search_gpu_s') or 0:6.1f} {bu.get('limit_s') or 0:6.1f} {bu.get('pruned_floor', 0):5d} "
            f"{bu.get('pruned_budget', 0):5d} {bu.get('race_stopped', 0):5d} {r.get('speedup_vs_default') or 0:8.4f} "
            f"{r.get('speedup_vs_shipped') or 0:8.4f} {r.get('replaced') or '-':>8}  "
            f"{'; '.join(bu.get('stages_cut') or []) or '-'} / {rt.get('kind')} top-{rt.get('top_k')} "
            f"max load {rt.get('max_load')}")


def part_tune(res, args, ctx, part: str):
    cfg, flags, what = _models(Path(args.out) / "models", args.smoke)[part]
    Ms = args.batch_sizes
    est = 300 if part == "mixtral" else 220
    if not args.smoke and left(args) < est * 0.6:
        say(f"  skip the {part} tune: {left(args):.0f} s left")
        return
    extra = ["--provider", "sglang", "--space", "smoke" if args.smoke else "fast", "--batch-sizes", Ms,
             "--model-config", str(cfg)] + flags + (["--budget", str(args.tune_budget)] if args.tune_budget else [])
    r = run_tune(args, ctx, f"tune_{part}", extra, timeout=left(args) - 15,
                 gpus=None if args.smoke else "0")
    t = _tune_summary(r)
    t["what"] = what
    res.setdefault("tunes", {})[part] = t
    _print_tune(f"{part} ({what})", t)


def part_compare(res, args, ctx, part: str):
    from remote.engines.sglang.provider import load_kernel
    from remote.engines.triton_moe.configfile import dumps_config
    from remote.tuning.tuner.timing import SLOW_REPLAY_US
    t = (res.get("tunes") or {}).get(part) or {}
    if not t.get("files"):
        say(f"  {part} compare: no tuned files")
        return
    cfg, flags, _what = _models(Path(args.out) / "models", args.smoke)[part]
    shape, naming, quant, kblock = _shape(cfg, flags)
    routing = {"shared": naming["shared_experts"]} if naming["shared_experts"] else None
    k = load_kernel()
    names = k.file_names(shape["E"], shape["N"], naming["dtype_selector"], kblock, bool(naming["per_channel_quant"]))
    root = Path(tempfile.mkdtemp(prefix=f"orch-issue30-{part}-"))
    sets = {"default": _config_dir(root, "default", None, None, names)}
    inst = k.installed_configs(shape["E"], shape["N"], naming["dtype_selector"], kblock,
                               bool(naming["per_channel_quant"]))
    if inst:
        d = root / "lookup_src"
        d.mkdir()
        (d / names["up"]).write_text(dumps_config(inst["up"]))
        down = inst.get("down")
        if down and names.get("down"):
            (d / names["down"]).write_text(dumps_config(down))
        sets["lookup"] = _config_dir(root, "lookup", d / names["up"],
                                     (d / names["down"]) if down and names.get("down") else None, names)
    sets["orch"] = _config_dir(root, "orch", Path(t["files"]["up"]), Path(t["files"]["down"]), names)
    Ms = [int(x) for x in args.batch_sizes.split(",")]
    dtype = "float16" if args.smoke else "bfloat16"
    per_m_s = (1.5 if part == "mixtral" else 1.0) * len(sets) * args.rounds / 5 + 1.5
    if not args.smoke and left(args) < per_m_s * len(Ms) + 20:
        keep = max(1, int((left(args) - 20) / per_m_s))
        say(f"  {part} compare: {left(args):.0f} s left: timing {keep} of {len(Ms)} batch sizes")
        Ms = Ms[::max(1, len(Ms) // keep)][:keep] if keep < len(Ms) else Ms
    if not args.smoke and left(args) < 30:
        say(f"  skip the {part} compare: {left(args):.0f} s left")
        return
    say(f"\n{part.upper()} COMPARE (independent timing; sets {sorted(sets)}; routing {routing or 'random logits'}; "
        f"{args.rounds} rounds, order rotating)")
    rows = compare_sets(args, shape, dtype, quant, Ms, sets, rounds=args.rounds, routing=routing,
                        replay_us=SLOW_REPLAY_US, rotate=True)
    base_name = "lookup" if "lookup" in sets else "default"
    out = []
    for row in rows:
        o, b, d = row.get("orch"), row.get(base_name), row.get("default")
        sp = row.get("spread") or {}
        ratio = round(b / o, 4) if o and b else None
        per_round = None
        smp = row.get("samples") or {}
        if smp.get("orch") and smp.get(base_name):
            rr = [x / y for x, y in zip(smp[base_name], smp["orch"])]
            per_round = [round(min(rr), 4), round(max(rr), 4)]
        out.append({"M": row["M"], "default_us": d, f"{base_name}_us": b, "orch_us": o,
                    "base_over_orch": ratio, "base_over_orch_rounds": per_round,
                    "default_over_orch": round(d / o, 4) if o and d else None, "spread_us": sp})
    ok = [r["M"] for r in out if r["base_over_orch"] is not None and r["base_over_orch"] >= 0.995]
    say(f"  {'M':>5} {'default':>9} {base_name:>9} {'orch':>9} {base_name[:6] + '/orch':>12} {'rounds':>16} "
        f"{'def/orch':>8}")
    for r in out:
        say(f"  {r['M']:>5} {r['default_us'] or 0:9.1f} {r[f'{base_name}_us'] or 0:9.1f} {r['orch_us'] or 0:9.1f} "
            f"{r['base_over_orch'] or 0:12.4f} {str(r['base_over_orch_rounds']):>16} {r['default_over_orch'] or 0:8.4f}")
    say(f"  target: orch >= {base_name} within 0.5% at {len(ok)}/{len(out)} M"
        + ("" if len(out) == len(args.batch_sizes.split(",")) else f" (of {len(args.batch_sizes.split(','))})"))
    res.setdefault("compare", {})[part] = {"base": base_name, "sets": sorted(sets), "routing": routing,
                                           "rounds": args.rounds, "rows": out, "ge_base_0p5": ok,
                                           "lookup_found": bool(inst)}


def _shape(path: Path, flags: list) -> tuple:
    """``(shape, naming, quant, kernel block_shape)`` the tune command resolves for this model and
    these server flags (``naming["shared_experts"]``: the fused shared experts)."""
    from remote.engines.sglang.model_flags import load_model_config
    from remote.engines.sglang.shape import moe_shape
    from remote.tuning.support import quant_entry

    tp = int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1
    q = flags[flags.index("--quantization") + 1] if "--quantization" in flags else None
    ms = moe_shape(load_model_config(str(path)), tp=tp, quantization=q)
    naming = dict(dtype_selector=ms.dtype_selector, block_shape=ms.block_shape, per_channel_quant=ms.per_channel_quant,
                  weight_dtype=ms.weight_dtype, group_size=ms.group_size, has_zp=ms.has_zp,
                  shared_experts=(ms.runtime_topk - ms.topk) if ms.shared_fused else 0)
    kblock = [0, ms.group_size] if ms.group_size else ms.block_shape
    return dict(E=ms.E, N=ms.N, hidden=ms.hidden, topk=ms.topk), naming, quant_entry(naming), kblock


PARTS = {"env": lambda res, args, ctx: section_env(res, args, ctx),
         "mixtral": lambda res, args, ctx: part_tune(res, args, ctx, "mixtral"),
         "dsv3": lambda res, args, ctx: part_tune(res, args, ctx, "dsv3"),
         "dsv3cmp": lambda res, args, ctx: part_compare(res, args, ctx, "dsv3"),
         "mixtralcmp": lambda res, args, ctx: part_compare(res, args, ctx, "mixtral")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help="SGLang wheel (sglang-0.5.23-...whl)")
    ap.add_argument("--sglang-dir", default="/tmp/orch-sglang")
    ap.add_argument("--parts", default="env,mixtral,dsv3,dsv3cmp,mixtralcmp")
    ap.add_argument("--batch-sizes", default=BATCH_SIZES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tune-budget", type=float, default=None, help="--budget of the tunes (default: the tune's own)")
    ap.add_argument("--budget-s", type=float, default=560.0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_out"))
    args = ap.parse_args()
    if args.smoke:
        args.batch_sizes = "1,40" if args.batch_sizes == BATCH_SIZES else args.batch_sizes
        args.budget_s = 1e9
    base.T0 = T0
    base.left = left  # the reused helpers check this script's budget
    Path(args.out).mkdir(parents=True, exist_ok=True)
    res = {"args": vars(args)}
    ctx = setup(args)
    res["setup_s"] = round(time.time() - T0, 1)
    jpath = Path(args.out) / "issue30.json"
    for part in args.parts.split(","):
        ts = time.time()
        try:
            PARTS[part](res, args, ctx)
        except Exception as exc:
            import traceback
            traceback.print_exc()
            res.setdefault("errors", {})[part] = f"{type(exc).__name__}: {exc}"
        res.setdefault("part_s", {})[part] = round(time.time() - ts, 1)
        say(f"[part {part}: {time.time() - ts:.0f} s; {time.time() - T0:.0f} s total]")
        jpath.write_text(json.dumps(res, indent=1, default=str))
    say(f"[total {time.time() - T0:.0f} s] -> {jpath}")


if __name__ == "__main__":
    main()
