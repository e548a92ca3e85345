#!/usr/bin/env python3
"""SGLang's own fused-MoE Triton kernel on the H200: default, shipped and orch-tuned configs,
all timed on SGLang's kernel side by side in one process; one script, one run.

SGLang is not installed on the H200 and it has no network: its wheel is carried in
(``--wheel``) and unpacked into ``--sglang-dir``. SGLang's import chain needs packages and
compiled ops absent there; ``tests/sglang_standins.py`` stands in for exactly those (server
packages as inert placeholders; compiled ops: the CUDA alignment used for M * top_k > 64, the
gated activation, the top-k sum, fp8 group quantization). SGLang's Triton GEMM, its Triton
alignment for small M and its launch code run for real. The compute stand-ins cost the same
for every config set, so they shift absolute times, not the ranking; the script prints them.

Sections (``--sections``, comma list; default ``env,fp8check,tune,compare``):

- ``env``:      GPU, torch, Triton, SGLang version and entry points, the stand-ins in use.
- ``fp8check``: orch's builtin fp8_w8a8 kernel, the 14 correctness cases of
                ``bench/tune_h200.py --sections fp8`` (same seed), once per fp8 accumulation
                mode (``remote.tuning.kernel.fused_moe.FP8_ACCUMULATION``: ``mma`` = the behaviour that
                failed 3 cases on the H200, ``promote32``, ``exact`` = the default on sm_90),
                plus the whole kernel's time per mode at the reference shape.
- ``tune``:     ``python -m remote tune --space fast`` for Qwen3-30B-A3B at TP1 (E=128,
                N=768, hidden 2048, top-k 8, bf16), all 18 SGLang batch sizes, with
                ``--provider sglang`` (SGLang's kernel; baseline and tie preference: the
                configs the installed SGLang loads, i.e. its shipped file) and with
                ``--provider builtin``; wall time of each.
- ``tune2``:    the same sglang-provider fast tune again, in a fresh process, on every visible GPU
                (on a 2-GPU machine: the batch sizes spread over both): its wall time and which
                device tuned which batch size; ``compare`` then times its picks beside the first
                tune's (two tunes within 1% of each other's kernel time).
- ``compare``:  per batch size, SGLang's ``fused_experts`` reading each config set from its own
                ``SGLANG_MOE_CONFIG_DIR``: default (no file), shipped ``triton_3_6_0``, shipped
                newest Triton folder holding the file (when another one does), builtin-tuned,
                sglang-tuned; CUDA graph of 10 calls, L2 flushed, median of 10 replays, 5
                interleaved rounds, median. Prints the targets (vs shipped, vs default).
- ``full``:     ``--space full`` with the sglang provider at ``--full-batch-sizes`` (one tune
                per batch size, largest first, each only if the budget still allows it), then
                fast's and full's picks side by side: quality (fast/full time) and GPU-time
                ratio (search timing seconds).
- ``fp8shape``: the fp8 block-[128, 128] shape SGLang 0.5.23 ships an H200 file for in
                ``triton_3_6_0``: E=256, N=512 (hidden 3072, top-k 8: Qwen3.5-122B-A10B-FP8
                at TP2); sglang-provider fast tune over ``--fp8-batch-sizes``, then default vs
                shipped vs tuned on SGLang's kernel.
- ``quant``:    quantized weights on SGLang's kernel (``QUANT_SHAPES``): one ``int4_w4a16`` shape
                (Qwen3-30B-A3B-GPTQ-Int4 at TP1, ``--quantization moe_wna16``) and one ``int8_w8a8``
                shape (DeepSeek-R1-Channel-INT8 at TP8, ``--quantization w8a8_int8``); a fast
                sglang-provider tune of ``--quant-batch-sizes`` each (both at once on a 2-GPU
                machine, one child process per GPU), then per batch size SGLang's default config, the shipped file (SGLang
                0.5.23 ships none of these names for the H200) and the tuned files, timed as in
                ``compare``, each set checked against the float64 reference on the same quantized
                numbers.

Issue 30 section (the unit down for GPU timing only):

- ``prepared``:   the same 18-batch-size fast tune split as ``orch tune`` runs it: ``python -m remote
                  prepare`` (before the stop: no CUDA context, niced, ``--prepare-workers``, at most
                  ``--prepare-s`` s of compiling, the GPU target from nvidia-smi), then ``python -m
                  remote tune --prepared`` (the GPU phase, while the unit is down), fresh processes;
                  their walls, the GPU phase's split and how many first launches found the prepared
                  binaries. ``compare --compare-sets sglang_tuned,sglang_old_tuned`` then times its picks
                  beside a one-phase tune's (``--tuned sglang_old:UP:DOWN``).

Issue 20 sections (compile off the GPU's memory budget; fast against a bounded exhaustive search):

- ``split``:      the 18-batch-size sglang-provider fast tune on one GPU with the new compile path
                  (``--compile-mode auto``: CPU processes without CUDA compile for the GPU target)
                  and adaptive screening (``--screen adaptive``), and the old arm: the old compile
                  path (``--compile-mode context``; or with ``--split-old fixed-screen`` the old
                  screening protocol, ``--screen fixed``), fresh process and empty Triton cache
                  each; wall time and the report's split (compile, first launch, timing, compare,
                  check). Run ``compare`` after it: both tunes' picks beside SGLang's default and
                  shipped file, and old vs new at every M (two tunes in fresh processes within 1%).
- ``exhaustive``: at ``--exhaustive-batch-sizes`` (1, 64, 512, 4096), every fitting config of
                  SGLang's space for each GEMM, with and without USE_TMA, screened within
                  ``--exhaustive-s`` seconds per batch size (the bound; coverage is printed), best
                  re-timed, whole-kernel final stage; beside ``fast``: its distance and GPU-time share.

Budget: every section checks the time left of ``--budget-s`` (default 530 s) against its
estimate and is skipped, or cut, with a message when it would not fit (one device call).

Outputs under ``$OUT`` (or ``--out``): ``sglang_kernel_h200.json`` (rewritten after every
section) and the tune folders.

H200 x2 (call 1): python3 bench/sglang_kernel_h200.py --wheel WHEEL --sections env,tune,tune2,compare
H200 x2 (call 2): python3 bench/sglang_kernel_h200.py --wheel WHEEL --sections env,fp8check,full,fp8shape
H200 x2 (quant):  python3 bench/sglang_kernel_h200.py --wheel WHEEL --sections env,quant --budget-s 530
CPU check:      python3 bench/sglang_kernel_h200.py --smoke   (TRITON_INTERPRET=1, tiny shapes,
                SGLang 0.5.23 from the test cache; numbers meaningless)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "bench" / "data"
MODEL = DATA / "Qwen3-30B-A3B.json"
SGLANG_BATCH_SIZES = "1,2,4,8,16,24,32,48,64,96,128,256,512,1024,1536,2048,3072,4096"
FP8_SHAPE = dict(E=256, N=512, hidden=3072, topk=8)

T0 = time.time()


def say(*a):
    print(*a, flush=True)


def left(args) -> float:
    return args.budget_s - (time.time() - T0)


# ----------------------------------------------------------------------------- setup


def setup(args) -> dict:
    """Unpack SGLang, install the stand-ins here and for child processes; returns context."""
    from tests import sglang_standins as st

    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        tree = st.release_tree("0.5.23")
    else:
        if not args.wheel and not (Path(args.sglang_dir) / "sglang").is_dir():
            raise SystemExit("--wheel PATH is required (or an unpacked --sglang-dir)")
        tree = st.unpack_wheel(args.wheel, args.sglang_dir) if args.wheel else Path(args.sglang_dir)
    os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/orch-triton-cache")
    info = st.prepare(tree)
    env = st.subprocess_env(Path(args.out) / "standin_site", tree, ROOT)
    return {"tree": tree, "standins": info, "env": env}


def provider():
    from remote.engines.sglang.provider import SglangProvider, load_kernel
    return SglangProvider(load_kernel())


# ----------------------------------------------------------------------------- env


def section_env(res, args, ctx):
    import torch
    import triton

    prov = provider()
    info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "cpus": os.cpu_count(),
            "sglang": prov.describe(), "standins": ctx["standins"]}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(capability=list(torch.cuda.get_device_capability()), sms=p.multi_processor_count,
                    smem_optin=getattr(p, "shared_memory_per_block_optin", None))
    res["env"] = info
    say("ENV", json.dumps({k: v for k, v in info.items() if k not in ("sglang", "standins")}))
    d = info["sglang"]
    say(f"SGLang {d['version']}: entry points {json.dumps(d['entry_points'])}")
    say(f"  _down files: {d['down_file']}, USE_TMA read from up: {d['up_tma']}, down: {d['down_tma']}, "
        f"TMA on this device: {d['tma_device']}; searched for: {d['tma_kinds']}; {d['server_args']}")
    say("STAND-INS (absent here, not part of SGLang's Triton GEMM/alignment/launch):")
    say("  packages:", ", ".join(ctx["standins"]["modules"]) or "none")
    say("  ops:", ", ".join(ctx["standins"]["ops"]) or "none")
    say("  other:", ", ".join(ctx["standins"]["logger"]) or "none")
    prov.close()


# ----------------------------------------------------------------------------- fp8check


def section_fp8check(res, args, ctx):
    """The builtin fp8 kernel's correctness (and speed) per accumulation mode."""
    import torch

    import remote.tuning.kernel.fused_moe as fm
    from bench.tune_h200 import fp8_correctness
    from remote.tuning.providers.builtin import BuiltinProvider
    from remote.tuning.tuner import space as sp
    from remote.tuning.tuner.timing import Timer

    modes = ["mma", "promote32", "exact"]
    out = {"modes": {}, "default_mode_here": None}
    gpu = torch.cuda.is_available()
    out["default_mode_here"] = {0: "mma", 1: "promote32", 2: "exact"}[fm.fp8_acc_code("cuda" if gpu else "cpu")]
    for mode in modes:
        fm.FP8_ACCUMULATION = mode
        try:
            rows = fp8_correctness()
        except Exception as exc:
            say(f"  fp8check {mode}: {type(exc).__name__}: {exc}")
            out["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out["modes"][mode] = {"rows": rows}
    fm.FP8_ACCUMULATION = "auto"
    say(f"\nFP8_W8A8 CORRECTNESS of orch's builtin kernel (max rel err over configs; pass < 1e-2); "
        f"default mode on this GPU: {out['default_mode_here']}")
    keys = []
    worst = {}
    for mode, r in out["modes"].items():
        for row in r.get("rows", []):
            key = (row["scheme"], row["case"])
            if key not in keys:
                keys.append(key)
            worst[(mode, key)] = max(worst.get((mode, key), 0.0), row["rel_err"])
    say(f"  {'scheme':10s} {'case':16s} " + " ".join(f"{m:>11s}" for m in modes))
    for key in keys:
        cells = []
        for m in modes:
            e = worst.get((m, key))
            cells.append(f"{e:8.2e} {'ok' if e < 1e-2 else '!!'}" if e is not None else f"{'-':>11s}")
        say(f"  {key[0]:10s} {key[1]:16s} " + " ".join(cells))
    for m in modes:
        n_bad = sum(1 for k in keys if worst.get((m, k), 0) >= 1e-2)
        say(f"  {m}: {n_bad} of {len(keys)} cases fail")
    # speed of each mode: whole fused MoE, default config, reference shape
    if gpu and left(args) > 60:
        shape = dict(E=128, N=768, hidden=2048, topk=8)
        prov, timer = BuiltinProvider(), Timer("cuda:0")
        times = {}
        for block in (None, [128, 128]):
            quant = {"block_shape": block}
            weights = None
            for M in (1, 256, 4096):
                p = prov.make_problem(shape, M, "bfloat16", "cuda:0", 7, weights, quant=quant)
                weights = p.weights
                d = sp.default_config(M, shape["E"], "fp8_w8a8", block)
                timer.warm_up(prov.full_fn(p, d, d))
                for mode in modes:
                    fm.FP8_ACCUMULATION = mode
                    try:
                        t = statistics.median(timer.time(prov.full_fn(p, d, d)) for _ in range(3))
                    except Exception as exc:
                        t = f"{type(exc).__name__}: {str(exc)[:120]}"
                    times[f"{'block' if block else 'per-tensor'} M={M} {mode}"] = t
                fm.FP8_ACCUMULATION = "auto"
            del weights
        out["speed_us"] = times
        say("  whole-kernel time (us, default config, E=128 N=768 hidden 2048 top-k 8):")
        for k, v in times.items():
            say(f"    {k:32s} {v if isinstance(v, str) else f'{v:9.1f}'}")
    res["fp8check"] = out


# ----------------------------------------------------------------------------- tune


def run_tune(args, ctx, name: str, extra: list, timeout: float, standins: bool = True,
             gpus: str | None = None, triton_cache: str | None = None) -> dict:
    """``python -m remote tune`` in a child process (with ``standins``: SGLang importable via
    sitecustomize, else a plain environment; ``gpus``: its CUDA_VISIBLE_DEVICES, None: every GPU;
    ``triton_cache``: a TRITON_CACHE_DIR emptied first, so the tune compiles everything itself);
    returns ``{"cmd", "wall_s", "rc", "gpus", "report"?, "stdout_tail"}``."""
    out = Path(args.out) / name
    cmd = [sys.executable, "-m", "remote", "tune", "--out", str(out), "--seed", "0", "--no-resume"] + extra
    if args.smoke:
        cmd += ["--device-name", "NVIDIA H200"]
    say(f"\nTUNE {name}: {' '.join(cmd)}")
    t0 = time.time()
    try:
        env = dict(ctx["env"]) if standins else dict(os.environ, PYTHONPATH=str(ROOT))
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        if triton_cache is not None:
            shutil.rmtree(triton_cache, ignore_errors=True)
            Path(triton_cache).mkdir(parents=True)
            env["TRITON_CACHE_DIR"] = triton_cache
        p = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True,
                           timeout=min(max(10, timeout), 86400))
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = "timeout", (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (
            exc.stdout or ""), ""
    r = {"cmd": cmd, "wall_s": round(time.time() - t0, 1), "rc": rc, "gpus": gpus, "stdout_tail": stdout[-3000:],
         "stderr_tail": stderr[-3000:]}
    rp = out / "report.json"
    if rp.exists():
        r["report"] = json.loads(rp.read_text())
        r["files"] = r["report"]["files"]
    else:
        say(f"  no report (rc {rc}): {(stderr or stdout)[-1500:]}")
    say(f"  {name}: {r['wall_s']} s wall on GPUs {gpus if gpus is not None else 'all'}, rc {rc}")
    return r


def _print_tune(rep: dict) -> None:
    say(f"  {'M':>5} {'default':>9} {'shipped':>9} {'tuned':>9} {'vs def':>7} {'vs ship':>7} {'evals':>5} "
        f"{'gpu_s':>6} {'wall_s':>6}  pick / up | down")
    for M, r in sorted(rep["batch_sizes"].items(), key=lambda kv: int(kv[0])):
        say(f"  {M:>5} {r['default_us'] or 0:9.1f} {r['shipped_us'] or 0:9.1f} {r['tuned_us'] or 0:9.1f} "
            f"{r['speedup_vs_default'] or 0:7.3f} {r['speedup_vs_shipped'] or 0:7.3f} {r['evaluated']:5d} "
            f"{r['search_gpu_s']:6.1f} {r['search_wall_s']:6.1f}  {r.get('pick', '')} / "
            f"{_label(r['up'])} | {_label(r['down'])}")


def _label(c: dict) -> str:
    return (f"{c['BLOCK_SIZE_M']}/{c['BLOCK_SIZE_N']}/{c['BLOCK_SIZE_K']} g{c['GROUP_SIZE_M']} w{c.get('num_warps', 4)} "
            f"s{c.get('num_stages', 3)}{' tma' if c.get('USE_TMA') else ''}")


def section_tune(res, args, ctx):
    model = (["--model-config", str(MODEL)] if not args.smoke else ["--shape", "E=8,N=64,hidden=128,topk=2"])
    space = "smoke" if args.smoke else "fast"
    out = {}
    for prov_name, extra in (("sglang", []), ("builtin", ["--shipped-config", str(DATA / "E=128,N=768,device_name="
                                                                                     "NVIDIA_H200.json")])):
        est = 200 if prov_name == "sglang" else 150
        if not args.smoke and left(args) < est:
            say(f"  skip {prov_name} tune: {left(args):.0f} s left of the budget, needs ~{est} s")
            continue
        # the sglang tune on ONE GPU (the "18 batch sizes in 3 minutes on one H200" target); the
        # builtin tune on every GPU (its wall time is not a target)
        out[prov_name] = run_tune(args, ctx, f"tune_{prov_name}_{space}",
                                  ["--provider", prov_name, "--space", space, "--batch-sizes", args.batch_sizes]
                                  + model + extra, timeout=left(args) - 20, standins=prov_name == "sglang",
                                  gpus="0" if prov_name == "sglang" and not args.smoke else None)
        rep = out[prov_name].get("report")
        if rep:
            _print_tune(rep)
    res["tune"] = out


def section_tune2(res, args, ctx):
    """A second sglang-provider fast tune of the same shape in a fresh process, on EVERY visible
    GPU (the batch sizes spread over them): its wall time (the multi-GPU spread) and, in
    ``compare``, its picks timed beside the first tune's (two tunes within 1%)."""
    import torch

    model = (["--model-config", str(MODEL)] if not args.smoke else ["--shape", "E=8,N=64,hidden=128,topk=2"])
    space = "smoke" if args.smoke else "fast"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not args.smoke and left(args) < 150:
        say(f"  skip tune2: {left(args):.0f} s left")
        return
    r = run_tune(args, ctx, f"tune_sglang_{space}_2", ["--provider", "sglang", "--space", space, "--batch-sizes",
                                                          args.batch_sizes] + model, timeout=left(args) - 20)
    r["n_gpus"] = n
    if r.get("report"):
        _print_tune(r["report"])
        from remote.tuning.tuner.driver import split_batches

        Ms = [int(x) for x in args.batch_sizes.split(",")]
        per_gpu = {f"cuda:{i}": part for i, part in enumerate(split_batches(Ms, max(1, n)))}
        r["batch_sizes_per_device"] = per_gpu
        say(f"  {n} GPU(s): batch sizes per device {json.dumps(per_gpu)}")
    res["tune2"] = r


# ----------------------------------------------------------------------------- compare


def _shape_files(tree: Path, names: dict) -> dict:
    """``{folder: {"up": path, "down": path|None}}`` of SGLang's shipped configs for these names."""
    from remote.engines.sglang.naming import parse_triton_folder
    from remote.engines.sglang.provider import load_kernel

    base = Path(sys.modules[load_kernel().get_moe_configs.__module__].__file__).parent / "configs"
    found = {}
    for d in sorted(base.glob("triton_*")):
        if parse_triton_folder(d.name) is None:
            continue
        up = d / names["up"]
        if up.is_file():
            down = d / names["down"] if names.get("down") else None
            found[d.name] = {"up": up, "down": down if down and down.is_file() else None}
    return found


def _config_dir(root: Path, name: str, up: Path | None, down: Path | None, names: dict) -> Path:
    """A SGLANG_MOE_CONFIG_DIR holding copies of ``up``/``down`` under the installed Triton's
    folder, with SGLang's file names (an empty folder when ``up`` is None: SGLang's default)."""
    import triton

    from remote.engines.sglang.naming import triton_folder
    folder = root / name / "configs" / triton_folder(triton.__version__)
    folder.mkdir(parents=True, exist_ok=True)
    if up is not None:
        shutil.copyfile(up, folder / names["up"])
        if down is not None and names.get("down"):
            shutil.copyfile(down, folder / names["down"])
    return root / name


def _set_configs(prov, p, d: Path) -> list:
    """The (kind, config) pairs SGLang's fused_experts will launch for problem ``p`` reading the
    config folder ``d`` (closest batch-size key; no file: SGLang's default; no _down file: the up
    entry without USE_TMA), for precompiling; approximate is fine (a miss compiles at launch)."""
    import triton

    from remote.engines.sglang.naming import triton_folder
    from remote.tuning.tuner import space as sp
    names = prov.k.file_names(p.E, p.N, prov.k.config_dtype(p.dtype, p.quant),
                              list(p.quant.block_shape) if p.quant and p.quant.block_shape else None)
    folder = Path(d) / "configs" / triton_folder(triton.__version__)
    up_f = folder / names["up"]
    if not up_f.is_file():
        c = prov.default_config(p)
        return [("up", c), ("down", c)]
    up = sp.closest_entry({str(k): v for k, v in json.loads(up_f.read_text()).items()}, p.M)
    down_f = folder / names["down"] if names.get("down") else None
    down = (sp.closest_entry({str(k): v for k, v in json.loads(down_f.read_text()).items()}, p.M)
            if down_f and down_f.is_file() else {k: v for k, v in up.items() if k != "USE_TMA"})
    down["BLOCK_SIZE_M"] = up["BLOCK_SIZE_M"]
    for c in (up, down):
        c.setdefault("num_warps", 4)
        c.setdefault("num_stages", 3)
    return [("up", up), ("down", down)]


def compare_sets(args, shape: dict, dtype: str, quant, batch_sizes: list, sets: dict, rounds: int,
                 routing=None, replay_us=None, rotate=False) -> list:
    """Time SGLang's fused_experts per batch size for each ``{set: config dir}`` (interleaved
    rounds, median); returns rows ``{"M", set: us, ..., "spread": {set: [min, max]}}``. On a GPU every
    set's configs at every batch size are first sent to the tuner's compile workers (compile off the
    GPU), so the timing loop mostly loads binaries instead of compiling them one by one.
    ``routing``: the tuner's routing entry (:mod:`remote.tuning.tuner.routing`, e.g. ``{"shared": 1}``
    for the fused shared expert in every row); ``replay_us``: the timer's adaptive graph length
    (e.g. ``timing.SLOW_REPLAY_US``: kernels slower than 1 ms get a graph of fewer calls, faster ones
    keep 10); ``rotate``: the sets' order rotates every round."""
    import torch

    from remote.tuning.tuner.timing import Timer
    prov = provider()
    cpu = not torch.cuda.is_available()
    dev = "cpu" if cpu else "cuda:0"
    timer = Timer(dev)
    proto = dict(n_calls=1, reps=1) if cpu else dict(n_calls=10, reps=10, **({"replay_us": replay_us} if replay_us
                                                                             else {}))
    rows = []
    weights = None
    problems = {}
    compiler = None
    if not cpu and getattr(args, "precompile_compare", True):
        from remote.tuning.tuner.driver import make_compiler
        try:
            compiler = make_compiler(prov, {"shape": shape, "dtype": dtype, "quant": quant, "routing": routing}, dev)
            for M in batch_sizes:
                p = prov.make_problem(shape, M, dtype, dev, 1000 + M, weights, quant=quant, routing=routing)
                weights = p.weights
                problems[M] = p
                if hasattr(compiler, "bind"):
                    compiler.bind(prov, p)
                for d in sets.values():
                    compiler.submit(_set_configs(prov, p, d), M=M)
        except Exception as exc:
            say(f"  compare: precompile skipped ({type(exc).__name__}: {str(exc)[:200]})")
    try:
        for M in batch_sizes:
            p = problems.pop(M, None) or prov.make_problem(shape, M, dtype, dev, 1000 + M, weights, quant=quant,
                                                           routing=routing)
            weights = p.weights
            fns = {name: prov.dir_fn(p, str(d)) for name, d in sets.items()}
            if not cpu:
                timer.warm_up(next(iter(fns.values())))
            samples = {name: [] for name in fns}
            for r in range(1 if cpu else rounds):
                names = list(fns)
                if rotate and names:
                    names = names[r % len(names):] + names[:r % len(names)]
                for name in names:
                    fn = fns[name]
                    try:
                        samples[name].append(timer.time(fn, **proto))
                    except Exception as exc:
                        samples[name] = None
                        say(f"  M={M} {name}: {type(exc).__name__}: {str(exc)[:200]}")
                        fns[name] = None
                fns = {k: v for k, v in fns.items() if v is not None}
            row = {"M": M}
            row.update({name: (statistics.median(v) if v else None) for name, v in samples.items()})
            say("  M=%5d  " % M + "  ".join(f"{k} {v:9.1f}" if v else f"{k} -" for k, v in row.items() if k != "M"))
            row["spread"] = {name: ([round(min(v), 2), round(max(v), 2)] if v else None) for name, v in samples.items()}
            row["samples"] = {name: ([round(x, 2) for x in v] if v else None) for name, v in samples.items()}
            rows.append(row)
    finally:
        if compiler is not None:
            say(f"  compare compile: {json.dumps(compiler.stats())}")
            compiler.close()
        prov.close()
    return rows


def _ratio(a, b):
    return None if not a or not b else round(a / b, 4)


def section_compare(res, args, ctx):
    from remote.engines.sglang.provider import load_kernel
    k = load_kernel()
    shape = dict(E=8, N=64, hidden=128, topk=2) if args.smoke else dict(E=128, N=768, hidden=2048, topk=8)
    dtype = "float16" if args.smoke else "bfloat16"
    names = k.file_names(shape["E"], shape["N"], None, None)
    shipped = _shape_files(ctx["tree"], names)
    root = Path(tempfile.mkdtemp(prefix="orch-bench-sets-"))
    if args.smoke and not shipped:
        # no shipped file for the tiny CPU shape: the H200 reference file's entries stand in, so the
        # shipped path (closest key, no _down file) runs
        shipped = {"triton_3_6_0": {"up": DATA / "E=128,N=768,device_name=NVIDIA_H200.json", "down": None}}
    sets = {"default": _config_dir(root, "default", None, None, names)}
    if "triton_3_6_0" in shipped:
        f = shipped["triton_3_6_0"]
        sets["ship_3_6_0"] = _config_dir(root, "ship_3_6_0", f["up"], f["down"], names)
    newest = [d for d in shipped if d != "triton_3_6_0"]
    if newest:
        from remote.engines.sglang.naming import sort_triton_folders
        d = sort_triton_folders(newest)[0]
        f = shipped[d]
        sets[f"ship_{d[len('triton_'):]}"] = _config_dir(root, f"ship_{d}", f["up"], f["down"], names)
    say(f"\nCOMPARE on SGLang {k.version}'s kernel: shipped files for this shape in folders {sorted(shipped)}")
    tunes = dict(res.get("tune", {}))
    if (res.get("tune2") or {}).get("files"):
        tunes["sglang2"] = res["tune2"]
    for prov_name in ("builtin", "sglang", "sglang2", "sglang_old"):
        files = (tunes.get(prov_name) or {}).get("files")
        if files:
            sets[f"{prov_name}_tuned"] = _config_dir(root, f"{prov_name}_tuned", Path(files["up"]),
                                                     Path(files["down"]), names)
    if getattr(args, "compare_sets", None):
        keep = set(args.compare_sets.split(","))
        sets = {k: v for k, v in sets.items() if k in keep}
    Ms = [int(x) for x in args.batch_sizes.split(",")]
    # per (M, set): ~3 s when every config compiles in this process, ~1 s when the compile workers
    # precompile them all first (compare_sets on a GPU)
    est = (1.0 if getattr(args, "precompile_compare", True) else 3.0) * len(Ms) * len(sets) + 20
    if not args.smoke and left(args) < est:
        keep = max(1, int(len(Ms) * left(args) / est))
        say(f"  budget: timing {keep} of {len(Ms)} batch sizes ({left(args):.0f} s left)")
        Ms = Ms[::max(1, len(Ms) // keep)][:keep]
    rows = compare_sets(args, shape, dtype, None, Ms, sets, rounds=getattr(args, "compare_rounds", 5))
    shutil.rmtree(root, ignore_errors=True)
    res["compare"] = {"sets": sorted(sets), "rows": rows, "shipped_folders": sorted(shipped)}
    say("\nCOMPARE (us, SGLang's fused_experts per config set; ratios > 1 = sglang-tuned faster)")
    ship = "ship_3_6_0" if "ship_3_6_0" in sets else None
    head = (f"  {'M':>5} " + " ".join(f"{s:>14s}" for s in sets)
            + f" {'sg/ship':>8} {'sg/def':>7} {'bi/ship':>8} {'sg2/sg':>7}")
    say(head)
    for r in rows:
        sg, bi, sg2 = r.get("sglang_tuned"), r.get("builtin_tuned"), r.get("sglang2_tuned")
        sh, de = (r.get(ship) if ship else None), r.get("default")
        say(f"  {r['M']:>5} " + " ".join(f"{r.get(s) or 0:14.1f}" for s in sets) +
            f" {_ratio(sh, sg) or 0:8.3f} {_ratio(de, sg) or 0:7.3f} {_ratio(sh, bi) or 0:8.3f}"
            f" {_ratio(sg, sg2) or 0:7.3f}")
    olds = [r for r in rows if r.get("sglang_tuned") and r.get("sglang_old_tuned")]
    if olds:  # section split: the same tune, old compile path vs new, each in a fresh process
        within = [r["M"] for r in olds if abs(r["sglang_old_tuned"] / r["sglang_tuned"] - 1) <= 0.01]
        say(f"  old-path tune vs new-path tune (fresh processes): within 1% at {len(within)}/{len(olds)} M; "
            "per M (old/new): " + ", ".join(f"{r['M']}: {r['sglang_old_tuned'] / r['sglang_tuned']:.3f}"
                                            for r in olds))
        res["compare"]["old_vs_new_within_1pct"] = within
        res["compare"]["old_over_new"] = {r["M"]: round(r["sglang_old_tuned"] / r["sglang_tuned"], 4) for r in olds}
    twins = [r for r in rows if r.get("sglang_tuned") and r.get("sglang2_tuned")]
    if twins:
        within = [r["M"] for r in twins if abs(r["sglang2_tuned"] / r["sglang_tuned"] - 1) <= 0.01]
        say(f"  two tunes within 1% of each other's kernel time at {len(within)}/{len(twins)} M")
        res["compare"]["two_tunes_within_1pct"] = within
    if ship and any(r.get("sglang_tuned") for r in rows):
        ok_ship = [r["M"] for r in rows if r.get("sglang_tuned") and r.get(ship) and
                   r[ship] / r["sglang_tuned"] >= 0.995]
        big = [r for r in rows if r["M"] >= 2048 and r.get("sglang_tuned") and r.get(ship)]
        ok_big = [r["M"] for r in big if r[ship] / r["sglang_tuned"] >= 1.04]
        mid = [r for r in rows if r["M"] >= 256 and r.get("sglang_tuned") and r.get("default")]
        ok_def = [r["M"] for r in mid if r["default"] / r["sglang_tuned"] >= 1.25]
        say(f"  targets: >= shipped (0.5% noise) at {len(ok_ship)}/{len(rows)} M; >= 4% faster at M>=2048: "
            f"{len(ok_big)}/{len(big)}; >= 1.25x default from M=256: {len(ok_def)}/{len(mid)}")
        res["compare"]["targets"] = {"ge_shipped": ok_ship, "ge4pct_large": ok_big, "ge125_default": ok_def}


# ----------------------------------------------------------------------------- full


def section_full(res, args, ctx):
    from remote.engines.sglang.provider import load_kernel
    k = load_kernel()
    model = (["--model-config", str(MODEL)] if not args.smoke else ["--shape", "E=8,N=64,hidden=128,topk=2"])
    space = "smoke" if args.smoke else "full"
    Ms = sorted((int(x) for x in args.full_batch_sizes.split(",")), reverse=True)
    fast_rep = ((res.get("tune") or {}).get("sglang") or {}).get("report")
    if fast_rep is None or not all(str(M) in fast_rep["batch_sizes"] for M in Ms):
        r = run_tune(args, ctx, "fast_for_full", ["--provider", "sglang", "--space", "smoke" if args.smoke else "fast",
                                                  "--batch-sizes", ",".join(map(str, Ms))] + model,
                     timeout=left(args) - 20)
        fast_rep = r.get("report")
    rows = []
    shape = dict(E=8, N=64, hidden=128, topk=2) if args.smoke else dict(E=128, N=768, hidden=2048, topk=8)
    names = k.file_names(shape["E"], shape["N"], None, None)
    classes_done = set()
    for M in Ms:
        # SGLang's kernel is specialised on M * top_k (and the alignment size): the first full
        # search of a class compiles all ~5000 candidates (with USE_TMA both ways), later ones reuse them
        cls = M % 2 == 0
        est = 420 if cls not in classes_done else (150 if M >= 1024 else 100)
        if not args.smoke and left(args) < est:
            say(f"  skip full at M={M}: {left(args):.0f} s left, needs ~{est} s")
            continue
        r = run_tune(args, ctx, f"full_M{M}", ["--provider", "sglang", "--space", space, "--batch-sizes", str(M)]
                     + model, timeout=left(args) - 15)
        classes_done.add(cls)
        rep = r.get("report")
        if not rep or not fast_rep:
            rows.append({"M": M, "error": r.get("stderr_tail", "")[-500:]})
            continue
        fr, fu = fast_rep["batch_sizes"][str(M)], rep["batch_sizes"][str(M)]
        root = Path(tempfile.mkdtemp(prefix="orch-bench-full-"))
        from remote.engines.triton_moe.configfile import dumps_config
        sets = {}
        for name, pick in (("fast", fr), ("full", fu)):
            d = root / name / "configs"
            import triton

            from remote.engines.sglang.naming import triton_folder
            folder = d / triton_folder(triton.__version__)
            folder.mkdir(parents=True)
            (folder / names["up"]).write_text(dumps_config({str(M): pick["up"]}))
            (folder / names["down"]).write_text(dumps_config({str(M): pick["down"]}))
            sets[name] = root / name
        t = compare_sets(args, shape, "float16" if args.smoke else "bfloat16", None, [M], sets, rounds=7)[0]
        shutil.rmtree(root, ignore_errors=True)
        row = {"M": M, "fast_us": t.get("fast"), "full_us": t.get("full"), "quality": _ratio(t.get("fast"), t.get("full")),
               "fast_gpu_s": fr["search_gpu_s"], "full_gpu_s": fu["search_gpu_s"],
               "gpu_ratio": _ratio(fr["search_gpu_s"], fu["search_gpu_s"]), "fast_evals": fr["evaluated"],
               "full_evals": fu["evaluated"], "full_wall_s": r["wall_s"], "fast_pick": fr, "full_pick": fu}
        rows.append(row)
        say(f"  M={M}: fast/full time {row['quality']}, GPU time ratio {row['gpu_ratio']} "
            f"(fast {fr['evaluated']} evals {fr['search_gpu_s']} s, full {fu['evaluated']} evals {fu['search_gpu_s']} s)")
        res["full"] = rows
    res["full"] = rows


# ----------------------------------------------------------------------------- fp8 shape


def section_fp8shape(res, args, ctx):
    from remote.engines.sglang.provider import load_kernel
    k = load_kernel()
    shape = dict(E=8, N=128, hidden=256, topk=2) if args.smoke else FP8_SHAPE
    block = [128, 128]
    Ms = [int(x) for x in args.fp8_batch_sizes.split(",")]
    if not args.smoke and left(args) < 150:
        say(f"  skip fp8shape: {left(args):.0f} s left")
        return
    r = run_tune(args, ctx, "tune_fp8_block", ["--provider", "sglang", "--space", "smoke" if args.smoke else "fast",
                                               "--batch-sizes", ",".join(map(str, Ms)),
                                               "--shape", ",".join(f"{a}={b}" for a, b in shape.items()),
                                               "--quantization", "fp8", "--block-shape", "128,128"],
                 timeout=left(args) - 60)
    names = k.file_names(shape["E"], shape["N"], "fp8_w8a8", block)
    shipped = _shape_files(ctx["tree"], names)
    root = Path(tempfile.mkdtemp(prefix="orch-bench-fp8-"))
    sets = {"default": _config_dir(root, "default", None, None, names)}
    for d in ("triton_3_6_0",) + tuple(x for x in shipped if x != "triton_3_6_0")[:1]:
        if d in shipped:
            sets[f"ship_{d[len('triton_'):]}"] = _config_dir(root, d, shipped[d]["up"], shipped[d]["down"], names)
    if r.get("files"):
        sets["sglang_tuned"] = _config_dir(root, "tuned", Path(r["files"]["up"]), Path(r["files"]["down"]), names)
    say(f"\nFP8 block [128, 128] E={shape['E']} N={shape['N']} hidden {shape['hidden']} top-k {shape['topk']}: "
        f"shipped in {sorted(shipped)}; tune {r['wall_s']} s wall")
    rows = compare_sets(args, shape, "float16" if args.smoke else "bfloat16", {"block_shape": block}, Ms, sets,
                        rounds=5)
    shutil.rmtree(root, ignore_errors=True)
    res["fp8shape"] = {"shape": shape, "tune": r, "rows": rows, "sets": sorted(sets)}


# ----------------------------------------------------------------------------- split (issue 20)


def _print_split(name: str, rep: dict, wall: float) -> None:
    sp_ = rep.get("time_split") or {}
    c = rep.get("compile") or {}
    say(f"  {name}: {wall:.1f} s wall (tune command {rep.get('wall_s')} s); where it went (s, summed over "
        f"{sp_.get('batch_sizes')} batch sizes): " + ", ".join(f"{k} {v:.1f}" for k, v in sp_.items()
                                                              if k not in ("batch_sizes",)))
    scr = [r.get("screen") or {} for r in (rep.get("batch_sizes") or {}).values()]
    if scr:
        say(f"    screen: {scr[0].get('mode')}, measurements shortened {sum(x.get('shortened', 0) for x in scr)}, "
            f"graph calls saved {sum(x.get('graph_calls_saved', 0) for x in scr)}")
    say(f"    compile: mode {c.get('mode')}, workers {c.get('workers')}, requests sent {c.get('sent')}, "
        f"failed {c.get('failed')}, first launches that found the worker's binary {c.get('launch_cache_hits')}, "
        f"that compiled {c.get('launch_compiles')}; fallback: {c.get('fallback_reason')}; notes {c.get('notes')}")


def section_split(res, args, ctx):
    """Item 2/3a: the 18-batch-size sglang-provider fast tune (bf16 Qwen3-30B-A3B, TP1, one GPU)
    with the new compile path (``--compile-mode auto``: compile for the GPU target in CPU
    processes without CUDA) and the old one (``--compile-mode context``), each in a fresh process
    with an empty Triton cache; the tune report's split (compile, first launch, timing, compare,
    check) of each. ``compare`` then times both tunes' picks beside SGLang's default and shipped
    file, and the two tunes against each other at every M (two tunes in fresh processes)."""
    model = (["--model-config", str(MODEL)] if not args.smoke else ["--shape", "E=8,N=64,hidden=128,topk=2"])
    space = "smoke" if args.smoke else "fast"
    out = {}
    # the "old" arm: the old compile path (--split-old context-compile) or the old screening
    # protocol with the new compile path (--split-old fixed-screen)
    old = ["--compile-mode", "context"] if args.split_old == "context-compile" else ["--screen", "fixed"]
    arms = ((["--compile-mode", "auto", "--screen", "adaptive"], "new", 130), (old, "old", 230))
    for flags, tag, est in arms[:1] if args.split_only_new else arms:
        if not args.smoke and left(args) < est:
            say(f"  skip the {tag}-path tune: {left(args):.0f} s left of the budget, needs ~{est} s")
            continue
        say(f"  {tag} arm: {' '.join(flags)}")
        r = run_tune(args, ctx, f"tune_sglang_{space}_{tag}",
                     ["--provider", "sglang", "--space", space, "--batch-sizes", args.batch_sizes]
                     + flags + model, timeout=left(args) - 20,
                     gpus="0" if not args.smoke else None, triton_cache=str(Path(args.out) / f"triton_cache_{tag}"))
        shutil.rmtree(Path(args.out) / f"triton_cache_{tag}", ignore_errors=True)  # not brought back
        out[tag] = r
        rep = r.get("report")
        if rep:
            _print_tune(rep)
            _print_split(f"{tag} path", rep, r["wall_s"])
    res["split"] = {k: {kk: vv for kk, vv in v.items() if kk != "report"} | {
        "time_split": (v.get("report") or {}).get("time_split"), "compile": (v.get("report") or {}).get("compile"),
        "tune_wall_s": (v.get("report") or {}).get("wall_s")} for k, v in out.items()}
    if out.get("new", {}).get("files"):
        res.setdefault("tune", {})["sglang"] = out["new"]
    if out.get("old", {}).get("files"):
        res.setdefault("tune", {})["sglang_old"] = out["old"]
    if "new" in out and "old" in out and out["new"].get("report") and out["old"].get("report"):
        a, b = out["new"]["report"]["wall_s"], out["old"]["report"]["wall_s"]
        say(f"  tune wall (tune command): new path {a:.1f} s, old path {b:.1f} s ({b / a:.2f}x); target <= 120 s "
            f"for 18 batch sizes on one H200: {'met' if a <= 120 else 'MISSED'}")


# ----------------------------------------------------------------------------- exhaustive (issue 20)


def section_exhaustive(res, args, ctx):
    """Item 3b: a bounded exhaustive search of SGLang's kernel beside ``fast`` at
    ``--exhaustive-batch-sizes`` (1, 64, 512, 4096) for bf16 Qwen3-30B-A3B at TP1, one GPU.

    ``fast``: ``python -m remote tune --space fast`` for those batch sizes in a fresh process
    (its picks and its search GPU time, ``search_gpu_s``). Exhaustive, here in this process with
    the tuner's own parts (Evaluator, compile workers, timer, whole-kernel final stage): every
    config of SGLang's 1920-config space that fits the device, for each GEMM, and each one again
    with ``USE_TMA`` where the release reads it (SGLang 0.5.23: up and down; TMA on/off is the
    ``b_use_tma`` / ``a_use_tma`` + ``b_use_tma`` of ``invoke_fused_moe_kernel``), fast's own
    pick first and the rest in a seeded random order; all screened (graph of 10 calls, 3
    replays), the 6 best per BLOCK_SIZE_M and GEMM re-timed with the full protocol, then the
    tuner's whole-kernel final stage. The bound: ``--exhaustive-s`` seconds per batch size for
    the screen (compile + timing); what it reached is reported (``screened`` of ``candidates``
    per GEMM), so a cut search is visible. Then fast's pick, the exhaustive pick and SGLang's
    default side by side (whole kernel, 7 interleaved rounds): fast's distance
    (fast/exhaustive - 1, target <= 1%) and its GPU-time share (fast's ``search_gpu_s`` over the
    exhaustive search's timer seconds, target <= 10%)."""
    import random

    import torch

    from remote.tuning.tuner import space as sp
    from remote.tuning.tuner.driver import compare, make_compiler, smem_limit
    from remote.tuning.tuner.search import FULL_PROTOCOL, SCREEN_PROTOCOL, Evaluator, final_stage
    from remote.tuning.tuner.timing import Timer

    smoke = args.smoke
    model = (["--model-config", str(MODEL)] if not smoke else ["--shape", "E=8,N=64,hidden=128,topk=2"])
    shape = dict(E=8, N=64, hidden=128, topk=2) if smoke else dict(E=128, N=768, hidden=2048, topk=8)
    dtype = "float16" if smoke else "bfloat16"
    Ms = [int(x) for x in args.exhaustive_batch_sizes.split(",")]
    fr = run_tune(args, ctx, "fast_for_exhaustive", ["--provider", "sglang", "--space", "smoke" if smoke else "fast",
                                                     "--batch-sizes", ",".join(map(str, Ms))] + model,
                  timeout=left(args) - 20, gpus=None if smoke else "0")
    fast = (fr.get("report") or {}).get("batch_sizes", {})
    # the compile workers this process spawns import SGLang too: give them the stand-ins
    for k in ("PYTHONPATH", "ORCH_STANDINS_REPO", "ORCH_STANDINS_SGLANG"):
        if k in ctx["env"]:
            os.environ[k] = ctx["env"][k]
    prov = provider()
    dev = "cpu" if smoke or not torch.cuda.is_available() else "cuda:0"
    cpu = dev == "cpu"
    timer = Timer(dev)
    compiler = None if cpu else make_compiler(prov, {"shape": shape, "dtype": dtype, "quant": None}, dev)
    smem = smem_limit(dev)
    space = sp.smoke_space() if smoke else sp.prune(sp.full_space(), smem, 2)[0]
    per_m_s = 1e9 if smoke else args.exhaustive_s
    rows = []
    try:
        for M in Ms:
            if not smoke and left(args) < per_m_s + 40:
                say(f"  skip exhaustive at M={M}: {left(args):.0f} s left, needs ~{per_m_s + 40:.0f} s")
                continue
            p = prov.make_problem(shape, M, dtype, dev, 1000 + M)
            ev = Evaluator(prov, p, timer, compiler, cpu=cpu)
            if not cpu:
                timer.warm_up(prov.full_fn(p, None, None))
            fpick = fast.get(str(M))
            rng = random.Random(M)
            cands = {}
            for kind in ev.kinds:
                cs = list(space) + ([sp.with_tma(c, True) for c in space] if kind in ev.tma_kinds else [])
                rng.shuffle(cs)
                own = fpick.get("up" if kind == "joint" else kind) if fpick else None
                cands[kind] = ([own] if own else []) + cs
            t0, gpu0, c0 = time.time(), timer.stats.seconds, (compiler.stats() if compiler else {})
            screened = {k: {} for k in ev.kinds}
            pos = {k: 0 for k in ev.kinds}
            chunk = 2 if smoke else 160
            for kind in ev.kinds:
                ev.prefetch(kind, cands[kind][:chunk])
            while time.time() - t0 < per_m_s and any(pos[k] < len(cands[k]) for k in ev.kinds):
                for kind in ev.kinds:  # the GEMMs alternate, so a cut leaves both sampled alike
                    part = cands[kind][pos[kind]: pos[kind] + chunk]
                    pos[kind] += len(part)
                    ev.prefetch(kind, cands[kind][pos[kind]: pos[kind] + chunk])  # the workers stay a chunk ahead
                    if part:
                        screened[kind].update(ev.measure(kind, part, SCREEN_PROTOCOL))
            screen_s = time.time() - t0
            final = {}
            for kind in ev.kinds:
                t = screened[kind]
                top = []
                for bm in sorted({k[0] for k in t}):
                    top += sorted((k for k in t if k[0] == bm), key=t.get)[:6]
                final[kind] = ev.measure(kind, [sp.from_key(k) for k in top], FULL_PROTOCOL)
            bm, picks, _ts, whole, fin = final_stage(ev, final, None)
            full_gpu = timer.stats.seconds - gpu0
            full_wall = time.time() - t0
            if "joint" in picks:
                up = down = sp.from_key(picks["joint"])
            else:
                up, down = sp.from_key(picks["up"]), sp.from_key(picks["down"])
            variants = {"exhaustive": (up, down), "default": (None, None)}
            if fpick:
                variants["fast"] = (fpick["up"], dict(fpick["down"], BLOCK_SIZE_M=fpick["up"]["BLOCK_SIZE_M"]))
            times = compare(prov, p, timer, variants, cpu, rounds=7)
            cst = compiler.stats() if compiler else {}
            row = {"M": M, "exhaustive_us": times.get("exhaustive"), "fast_us": times.get("fast"),
                   "default_us": times.get("default"),
                   "fast_distance": (round(times["fast"] / times["exhaustive"] - 1, 4)
                                     if times.get("fast") and times.get("exhaustive") else None),
                   "candidates": {k: len(v) for k, v in cands.items()},
                   "screened": {k: min(pos[k], len(cands[k])) for k, v in cands.items()},
                   "timed_ok": {k: len(v) for k, v in screened.items()},
                   "bound_s": per_m_s, "screen_s": round(screen_s, 1), "exhaustive_wall_s": round(full_wall, 1),
                   "exhaustive_gpu_s": round(full_gpu, 2),
                   "fast_gpu_s": fpick.get("search_gpu_s") if fpick else None,
                   "fast_wall_s": fpick.get("search_wall_s") if fpick else None,
                   "compile_requests": (cst.get("sent", 0) - c0.get("sent", 0)) if cst else None,
                   "exhaustive_up": up, "exhaustive_down": down,
                   "fast_up": fpick.get("up") if fpick else None, "fast_down": fpick.get("down") if fpick else None}
            row["fast_gpu_share"] = (round(row["fast_gpu_s"] / full_gpu, 4) if row["fast_gpu_s"] and full_gpu
                                     else None)
            rows.append(row)
            cut = any(row["screened"][k] < row["candidates"][k] for k in row["candidates"])
            say(f"  M={M}: exhaustive {row['exhaustive_us']} us ({_label(up)} | {_label(down)}), fast "
                f"{row['fast_us']} us, default {row['default_us']} us; fast distance {row['fast_distance']}, "
                f"GPU share {row['fast_gpu_share']} (fast {row['fast_gpu_s']} s, exhaustive "
                f"{row['exhaustive_gpu_s']} s timer, {row['exhaustive_wall_s']} s wall); "
                f"screened {row['screened']} of {row['candidates']}"
                f"{' (CUT by the time bound)' if cut else ''}")
            res["exhaustive"] = {"rows": rows, "fast_tune": {k: v for k, v in fr.items() if k != "report"}}
    finally:
        if compiler:
            res.setdefault("exhaustive", {})["compile"] = compiler.stats()
            compiler.close()
        prov.close()
    res.setdefault("exhaustive", {})["rows"] = rows
    ok = [r["M"] for r in rows if r["fast_distance"] is not None and r["fast_distance"] <= 0.01]
    share = [r["M"] for r in rows if r["fast_gpu_share"] is not None and r["fast_gpu_share"] <= 0.10]
    say(f"  targets: fast within 1% of the bounded exhaustive search at {len(ok)}/{len(rows)} M; fast's GPU time "
        f"<= 10% of it at {len(share)}/{len(rows)} M")
# ----------------------------------------------------------------------------- quantized formats

#: the quantized shapes of section ``quant``: (name, model config, server flags, what it is)
QUANT_SHAPES = (
    ("int4_w4a16", ROOT / "tests" / "data" / "models" / "quantized" / "Qwen3-30B-A3B-GPTQ-Int4.json",
     ["--tp", "1", "--quantization", "moe_wna16"],
     "Qwen3-30B-A3B-GPTQ-Int4 at TP1 served with --quantization moe_wna16 (E=128, N=768 -> file N 384, hidden 2048, "
     "top-k 8, group 128, no zero points)"),
    ("int8_w8a8", ROOT / "tests" / "data" / "models" / "DeepSeek-V3.json",
     ["--tp", "8", "--quantization", "w8a8_int8"],
     "DeepSeek-R1-Channel-INT8 (DeepSeek-V3 architecture) at TP8 served with --quantization w8a8_int8 (E=256+1 "
     "fused shared, N=256, hidden 7168, top-k 8, per-channel int8, per-token int8 activations)"),
)


def _smoke_quant_configs(root: Path) -> tuple:
    """Tiny Qwen3-MoE configs for ``--smoke`` (same chain: model config -> shape -> tune -> compare)."""
    base = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "moe_intermediate_size": 128,
            "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2, "torch_dtype": "bfloat16"}
    root.mkdir(parents=True, exist_ok=True)
    gptq = dict(base, quantization_config={"bits": 4, "group_size": 64, "desc_act": False, "sym": True,
                                           "quant_method": "gptq"})
    (root / "tiny-gptq.json").write_text(json.dumps(gptq))
    (root / "tiny.json").write_text(json.dumps(base))
    return (("int4_w4a16", root / "tiny-gptq.json", ["--quantization", "moe_wna16"], "tiny GPTQ int4 (smoke)"),
            ("int8_w8a8", root / "tiny.json", ["--quantization", "w8a8_int8"], "tiny w8a8_int8 (smoke)"))


def _quant_shape(path: Path, flags: list) -> tuple:
    """``(shape, naming, quant, kernel block_shape)`` the tune command resolves for this model."""
    from remote.engines.sglang.model_flags import load_model_config
    from remote.engines.sglang.shape import moe_shape
    from remote.tuning.support import quant_entry

    tp = int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1
    q = flags[flags.index("--quantization") + 1]
    ms = moe_shape(load_model_config(str(path)), tp=tp, quantization=q)
    naming = dict(dtype_selector=ms.dtype_selector, block_shape=ms.block_shape, per_channel_quant=ms.per_channel_quant,
                  weight_dtype=ms.weight_dtype, group_size=ms.group_size, has_zp=ms.has_zp)
    quant = quant_entry(naming)
    kblock = [0, ms.group_size] if ms.group_size else ms.block_shape
    return dict(E=ms.E, N=ms.N, hidden=ms.hidden, topk=ms.topk), naming, quant, kblock


def check_sets(shape: dict, dtype: str, quant, batch_sizes: list, sets: dict) -> dict:
    """Per batch size and config set, the relative error of SGLang's ``fused_experts`` reading that
    set's files against the float64 reference on the same quantized numbers
    (:func:`remote.tuning.kernel.formats.reference`): ``{M: {set: err}}``."""
    import torch

    from remote.tuning.kernel import formats
    from remote.tuning.kernel.reference import relative_error
    prov = provider()
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    out, weights = {}, None
    try:
        for M in batch_sizes:
            p = prov.make_problem(shape, M, dtype, dev, 2000 + M, weights, quant=quant)
            weights = p.weights
            ref = formats.reference(p.x, p.w1, p.w2, p.quant, p.topk_weights, p.topk_ids,
                                    scales=(p.w1_scale, p.w2_scale), zps=(p.w1_zp, p.w2_zp))
            out[M] = {}
            for name, d in sets.items():
                try:
                    out[M][name] = relative_error(prov.dir_fn(p, str(d))(), ref)
                except Exception as exc:
                    out[M][name] = None
                    say(f"  check M={M} {name}: {type(exc).__name__}: {str(exc)[:200]}")
            del ref
    finally:
        prov.close()
    return out


def section_quant(res, args, ctx):
    """One int4_w4a16 and one int8_w8a8 shape of real models (:data:`QUANT_SHAPES`): per shape a fast
    sglang-provider tune of ``--quant-batch-sizes``, then per batch size SGLang's default config,
    the shipped file (where SGLang ships one for this GPU) and the tuned files side by side on
    SGLang's kernel (as ``compare``), with every set's correctness against the float64 reference on
    the same quantized numbers. On a machine with two GPUs the shapes run at once, each in a child
    process of this script (``--quant-only NAME``) on its own GPU (SGLang's config lookup reads one
    process-wide ``SGLANG_MOE_CONFIG_DIR``, so two shapes cannot be compared in one process)."""
    import torch

    shapes = _smoke_quant_configs(Path(args.out) / "smoke_models") if args.smoke else QUANT_SHAPES
    if args.quant_only:
        shapes = tuple(s for s in shapes if s[0] == args.quant_only)
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpu >= 2 and len(shapes) >= 2:
        procs = []
        for i, (name, *_rest) in enumerate(shapes):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--sections", "quant", "--quant-only", name,
                   "--out", str(Path(args.out) / f"quant_{name}"), "--budget-s", str(int(left(args) - 20)),
                   "--quant-batch-sizes", args.quant_batch_sizes, "--sglang-dir", str(ctx["tree"])]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % n_gpu))
            say(f"\nQUANT {name} on GPU {i % n_gpu}: {' '.join(cmd)}")
            procs.append((name, subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)))
        out = {}
        for name, p in procs:
            try:
                text, _ = p.communicate(timeout=max(10, left(args) - 5))
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            say(f"\n===== QUANT {name} (child rc {p.returncode}) =====\n" + "\n".join(
                ln for ln in (text or "").splitlines() if "Warning" not in ln and "warnings.warn" not in ln)[-12000:])
            jp = Path(args.out) / f"quant_{name}" / "sglang_kernel_h200.json"
            child = json.loads(jp.read_text()) if jp.exists() else {}
            out[name] = (child.get("quant") or {}).get(name) or {"error": f"child rc {p.returncode}",
                                                                  "errors": child.get("errors")}
            res["quant"] = out
        res["quant"] = out
        return
    out = {}
    for i, shp in enumerate(shapes):
        # the compare of this shape, and what the later shapes need
        reserve = args.quant_reserve_s * (len(shapes) - i)
        if not args.smoke and left(args) < reserve + args.quant_min_tune_s:
            say(f"  skip quant {shp[0]}: {left(args):.0f} s left")
            continue
        out[shp[0]] = _quant_one(args, ctx, shp, tune_timeout=left(args) - reserve if not args.smoke else 86400)
        res["quant"] = out
    res["quant"] = out


def _partial_files(tune_out: Path, root: Path, names: dict):
    """Up/down files of the batch sizes a stopped tune finished (its ``checkpoint.json``, as the tune
    command writes them at the end: the down config on the up config's BLOCK_SIZE_M), or None."""
    from remote.engines.triton_moe.configfile import dumps_config
    cp = tune_out / "checkpoint.json"
    try:
        done = json.loads(cp.read_text()).get("results") or {}
    except (OSError, ValueError):
        return None
    if not done:
        return None
    Ms = sorted(int(k) for k in done)
    up = {str(M): done[str(M)]["up"] for M in Ms}
    down = {str(M): dict(done[str(M)]["down"], BLOCK_SIZE_M=done[str(M)]["up"]["BLOCK_SIZE_M"]) for M in Ms}
    d = root / "partial"
    d.mkdir(parents=True, exist_ok=True)
    (d / names["up"]).write_text(dumps_config(up))
    (d / names["down"]).write_text(dumps_config(down))
    return {"up": str(d / names["up"]), "down": str(d / names["down"])}, Ms


def _quant_one(args, ctx, shp, tune_timeout: float) -> dict:
    """Tune one quantized shape with the sglang provider, then time and check default / shipped /
    tuned on SGLang's kernel; prints the table, returns the section's JSON entry."""
    from remote.engines.sglang.provider import load_kernel
    from remote.tuning.tuner.driver import REL_ERR_BAR
    name, path, flags, what = shp
    k = load_kernel()
    Ms = [int(x) for x in args.quant_batch_sizes.split(",")]
    shape, naming, quant, kblock = _quant_shape(path, flags)
    r = run_tune(args, ctx, f"tune_quant_{name}",
                 ["--provider", "sglang", "--space", "smoke" if args.smoke else "fast",
                  "--batch-sizes", ",".join(map(str, Ms)), "--model-config", str(path)] + flags,
                 # a --quant-only child already sees only its own GPU (CUDA_VISIBLE_DEVICES from the parent)
                 timeout=tune_timeout, gpus=None if (args.smoke or args.quant_only) else "0")
    sel, pc = naming["dtype_selector"], bool(naming["per_channel_quant"])
    names = k.file_names(shape["E"], shape["N"], sel, kblock, pc)
    shipped = _shape_files(ctx["tree"], names)
    root = Path(tempfile.mkdtemp(prefix=f"orch-bench-quant-{name}-"))
    sets = {"default": _config_dir(root, "default", None, None, names)}
    for d in ("triton_3_6_0",) + tuple(x for x in sorted(shipped) if x != "triton_3_6_0")[:1]:
        if d in shipped:
            sets[f"ship_{d[len('triton_'):]}"] = _config_dir(root, d, shipped[d]["up"], shipped[d]["down"], names)
    if not r.get("files"):
        # the tune ran out of time: its checkpoint holds the finished batch sizes; time those
        part = _partial_files(Path(args.out) / f"tune_quant_{name}", root, names)
        if part:
            r["files"], r["partial_batch_sizes"] = part
            Ms = [M for M in Ms if M in r["partial_batch_sizes"]]
            say(f"  tune unfinished: comparing the {len(Ms)} batch sizes its checkpoint holds: {Ms}")
    if r.get("files"):
        sets["sglang_tuned"] = _config_dir(root, "tuned", Path(r["files"]["up"]), Path(r["files"]["down"]), names)
    say(f"\nQUANT {name}: {what}\n  files {names['up']} (+ _down); SGLang ships this name for this GPU in "
        f"{sorted(shipped) or 'no folder'}; tune {r['wall_s']} s wall, rc {r['rc']}")
    if r.get("report"):
        _print_tune(r["report"])
        _print_split(f"tune {name}", r["report"], r["wall_s"])
    dtype = "float16" if args.smoke else "bfloat16"
    Mc = list(Ms)
    est = 3.0 * len(Mc) * len(sets) + 2.0 * len(Mc)
    if not args.smoke and left(args) < est:
        keep = max(1, int(len(Mc) * max(0.0, left(args) - 10) / est))
        say(f"  budget: timing {keep} of {len(Mc)} batch sizes ({left(args):.0f} s left)")
        Mc = Mc[::max(1, len(Mc) // keep)][:keep]
    rows = compare_sets(args, shape, dtype, quant, Mc, sets, rounds=5) if Mc else []
    errs = check_sets(shape, dtype, quant, Mc, sets) if Mc else {}
    shutil.rmtree(root, ignore_errors=True)
    ship = next((s for s in sets if s.startswith("ship_")), None)
    tuned_rel = {M: v.get("rel_err") for M, v in ((r.get("report") or {}).get("batch_sizes") or {}).items()}
    nan = float("nan")
    say(f"\nQUANT {name} (us, SGLang's fused_experts; ratios > 1 = tuned faster; err = relative error vs the "
        f"float64 reference, bar {REL_ERR_BAR:g}; tune err = the tuner's own check)")
    say(f"  {'M':>5} {'default':>10} {'shipped':>10} {'tuned':>10} {'def/tun':>8} {'shp/tun':>8} "
        f"{'err def':>9} {'err tun':>9} {'tune err':>9}")
    for row in rows:
        M = row["M"]
        de, sh, tu = row.get("default"), (row.get(ship) if ship else None), row.get("sglang_tuned")
        e = row["errors"] = errs.get(M, {})
        row["tune_rel_err"] = tuned_rel.get(str(M))
        say(f"  {M:>5} {de or 0:10.1f} {sh or 0:10.1f} {tu or 0:10.1f} {_ratio(de, tu) or 0:8.3f} "
            f"{_ratio(sh, tu) or 0:8.3f} {nan if e.get('default') is None else e['default']:9.2e} "
            f"{nan if e.get('sglang_tuned') is None else e['sglang_tuned']:9.2e} "
            f"{nan if row['tune_rel_err'] is None else row['tune_rel_err']:9.2e}")
    timed = [x for x in rows if x.get("sglang_tuned") and x.get("default")]
    ge_def = [x["M"] for x in timed if x["default"] / x["sglang_tuned"] >= 0.995]
    ge_ship = [x["M"] for x in timed if ship and x.get(ship) and x[ship] / x["sglang_tuned"] >= 0.995]
    ok = [x["M"] for x in rows if x["errors"].get("sglang_tuned") is not None
          and x["errors"]["sglang_tuned"] < REL_ERR_BAR]
    say(f"  targets: tuned >= default (0.5% noise) at {len(ge_def)}/{len(timed)} M; "
        + (f">= shipped at {len(ge_ship)}/{len(timed)} M; " if ship else "no shipped file for this GPU; ")
        + f"tuned files pass the {REL_ERR_BAR:g} bar at {len(ok)}/{len(rows)} M")
    return {"what": what, "model_config": str(path), "flags": flags, "shape": shape, "naming": naming,
            "quant": quant, "file_names": names, "shipped_folders": sorted(shipped), "sets": sorted(sets),
            "tune": r, "rows": rows, "targets": {"ge_default": ge_def, "ge_shipped": ge_ship if ship else None,
                                                   "pass_bar": ok}}


# ----------------------------------------------------------------------------- main


SECTIONS = {"env": section_env, "fp8check": section_fp8check, "tune": section_tune, "tune2": section_tune2,
            "compare": section_compare,
            "full": section_full, "fp8shape": section_fp8shape, "quant": section_quant}
SECTIONS.update(split=section_split, exhaustive=section_exhaustive)  # issue 20: compile off the GPU, fast vs exhaustive


def section_prepared(res, args, ctx):
    """Issue 30 item 1: the 18-batch-size sglang-provider fast tune split into the prepare step (what
    runs before the unit stops: ``python -m remote prepare``, no CUDA context, niced, ``--prepare-workers``
    CPU processes, at most ``--prepare-s`` seconds of compiling; the GPU target from nvidia-smi) and
    the GPU phase (``python -m remote tune --prepared``: what runs while the unit is down), in fresh
    processes, the same work folder. The GPU phase's call wall is the tune step's share of the
    unit's downtime. Run ``compare`` after it: its picks (``sglang_tuned``) beside the one-phase
    tune's given with ``--tuned sglang_old:UP:DOWN``."""
    model = (["--model-config", str(MODEL)] if not args.smoke else ["--shape", "E=8,N=64,hidden=128,topk=2"])
    space = "smoke" if args.smoke else "fast"
    name = f"tune_sglang_{space}_prepared"
    out = Path(args.out) / name
    cmd = [sys.executable, "-m", "remote", "prepare", "--out", str(out), "--seed", "0", "--provider", "sglang",
           "--space", space, "--batch-sizes", args.batch_sizes, "--smem-limit", "232448",
           "--workers", str(args.prepare_workers), "--nice", "10", "--max-seconds", str(args.prepare_s)] + model
    if args.smoke:
        cmd += ["--capability", "9.0", "--device-name", "NVIDIA H200"]
    say(f"\nPREPARE (before the stop): {' '.join(cmd)}")
    t0 = time.time()
    # no GPU for it from its first instruction, as on a host whose server holds the GPU (the payload
    # hides it itself too; here the stand-ins' sitecustomize runs before the payload's code)
    p = subprocess.run(cmd, cwd=str(ROOT), env=dict(ctx["env"], CUDA_VISIBLE_DEVICES=""), capture_output=True,
                       text=True, timeout=max(30.0, args.prepare_s + 120))
    wall = round(time.time() - t0, 1)
    final = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{") and '"proto"' in ln
             and json.loads(ln).get("type") in ("result", "error")]
    prep = (final[-1] if final else {"type": "error", "msg": f"rc {p.returncode}: {p.stderr[-1500:]}"})
    out_res = {"prepare_cmd": cmd, "prepare_wall_s": wall, "prepare": prep.get("data") or prep}
    d = prep.get("data") or {}
    say(f"  prepare: {wall} s wall, rc {p.returncode}; {d.get('kernels')} kernels compiled of {d.get('candidates')} "
        f"candidates ({d.get('failed')} failed) in {d.get('compile_s')} s on {d.get('workers')} workers, nice "
        f"{d.get('nice')}, cut by its budget: {d.get('cut')}; GPU target {d.get('gpu')}; CUDA {d.get('cuda')}")
    if prep.get("type") != "result":
        say(f"  prepare failed: {prep.get('msg')}")
    r = run_tune(args, ctx, name, ["--provider", "sglang", "--space", space, "--batch-sizes", args.batch_sizes,
                                   "--prepared", str(out / "prepared")] + model,
                 timeout=left(args) - 15, gpus="0" if not args.smoke else None)
    rep = r.get("report")
    if rep:
        _print_tune(rep)
        _print_split("GPU phase", rep, r["wall_s"])
        pu = rep.get("prepared") or {}
        say(f"  prepared folder: used {pu.get('used')}, {pu.get('kernels')} kernels, reason {pu.get('reason')}")
        res.setdefault("tune", {})["sglang"] = r
    out_res.update(gpu_phase_wall_s=r["wall_s"], tune_wall_s=(rep or {}).get("wall_s"),
                   time_split=(rep or {}).get("time_split"), compile=(rep or {}).get("compile"),
                   prepared_used=(rep or {}).get("prepared"), files=r.get("files"), rc=r["rc"])
    say(f"  downtime of the tune step (the GPU phase's call wall): {r['wall_s']:.1f} s; target <= 60 s: "
        f"{'met' if r['wall_s'] <= 60 else 'MISSED'}")
    res["prepared"] = out_res


SECTIONS.update(prepared=section_prepared)  # issue 30: compile before the stop, GPU timing after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help="SGLang wheel (e.g. sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl)")
    ap.add_argument("--sglang-dir", default="/tmp/orch-sglang", help="where the wheel is unpacked")
    ap.add_argument("--sections", default="env,fp8check,tune,compare")
    ap.add_argument("--batch-sizes", default=SGLANG_BATCH_SIZES)
    ap.add_argument("--full-batch-sizes", default="4096,64,512,1")
    ap.add_argument("--fp8-batch-sizes", default="1,16,64,256,1024,4096")
    ap.add_argument("--exhaustive-batch-sizes", default="1,64,512,4096")
    ap.add_argument("--exhaustive-s", type=float, default=75.0,
                    help="bound of the exhaustive section: seconds of screening (compile + timing) per batch size")
    ap.add_argument("--quant-batch-sizes", default=SGLANG_BATCH_SIZES, help="batch sizes of section quant")
    ap.add_argument("--quant-only", default=None, help="section quant: only this shape of QUANT_SHAPES (int4_w4a16 "
                    "or int8_w8a8; the 2-GPU run starts one child per shape with it)")
    ap.add_argument("--quant-reserve-s", type=float, default=150.0,
                    help="section quant: seconds kept per shape for its compare after the tune")
    ap.add_argument("--quant-min-tune-s", type=float, default=120.0,
                    help="section quant: a shape is skipped when less than this is left for its tune")
    ap.add_argument("--budget-s", type=float, default=530.0, help="wall-clock budget of this run")
    ap.add_argument("--split-only-new", action="store_true",
                    help="section split: run the new arm only (compare an old arm given with --tuned sglang_old:UP:DOWN)")
    ap.add_argument("--split-old", choices=("context-compile", "fixed-screen"), default="context-compile",
                    help="section split's old arm: the old compile path (--compile-mode context) or the old "
                         "screening protocol (--screen fixed, with the new compile path); the new arm is "
                         "--compile-mode auto --screen adaptive")
    ap.add_argument("--prepare-s", type=float, default=900.0, help="section prepared: the prepare's --max-seconds")
    ap.add_argument("--prepare-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="section prepared: the prepare's --workers (default: all cores but one: no server here)")
    ap.add_argument("--compare-sets", default=None,
                    help="section compare: only these sets (comma list of default, ship_*, sglang_tuned, ...)")
    ap.add_argument("--compare-rounds", type=int, default=5, help="section compare: interleaved rounds")
    ap.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_out"))
    ap.add_argument("--tuned", default=None, help="PROVIDER:UP:DOWN,... config files of an earlier tune to "
                    "compare instead of tuning again (e.g. sglang:bench/results/.../sglang_fast_up.json:...)")
    args = ap.parse_args()
    if args.smoke:
        args.batch_sizes = "1,40" if args.batch_sizes == SGLANG_BATCH_SIZES else args.batch_sizes
        args.full_batch_sizes = "4"
        args.fp8_batch_sizes = "3"
        args.exhaustive_batch_sizes = "4"
        args.quant_batch_sizes = "3,40" if args.quant_batch_sizes == SGLANG_BATCH_SIZES else args.quant_batch_sizes
        args.budget_s = 1e9
    Path(args.out).mkdir(parents=True, exist_ok=True)
    res = {"args": vars(args)}
    for item in (args.tuned or "").split(","):
        if item:
            prov_name, up, down = item.split(":")
            res.setdefault("tune", {})[prov_name] = {"files": {"up": up, "down": down}, "from": "earlier run"}
    ctx = setup(args)
    res["setup_s"] = round(time.time() - T0, 1)
    jpath = Path(args.out) / "sglang_kernel_h200.json"
    for s in args.sections.split(","):
        ts = time.time()
        try:
            SECTIONS[s](res, args, ctx)
        except Exception as exc:
            import traceback
            traceback.print_exc()
            res.setdefault("errors", {})[s] = f"{type(exc).__name__}: {exc}"
        res.setdefault("section_s", {})[s] = round(time.time() - ts, 1)
        say(f"[section {s}: {time.time() - ts:.0f} s; {time.time() - T0:.0f} s total]")
        jpath.write_text(json.dumps(res, indent=1, default=str))
    say(f"[total {time.time() - T0:.0f} s] -> {jpath}")


if __name__ == "__main__":
    main()
