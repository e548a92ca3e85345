"""Parallel ahead-of-time compilation of candidate configs on the host's CPU cores.

Compilation dominates a search (about one CPU-second per config on the H200 host,
facts/tuning-on-h200.md). Triton compiles for a signature and device without launching
(``JITFunction.warmup``), and its on-disk cache (``TRITON_CACHE_DIR``, default
``~/.triton/cache``) is shared by processes, so worker processes compile and the timing
process then loads binaries. Under TRITON_INTERPRET=1 nothing is compiled.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os


def _init_worker(device_index: int):
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch
    torch.cuda.set_device(device_index)


def compile_one(kind: str, cfg: dict, dtype: str, E: int, N: int, hidden: int, top_k: int, quant=None):
    """Compile the builtin GEMM for one (kind, cfg); ``quant`` as the tuner spec's entry
    (fp8_w8a8). Returns ``(ok, error_text)``; never raises."""
    try:
        import torch

        from ..kernel.fused_moe import precompile
        from ..providers.builtin import quant_spec
        td = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
        precompile(kind, td, E, N, hidden, top_k, cfg, quant_spec(quant))
        return True, ""
    except Exception as exc:  # a candidate that does not compile is skipped, not fatal
        return False, f"{type(exc).__name__}: {str(exc)[:300]}"


def _resolve(target: str):
    mod, _, attr = target.partition(":")
    import importlib
    return getattr(importlib.import_module(mod), attr)


def _run_target(target: str, kind: str, cfg: dict, args: dict):
    return _resolve(target)(kind, cfg, **args)


class Compiler:
    """A pool of spawned processes compiling (kind, cfg) jobs for one shape.

    ``args``: picklable keyword arguments of the compile function; ``target``:
    ``"module:function"`` of it, called as ``fn(kind, cfg, **args)`` and returning
    ``(ok, error_text)`` (default: :func:`compile_one`, the builtin kernel); with
    ``per_batch`` the batch size is one more argument (``M=...``; kernels specialised on
    M-dependent integers, like SGLang's, compile per batch size).
    ``workers``: process count (default: CPU cores - 1, at least 1); ``device_index``:
    the CUDA device whose architecture is compiled for. ``compile(jobs, M=...)`` returns
    ``{(kind, cfg_key): error_text}`` for the jobs that failed. With ``enabled=False``
    (CPU/interpreter) it does nothing.
    """

    def __init__(self, args: dict | None, device_index: int = 0, workers: int | None = None, enabled: bool = True,
                 target: str | None = None, per_batch: bool = False):
        self.args = args
        self.target = target
        self.per_batch = per_batch
        self.enabled = enabled and args is not None
        self.done: set = set()
        self.failed: dict = {}
        self.seconds = 0.0
        self._pool = None
        if self.enabled:
            n = workers or max(1, (os.cpu_count() or 2) - 1)
            self._pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"),
                                                initializer=_init_worker, initargs=(device_index,))

    def compile(self, jobs, M: int | None = None):
        """Compile ``jobs`` (iterable of ``(kind, cfg)``) in parallel; skip ones done before
        (per batch size ``M`` when ``per_batch``)."""
        import time

        from .space import cfg_key
        if not self.enabled:
            return {}
        todo = []
        for kind, cfg in jobs:
            key = (kind, cfg_key(cfg))
            done_key = key + ((M,) if self.per_batch else ())
            if done_key not in self.done:
                self.done.add(done_key)
                todo.append((key, kind, cfg))
        t0 = time.perf_counter()
        args = dict(self.args, M=M) if self.per_batch else self.args
        if self.target:
            futs = {self._pool.submit(_run_target, self.target, kind, cfg, args): key for key, kind, cfg in todo}
        else:
            futs = {self._pool.submit(compile_one, kind, cfg, **args): key for key, kind, cfg in todo}
        for f in cf.as_completed(futs):
            ok, err = f.result()
            if not ok:
                self.failed[futs[f]] = err
        self.seconds += time.perf_counter() - t0
        return {k: self.failed[k] for k, _, _ in todo if k in self.failed}

    def close(self):
        """Shut the pool down."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
