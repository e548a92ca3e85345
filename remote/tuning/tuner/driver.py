"""Runs the search for a list of batch sizes on one device (:func:`tune_on_device`), or
spread over several GPUs, one spawned worker process per GPU (:func:`tune_parallel`).

A ``spec`` is a plain dict (picklable): ``shape`` {E, N, hidden, topk}, ``dtype``
(bfloat16/float16/float32), ``space``, ``provider`` (resolved name), ``seed``,
``dtype_selector``, ``block_shape``, ``shipped`` ({"up": cfg-dict, "down": cfg-dict|None}
or None), ``check`` (bool: verify tuned configs against the float64 reference), ``quant``
(``None``, or ``{"block_shape": None | [bn, bk]}`` for fp8_w8a8: ``dtype`` is then the
activation/output dtype and the weights are fp8 e4m3), ``routing`` (the
:class:`~.routing.Routing` dict every problem is built with: fused shared expert, recorded routing,
skew; None: random router logits), ``budget_s`` (seconds of GPU timing per GPU for all its batch
sizes, :mod:`.floor`; None or 0: unbounded; no budget applies on the CPU, whose times are the
interpreter's) and ``ceilings`` (the :class:`~.floor.Ceilings` dict the floor uses instead of the
device's: tests).

Per batch size: the search (with its share of the budget and the floor rule), then the second
opinion (:mod:`.opinion`: the tuned pair, SGLang's default and the shipped pair timed again on fresh
inputs; a pick slower there than the shipped entry, or than the default where nothing is shipped,
is replaced by it), then the correctness check.

Events passed to ``emit(event)`` are the records of :mod:`remote.tuning.tuner.events`:
:class:`~.events.Progress`, :class:`~.events.Log`, :class:`~.events.Done`, :class:`~.events.Error`
and :class:`~.events.Fatal` (a CUDA out-of-memory error outside any candidate; a candidate that
runs out of memory is skipped like any failing candidate): the device stops there, and
:func:`tune_parallel` stops every worker.
"""

from __future__ import annotations

import math
import os
import queue as queue_mod
import statistics
import time

from .events import Done, Error, Fatal, Log, Progress, WorkerExit
from .search import DEFAULT_SCREEN

REL_ERR_BAR = 1e-2  # relative error bound against the float64 reference (bf16 kernel's accumulation)
KERNEL_FLOOR_FACTOR = 2.0  # a provider's own kernel: a tuned config may err up to this times its no-file error


def smem_limit(device: str) -> int | None:
    """Shared memory (bytes) one block may use on ``device`` with the opt-in limit (232,448 on an
    H200), from torch's device properties, else Triton's driver; None on the CPU or when unknown."""
    import torch
    if not device.startswith("cuda"):
        return None
    props = torch.cuda.get_device_properties(torch.device(device))
    for attr in ("shared_memory_per_block_optin", "max_shared_memory_per_block_optin"):
        v = getattr(props, attr, None)
        if v:
            return int(v)
    try:
        import triton
        idx = torch.device(device).index or 0
        return int(triton.runtime.driver.active.utils.get_device_properties(idx)["max_shared_mem"])
    except Exception:
        return None


def compare(provider, problem, timer, variants: dict, cpu: bool, rounds: int = 3) -> dict:
    """Time the whole fused MoE for each ``{name: (up_cfg, down_cfg)}``, interleaved over
    ``rounds`` rounds (side by side, so drift hits all alike); median per variant in µs,
    None for a variant that failed to run."""
    from .search import CPU_PROTOCOL, FULL_PROTOCOL
    proto = CPU_PROTOCOL if cpu else FULL_PROTOCOL
    samples = {k: [] for k in variants}
    for _ in range(1 if cpu else rounds):
        for name, (up, down) in variants.items():
            try:
                samples[name].append(timer.time(provider.full_fn(problem, up, down), **proto))
            except Exception:  # e.g. a shipped config that does not fit this device
                samples[name].append(None)
    return {k: (None if not v or None in v else statistics.median(v)) for k, v in samples.items()}


def check_tuned(provider, problem, up: dict, down: dict) -> tuple[bool, dict]:
    """Correctness of a tuned up/down pair: ``(ok, fields)``, ``ok`` when ``rel_err < rel_err_bar``;
    ``fields`` (kept in the batch size's result) are ``rel_err``, ``rel_err_bar`` and, when the bar
    was widened, ``rel_err_default``.

    ``rel_err`` is ``provider.check`` (relative error against the float64 reference, dimensionless).
    The bar is :data:`REL_ERR_BAR` (1e-2). A provider that times the server's own kernel (it has
    ``default_config``: SGLang's) cannot change that kernel's numerics: its fp8 dots on Hopper
    accumulate in reduced precision (measured on the H200: 1.19e-2 at M=1 for fp8 block [128, 128],
    SGLang 0.5.23, E=256, N=512), so when the tuned pair misses 1e-2 the same kernel is checked with
    no config file (what the server runs untuned) and the bar becomes ``max(1e-2, 2 x that error)``.
    A config that miscomputes (wrong tiles, races, NaN) errs by O(1) and still fails; orch's builtin
    kernel keeps the fixed bar (its fp8 accumulation is orch's to fix, see kernel/fused_moe.py).
    """
    err = provider.check(problem, up, down)
    out = {"rel_err": err, "rel_err_bar": REL_ERR_BAR}
    if not err < REL_ERR_BAR and getattr(provider, "default_config", None) is not None:
        base = provider.check(problem, None, None)
        out["rel_err_default"] = base
        if math.isfinite(base):
            out["rel_err_bar"] = max(REL_ERR_BAR, KERNEL_FLOOR_FACTOR * base)
    return err < out["rel_err_bar"], out


def make_problem(provider, shape: dict, M: int, dtype: str, device: str, seed: int, weights, quant, routing):
    """``provider.make_problem`` with the tune's routing (:mod:`.routing`). A provider whose
    ``make_problem`` takes no ``routing`` runs the synthetic routing only: ValueError when the tune
    asks for another (a fused shared expert, a recording, a skew)."""
    import inspect

    from .routing import Routing
    if "routing" in inspect.signature(provider.make_problem).parameters:
        return provider.make_problem(shape, M, dtype, device, seed, weights, quant=quant, routing=routing)
    if not Routing.from_dict(routing).synthetic:
        raise ValueError(f"the {provider.name} provider times no routing but random router logits; this tune asks "
                         f"for {Routing.from_dict(routing).describe()}")
    return provider.make_problem(shape, M, dtype, device, seed, weights, quant=quant)


def shipped_pair(shipped: dict | None, M: int):
    """SGLang 0.5.23's choice from a shipped up/down config pair for M: the entry with the
    key closest to M of each file; a missing down file reuses the up entry without TMA; a
    down BLOCK_SIZE_M that differs is overridden with the up one (0.5.23 warns and
    overrides). ``USE_TMA`` stays where the file has it (a provider whose kernel does not
    read it ignores it); missing num_warps/num_stages get Triton's launch defaults (4, 3)."""
    from .space import closest_entry
    if not shipped or not shipped.get("up"):
        return None
    up = closest_entry(shipped["up"], M)
    down = closest_entry(shipped["down"], M) if shipped.get("down") else {k: v for k, v in up.items() if k != "USE_TMA"}
    down["BLOCK_SIZE_M"] = up["BLOCK_SIZE_M"]
    for c in (up, down):
        c.setdefault("num_warps", 4)
        c.setdefault("num_stages", 3)
    return up, down


def tune_on_device(spec: dict, device: str, batch_sizes: list[int], emit) -> None:
    """Tune ``batch_sizes`` one after another on ``device`` (``cuda:i`` or ``cpu``)."""
    from ..providers import get_provider
    from . import floor as fl
    from . import space as sp
    from .compile import Compiler
    from .opinion import second_opinion, verdict as opinion_verdict
    from .search import Evaluator, search
    from .timing import Timer

    cpu = not device.startswith("cuda")
    provider = get_provider(spec["provider"])
    timer = Timer(device)
    compiler = None
    target = getattr(provider, "compile_target", None)
    if not cpu and target:
        compiler = make_compiler(provider, spec, device)
    smem = smem_limit(device)
    quant = spec.get("quant")
    elem = 1 if quant is not None else {"bfloat16": 2, "float16": 2, "float32": 4}[spec["dtype"]]
    block_k = int(quant["block_shape"][1]) if quant and quant.get("block_shape") else None
    shape = spec["shape"]
    routing = spec.get("routing")
    ceil = fl.Ceilings.from_dict(spec["ceilings"]) if spec.get("ceilings") else None
    budget_s = float(spec.get("budget_s") or 0) or None
    if cpu:
        budget_s = None  # the interpreter's wall clock is not GPU time
    weights = None
    prev = None  # this worker's last winner: warm start for the next batch size
    plan = None  # {M: expected cost} of the batch sizes (the budget's split)
    t_budget0 = timer.stats.seconds
    try:
        for i_m, M in enumerate(batch_sizes):
            t_start = time.perf_counter()
            try:
                p = make_problem(provider, shape, M, spec["dtype"], device, spec["seed"] + M, weights, quant, routing)
                weights = p.weights
                ev = Evaluator(provider, p, timer, compiler, log=lambda m, lvl="info": emit(Log(m, lvl)), cpu=cpu,
                               screen=spec.get("screen") or DEFAULT_SCREEN)
                floors = None
                if ceil is None and not cpu:
                    ceil = fl.device_ceilings(device)
                if ceil is not None and callable(getattr(provider, "floor_inputs", None)):
                    g = provider.floor_inputs(p)
                    floors = fl.Floors(g, ceil)
                    ev.pruner = fl.Pruner(floors, ev.kinds)
                    if plan is None:
                        plan = {m: fl.cost_weight(fl.Floors(fl.planned(g, m), ceil).planned_whole_us())
                                for m in batch_sizes}
                if budget_s is not None:
                    left = budget_s - (timer.stats.seconds - t_budget0)
                    w = {m: (plan or {}).get(m, 1.0) for m in batch_sizes[i_m:]}
                    ev.budget = fl.Budget(fl.allocate(left, w, M), timer)
                short0 = (timer.stats.shortened, timer.stats.calls_saved)
                own_default = getattr(provider, "default_config", None)
                default = (own_default(p) if own_default else
                           sp.default_config(M, shape["E"], spec.get("dtype_selector"), spec.get("block_shape")))
                if not cpu and not timer._warm:
                    timer.warm_up(provider.full_fn(p, default, default))
                sh = shipped_pair(spec.get("shipped"), M)
                hints = [h for h in (prev, sh) if h]
                # what the engine may read at this M as a file entry (vLLM's compiled WNA16 kernel's checks)
                allowed = getattr(provider, "config_allowed", None)

                def writable(pair, p=p, allowed=allowed):
                    return allowed is None or all(allowed(p, c) for c in pair if c is not None)

                prefer = [t for t in ([("shipped", sh[0], sh[1])] if sh else []) + [("default", default, default)]
                          if writable(t[1:])]
                split0 = _split_marks(compiler, timer)
                t_m = time.perf_counter()
                res = search(ev, spec["space"], M, shape["E"], getattr(p, "top_k", shape["topk"]), smem, elem,
                             progress=lambda best, M=M: emit(Progress(M, best)), hints=hints, block_k=block_k,
                             prefer=prefer)
                t_search, split1 = time.perf_counter(), _split_marks(compiler, timer)
                res["routing"] = dict(getattr(p, "routing_info", None) or {"kind": "synthetic"})
                res["budget"] = dict(ev.budget.report(), floor=("on: " + ceil.source) if ev.pruner is not None else
                                     "off: the device's ceilings are unknown here")
                # SGLang's kernel: "default" is what the server does without a file
                no_file = (None, None) if own_default else (default, default)
                variants = {"tuned": (res["up"], res["down"]), "default": no_file}
                if sh:
                    variants["shipped"] = sh
                # the second opinion: fresh inputs (another seed, the same routing), interleaved rounds
                p2 = make_problem(provider, shape, M, spec["dtype"], device, spec["seed"] + 100003 + M, weights, quant,
                                  routing)
                tags = {f.get("tag"): f.get("whole_us") for f in res.get("final") or []}
                est = {"tuned": res.get("whole_us"), "default": tags.get("default"), "shipped": tags.get("shipped")}
                op = second_opinion(provider, p2, timer, variants, cpu, estimates=est)
                del p2
                baseline = "shipped" if sh else "default"
                replace, why = opinion_verdict(op, baseline)
                if replace and not writable(variants[baseline] if variants[baseline][0] is not None
                                            else (default, default)):
                    replace, why = False, why + "; the search's pick is kept: the engine would refuse the baseline's " \
                                                "entry written at this M"
                op["baseline"], op["verdict"] = baseline, why
                if replace:
                    up_b, down_b = variants[baseline] if variants[baseline][0] is not None else (default, default)
                    res["replaced"] = {"by": baseline, "search_pick": {"up": res["up"], "down": res["down"]},
                                       "why": why}
                    res["up"], res["down"] = dict(up_b), dict(down_b, BLOCK_SIZE_M=up_b["BLOCK_SIZE_M"])
                    res["pick"] = f"{baseline} (replaced after the second opinion)"
                    emit(Log(f"M={M}: {why}", "warning"))
                res["second_opinion"] = op
                times = dict(op["us"])
                if replace:  # what is written now is the baseline: its time is the tuned time
                    times["tuned"] = times[baseline]
                prev = (res["up"], res["down"])
                t_compare = time.perf_counter()
                res["default_config"] = default
                res["default_us"] = times["default"]
                res["tuned_us"] = times["tuned"]
                res["shipped_us"] = times.get("shipped")
                res["shipped_config"] = {"up": sh[0], "down": sh[1]} if sh else None
                res["speedup_vs_default"] = _ratio(times["default"], times["tuned"])
                res["speedup_vs_shipped"] = _ratio(times.get("shipped"), times["tuned"])
                if spec.get("check", True):
                    small = make_problem(provider, shape, min(M, 256), spec["dtype"], device, spec["seed"] + 7 * M,
                                         weights, quant, routing)
                    if hasattr(compiler, "bind") and getattr(small, "M", M) != M:  # other specialisations
                        compiler.bind(provider, small)
                        compiler.compile([("up", res["up"]), ("down", res["down"])], M=small.M)
                    ok, verdict = check_tuned(provider, small, res["up"], res["down"])
                    res.update(verdict)
                    if not ok:
                        base = (f"; the kernel with no config file: {verdict['rel_err_default']:.3g}"
                                if "rel_err_default" in verdict else "")
                        emit(Error(M, f"tuned config fails the correctness check: rel_err={res['rel_err']:.3g} "
                                      f"(bar {verdict['rel_err_bar']:.3g}{base})"))
                        continue
                res["compile_s"] = round(compiler.seconds, 3) if compiler else 0.0
                res["screen"] = {"mode": spec.get("screen") or DEFAULT_SCREEN,
                                 "shortened": timer.stats.shortened - short0[0],
                                 "graph_calls_saved": timer.stats.calls_saved - short0[1]}
                res["time_split"] = time_split(split0, split1, t_m, t_search, t_compare, time.perf_counter(),
                                               t_start)
                res["compile"] = compiler.stats() if compiler else {"mode": "none", "fallback_reason": (
                    "CPU/interpreter: nothing is compiled" if cpu else "the provider compiles at first launch")}
                emit(Done(M, res))
            except Exception as exc:
                import traceback
                if is_oom(exc):
                    # a candidate out of memory is skipped inside the search; this one came from
                    # what every candidate needs (inputs, buffers, the reference check): stop
                    emit(Fatal(M, f"out of GPU memory on {device} at batch size {M}, outside any candidate "
                                  f"(inputs, buffers or the correctness check): {type(exc).__name__}: {exc}",
                               traceback.format_exc()[-4000:]))
                    return
                emit(Error(M, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"))
    finally:
        if compiler:
            compiler.close()
        close = getattr(provider, "close", None)
        if close:
            close()


#: ``compile_mode`` values of a spec: ``auto`` (target compile where possible, else context), ``target``
#: (the same, the fallback reason is reported), ``context`` (force today's path: workers with a CUDA context).
COMPILE_MODES = ("auto", "target", "context")
#: the ``compile_mode`` when a spec names none
DEFAULT_COMPILE_MODE = COMPILE_MODES[0]


def make_compiler(provider, spec: dict, device: str):
    """The compiler for a GPU tune: a :class:`~.compile.TargetCompiler` (CPU processes without
    CUDA, one per CPU core but one) where the provider can hand over its kernels' compile
    requests (``kernel_specs``) and this Triton can compile for an explicit target
    (:func:`.aot.available`); else, or with ``spec["compile_mode"] == "context"``, a
    :class:`~.compile.Compiler` whose workers hold a CUDA context (their number capped by the
    provider's ``compile_workers``, i.e. GPU memory). ``fallback_reason`` of the result says why
    the target path was not taken (None when it was). ``spec["prepared"]``: identities of compile
    requests compiled before the stop (``python -m remote prepare``), handed to the
    :class:`~.compile.TargetCompiler` (not sent again; its workers start at the first other one).
    Raises ValueError for an unknown mode."""
    from . import aot
    from .compile import Compiler, TargetCompiler
    mode = spec.get("compile_mode") or DEFAULT_COMPILE_MODE
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {mode!r}")
    idx = int(device.split(":")[1]) if ":" in device else 0
    workers = spec.get("compile_workers")

    def context():
        n = workers
        fits = getattr(provider, "compile_workers", None)
        if fits is not None:
            cap = fits(spec["shape"], spec["dtype"], spec.get("quant"), device)
            n = min(n, cap) if n else cap
        import inspect
        takes = "routing" in inspect.signature(provider.precompile_args).parameters
        pargs = (provider.precompile_args(spec["shape"], spec["dtype"], spec.get("quant"), routing=spec["routing"])
                 if spec.get("routing") and takes else
                 provider.precompile_args(spec["shape"], spec["dtype"], spec.get("quant")))
        return Compiler(pargs,
                        provider.compile_target, device_index=idx, workers=n,
                        per_batch=getattr(provider, "compile_per_batch", False))

    why = "compile_mode context (forced)" if mode == "context" else (
        aot.available() or (None if callable(getattr(provider, "kernel_specs", None))
                            else f"the {provider.name} provider hands over no compile requests (kernel_specs)"))
    if not why:
        try:
            return TargetCompiler(workers=workers, fallback=context, prepared=spec.get("prepared"))
        except Exception as exc:  # e.g. the CPU workers could not start
            why = f"CPU compile workers did not start: {type(exc).__name__}: {str(exc)[:200]}"
    c = context()
    c.fallback_reason = why
    return c


def _split_marks(compiler, timer) -> dict:
    st = compiler.stats() if compiler else {}
    return {"compile": float(st.get("wait_s", 0.0)) + float(st.get("capture_s", 0.0)),
            "first": timer.stats.first_s, "timer": timer.stats.seconds}


def time_split(a: dict, b: dict, t0: float, t_search: float, t_compare: float, t_end: float,
               t_start: float | None = None) -> dict:
    """Where one batch size's wall time went, in seconds, from marks ``a`` (search start) and ``b``
    (search end) of :func:`_split_marks` and the clock at the search's start and end, after the
    side-by-side comparison and at the end: ``compile`` (this process waiting for compile workers,
    plus capturing compile requests), ``first_launch`` (each timed candidate's first eager launch:
    loading its binary, or compiling it here when no worker did), ``timing`` (graph capture and
    replays), ``search_other`` (the rest of the search: inputs, bookkeeping), ``compare`` (default,
    shipped and tuned side by side) and ``check`` (the whole-kernel correctness check against the
    float64 reference); ``setup`` (from ``t_start``: inputs, SGLang's default config, the timer's
    warm-up before the search); ``wall`` is their sum."""
    compile_s = b["compile"] - a["compile"]
    first = b["first"] - a["first"]
    timer_s = b["timer"] - a["timer"]
    out = {"compile": compile_s, "first_launch": first, "timing": max(0.0, timer_s - first),
           "search_other": max(0.0, (t_search - t0) - compile_s - timer_s), "compare": t_compare - t_search,
           "check": t_end - t_compare, "setup": t0 - (t0 if t_start is None else t_start),
           "wall": t_end - (t0 if t_start is None else t_start)}
    return {k: round(v, 3) for k, v in out.items()}


def is_oom(exc: BaseException) -> bool:
    """True for a CUDA out-of-memory error: ``torch.cuda.OutOfMemoryError``, or the plain
    ``RuntimeError("CUDA out of memory...")`` of torch before 1.13."""
    import torch
    cls = getattr(torch.cuda, "OutOfMemoryError", None)
    if cls is not None and isinstance(exc, cls):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def _ratio(a, b):
    if a is None or b is None or not (a == a) or not (b == b) or b <= 0:
        return None
    return round(a / b, 4)


def _worker(spec, device, batch_sizes, queue):
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        if device.startswith("cuda"):
            import torch
            torch.cuda.set_device(torch.device(device))
        tune_on_device(spec, device, batch_sizes, queue.put)
    except BaseException as exc:  # report, never hang the parent
        queue.put(Error(None, f"worker {device}: {type(exc).__name__}: {exc}"))
    finally:
        queue.put(WorkerExit(device))


def split_batches(batch_sizes: list[int], n: int) -> list[list[int]]:
    """Spread batch sizes over ``n`` workers: largest first, round robin (the large ones
    cost most), so each worker gets a similar mix."""
    order = sorted(batch_sizes, reverse=True)
    parts = [[] for _ in range(n)]
    for i, M in enumerate(order):
        parts[i % n].append(M)
    return [sorted(p) for p in parts if p]


def tune_parallel(spec: dict, devices: list[str], batch_sizes: list[int], emit) -> None:
    """One spawned process per device in ``devices``; their events are relayed to ``emit`` in
    the calling thread. With one device (or CPU) it runs in this process."""
    if len(devices) <= 1:
        tune_on_device(spec, devices[0] if devices else "cpu", batch_sizes, emit)
        return
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    parts = split_batches(batch_sizes, len(devices))
    n_cpu = os.cpu_count() or 2
    spec = dict(spec, compile_workers=max(1, n_cpu // len(parts) - 1))
    # not daemonic: each worker runs its own pool of compile processes (a daemonic process may
    # not have children); the finally below ends them whatever happens here
    procs = [ctx.Process(target=_worker, args=(spec, dev, part, q), daemon=False) for dev, part in zip(devices, parts)]
    try:
        for pr in procs:
            pr.start()
        exited = 0
        while exited < len(procs):
            try:
                event = q.get(timeout=5)
            except queue_mod.Empty:
                if not any(pr.is_alive() for pr in procs):
                    emit(Error(None, "GPU worker processes exited without reporting"))
                    break
                continue
            if isinstance(event, WorkerExit):
                exited += 1
                continue
            emit(event)
            if isinstance(event, Fatal):  # the tune ends: the other GPUs' work would be thrown away
                break
    finally:  # an interrupt or an error here must not leave GPU workers behind
        for pr in procs:
            if pr.is_alive():
                pr.terminate()
        for pr in procs:
            pr.join(timeout=10)
            if pr.is_alive():
                pr.kill()
