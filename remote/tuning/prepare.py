"""Prepare a tune before the unit stops: compile its candidates for the GPU's target on the CPUs.

Usage (payload command, see docs/protocol.md and docs/tuning.md)::

    python -m remote prepare --out DIR [model flags as for tune] [--batch-sizes 1,2,...]
        [--space fast] [--provider auto] [--seed 0] [--shipped-config PATH]
        [--capability 9.0] [--device-name NAME] [--smem-limit BYTES]
        [--workers N] [--nice 10] [--max-seconds 900]

Runs while the server still serves, so it never opens a CUDA context: every GPU is hidden from it
(``CUDA_VISIBLE_DEVICES=""``, set before torch is imported) and from its compile workers. The GPU
it compiles for is ``--capability`` (the probe's, or the inventory's ``orch_gpu_capability``),
else ``nvidia-smi --query-gpu=compute_cap`` (NVML, no context). Triton's launch path and SGLang's
launch code are run on CPU tensors against a stand-in driver and device queries answering as that
GPU (:mod:`remote.tuning.tuner.offgpu`): the compile request each candidate's first launch will
make on the GPU is captured (:func:`remote.tuning.tuner.aot.capture`) and compiled by worker
processes (:func:`remote.tuning.tuner.aot.compile_specs`) into the prepared Triton cache.

CPU use is bounded: the process and its workers run at ``--nice`` (default 10: the server's
processes come first), ``--workers`` processes (default half the host's cores, at least 1), and
the compile stops at ``--max-seconds`` (what was compiled by then is kept; the rest compiles after
the stop, the manifest says ``stats.cut``). Which candidates: :func:`remote.tuning.tuner.prepared.plan`
(the ``fast`` search's first screen and its first refinement round, for every batch size; the
whole space for ``full``/``smoke``), first screens of every batch size first.

Output: ``<--out>/prepared/manifest.json`` and the Triton cache it names,
``<--out>/triton-cache/triton-cache-<tag>/`` (:mod:`remote.tuning.tuner.prepared`); ``tune --out DIR
--prepared DIR/prepared`` uses them. An earlier prepared folder and its cache are removed first.

Result ``data``::

    {"dir": path, "manifest": path, "gpu": {"capability", "device_name", "target", "source"},
     "kernels": compiled, "failed": n, "candidates": n, "compile_s": s, "seconds": s,
     "workers": n, "nice": n, "cut": bool, "interpret": bool, "nothing_compiled": reason | null,
     "cuda": {"visible": "", "initialized": false}, "triton_version": str, "engine": {...}}

Under ``TRITON_INTERPRET=1`` (test beds) nothing is compiled (the interpreter compiles nothing):
the candidates and the manifest are still written and ``nothing_compiled`` says why; likewise for
a provider that hands over no compile requests (the builtin kernel).

Errors: ``bad_input`` (flags, as tune), ``not_found`` (no compute capability: none given and
nvidia-smi names none; model config missing), ``runtime`` (the process initialised CUDA after all:
its result is refused).
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import json
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

from .. import PAYLOAD_VERSION
from ..engines import add_model_flags, engine_named
from ..host.fs import atomic_write
from ..protocol import DEFAULT_PROVIDER, DEFAULT_SEARCH_SPACE, PROVIDER_NAMES, SEARCH_SPACES, PayloadError, log, progress

#: default niceness of the prepare process and its workers (nice(1): 0 is the server's, 19 the least)
DEFAULT_NICE = 10
#: default time budget of the compile, seconds
DEFAULT_MAX_SECONDS = 900.0
#: the prepared folder inside the tune's work folder
FOLDER = "prepared"


def add_arguments(p) -> None:
    """Register the ``prepare`` flags: the tune's model flags and search flags, and the GPU target
    and CPU bounds."""
    add_model_flags(p, "tune")
    p.add_argument("--batch-sizes", default=None, help="batch sizes M, comma-separated (default: the engine's "
                                                       "tuning list, Engine.default_batch_sizes)")
    p.add_argument("--space", choices=SEARCH_SPACES, default=DEFAULT_SEARCH_SPACE)
    p.add_argument("--out", required=True, help="the tune's --out folder; the prepared folder is OUT/prepared")
    p.add_argument("--provider", choices=PROVIDER_NAMES, default=DEFAULT_PROVIDER)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shipped-config", default=None)
    p.add_argument("--capability", default=None, help="GPU 0's compute capability MAJOR.MINOR (else the GPU vendor's tool's)")
    p.add_argument("--smem-limit", type=int, default=None,
                   help="shared memory a block may use on the GPU, bytes (the probe's); unknown: not checked")
    p.add_argument("--workers", type=int, default=None, help="compile processes (default: half the cores)")
    p.add_argument("--nice", type=int, default=DEFAULT_NICE, help="niceness of the prepare and its workers")
    p.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                   help="stop compiling after this many seconds (the rest compiles after the stop)")
    # the tune's own flags the controller passes through (remote/tuning/command.py): what is timed and
    # for how long does not change the kernels compiled, so the prepare step takes them and ignores them
    p.add_argument("--budget", type=float, default=None, help="the tune's --budget (not used here)")
    p.add_argument("--routing-file", default=None, help="the tune's --routing-file (not used here)")
    p.add_argument("--routing-skew", type=float, default=None, help="the tune's --routing-skew (not used here)")
    p.add_argument("--smi", default=None, help="the GPU vendor's management tool to ask (default: the one on PATH)")


def default_workers(cores: int | None = None) -> int:
    """Half the host's cores, at least 1: the server keeps the other half while it serves."""
    return max(1, int(cores or os.cpu_count() or 2) // 2)


def _remove_earlier(folder: Path) -> None:
    """Remove an earlier prepared folder and the cache its manifest names (a run that ended before
    its tune took them)."""
    from .tuner import prepared
    try:
        old = json.loads((folder / prepared.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict):
        cache = prepared.cache_dir(folder, old)
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)


def _compile(spec):
    from .tuner.aot import compile_specs
    return compile_specs([spec])


def run(args) -> dict:
    """Run the ``prepare`` command (see the module docstring)."""
    from .tuner import offgpu
    offgpu.hide_gpus()  # first: nothing below may open a CUDA context
    t_start = time.time()
    now = os.nice(0)
    if args.nice and int(args.nice) > now:  # a unit started with Nice= is there already
        try:
            os.nice(int(args.nice) - now)
        except OSError as exc:
            log(f"could not lower the priority to nice {args.nice}: {exc}", "warning")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    from .inputs import load_shipped, parse_batch_sizes, quant_of, resolve_shape
    rules = engine_named(getattr(args, "engine", None))
    batch_sizes = parse_batch_sizes(args.batch_sizes or ",".join(map(str, rules.default_batch_sizes)))
    shape, naming, _ms = resolve_shape(args)
    from .support import resolve_provider_name
    quant = quant_of(naming, resolve_provider_name(args.provider, rules.name)[0])
    dtype = naming["act_dtype"] if quant is not None else naming["weight_dtype"]
    if interpret and dtype == "bfloat16":
        dtype = "float16"  # as the tune times it under the interpreter (remote/tuning/command.py)
    gpu = None
    if args.capability or not interpret:
        gpu = offgpu.gpu_target(args.capability, args.device_name, args.smi)
    from .tuner import prepared
    folder = Path(args.out) / FOLDER
    _remove_earlier(folder)
    folder.mkdir(parents=True, mode=0o700)
    # its own Triton cache, named by this run's tag as a tune's is (tuning.cache.fresh_cache sets
    # TRITON_CACHE_DIR, and TMPDIR: Triton builds in a temp folder first)
    from .cache import fresh_cache
    cache = fresh_cache(Path(args.out) / "triton-cache", os.environ.get("ORCH_TAG") or f"pid{os.getpid()}")
    # only the binary and its metadata are kept (a cache hit needs no more; the IR of some thousand
    # kernels would take gigabytes); not part of Triton's cache key (``get_cache_invalidating_env_vars``)
    os.environ["TRITON_STORE_BINARY_ONLY"] = "1"
    replaced = []
    if gpu is not None and not interpret:
        replaced = offgpu.answer_as_target(gpu["capability"], gpu["device_name"])
    import triton
    if gpu is not None and not interpret:
        offgpu.use_target_driver(gpu["target"])

    from .providers import get_provider
    provider = get_provider(args.provider, rules.name)
    shipped = load_shipped(args.shipped_config)
    engine = {"provider": provider.name, "version": PAYLOAD_VERSION}
    if hasattr(provider, "host_configs"):  # an engine's own kernel: its release, and what the server reads now
        # (the file-name check against orch's names is the tune's, on the GPU: cpu=True skips it here)
        info, installed = provider.host_configs(shape, naming, {}, True)
        engine["version"] = info["version"]
        shipped = shipped if shipped is not None else installed
    from .tuner import aot
    from .tuner import space as sp
    from .tuner.driver import shipped_pair

    nothing = None
    if interpret:
        nothing = "TRITON_INTERPRET=1: the interpreter compiles nothing"
    elif not callable(getattr(provider, "kernel_specs", None)):
        nothing = f"the {provider.name} provider hands over no compile requests: its candidates compile after the stop"
    elif "shape_only" not in inspect.signature(provider.make_problem).parameters:
        nothing = (f"the {provider.name} provider makes no inputs without the GPU (shape_only problems): its "
                   "candidates compile after the stop")
    elif aot.available():
        nothing = aot.available()
    can_compile = nothing is None

    def feasible(c):
        return sp.fits(c, args.smem_limit, 1 if quant is not None else {"float32": 4}.get(dtype, 2),
                       int(quant["block_shape"][1]) if quant and quant.get("block_shape") else None)[0]

    sel = dict(dtype=naming["dtype_selector"], block_shape=naming["block_shape"],
               per_channel_quant=naming["per_channel_quant"])
    own_kinds = getattr(provider, "kinds", None)
    kinds = tuple(own_kinds) if own_kinds else (("up", "down") if provider.separable else ("joint",))
    problems, tiers_by_m, candidates = {}, {}, {}
    weights = None
    for M in batch_sizes:
        p = None
        if can_compile:
            p = provider.make_problem(shape, M, dtype, "cpu", args.seed + M, weights, quant=quant, shape_only=True)
            weights = p.weights
            problems[M] = p
        per_problem = getattr(provider, "tma_kinds_for", None)
        tma = (per_problem(p) if per_problem and p is not None else getattr(provider, "tma_kinds", ())) or ()
        own_default = getattr(provider, "default_config", None)
        default = (own_default(p) if own_default and p is not None else
                   sp.default_config(M, shape["E"], naming["dtype_selector"], naming["block_shape"]))
        prefer = [pair for pair in (shipped_pair(shipped and {"up": shipped["up"], "down": shipped["down"]}, M),
                                    (default, default)) if pair]
        server_variants = getattr(provider, "server_variants", None)
        variants = ({k: server_variants(p, k) for k in kinds} if server_variants and p is not None else {})
        tiers = prepared.plan(args.space, M, shape["E"], shape["topk"], kinds, tma, feasible, prefer, variants)
        tiers_by_m[M] = tiers
        candidates[str(M)] = {k: [list(sp.cfg_key(c)) for t in tiers for kind, c in t if kind == k]
                              for k in dict.fromkeys(kind for t in tiers for kind, _ in t)}
    n_cands = sum(len(t) for ts in tiers_by_m.values() for t in ts)

    workers = int(args.workers or default_workers())
    compiled, failed, cut = [], {}, False
    t_compile = time.time()
    if can_compile:
        compiled, failed, cut = _compile_all(provider, problems, tiers_by_m, workers, float(args.max_seconds),
                                             n_cands)
    compile_s = round(time.time() - t_compile, 3)
    cuda = offgpu.cuda_state()
    if cuda["initialized"] or cuda["visible"] != "":
        raise PayloadError("runtime", f"the prepare process would hold a CUDA context ({cuda}): its result is refused")
    manifest = prepared.build(
        payload_version=PAYLOAD_VERSION, created=round(t_start, 3), gpu=gpu, triton_version=triton.__version__,
        engine=engine, shape=shape, dtype=dtype, naming=sel, quant=quant, space=args.space,
        batch_sizes=batch_sizes, interpret=interpret, cache=str(cache.relative_to(Path(args.out))),
        shipped=({"up": shipped["up"], "down": shipped["down"]} if shipped else None),
        candidates=candidates, kernels={"compiled": sorted(compiled), "failed": failed},
        cache_files=prepared.cache_files(cache),
        stats={"compile_s": compile_s, "seconds": round(time.time() - t_start, 3), "workers": workers,
               "nice": os.nice(0), "cut": cut, "candidates": n_cands, "torch_cuda_answers": replaced,
               "nothing_compiled": nothing},
        cuda=cuda)
    mpath = folder / prepared.MANIFEST
    atomic_write(str(mpath), (json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n").encode("utf-8"))
    shutil.rmtree(cache / "tmp", ignore_errors=True)
    return {"dir": str(folder), "manifest": str(mpath), "gpu": gpu, "kernels": len(compiled), "failed": len(failed),
            "candidates": n_cands, "compile_s": compile_s, "seconds": round(time.time() - t_start, 3),
            "workers": workers, "nice": os.nice(0), "cut": cut, "interpret": interpret, "nothing_compiled": nothing,
            "cuda": cuda, "triton_version": triton.__version__, "engine": engine}


def _compile_all(provider, problems: dict, tiers_by_m: dict, workers: int, max_s: float,
                 n_cands: int) -> tuple[list[str], dict, bool]:
    """Capture every candidate's compile requests (tier by tier over all batch sizes) and compile
    each new one in ``workers`` CPU processes (GPUs hidden, :func:`remote.tuning.tuner.aot.worker_init`;
    they inherit this process's niceness); stop sending at ``max_s`` seconds, and cancel what has
    not started by then. Returns ``(compiled idents, {ident: error}, cut)``."""
    from .tuner.aot import worker_init
    t0 = time.monotonic()
    futs: dict = {}
    captured = 0
    cut = False
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=worker_init)
    try:
        n_tiers = max((len(t) for t in tiers_by_m.values()), default=0)
        for tier in range(n_tiers):
            for M, tiers in tiers_by_m.items():
                if tier >= len(tiers):
                    continue
                for kind, cfg in tiers[tier]:
                    if time.monotonic() - t0 > max_s:
                        cut = True
                        break
                    captured += 1
                    try:
                        specs = provider.kernel_specs(problems[M], kind, cfg)
                    except Exception as exc:  # a config the launch code rejects, or no capture here
                        log(f"prepare M={M} {kind} {cfg}: not captured: {type(exc).__name__}: {str(exc)[:200]}",
                            "debug")
                        continue
                    for s in specs:
                        if s.ident() not in futs:
                            futs[s.ident()] = pool.submit(_compile, s)
                    if captured % 50 == 0:
                        progress(sum(1 for f in futs.values() if f.done()), len(futs), "prepare",
                                 captured=captured, candidates=n_cands)
                if cut:
                    break
            if cut:
                break
        pending = set(futs.values())
        while pending:
            left = max_s - (time.monotonic() - t0)
            if left <= 0:
                cut = True
                break
            _done, pending = cf.wait(pending, timeout=min(left, 5.0))
            progress(sum(1 for f in futs.values() if f.done()), len(futs), "prepare", captured=captured,
                     candidates=n_cands)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # compiles under way finish; the rest is dropped
    compiled, failed = [], {}
    for ident, f in futs.items():
        if f.cancelled() or not f.done():
            continue
        try:
            ok, err = f.result()
        except Exception as exc:  # a worker that died
            ok, err = False, f"{type(exc).__name__}: {exc}"
        if ok:
            compiled.append(ident)
        else:
            failed[ident] = str(err)[:300]
    return compiled, failed, cut
