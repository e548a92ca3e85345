#!/usr/bin/env python3
"""The whole H200 measurement for the builtin fused-MoE kernel and tuner, in one script.

Sections (``--sections``, comma list; default all):
- ``env``:     GPU, torch, Triton.
- ``correct``: kernel correctness on the GPU, bf16 and fp16, against a float64 reference
               (||out-ref||/||ref|| < 1e-2, buffers poisoned with NaN): uneven expert loads,
               experts with no tokens, M smaller than a block, E=1, top-k 1, and the
               reference shape with the default, shipped and assorted configs.
- ``tune``:    ``python -m remote tune`` (space ``--tune-space``, default fast) for
               Qwen3-30B-A3B TP1 (E=128, N=768, hidden 2048, top-k 8, bf16) over
               ``--tune-batch-sizes``, with the shipped SGLang 0.5.23 file for comparison;
               prints default / shipped / tuned kernel time per batch size.
- ``fp8``:     fp8_w8a8 (per-tensor and block [128, 128]): kernel correctness against the
               float64 reference on the same quantized numbers (< 1e-2) and against the
               unquantized one (what fp8 costs), then ``python -m remote tune`` for
               Qwen3-30B-A3B-FP8's shape (E=128, N=768, hidden 2048, top-k 8, block
               [128, 128]) over ``--fp8-batch-sizes``: default vs tuned kernel time.
- ``fastfull``: for ``--full-batch-sizes``: the fast search, then the full (1920-config)
               search, on the same inputs in one process; both picks re-timed side by side;
               prints quality (fast/full time) and GPU-time ratio.

Outputs under ``$OUT`` (or ``--out``): ``bench.json`` and the tune output folder.
Without a GPU it runs the same code under TRITON_INTERPRET=1 on a tiny shape (numbers
meaningless; for checking the script only).

Usage on the H200: ``python3 bench/tune_h200.py --sections env,correct,tune,fastfull``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "bench" / "data"
SHIPPED = DATA / "E=128,N=768,device_name=NVIDIA_H200.json"
MODEL = DATA / "Qwen3-30B-A3B.json"

import torch  # noqa: E402

GPU = torch.cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def say(*a):
    print(*a, flush=True)


def section_env(res):
    import triton
    info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name() if GPU else None, "cpus": os.cpu_count()}
    if GPU:
        p = torch.cuda.get_device_properties(0)
        info.update(sms=p.multi_processor_count, l2=getattr(p, "L2_cache_size", None),
                    smem_optin=getattr(p, "shared_memory_per_block_optin", None))
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,"
                                                 "power.draw,temperature.gpu", "--format=csv,noheader"],
                                                capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:
            info["nvidia_smi"] = str(exc)
    res["env"] = info
    say("ENV", json.dumps(info))


def section_correct(res):
    from remote.tuning.kernel.fused_moe import fused_moe, make_buffers
    from remote.tuning.kernel.reference import fused_moe_reference, relative_error, route
    from remote.tuning.tuner import space as sp
    dev = "cuda" if GPU else "cpu"
    dtypes = [torch.bfloat16, torch.float16] if GPU else [torch.float16, torch.float32]
    rows = []
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    big = (128, 768, 2048, 8) if GPU else (8, 64, 128, 2)
    cases = [
        # name, E, N, hidden, topk, M, logits-mode
        ("uneven loads", 16, 128, 256, 4, 37, "skew"),
        ("idle experts", 32, 64, 128, 2, 5, "idle"),
        ("M < block", 8, 64, 128, 2, 3, "random"),
        ("E=1", 1, 64, 128, 1, 19, "random"),
        ("top-k 1", 8, 128, 256, 1, 40, "random"),
        ("odd K (masked)", 4, 96, 200, 2, 9, "random"),
        ("ref shape M=1", *big, 1, "random"),
        ("ref shape M=300", *big, 300, "random"),
    ]
    if not GPU:
        cases = [c for c in cases if c[5] < 64 and c[1] <= 32]
    shipped = json.loads(SHIPPED.read_text())
    from remote.tuning.tuner.driver import smem_limit
    smem = smem_limit("cuda:0") if GPU else None
    for dt in dtypes:
        for name, E, N, H, k, M, mode in cases:
            if mode == "skew":
                logits = torch.randn(M, E, generator=gen, device=dev) + torch.linspace(4, 0, E, device=dev)
            elif mode == "idle":
                logits = torch.randn(M, E, generator=gen, device=dev)
                logits[:, E // 2:] = -1e4  # half the experts get nothing
            else:
                logits = torch.randn(M, E, generator=gen, device=dev)
            tw, ti = route(M, E, k, logits=logits)
            x = torch.randn(M, H, generator=gen, device=dev).to(dt)
            w1 = (torch.randn(E, 2 * N, H, generator=gen, device=dev) / H ** 0.5).to(dt)
            w2 = (torch.randn(E, H, N, generator=gen, device=dev) / N ** 0.5).to(dt)
            ref = fused_moe_reference(x, w1, w2, tw, ti)
            cfgs = [("default", sp.default_config(M, E)), ("default-large", sp.default_config(10 ** 6, E)),
                    ("shipped@M", sp.closest_entry(shipped, M))]
            if GPU:
                cfgs += [("128x256x64 w8 s4", dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64,
                                                   GROUP_SIZE_M=16, num_warps=8, num_stages=4)),
                         ("256x128x64 w8 s3", dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64,
                                                   GROUP_SIZE_M=64, num_warps=8, num_stages=3)),
                         ("32x32x256 w4 s2", dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=256,
                                                  GROUP_SIZE_M=32, num_warps=4, num_stages=2))]
            for cname, cfg in cfgs:
                down = dict(cfg, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128 if GPU else 64)
                for dname, dcfg in (("same", cfg), ("other-down", down)):
                    if GPU and not (sp.fits(cfg, smem)[0] and sp.fits(dcfg, smem)[0]):
                        continue  # cannot run on this device (pruned by the tuner too)
                    bufs = make_buffers(M, k, N, H, dt, dev)  # NaN-poisoned
                    out = torch.full((M, H), float("nan"), dtype=dt, device=dev)
                    fused_moe(x, w1, w2, tw, ti, cfg, dcfg, buffers=bufs, out=out)
                    err = relative_error(out, ref)
                    ok = err < 1e-2
                    rows.append(dict(dtype=str(dt).split(".")[-1], case=name, E=E, N=N, hidden=H, topk=k, M=M,
                                     config=cname, down=dname, rel_err=err, ok=ok))
                    if not ok:
                        say("FAIL", rows[-1])
    res["correct"] = rows
    bad = [r for r in rows if not r["ok"]]
    worst = {}
    for r in rows:
        key = (r["dtype"], r["case"])
        worst[key] = max(worst.get(key, 0.0), r["rel_err"])
    say("\nCORRECTNESS (max rel err over configs; pass < 1e-2)")
    for (d, c), e in worst.items():
        say(f"  {d:9s} {c:18s} {e:.2e} {'ok' if e < 1e-2 else 'FAIL'}")
    say(f"  {len(rows)} runs, {len(bad)} failures")


def _pair_label(u: dict, d: dict) -> str:
    """``BM/BN/BK gG wW sS | BN/BK gG wW sS`` of a tuned up / down config pair (one table cell)."""
    return (f"{u['BLOCK_SIZE_M']}/{u['BLOCK_SIZE_N']}/{u['BLOCK_SIZE_K']} g{u['GROUP_SIZE_M']} w{u['num_warps']} "
            f"s{u['num_stages']} | {d['BLOCK_SIZE_N']}/{d['BLOCK_SIZE_K']} g{d['GROUP_SIZE_M']} w{d['num_warps']} "
            f"s{d['num_stages']}")


def section_tune(res, args, out):
    tdir = out / f"tune_{args.tune_space}"
    cmd = [sys.executable, "-m", "remote", "tune", "--provider", "builtin", "--space", args.tune_space,
           "--out", str(tdir), "--batch-sizes", args.tune_batch_sizes, "--shipped-config", str(SHIPPED),
           "--seed", "0"]
    if GPU:
        cmd += ["--model-config", str(MODEL)]
    else:
        cmd += ["--shape", "E=8,N=64,hidden=128,topk=2", "--device-name", "NVIDIA H200"]
    if args.no_resume:
        cmd.append("--no-resume")
    say("\nTUNE:", " ".join(cmd))
    t0 = time.time()
    lines = []
    with subprocess.Popen(cmd, cwd=str(ROOT), stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT))) as proc:
        for line in proc.stdout:
            lines.append(line)
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("type") in ("progress", "log", "error") and (o.get("type") != "progress" or o["done"] != 0):
                say("  ", line.strip()[:300])
    wall = time.time() - t0
    (out / "tune_stdout.jsonl").write_text("".join(lines))
    res["tune"] = {"cmd": cmd, "wall_s": wall, "rc": proc.returncode}
    rp = tdir / "report.json"
    if not rp.exists():
        say("tune produced no report; rc", proc.returncode)
        return
    rep = json.loads(rp.read_text())
    res["tune"]["report"] = rep
    say(f"\nTUNE RESULT ({args.tune_space}, {wall:.0f} s wall, device {rep['device_name']}, triton "
        f"{rep['triton_version']}): whole fused-MoE kernel time, us (median, CUDA graph, L2 flushed)")
    say(f"  {'M':>5} {'default':>9} {'shipped':>9} {'tuned':>9} {'vs def':>7} {'vs ship':>7} {'evals':>5} "
        f"{'gpu_s':>6} {'err':>8}  tuned up / down")
    for M, r in sorted(rep["batch_sizes"].items(), key=lambda kv: int(kv[0])):
        cfg = _pair_label(r["up"], r["down"])
        say(f"  {M:>5} {r['default_us']:9.1f} {r['shipped_us'] or float('nan'):9.1f} {r['tuned_us']:9.1f} "
            f"{r['speedup_vs_default'] or 0:7.3f} {r['speedup_vs_shipped'] or 0:7.3f} {r['evaluated']:5d} "
            f"{r['search_gpu_s']:6.1f} {r.get('rel_err', float('nan')):8.1e}  {cfg}")


FP8_CASES = [("uneven loads", 16, 128, 256, 4, 37, "skew"), ("idle experts", 32, 128, 256, 2, 5, "idle"),
             ("M < block", 8, 128, 256, 2, 3, "random"), ("E=1", 1, 128, 128, 1, 19, "random"),
             ("top-k 1", 8, 128, 256, 1, 40, "random")]
FP8_GPU_CASES = [("ref shape M=1", 128, 768, 2048, 8, 1, "random"),
                 ("ref shape M=300", 128, 768, 2048, 8, 300, "random")]


def fp8_correctness(seed: int = 4321) -> list[dict]:
    """orch's fp8_w8a8 kernel against the float64 reference on the same quantized numbers:
    per-tensor and block [128, 128] over :data:`FP8_CASES` (+ :data:`FP8_GPU_CASES` on a GPU),
    default config and 16x64x64; one row per (scheme, case, config) with ``rel_err``,
    ``rel_err_vs_unquantized`` and ``ok`` (< 1e-2). Same random numbers for the same seed."""
    from remote.tuning.kernel.fused_moe import fused_moe, make_buffers
    from remote.tuning.kernel.quant import QuantSpec, QuantWeights, quant_weight
    from remote.tuning.kernel.reference import fused_moe_reference, fused_moe_reference_fp8, relative_error, route
    from remote.tuning.tuner import space as sp
    dev = "cuda" if GPU else "cpu"
    dt = torch.bfloat16 if GPU else torch.float16
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    cases = FP8_CASES + (FP8_GPU_CASES if GPU else [])
    rows = []
    for block in (None, (128, 128)):
        spec = QuantSpec(block)
        for name, E, N, H, k, M, mode in cases:
            logits = torch.randn(M, E, generator=gen, device=dev)
            if mode == "skew":
                logits += torch.linspace(4, 0, E, device=dev)
            elif mode == "idle":
                logits[:, E // 2:] = -1e4
            tw, ti = route(M, E, k, logits=logits)
            x = torch.randn(M, H, generator=gen, device=dev).to(dt)
            w1 = torch.randn(E, 2 * N, H, generator=gen, device=dev) / H ** 0.5
            w2 = torch.randn(E, H, N, generator=gen, device=dev) / N ** 0.5
            (w1q, s1), (w2q, s2) = quant_weight(w1, spec), quant_weight(w2, spec)
            qw = QuantWeights(spec, s1, s2)
            ref = fused_moe_reference_fp8(x, w1q, w2q, qw, tw, ti)
            ref_full = fused_moe_reference(x, w1.to(dt), w2.to(dt), tw, ti)
            default = sp.default_config(M, E, "fp8_w8a8", list(block) if block else None)
            cfgs = [("default", default), ("16x64x64 w4 s3", dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64,
                                                                   GROUP_SIZE_M=1, num_warps=4, num_stages=3))]
            for cname, cfg in cfgs:
                bufs = make_buffers(M, k, N, H, dt, dev)
                o = torch.full((M, H), float("nan"), dtype=dt, device=dev)
                fused_moe(x, w1q, w2q, tw, ti, cfg, buffers=bufs, out=o, quant=qw)
                err, err_full = relative_error(o, ref), relative_error(o, ref_full)
                rows.append(dict(scheme="block128" if block else "per-tensor", case=name, M=M, config=cname,
                                 rel_err=err, rel_err_vs_unquantized=err_full, ok=err < 1e-2))
    return rows


def section_fp8(res, args, out):
    rows = fp8_correctness()
    for r in rows:
        if not r["ok"]:
            say("FAIL", r)
    res["fp8_correct"] = rows
    say("\nFP8_W8A8 CORRECTNESS (max rel err over configs; pass < 1e-2; 'vs bf16' = quantization cost)")
    worst = {}
    for r in rows:
        key = (r["scheme"], r["case"])
        a, b = worst.get(key, (0.0, 0.0))
        worst[key] = (max(a, r["rel_err"]), max(b, r["rel_err_vs_unquantized"]))
    for (sch, c), (e, ef) in worst.items():
        say(f"  {sch:10s} {c:16s} {e:.2e} {'ok' if e < 1e-2 else 'FAIL'}   vs bf16 {ef:.2e}")
    tdir = out / "tune_fp8_block"
    shape = "E=128,N=768,hidden=2048,topk=8" if GPU else "E=4,N=128,hidden=256,topk=2"
    cmd = [sys.executable, "-m", "remote", "tune", "--provider", "builtin", "--space",
           args.tune_space, "--out", str(tdir), "--batch-sizes", args.fp8_batch_sizes, "--shape", shape,
           "--quantization", "fp8", "--block-shape", "128,128", "--seed", "0"]
    if not GPU:
        cmd += ["--device-name", "NVIDIA H200"]
    say("\nTUNE fp8:", " ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.time() - t0
    res["fp8_tune"] = {"cmd": cmd, "wall_s": wall, "rc": p.returncode, "stderr_tail": p.stderr[-2000:]}
    rp = tdir / "report.json"
    if not rp.exists():
        say("fp8 tune produced no report; rc", p.returncode, p.stdout[-1500:])
        return
    rep = json.loads(rp.read_text())
    res["fp8_tune"]["report"] = rep
    say(f"TUNE fp8 block [128, 128] ({args.tune_space}, {wall:.0f} s wall): whole fused-MoE kernel time, us")
    say(f"  {'M':>5} {'default':>9} {'tuned':>9} {'vs def':>7} {'evals':>5} {'gpu_s':>6} {'err':>8}  tuned up / down")
    for M, r in sorted(rep["batch_sizes"].items(), key=lambda kv: int(kv[0])):
        cfg = _pair_label(r["up"], r["down"])
        say(f"  {M:>5} {r['default_us']:9.1f} {r['tuned_us']:9.1f} {r['speedup_vs_default'] or 0:7.3f} "
            f"{r['evaluated']:5d} {r['search_gpu_s']:6.1f} {r.get('rel_err', float('nan')):8.1e}  {cfg}")


def section_fastfull(res, args):
    from remote.tuning.providers.builtin import BuiltinProvider
    from remote.tuning.tuner.compile import Compiler
    from remote.tuning.tuner.driver import compare, smem_limit
    from remote.tuning.tuner.search import Evaluator, search
    from remote.tuning.tuner.timing import Timer
    from remote.tuning.tuner import space as sp
    shape = dict(E=128, N=768, hidden=2048, topk=8) if GPU else dict(E=8, N=64, hidden=128, topk=2)
    dtype = "bfloat16" if GPU else "float16"
    dev = "cuda:0" if GPU else "cpu"
    prov = BuiltinProvider()
    timer = Timer(dev)
    comp = Compiler(prov.precompile_args(shape, dtype), prov.compile_target, 0, enabled=GPU)
    smem = smem_limit(dev)
    rows = []
    weights = None
    space_full = "full" if GPU else "smoke"
    try:
        for M in [int(x) for x in args.full_batch_sizes.split(",")]:
            p = prov.make_problem(shape, M, dtype, dev, 100 + M, weights)
            weights = p.weights
            if GPU and not timer._warm:
                d = sp.default_config(M, shape["E"])
                timer.warm_up(prov.full_fn(p, d, d))
            row = {"M": M}
            for space in ("fast", space_full):
                c0 = comp.seconds
                ev = Evaluator(prov, p, timer, comp, cpu=not GPU)
                r = search(ev, space, M, shape["E"], shape["topk"], smem, 2)
                row[space] = dict(r, compile_s=round(comp.seconds - c0, 2))
                say(f"  M={M} {space}: {r['kernel_us']:.1f} us (search's estimate), evaluated {r['evaluated']}, "
                    f"gpu {r['search_gpu_s']:.1f} s, compile {comp.seconds - c0:.1f} s")
            t = compare(prov, p, timer, {"fast": (row["fast"]["up"], row["fast"]["down"]),
                                         "full": (row[space_full]["up"], row[space_full]["down"])},
                        cpu=not GPU, rounds=5)
            row["retimed_us"] = t
            row["quality"] = t["fast"] / t["full"]
            row["gpu_ratio"] = row["fast"]["search_gpu_s"] / max(row[space_full]["search_gpu_s"], 1e-9)
            rows.append(row)
            res["fastfull"] = rows
            (Path(args.out) / "fastfull.json").write_text(json.dumps(rows, indent=1, default=str))
            say(f"  M={M}: fast/full kernel time {row['quality']:.4f}, GPU time ratio {row['gpu_ratio']:.3f}")
    finally:
        comp.close()
    res["fastfull"] = rows
    say("\nFAST vs FULL (whole fused MoE re-timed side by side, 5 rounds; GPU time = timing wall time, "
        "compile excluded)")
    say(f"  {'M':>5} {'full us':>9} {'fast us':>9} {'fast/full':>9} {'evals fast':>10} {'evals full':>10} "
        f"{'gpu s fast':>10} {'gpu s full':>10} {'ratio':>6}")
    for r in rows:
        say(f"  {r['M']:>5} {r['retimed_us']['full']:9.1f} {r['retimed_us']['fast']:9.1f} {r['quality']:9.4f} "
            f"{r['fast']['evaluated']:10d} {r[space_full]['evaluated']:10d} {r['fast']['search_gpu_s']:10.1f} "
            f"{r[space_full]['search_gpu_s']:10.1f} {r['gpu_ratio']:6.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="env,correct,tune,fp8,fastfull")
    ap.add_argument("--tune-space", default="fast")
    ap.add_argument("--tune-batch-sizes", default="1,2,4,8,16,24,32,48,64,96,128,256,512,1024,1536,2048,3072,4096")
    ap.add_argument("--full-batch-sizes", default="1,64,512")
    ap.add_argument("--fp8-batch-sizes", default="1,16,64,256,1024,4096")
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_out"))
    args = ap.parse_args()
    if not GPU:
        args.tune_space = "smoke" if args.tune_space == "fast" else args.tune_space
        args.tune_batch_sizes = "1,4"
        args.full_batch_sizes = "2"
        args.fp8_batch_sizes = "3"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"args": vars(args), "gpu": GPU}
    t0 = time.time()
    for s in args.sections.split(","):
        ts = time.time()
        try:
            if s == "env":
                section_env(res)
            elif s == "correct":
                section_correct(res)
            elif s == "tune":
                section_tune(res, args, out)
            elif s == "fp8":
                section_fp8(res, args, out)
            elif s == "fastfull":
                section_fastfull(res, args)
        except Exception as exc:
            import traceback
            traceback.print_exc()
            res.setdefault("errors", {})[s] = f"{type(exc).__name__}: {exc}"
        say(f"[section {s}: {time.time() - ts:.0f} s]")
        (out / "bench.json").write_text(json.dumps(res, indent=1, default=str))
    say(f"[total {time.time() - t0:.0f} s]")


if __name__ == "__main__":
    main()
