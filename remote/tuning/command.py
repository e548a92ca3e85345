"""Tune the fused-MoE Triton kernel for one model shape; write the up and ``_down`` files and report.json.

Usage (payload command, see docs/protocol.md)::

    python -m remote tune --model-config PATH|REPO_ID [--tp 1] [--ep 1] [--dtype auto]
        [--quantization Q] [--device-name NAME] [--batch-sizes 1,2,...] [--space fast]
        [--out DIR] [--provider auto] [--gpus all] [--seed 0] [--no-resume]
        [--shipped-config PATH] [--compile-mode auto|target|context]
    python -m remote tune --shape E=8,N=64,hidden=128,topk=2 ...   (no model config)

The model flags (``--model-config``, ``--hf-home``, ``--download-dir``, ``--tp``, ``--ep``,
``--dtype``, ``--quantization``, ``--disable-shared-experts-fusion``, ``--device-name``, ``--shape``,
``--block-shape``, with ``--engine``: :func:`remote.engines.add_model_flags`) are
:data:`remote.engines.sglang.model_flags.MODEL_FLAGS`, shared with ``names``,
``probe`` and ``orch config-names``; the shape they name comes from
:func:`remote.engines.sglang.model_flags.shape_from_args`. ``--space`` and ``--provider`` take
:data:`remote.protocol.SEARCH_SPACES` and :data:`remote.protocol.PROVIDER_NAMES`.

Spaces: ``full`` = SGLang's 1920-config CUDA space (minus configs that cannot fit the
device); ``fast`` = seeded screen + coordinate-descent refinement (remote/tuning/tuner/search.py);
``smoke`` = 3 configs, for the CPU test bed. Without a GPU the kernel runs under
``TRITON_INTERPRET=1`` and the times are meaningless wall-clock numbers (the search logic
is exercised, nothing is measured). ``--device-name`` is then required.

Outputs in ``--out``: ``E=..,N=..,device_name=...json`` and the ``..._down.json`` file
(exact SGLang 0.5.23 names, integer-string keys, sorted), ``report.json`` and
``checkpoint.json`` (resume: re-running the same command skips finished batch sizes;
the checkpoint is keyed by shape, dtype, space, device name, Triton version, provider,
seed and payload version). Each is written with :func:`remote.host.fs.atomic_write` (temp
file, fsync, rename, fsync folder): a reader sees the old or the new file, never a torn one.

``--compile-mode``: how candidates compile on a GPU host (remote/tuning/tuner/compile.py):
``auto``/``target`` compile for the GPU's target in CPU processes that never create a CUDA
context, as many as CPU cores but one, falling back to ``context`` (the reason in the report's
``compile.fallback_reason``); ``context`` forces worker processes holding a CUDA context (their
number capped by GPU memory). report.json's ``time_split`` (and each batch size's) says where the
wall time went: compile, first launch, timing, compare, check (whole-kernel correctness), setup.

``--screen``: the ``fast`` search's screening protocol (remote/tuning/tuner/timing.py, "Adaptive
screening"): ``adaptive`` (default) shortens the graph of a candidate slower than 100 µs so each
replay lasts about 1 ms; ``fixed`` always captures 10 calls. Each batch size's ``screen`` in the
report counts the shortened measurements and the graph calls saved.

``--budget SECONDS`` (default :data:`remote.protocol.DEFAULT_TUNE_BUDGET_S`; 0: unbounded): seconds of
GPU timing per GPU for all batch sizes (the inventory's ``orch_tune_budget``), split over the batch
sizes by their expected cost; each batch size's search stops screening and refining when its share is
spent, and candidates whose bandwidth/FLOP floor exceeds the time to beat are never timed
(remote/tuning/tuner/floor.py). Each batch size's ``budget`` in the report says what was cut; the
report's ``budget`` sums it up. No budget applies on the CPU (the interpreter's times are not GPU time).

Routing (remote/tuning/tuner/routing.py): candidates are timed with the routing the server runs.
Where SGLang fuses the shared expert into the routed GEMM (the model's shape says so), every row
also runs it: top-(k+1) over E experts. ``--routing-file PATH`` (``orch_tune_routing_file``): a
recorded routing on the host, SGLang's ``--topk-ids-dir`` folder of its separate tuner or a file of
it, or an expert-distribution dump of SGLang's recorder (``stat`` or ``per_token``);
``--routing-skew S`` (``orch_tune_routing_skew``, >= 0): a what-if skew of the expert loads. Each
batch size's ``routing`` in the report says what it was timed with. A routing file that cannot be
read or does not fit the shape is ``bad_input`` naming the file.

Second opinion (remote/tuning/tuner/opinion.py): after each batch size's search, the tuned pair,
SGLang's default and the shipped pair are timed again as the whole fused MoE on fresh inputs
(interleaved rounds, the spread reported in ``second_opinion``); a pick slower there than the
shipped entry (than the default where nothing is shipped) is replaced by it (``replaced``), and the
speedups of the report are the second opinion's.

``--provider``: ``auto`` times the engine's own fused-MoE entry (``--engine``; SGLang's) when it is installed, else orch's
builtin kernel (:func:`remote.tuning.support.resolve_provider_name`, the answer the probe
reports as ``tuner_provider``).

Result ``data``::

    {"files": {"up": path, "down": path}, "report": path, "provider": "builtin"|<engine's provider>,
     "provider_fallback_reason": str|null (why ``auto`` tuned the builtin kernel),
     "engine": "sglang", "engine_version": str|null (the release whose kernel was timed),
     "batch_sizes": [...], "speedup_vs_default": {"M": x, ...},
     "speedup_vs_shipped": {"M": x, ...} | null, "device_name": str, "triton_version": str,
     "resumed": [M, ...], "space": str}

fp8_w8a8 (a model whose quantization selects ``dtype=fp8_w8a8``, per-tensor or
``block_shape=[128, 128]``; or ``--shape ... --quantization fp8 [--block-shape 128,128]``):
the weights are quantized to e4m3 with random data, activations dynamically, as SGLang does.

Errors: ``bad_input`` (bad flags, unsupported dtype/quantization for the builtin kernel,
no device name on CPU), ``not_found`` (model config or shipped file missing; provider
sglang requested but absent), ``runtime`` (CUDA out of memory outside any candidate, i.e.
for the inputs every candidate needs: the message says so, ``detail.oom`` is true and the
traceback is on stderr; or batch sizes failed: the checkpoint keeps the
finished ones; or ``--provider auto`` resolved to sglang but SGLang's entry does not import).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .. import PAYLOAD_VERSION
from ..host.fs import atomic_write
from ..protocol import (DEFAULT_PROVIDER, DEFAULT_SEARCH_SPACE, DEFAULT_TUNE_BUDGET_S, PROVIDER_NAMES, SEARCH_SPACES,
                        PayloadError, log, progress)
from ..engines import add_model_flags, engine_named
from .inputs import load_shipped as _load_shipped
from .inputs import parse_batch_sizes
from .inputs import quant_of as _quant_of
from .inputs import resolve_shape as _resolve_shape
from .tuner.driver import COMPILE_MODES, DEFAULT_COMPILE_MODE
from .tuner.search import DEFAULT_SCREEN, SCREEN_PROTOCOLS
from .tuner.events import Done, Error, Event, Fatal, Log, Progress


def add_arguments(p) -> None:
    """Register the ``tune`` flags on an argparse parser: the model flags
    (:func:`remote.engines.add_model_flags`) and the tuner's own."""
    add_model_flags(p, "tune")
    p.add_argument("--batch-sizes", default=None, help="batch sizes M, comma-separated (default: the engine's "
                                                       "tuning list, Engine.default_batch_sizes)")
    p.add_argument("--space", choices=SEARCH_SPACES, default=DEFAULT_SEARCH_SPACE)
    p.add_argument("--out", default="tune-out")
    p.add_argument("--provider", choices=PROVIDER_NAMES, default=DEFAULT_PROVIDER)
    p.add_argument("--gpus", default="all", help="'all' or comma-separated CUDA indices")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--no-check", action="store_true", help="skip the float64 check of tuned configs")
    p.add_argument("--shipped-config", default=None,
                   help="shipped up config file to compare with (its _down twin is used if present)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default=DEFAULT_COMPILE_MODE,
                   help="auto/target: compile candidates for the GPU's target in CPU processes without CUDA "
                        "(fallback: context, the reason in the report); context: worker processes with a CUDA "
                        "context (their number capped by GPU memory)")
    p.add_argument("--budget", type=_nonneg_float, default=DEFAULT_TUNE_BUDGET_S,
                   help="seconds of GPU timing per GPU for all batch sizes (0: unbounded); the report says "
                        "what it cut")
    p.add_argument("--routing-file", default=None,
                   help="a routing the engine recorded, in its own format (docs/tuning.md lists them)")
    p.add_argument("--routing-skew", type=_nonneg_float, default=0.0,
                   help="what-if skew of the expert loads (>= 0; 0: as recorded, or uniform)")
    p.add_argument("--prepared", default=None,
                   help="a prepared folder (python -m remote prepare, before the stop): its compiled candidates are "
                        "used when its manifest matches this GPU, Triton, engine and shape; else refused, naming why")
    p.add_argument("--screen", choices=tuple(SCREEN_PROTOCOLS), default=DEFAULT_SCREEN,
                   help="fast search's screening: adaptive (a graph of fewer calls for candidates slower than "
                        "100 us, each replay about 1 ms) or fixed (a graph of 10 calls, 3 replays)")


def _nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v >= 0.0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def tune_routing(args, shape: dict, naming: dict):
    """The :class:`remote.tuning.tuner.routing.Routing` of this tune: the fused shared experts of the
    shape (``naming["shared_experts"]``), ``--routing-file`` and ``--routing-skew``; a routing file is
    read and checked against the shape here (PayloadError ``bad_input`` naming it when it does not
    fit, ``not_found`` when it is absent)."""
    from .tuner.routing import Routing, RoutingError, load_recorded, make
    path = getattr(args, "routing_file", None) or None
    if path is not None and not os.path.exists(path):
        raise PayloadError("not_found", f"--routing-file {path}: no such file or folder")
    try:
        rt = Routing(shared=int(naming.get("shared_experts") or 0), file=path,
                     skew=float(getattr(args, "routing_skew", 0.0) or 0.0),
                     engine=getattr(args, "engine", None) if path is not None else None)
        if path is not None:
            make(rt, 1, shape["E"], shape["topk"], 0, "cpu", load_recorded(path, rt.engine))
    except RoutingError as exc:
        raise PayloadError("bad_input", f"--routing-file/--routing-skew: {exc}") from None
    return rt


def _devices(gpus: str) -> list[str]:
    import torch
    if not torch.cuda.is_available():
        return ["cpu"]
    n = torch.cuda.device_count()
    if gpus in (None, "", "all"):
        return [f"cuda:{i}" for i in range(n)]
    try:
        idx = [int(x) for x in gpus.split(",") if x.strip()]
    except ValueError:
        raise PayloadError("bad_input", f"--gpus: 'all' or comma-separated indices, got {gpus!r}") from None
    bad = [i for i in idx if not 0 <= i < n]
    if bad or not idx:
        raise PayloadError("bad_input", f"--gpus: indices {bad or idx} not in 0..{n - 1}")
    return [f"cuda:{i}" for i in idx]






def total_split(per_m: dict, resumed: list) -> dict:
    """Seconds per part of the tune's wall time (``time_split`` of each batch size tuned in this run,
    summed; see :func:`remote.tuning.tuner.driver.time_split`), with ``batch_sizes`` counted. With
    several GPUs the parts add up over devices (they ran at the same time)."""
    out: dict = {}
    n = 0
    for M, r in per_m.items():
        if int(M) in resumed or not r.get("time_split"):
            continue
        n += 1
        for k, v in r["time_split"].items():
            out[k] = round(out.get(k, 0.0) + v, 3)
    return dict(out, batch_sizes=n)


def _stat(path: str | None) -> list | None:
    """``[size, mtime]`` of a file, or of a folder's newest file (None when absent)."""
    if not path:
        return None
    try:
        if os.path.isdir(path):
            st = [os.stat(os.path.join(path, f)) for f in sorted(os.listdir(path))]
            return [sum(x.st_size for x in st), max((x.st_mtime for x in st), default=0.0)]
        st = os.stat(path)
        return [st.st_size, st.st_mtime]
    except OSError:
        return None


def budget_summary(per_m: dict, resumed: list, budget_s: float | None, cpu: bool) -> dict:
    """The report's ``budget``: ``seconds`` (per GPU; None: unbounded), ``search_gpu_s`` (the
    searches' timer seconds, summed over batch sizes and GPUs), and per batch size what was cut
    (``cut``: floor-pruned, budget-cut, race-stopped candidates and stages cut; only those that cut
    something), ``replaced`` (batch sizes whose pick the second opinion replaced)."""
    cut, spent, replaced = {}, 0.0, {}
    for M, r in per_m.items():
        if int(M) in resumed:
            continue
        spent += float(r.get("search_gpu_s") or 0.0)
        b = r.get("budget") or {}
        if b.get("pruned_floor") or b.get("pruned_budget") or b.get("race_stopped") or b.get("stages_cut"):
            cut[M] = {k: b.get(k) for k in ("limit_s", "spent_s", "pruned_floor", "pruned_budget", "race_stopped",
                                            "stages_cut")}
        if r.get("replaced"):
            replaced[M] = r["replaced"]["by"]
    return {"seconds": None if cpu else budget_s, "per": "GPU", "search_gpu_s": round(spent, 3),
            "note": "no budget on the CPU (interpreter)" if cpu else None, "cut": cut, "replaced": replaced}


def _compile_info(per_m: dict, resumed: list) -> dict | None:
    """How candidates were compiled (the last batch size's compiler stats: mode, workers,
    fallback reason, compile requests sent)."""
    last = [r.get("compile") for M, r in sorted(per_m.items(), key=lambda kv: int(kv[0]))
            if int(M) not in resumed and r.get("compile")]
    return last[-1] if last else None


def _take_prepared(path: str | None, provider, engine_info, shape, dtype, sel, quant, cpu: bool, devices,
                   triton_version: str) -> dict:
    """What the tune takes from ``--prepared`` (:mod:`remote.tuning.tuner.prepared`): ``{"used":
    False, "reason"}`` without one or when its manifest does not match this GPU's compute
    capability, Triton, engine release, payload, shape, dtype or quantization (the reason is
    logged, and the tune compiles as without one); else ``{"used": True, "dir", "cache",
    "kernels", "failed", "prepare_s", "cut", "gpu", "idents"}`` (``idents``: the compile requests
    already compiled, taken out for the tuner spec)."""
    if not path:
        return {"used": False, "reason": "no prepared folder (compiled after the stop)"}
    from .. import PAYLOAD_VERSION as payload_version
    from .tuner import prepared
    cap = None
    if not cpu:
        import torch
        cap = tuple(torch.cuda.get_device_capability(torch.device(devices[0])))
    engine = {"provider": provider.name, "version": engine_info["version"] if engine_info else payload_version}
    expect = prepared.expectation(payload_version=payload_version, triton_version=triton_version, engine=engine,
                                  shape=shape, dtype=dtype, naming=sel, quant=quant, interpret=cpu, capability=cap)
    manifest, why = prepared.load(Path(path), expect)
    if manifest is None:
        log(f"prepared folder {path} refused: {why}; compiling after the stop as without one", "warning")
        return {"used": False, "dir": path, "reason": why}
    kernels = manifest.get("kernels") or {}
    stats = manifest.get("stats") or {}
    log(f"prepared before the stop: {len(kernels.get('compiled') or [])} kernels compiled in "
        f"{stats.get('compile_s')} s ({path})")
    return {"used": True, "dir": path, "cache": str(prepared.cache_dir(Path(path), manifest)),
            "kernels": len(kernels.get("compiled") or []), "failed": len(kernels.get("failed") or {}),
            "prepare_s": stats.get("seconds"), "cut": bool(stats.get("cut")), "gpu": manifest.get("gpu"),
            "nothing_compiled": stats.get("nothing_compiled"), "idents": list(kernels.get("compiled") or [])}


def run(args) -> dict:
    """Run the ``tune`` command (see the module docstring for flags, outputs and errors)."""
    engine = engine_named(args.engine)
    batch_sizes = parse_batch_sizes(args.batch_sizes or ",".join(map(str, engine.default_batch_sizes)))
    shape, naming, ms = _resolve_shape(args)
    from .support import resolve_provider_name
    quant = _quant_of(naming, resolve_provider_name(args.provider, engine.name)[0])
    dtype = naming["act_dtype"] if quant is not None else naming["weight_dtype"]
    import torch
    devices = _devices(args.gpus)
    cpu = devices == ["cpu"]
    if quant is not None and quant["dtype"] == "fp8_w8a8" and not cpu:
        cc = torch.cuda.get_device_capability(torch.device(devices[0]))
        if cc < (8, 9):
            raise PayloadError("bad_input", f"fp8_w8a8 needs fp8 tensor cores (compute capability 8.9+); "
                                            f"{torch.cuda.get_device_name(torch.device(devices[0]))} is "
                                            f"{cc[0]}.{cc[1]}")
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before remote.tuning.kernel is imported
        if dtype == "bfloat16":
            log("CPU/interpreter run: bf16 loads are wrong under Triton's interpreter here; timing in float16 "
                "(file names unchanged; the numbers mean nothing on CPU anyway)", "warning")
            dtype = "float16"
    import triton

    torch_name = args.device_name or (None if cpu else torch.cuda.get_device_name(torch.device(devices[0])))
    if not torch_name:
        raise PayloadError("bad_input", "no GPU: --device-name is required to name the files")
    device_name = engine.device_name(torch_name)
    sel = dict(dtype=naming["dtype_selector"], block_shape=naming["block_shape"],
               per_channel_quant=naming["per_channel_quant"])
    names = ms.file_names(device_name)

    from .providers import get_provider
    provider = get_provider(args.provider, engine.name)
    shipped = _load_shipped(args.shipped_config)
    engine_info = None
    if hasattr(provider, "host_configs"):  # an engine's own kernel: what the host's engine reads
        engine_info, installed = provider.host_configs(shape, naming, names, cpu)
        shipped = shipped if shipped is not None else installed
        provider.close()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prep = _take_prepared(getattr(args, "prepared", None), provider, engine_info, shape, dtype, sel, quant, cpu,
                          devices, triton.__version__)
    from .tuner import checkpoint
    routing = tune_routing(args, shape, naming)
    # a routing other than random logits is part of the key (the recording's size and time too: another
    # recording under the same name is another tune)
    rkey = {} if routing.synthetic else {"routing": dict(routing.to_dict(), file_stat=_stat(routing.file))}
    key, key_id = checkpoint.run_key(shape=shape, dtype=dtype, naming=sel, space=args.space, device=device_name,
                                     triton=triton.__version__, provider=provider.name, seed=args.seed,
                                     engine_version=engine_info["version"] if engine_info else None,
                                     payload=PAYLOAD_VERSION, interpret=cpu, **rkey)
    done: dict = {}
    if not args.no_resume:
        done, why = checkpoint.load(out, key_id)
        if why:
            log(why, "warning")
    done = {k: v for k, v in done.items() if int(k) in batch_sizes}
    resumed = sorted(int(k) for k in done)
    if resumed:
        log(f"resuming: batch sizes {resumed} already tuned (checkpoint {key_id})")
    todo = [M for M in batch_sizes if str(M) not in done]
    total = len(batch_sizes)
    spec = dict(shape=shape, dtype=dtype, space=args.space, provider=provider.name, seed=args.seed,
                dtype_selector=naming["dtype_selector"], block_shape=naming["block_shape"], quant=quant,
                shipped=({"up": shipped["up"], "down": shipped["down"]} if shipped else None),
                check=not args.no_check, compile_mode=getattr(args, "compile_mode", DEFAULT_COMPILE_MODE),
                screen=getattr(args, "screen", DEFAULT_SCREEN), routing=routing.to_dict(),
                budget_s=getattr(args, "budget", None) or None, prepared=prep.pop("idents", None))
    errors: dict = {}
    t0 = time.time()
    n_new = [0]
    progress(len(done), total, "tune", eta_s=None)

    def eta():
        if not n_new[0]:
            return None
        per = (time.time() - t0) / n_new[0]
        return round(per * (total - len(done)) / max(1, min(len(devices), total - len(done) or 1)), 1)

    def emit(event: Event) -> None:
        if isinstance(event, Progress):
            progress(len(done), total, "tune", batch_size=event.batch_size, best_us=round(event.best_us, 3),
                     eta_s=eta())
        elif isinstance(event, Log):
            if event.level != "debug":
                log(event.msg, event.level)
        elif isinstance(event, Done):
            res = event.result
            done[str(event.batch_size)] = res
            n_new[0] += 1
            checkpoint.save(out, key, key_id, done)
            progress(len(done), total, "tune", batch_size=event.batch_size,
                     best_us=round(res["tuned_us"] or res["kernel_us"], 3), eta_s=eta())
        elif isinstance(event, Error):
            errors[str(event.batch_size)] = event.text
            log(f"batch size {event.batch_size}: {event.text}", "error")
        elif isinstance(event, Fatal):
            fatal.append(event)

    fatal: list[Fatal] = []

    def run_once() -> dict:
        left = [M for M in todo if str(M) not in done]
        errors.clear()
        if left and not fatal:
            from .tuner.driver import tune_parallel
            tune_parallel(spec, devices, left, emit)
        return dict(errors)

    # the tuner's own Triton cache, fresh for this run (never the server's); see .cache
    from .cache import tune_with_cache
    cache = tune_with_cache(run_once, out / "triton-cache", os.environ.get("ORCH_TAG") or f"pid{os.getpid()}", log,
                            prepared=Path(prep["cache"]) if prep.get("used") else None)
    if fatal:
        # out of GPU memory for what every candidate needs: the traceback goes to stderr (the
        # controller shows its tail), the finished batch sizes stay in the checkpoint
        sys.stderr.write(fatal[0].traceback)
        sys.stderr.flush()
        raise PayloadError("runtime", fatal[0].text, detail={
            "oom": True, "batch_size": fatal[0].batch_size, "finished": sorted(int(k) for k in done),
            "checkpoint": str(out / checkpoint.NAME)})
    if errors or any(str(M) not in done for M in batch_sizes):
        missing = [M for M in batch_sizes if str(M) not in done]
        raise PayloadError("runtime", f"tuning failed for batch sizes {missing}",
                           detail={"errors": errors, "checkpoint": str(out / checkpoint.NAME)})

    from ..engines.triton_moe.configfile import dumps_config
    # fields the engine's loader needs in every entry of this format (the provider's
    # ``file_entry``; vLLM's WNA16 launch requires SPLIT_K), kept by the engine's extra fields
    entry = getattr(provider, "file_entry", None)
    add = dict(entry(quant)) if entry else {}
    up = {str(M): dict(done[str(M)]["up"], **add) for M in batch_sizes}
    down = {str(M): dict(done[str(M)]["down"], BLOCK_SIZE_M=done[str(M)]["up"]["BLOCK_SIZE_M"], **add)
            for M in batch_sizes}
    paths = {"up": out / names["up"], "down": out / names["down"]}
    for k in ("up", "down"):
        atomic_write(str(paths[k]), dumps_config(up if k == "up" else down,
                                                 extra_fields=engine.config_extra_fields).encode("utf-8"))
    per_m = {str(M): done[str(M)] for M in batch_sizes}
    report = {
        "payload_version": PAYLOAD_VERSION, "provider": provider.name, "triton_version": triton.__version__,
        "torch_version": torch.__version__, "device_name": device_name, "torch_device_name": torch_name,
        "devices": devices, "interpret": cpu,
        "timing": ("wall-clock medians under TRITON_INTERPRET=1: meaningless for performance" if cpu else
                   "CUDA graph of 10 calls, L2 flushed, median of 10 replays; " +
                   getattr(provider, "whole_timed", None) or
                   "whole fused MoE with alignment precomputed (up GEMM + SiLU-mul + down GEMM + top-k sum)"),
        "shape": shape, "dtype": dtype, "quant": quant, "naming": naming, "space": args.space, "seed": args.seed,
        "files": {k: str(v) for k, v in paths.items()},
        "shipped": ({"path": shipped["path"], "down_path": shipped["down_path"]} if shipped else None),
        "checkpoint_key": key_id, "resumed": resumed, "batch_sizes": per_m,
        "engine": engine.name, "engine_info": engine_info,
        "provider_fallback_reason": getattr(provider, "fallback_reason", None),
        "wall_s": round(time.time() - t0, 3), "time_split": total_split(per_m, resumed),
        "compile": _compile_info(per_m, resumed),
        "routing": routing.describe(),
        "budget": budget_summary(per_m, resumed, getattr(args, "budget", None) or None, cpu),
        "triton_cache": {"dir": cache["cache"], "moved_aside": cache["moved_aside"]},
        "prepared": prep,
    }
    rpath = out / "report.json"
    atomic_write(str(rpath), (json.dumps(report, indent=1, sort_keys=True, default=str) + "\n").encode("utf-8"))
    return {
        "files": {k: str(v) for k, v in paths.items()}, "report": str(rpath), "provider": provider.name,
        "provider_fallback_reason": getattr(provider, "fallback_reason", None),
        "engine": engine.name, "engine_version": engine_info["version"] if engine_info else None,
        "batch_sizes": batch_sizes, "space": args.space, "device_name": device_name,
        "triton_version": triton.__version__, "resumed": resumed,
        "triton_cache": {"dir": cache["cache"], "moved_aside": cache["moved_aside"]},
        "prepared": prep, "wall_s": report["wall_s"], "time_split": report["time_split"],
        "speedup_vs_default": {str(M): done[str(M)].get("speedup_vs_default") for M in batch_sizes},
        "speedup_vs_shipped": ({str(M): done[str(M)].get("speedup_vs_shipped") for M in batch_sizes}
                               if shipped else None),
    }
