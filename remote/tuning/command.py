"""Tune the fused-MoE Triton kernel for one model shape; write the up and ``_down`` files and report.json.

Usage (payload command, see docs/protocol.md)::

    python -m remote tune --model-config PATH|REPO_ID [--tp 1] [--ep 1] [--dtype auto]
        [--quantization Q] [--device-name NAME] [--batch-sizes 1,2,...] [--space fast]
        [--out DIR] [--provider auto] [--gpus all] [--seed 0] [--no-resume]
        [--shipped-config PATH] [--compile-mode auto|target|context]
    python -m remote tune --shape E=8,N=64,hidden=128,topk=2 ...   (no model config)

The model flags (``--model-config``, ``--hf-home``, ``--download-dir``, ``--tp``, ``--ep``,
``--dtype``, ``--quantization``, ``--disable-shared-experts-fusion``, ``--device-name``, ``--shape``,
``--block-shape``) are :data:`remote.engines.sglang.model_flags.MODEL_FLAGS`, shared with ``names``,
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

``--provider``: ``auto`` times SGLang's own fused-MoE entry when it is installed, else orch's
builtin kernel (:func:`remote.tuning.support.resolve_provider_name`, the answer the probe
reports as ``tuner_provider``).

Result ``data``::

    {"files": {"up": path, "down": path}, "report": path, "provider": "builtin"|"sglang",
     "provider_fallback_reason": str|null (why ``auto`` tuned the builtin kernel),
     "sglang_version": str|null, "batch_sizes": [...], "speedup_vs_default": {"M": x, ...},
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

import json
import os
import sys
import time
from pathlib import Path

from .. import PAYLOAD_VERSION
from ..host.fs import atomic_write
from ..protocol import (DEFAULT_PROVIDER, DEFAULT_SEARCH_SPACE, PROVIDER_NAMES, SEARCH_SPACES, PayloadError, log,
                        progress)
from ..engines.sglang.defaults import DEFAULT_BATCH_SIZES
from ..engines.sglang.model_flags import add_model_flags
from .inputs import load_shipped as _load_shipped
from .inputs import parse_batch_sizes
from .inputs import quant_of as _quant_of
from .inputs import resolve_shape as _resolve_shape
from .tuner.events import Done, Error, Event, Fatal, Log, Progress


def add_arguments(p) -> None:
    """Register the ``tune`` flags on an argparse parser: the model flags
    (:func:`remote.engines.sglang.model_flags.add_model_flags`) and the tuner's own."""
    add_model_flags(p, "tune")
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)))
    p.add_argument("--space", choices=SEARCH_SPACES, default=DEFAULT_SEARCH_SPACE)
    p.add_argument("--out", default="tune-out")
    p.add_argument("--provider", choices=PROVIDER_NAMES, default=DEFAULT_PROVIDER)
    p.add_argument("--gpus", default="all", help="'all' or comma-separated CUDA indices")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--no-check", action="store_true", help="skip the float64 check of tuned configs")
    p.add_argument("--shipped-config", default=None,
                   help="shipped up config file to compare with (its _down twin is used if present)")
    p.add_argument("--compile-mode", choices=("auto", "target", "context"), default="auto",
                   help="auto/target: compile candidates for the GPU's target in CPU processes without CUDA "
                        "(fallback: context, the reason in the report); context: worker processes with a CUDA "
                        "context (their number capped by GPU memory)")
    p.add_argument("--prepared", default=None,
                   help="a prepared folder (python -m remote prepare, before the stop): its compiled candidates are "
                        "used when its manifest matches this GPU, Triton, engine and shape; else refused, naming why")
    p.add_argument("--screen", choices=("adaptive", "fixed"), default="adaptive",
                   help="fast search's screening: adaptive (a graph of fewer calls for candidates slower than "
                        "100 us, each replay about 1 ms) or fixed (a graph of 10 calls, 3 replays)")






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


def _compile_info(per_m: dict, resumed: list) -> dict | None:
    """How candidates were compiled (the last batch size's compiler stats: mode, workers,
    fallback reason, compile requests sent)."""
    last = [r.get("compile") for M, r in sorted(per_m.items(), key=lambda kv: int(kv[0]))
            if int(M) not in resumed and r.get("compile")]
    return last[-1] if last else None


def _take_prepared(path: str | None, provider, sglang_info, shape, dtype, sel, quant, cpu: bool, devices,
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
    engine = {"provider": provider.name, "version": sglang_info["version"] if sglang_info else payload_version}
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
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    shape, naming = _resolve_shape(args)
    from .support import resolve_provider_name
    quant = _quant_of(naming, resolve_provider_name(args.provider)[0])
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

    from ..engines.sglang.naming import config_file_name, sglang_device_name
    torch_name = args.device_name or (None if cpu else torch.cuda.get_device_name(torch.device(devices[0])))
    if not torch_name:
        raise PayloadError("bad_input", "no GPU: --device-name is required to name the files")
    device_name = sglang_device_name(torch_name)
    sel = dict(dtype=naming["dtype_selector"], block_shape=naming["block_shape"],
               per_channel_quant=naming["per_channel_quant"])
    names = {"up": config_file_name(shape["E"], shape["N"], device_name, **sel),
             "down": config_file_name(shape["E"], shape["N"], device_name, down=True, **sel)}

    from .providers import get_provider
    provider = get_provider(args.provider)
    shipped = _load_shipped(args.shipped_config)
    sglang_info = None
    if provider.name == "sglang":
        sglang_info = provider.describe()
        block = naming["block_shape"]
        kblock = [0, naming["group_size"]] if naming.get("group_size") else block  # as the server passes it
        sglang_info["file_names"] = provider.k.file_names(shape["E"], shape["N"], naming["dtype_selector"], kblock,
                                                          bool(naming["per_channel_quant"]))
        if not cpu and sglang_info["file_names"]["up"] != names["up"]:
            log(f"SGLang {provider.k.version} names the up file {sglang_info['file_names']['up']!r}, orch "
                f"{names['up']!r}: the server would not read orch's file", "warning")
        if shipped is None:
            # the configs the server would load now: the baseline to beat and the tie preference
            inst = provider.k.installed_configs(shape["E"], shape["N"], naming["dtype_selector"], kblock,
                                                bool(naming["per_channel_quant"]))
            if inst:
                shipped = dict(inst, path="SGLang get_moe_configs (installed tree or SGLANG_MOE_CONFIG_DIR)",
                               down_path=None)
        provider.close()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prep = _take_prepared(getattr(args, "prepared", None), provider, sglang_info, shape, dtype, sel, quant, cpu,
                          devices, triton.__version__)
    from .tuner import checkpoint
    key, key_id = checkpoint.run_key(shape=shape, dtype=dtype, naming=sel, space=args.space, device=device_name,
                                     triton=triton.__version__, provider=provider.name, seed=args.seed,
                                     sglang=sglang_info["version"] if sglang_info else None,
                                     payload=PAYLOAD_VERSION, interpret=cpu)
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
                check=not args.no_check, compile_mode=getattr(args, "compile_mode", "auto"),
                screen=getattr(args, "screen", "adaptive"), prepared=prep.pop("idents", None))
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
    up = {str(M): done[str(M)]["up"] for M in batch_sizes}
    down = {str(M): dict(done[str(M)]["down"], BLOCK_SIZE_M=done[str(M)]["up"]["BLOCK_SIZE_M"]) for M in batch_sizes}
    paths = {"up": out / names["up"], "down": out / names["down"]}
    for k in ("up", "down"):
        atomic_write(str(paths[k]), dumps_config(up if k == "up" else down).encode("utf-8"))
    per_m = {str(M): done[str(M)] for M in batch_sizes}
    report = {
        "payload_version": PAYLOAD_VERSION, "provider": provider.name, "triton_version": triton.__version__,
        "torch_version": torch.__version__, "device_name": device_name, "torch_device_name": torch_name,
        "devices": devices, "interpret": cpu,
        "timing": ("wall-clock medians under TRITON_INTERPRET=1: meaningless for performance" if cpu else
                   "CUDA graph of 10 calls, L2 flushed, median of 10 replays; " +
                   ("whole fused MoE = SGLang's fused_experts reading the candidate files (alignment, up GEMM, "
                    "activation, down GEMM, top-k sum)" if provider.name == "sglang" else
                    "whole fused MoE with alignment precomputed (up GEMM + SiLU-mul + down GEMM + top-k sum)")),
        "shape": shape, "dtype": dtype, "quant": quant, "naming": naming, "space": args.space, "seed": args.seed,
        "files": {k: str(v) for k, v in paths.items()},
        "shipped": ({"path": shipped["path"], "down_path": shipped["down_path"]} if shipped else None),
        "checkpoint_key": key_id, "resumed": resumed, "batch_sizes": per_m,
        "sglang": sglang_info, "provider_fallback_reason": getattr(provider, "fallback_reason", None),
        "wall_s": round(time.time() - t0, 3), "time_split": total_split(per_m, resumed),
        "compile": _compile_info(per_m, resumed),
        "triton_cache": {"dir": cache["cache"], "moved_aside": cache["moved_aside"]},
        "prepared": prep,
    }
    rpath = out / "report.json"
    atomic_write(str(rpath), (json.dumps(report, indent=1, sort_keys=True, default=str) + "\n").encode("utf-8"))
    return {
        "files": {k: str(v) for k, v in paths.items()}, "report": str(rpath), "provider": provider.name,
        "provider_fallback_reason": getattr(provider, "fallback_reason", None),
        "sglang_version": sglang_info["version"] if sglang_info else None,
        "batch_sizes": batch_sizes, "space": args.space, "device_name": device_name,
        "triton_version": triton.__version__, "resumed": resumed,
        "triton_cache": {"dir": cache["cache"], "moved_aside": cache["moved_aside"]},
        "prepared": prep, "wall_s": report["wall_s"], "time_split": report["time_split"],
        "speedup_vs_default": {str(M): done[str(M)].get("speedup_vs_default") for M in batch_sizes},
        "speedup_vs_shipped": ({str(M): done[str(M)].get("speedup_vs_shipped") for M in batch_sizes}
                               if shipped else None),
    }
