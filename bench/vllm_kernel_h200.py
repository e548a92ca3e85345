#!/usr/bin/env python3
"""vLLM's own fused-MoE Triton kernel on the H200: vLLM's default config, vLLM's shipped H200 file
and orch's file, timed side by side on vLLM's kernel in one process; one script, one run.

vLLM is not installed on the H200 (and cannot be): the release's Python sources are carried in
(``--vllm-src``: a folder holding the ``vllm`` package, e.g. ``tests/vllm_releases.py``'s cache
entry) and ``tests/vllm_standins.py`` stands in for vLLM's package ``__init__`` files, its platform
detection and its compiled ops (alignment, gated activation, top-k sum, activation quantization);
vLLM's Triton GEMM, its launch code, its config lookup and its default config run for real. The
compute stand-ins cost the same for every config set: they shift absolute times, not the ranking.

For each shape: ``tune_on_device`` (the tuner's ``fast`` search, ``--provider vllm``: vLLM's
``fused_experts_impl`` with each candidate forced by vLLM's ``override_config``) at SGLang's 18
batch sizes, then per batch size vLLM's ``fused_experts_impl`` reading each config set from its
own ``VLLM_TUNED_CONFIG_FOLDER`` (default: vLLM's ``get_default_config`` written as a file;
shipped: the release's H200 file; orch: the tuned file), CUDA graph of 10 calls, L2 flushed,
median of 10 replays, 5 interleaved rounds, median.

Shapes: Qwen3-30B-A3B at TP1 (E=128, N=768, hidden 2048, top-k 8, bf16) and
Qwen3-30B-A3B-FP8 at TP1 (same, fp8_w8a8 block [128, 128]); vLLM 0.34.0 ships an H200 file for both.

H200:      python3 bench/vllm_kernel_h200.py --vllm-src DIR [--budget-s 420]   (DIR: a folder named after the
           release, holding its ``vllm`` package; the release must require the installed Triton:
           vLLM 0.26.0 on the H200's Triton 3.6.0, tests/vllm_releases.py H200_RELEASE)
CPU check: python3 bench/vllm_kernel_h200.py --smoke   (TRITON_INTERPRET=1, tiny shapes, vLLM from
           the test cache; numbers meaningless)
Output: ``vllm_kernel_h200.json`` under ``$OUT`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BATCH_SIZES = "1,2,4,8,16,24,32,48,64,96,128,256,512,1024,1536,2048,3072,4096"
SHAPES = {"bf16": (dict(E=128, N=768, hidden=2048, topk=8), None),
          "fp8_block": (dict(E=128, N=768, hidden=2048, topk=8),
                        dict(dtype="fp8_w8a8", block_shape=[128, 128], per_channel=False, group_size=0,
                             has_zp=False))}
SMOKE_SHAPE = dict(E=8, N=128, hidden=128, topk=2)
T0 = time.time()


def say(*a):
    print(*a, flush=True)


def setup(args) -> dict:
    """Install the stand-ins (this process and the tuner's compile workers); returns what stood in."""
    from tests import vllm_standins as vs

    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        from tests.vllm_releases import NEWEST, source_tree
        src = Path(args.vllm_src) if args.vllm_src else source_tree(NEWEST)
    else:
        src = Path(args.vllm_src)
        check_triton(src, args.allow_triton_mismatch)
    os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/orch-triton-cache")
    site = Path(args.out) / "standin_site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os, sys\nsys.path.insert(0, os.environ['ORCH_STANDINS_REPO'])\n"
        "from tests.vllm_standins import fused_moe_module\nfused_moe_module(os.environ['ORCH_STANDINS_VLLM'])\n")
    os.environ["ORCH_STANDINS_REPO"], os.environ["ORCH_STANDINS_VLLM"] = str(ROOT), str(src)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    info = vs.install(src)
    vs.fused_moe_module(src)
    # the carried tree has no compiled ops (vllm/_C*.so): the stand-ins above take their place, so the
    # engine's on-disk check of them (VllmEngine.provider_missing) is answered for this process
    from remote.engines.vllm.engine import ENGINE
    ENGINE.provider_missing = lambda: None
    return {"src": str(src), "standins": info}


def check_triton(src: Path, allow: bool) -> None:
    """Refuse (exit 2) a vLLM release whose required Triton is not this machine's, unless ``allow``:
    vLLM 0.32.0+ need Triton 3.7.1/3.8 and fail on 3.6.0 with ``PassManager::run failed`` from
    M = 8 on (docs/benchmarks.md 4.6); :data:`tests.vllm_releases.H200_RELEASE` matches the H200."""
    import triton

    from tests.vllm_releases import H200_RELEASE, required_triton, triton_matches
    release = src.name if src.name[:1].isdigit() else None
    if release is None:
        from tests.vllm_standins import _version
        release = _version(src)
    want = required_triton(release)
    ok = triton_matches(release, triton.__version__)
    say(f"vLLM {release} requires Triton {want or 'unknown'} (through its torch pin); installed "
        f"{triton.__version__}: {'ok' if ok else 'MISMATCH'}")
    if not ok and not allow:
        say(f"refusing: carry the sources of vLLM {H200_RELEASE} for Triton 3.6.0, or pass --allow-triton-mismatch")
        sys.exit(2)


def tune(shape: dict, quant, dtype: str, Ms: list, device: str, shipped: dict | None = None) -> dict:
    """The tuner's fast search on vLLM's kernel (``tune_on_device``); ``{M: result}``. ``shipped``:
    the entries of the file vLLM reads for this shape (``{M: config}``), the second opinion's
    baseline as ``orch tune`` gives it (remote.tuning.command: the file the lookup found)."""
    from remote.protocol import DEFAULT_TUNE_BUDGET_S
    from remote.tuning.tuner.driver import tune_on_device
    from remote.tuning.tuner.events import Done, Error, Fatal

    spec = dict(shape=shape, dtype=dtype, space="smoke" if device == "cpu" else "fast", provider="vllm", seed=0,
                dtype_selector=quant["dtype"] if quant else None,
                block_shape=quant["block_shape"] if quant else None, quant=quant,
                shipped={"up": shipped, "down": None} if shipped else None, check=True,
                compile_mode="auto", screen="adaptive",
                # orch tune's default GPU-timing budget per GPU (remote.tuning.command --budget)
                budget_s=None if device == "cpu" else DEFAULT_TUNE_BUDGET_S)
    out, errors = {}, {}

    def emit(ev):
        if isinstance(ev, Done):
            out[ev.batch_size] = ev.result
        elif isinstance(ev, (Error, Fatal)):
            errors[ev.batch_size] = ev.text[:400]
            say(f"  M={ev.batch_size}: {ev.text[:300]}")
    tune_on_device(spec, device, Ms, emit)
    return {"results": out, "errors": errors}


def compare(shape, quant, dtype, Ms, sets: dict, device: str, rounds: int) -> list:
    """Per M, vLLM's fused_experts_impl reading each set's folder; rows ``{"M", set: us}``."""
    from remote.engines.vllm.provider import VllmProvider
    from remote.tuning.tuner.timing import Timer

    prov = VllmProvider()
    timer = Timer(device)
    cpu = device == "cpu"
    proto = dict(n_calls=1, reps=1) if cpu else dict(n_calls=10, reps=10)
    rows, weights = [], None
    try:
        for M in Ms:
            p = prov.make_problem(shape, M, dtype, device, 1000 + M, weights, quant=quant)
            weights = p.weights
            fns, failed = {}, {}
            for name, folder in sets.items():
                fn = prov.dir_fn(p, folder)
                try:
                    fn()  # compile what this set launches at M (outside the timed rounds)
                    fns[name] = fn
                except Exception as exc:  # a config Triton cannot compile here: a row with its reason
                    failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"
            samples = {name: [] for name in fns}
            for _ in range(rounds):
                for name, fn in fns.items():
                    samples[name].append(timer.time(fn, **proto))
            rows.append({"M": M, **{n: round(statistics.median(v), 3) for n, v in samples.items()},
                         **({"failed": failed} if failed else {})})
            say("  " + "  ".join([f"M={M:<5}"] + [f"{n} {rows[-1][n]:9.2f}" for n in fns])
                + (f"  FAILED {failed}" if failed else ""))
    finally:
        prov.close()
    return rows


def compare_fresh(name, shape, quant, dtype, Ms, sets, device, rounds, args) -> list:
    """:func:`compare` in a child process of its own with an empty Triton cache, as a server starts:
    every config is compiled there by Triton's JIT on the launch, nothing reaches it from the tune's
    process or its compile workers."""
    job = Path(args.out) / f"compare_{name}.json"
    job.write_text(json.dumps(dict(shape=shape, quant=quant, dtype=dtype, Ms=Ms, sets=sets, device=device,
                                   rounds=rounds)))
    cache = Path(args.out) / f"triton_cache_compare_{name}"
    shutil.rmtree(cache, ignore_errors=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--compare-job", str(job), "--out", args.out]
    cmd += (["--smoke"] if args.smoke else []) + (["--vllm-src", args.vllm_src] if args.vllm_src else [])
    say(f"  compare in a fresh process (Triton cache {cache})")
    # the child installs the stand-ins itself (setup); the stand-in site on PYTHONPATH is for compile workers
    site = str(Path(args.out) / "standin_site")
    path = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site)
    subprocess.run(cmd, env=dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONPATH=path), check=False)
    out = job.with_suffix(".rows.json")
    return json.loads(out.read_text()) if out.is_file() else []


def run_compare_job(path: str) -> int:
    """The child of :func:`compare_fresh`: runs :func:`compare` and writes its rows beside the job."""
    job = json.loads(Path(path).read_text())
    rows = compare(job["shape"], job["quant"], job["dtype"], job["Ms"], job["sets"], job["device"], job["rounds"])
    Path(path).with_suffix(".rows.json").write_text(json.dumps(rows))
    return 0


def probe_compile(args, ctx, res) -> None:
    """Whether vLLM's own configs compile in a fresh process (``--probe-compile``): for the bf16 shape,
    vLLM's default config and its shipped file at each of ``--probe-ms`` (one launch each, in this
    order), then once more the first of them that compiled, which shows whether an earlier failed
    compile leaves this process unable to compile a config it compiled before."""
    import torch  # noqa: F401 (CUDA context first, as a server)

    from remote.engines.vllm.lookup import dumps
    from remote.engines.vllm.provider import VllmProvider

    shape, quant = SHAPES["bf16"]
    device = "cpu" if args.smoke else "cuda:0"
    dtype = "float16" if args.smoke else "bfloat16"
    if args.smoke:
        shape = SMOKE_SHAPE
    Ms = [int(x) for x in args.probe_ms.split(",")]
    prov = VllmProvider()
    p0 = prov.make_problem(shape, 1, dtype, device, 0)
    fname = prov.file_name(p0, "NVIDIA H200")
    root = Path(args.out) / "probe_sets"
    shutil.rmtree(root, ignore_errors=True)
    sets = {}
    for set_name in ("default", "shipped"):
        d = root / set_name
        d.mkdir(parents=True)
        if set_name == "default":
            (d / fname).write_text(dumps({str(M): prov.default_config(prov.make_problem(shape, M, dtype, device, 0,
                                                                                       p0.weights)) for M in Ms}))
        else:
            shipped = Path(ctx["src"]) / "vllm/model_executor/layers/fused_moe/configs" / fname
            if not shipped.is_file():
                continue
            shutil.copyfile(shipped, d / fname)
        sets[set_name] = str(d)
    rows, first_ok = [], None
    for M in Ms:
        p = prov.make_problem(shape, M, dtype, device, 7, p0.weights)
        for set_name, folder in sets.items():
            try:
                prov.dir_fn(p, folder)()
                rows.append({"M": M, "set": set_name, "ok": True})
                first_ok = first_ok or (M, set_name)
            except Exception as exc:  # noqa: BLE001 - the row records it
                rows.append({"M": M, "set": set_name, "ok": False,
                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"})
            say(f"  probe M={M:<5} {set_name:8s} {'ok' if rows[-1]['ok'] else rows[-1]['error']}")
    again = None
    if first_ok and any(not r["ok"] for r in rows):
        # the same config again, at another M of the same kernel specialisation is not enough: clear
        # Triton's in-memory kernel cache so the launch compiles once more
        M, set_name = first_ok
        fm = prov.k.fm
        for obj in vars(fm).values():
            cache = getattr(obj, "device_caches", None)
            if isinstance(cache, dict):
                cache.clear()
        try:
            prov.dir_fn(prov.make_problem(shape, M, dtype, device, 8, p0.weights), sets[set_name])()
            again = {"M": M, "set": set_name, "ok": True}
        except Exception as exc:  # noqa: BLE001
            again = {"M": M, "set": set_name, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        say(f"  again after the failures: M={M} {set_name}: {again}")
    prov.close()
    res["probe_compile"] = {"rows": rows, "again": again}


def run_shape(name, args, ctx, res):
    import torch

    from remote.engines.vllm.lookup import dumps
    from remote.engines.vllm.provider import VllmProvider

    shape, quant = SHAPES[name]
    if args.smoke:
        shape = SMOKE_SHAPE
    device = "cpu" if args.smoke else "cuda:0"
    dtype = "float16" if args.smoke else "bfloat16"
    Ms = [int(x) for x in (args.smoke_batch_sizes if args.smoke else args.batch_sizes).split(",")]
    prov = VllmProvider()
    probe = prov.make_problem(shape, 1, dtype, device, 0, quant=quant)
    gpu_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "NVIDIA H200"
    fname = prov.file_name(probe, gpu_name)
    assert fname == prov.k.fm.get_config_file_name(
        probe.E, probe.N, probe.dtype_sel, probe.block_shape), "orch's file name differs from vLLM's"
    shipped = Path(ctx["src"]) / "vllm/model_executor/layers/fused_moe/configs" / fname
    say(f"\n== {name}: {json.dumps(shape)} quant={quant and quant['block_shape']} file {fname} "
        f"(vLLM ships it: {shipped.is_file()})")
    t = time.time()
    tuned = tune(shape, quant, dtype, Ms, device, json.loads(shipped.read_text()) if shipped.is_file() else None)
    tune_s = round(time.time() - t, 1)
    say(f"  tune: {tune_s} s, {len(tuned['results'])} of {len(Ms)} batch sizes")
    root = Path(args.out) / f"sets_{name}"
    shutil.rmtree(root, ignore_errors=True)
    sets = {}
    for set_name in ("default", "shipped", "orch"):
        d = root / set_name
        d.mkdir(parents=True)
        if set_name == "default":
            cfg = {str(M): prov.default_config(prov.make_problem(shape, M, dtype, device, 0, probe.weights,
                                                                 quant=quant)) for M in Ms}
        elif set_name == "shipped":
            if not shipped.is_file():
                continue
            shutil.copyfile(shipped, d / fname)
            sets[set_name] = str(d)
            continue
        else:
            if not tuned["results"]:
                continue
            cfg = {str(M): r["up"] for M, r in tuned["results"].items()}
        (d / fname).write_text(dumps(cfg))
        sets[set_name] = str(d)
    prov.close()
    cmp_Ms = [M for M in Ms if M in tuned["results"]] or Ms
    if args.fresh_compare:
        rows = compare_fresh(name, shape, quant, dtype, cmp_Ms, sets, device, 1 if args.smoke else 5, args)
    else:
        rows = compare(shape, quant, dtype, cmp_Ms, sets, device, 1 if args.smoke else 5)
    verdict = []
    for r in rows:
        o = r.get("orch")
        if o is None:
            if "orch" in r.get("failed", {}):
                verdict.append(f"M={r['M']}: orch's config did not compile: {r['failed']['orch']}")
            continue
        for base in ("shipped", "default"):
            if base in r and o > r[base] * 1.005:
                verdict.append(f"M={r['M']}: orch {o:.2f} us > {base} {r[base]:.2f} us (+{(o / r[base] - 1) * 100:.1f}%)")
    res[name] = {"shape": shape, "quant": quant, "file": fname, "shipped_exists": shipped.is_file(), "tune_s": tune_s,
                 "errors": tuned["errors"], "rows": rows, "misses": verdict,
                 "orch_file": {str(M): r["up"] for M, r in tuned["results"].items()}}
    say(f"  misses (orch slower than shipped/default by more than 0.5%): {verdict or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-src", help="folder holding the vllm package (the release's Python sources)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/vllm_kernel_h200"))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shapes", default="bf16,fp8_block")
    ap.add_argument("--batch-sizes", default=BATCH_SIZES)
    ap.add_argument("--smoke-batch-sizes", default="1,16")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--allow-triton-mismatch", action="store_true",
                    help="run a release whose required Triton is not the installed one")
    ap.add_argument("--fresh-compare", action="store_true",
                    help="time the sets in a fresh process with an empty Triton cache (as a server compiles them)")
    ap.add_argument("--compare-job", help=argparse.SUPPRESS)
    ap.add_argument("--probe-compile", action="store_true",
                    help="only: do vLLM's default and shipped bf16 configs compile here, at --probe-ms")
    ap.add_argument("--probe-ms", default="8,256,512,1024,2048,4096")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    ctx = setup(args)
    if args.compare_job:
        return run_compare_job(args.compare_job)
    import torch
    import triton
    res = {"env": {"torch": torch.__version__, "triton": triton.__version__,
                   "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                   "vllm": ctx["standins"]["release"], "standins": ctx["standins"]}}
    say("ENV", json.dumps(res["env"]))
    if args.probe_compile:
        probe_compile(args, ctx, res)
        (Path(args.out) / "vllm_kernel_h200.json").write_text(json.dumps(res, indent=1, default=str))
        return 0
    for name in args.shapes.split(","):
        if time.time() - T0 > args.budget_s * 0.5 and not args.smoke:
            say(f"skip {name}: budget")
            continue
        run_shape(name, args, ctx, res)
        (Path(args.out) / "vllm_kernel_h200.json").write_text(json.dumps(res, indent=1, default=str))
    say(f"total {time.time() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
