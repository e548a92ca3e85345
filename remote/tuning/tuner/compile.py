"""Parallel ahead-of-time compilation of candidate configs on the host's CPU cores.

Compilation dominates a search: on the H200 host the ``full`` space's 2512 GEMM candidates of one
batch size took 55.9 s to compile on 15 processes against 16.1 s of timing (docs/benchmarks.md
section 3, run 2; bench/results/h200-2026-11-29/run2_log.txt). Triton compiles for a signature and
device without launching (``JITFunction.warmup``), and its on-disk cache (``TRITON_CACHE_DIR``,
default ``~/.triton/cache``) is shared by processes, so worker processes compile and the timing
process then loads binaries. What a job compiles is the provider's (its ``compile_target``, e.g.
:func:`remote.tuning.providers.builtin.compile_one`); this module knows no provider. Under
TRITON_INTERPRET=1 nothing is compiled.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os


def _init_worker(device_index: int):
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch
    torch.cuda.set_device(device_index)


def _resolve(target: str):
    mod, _, attr = target.partition(":")
    import importlib
    return getattr(importlib.import_module(mod), attr)


def _run_target(target: str, kind: str, cfg: dict, args: dict):
    return _resolve(target)(kind, cfg, **args)


class Compiler:
    """A pool of spawned processes compiling (kind, cfg) jobs for one shape.

    ``args``: picklable keyword arguments of the compile function; ``target``:
    ``"module:function"`` of it (the provider's ``compile_target``), called as
    ``fn(kind, cfg, **args)`` in a worker and returning ``(ok, error_text)``; with
    ``per_batch`` the batch size is one more argument (``M=...``; kernels specialised on
    M-dependent integers, like SGLang's, compile per batch size).
    ``workers``: process count (default: CPU cores - 1, at least 1); ``device_index``:
    the CUDA device whose architecture is compiled for. ``compile(jobs, M=...)`` waits and
    returns ``{(kind, cfg_key): error_text}`` for the jobs that failed; ``submit``/``wait``
    let the caller time finished configs while the others still compile. ``seconds``:
    time spent waiting for compiles. With ``enabled=False`` (CPU/interpreter) it does
    nothing.
    """

    def __init__(self, args: dict | None, target: str, device_index: int = 0, workers: int | None = None,
                 enabled: bool = True, per_batch: bool = False):
        self.args = args
        self.target = target
        self.per_batch = per_batch
        self.enabled = enabled and args is not None
        self.done: set = set()
        self.failed: dict = {}
        self.seconds = 0.0
        self._futures: dict = {}
        self._pool = None
        if self.enabled:
            n = workers or max(1, (os.cpu_count() or 2) - 1)
            self._pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"),
                                                initializer=_init_worker, initargs=(device_index,))

    def submit(self, jobs, M: int | None = None) -> dict:
        """Start compiling ``jobs`` (iterable of ``(kind, cfg)``) in the pool without waiting;
        jobs done or under way before (per batch size ``M`` when ``per_batch``) are not sent
        again. Returns ``{(kind, cfg_key): future}`` for the jobs of this call that are still
        running or were sent now (a finished one has no entry); the futures give
        ``(ok, error_text)``."""
        if not self.enabled:
            return {}
        out = {}
        args = dict(self.args, M=M) if self.per_batch else self.args
        try:
            return self._submit(jobs, M, args, out)
        except cf.process.BrokenProcessPool as exc:
            self._broken(exc)
            return {}

    def _submit(self, jobs, M, args, out) -> dict:
        from .space import cfg_key
        for kind, cfg in jobs:
            key = (kind, cfg_key(cfg))
            done_key = key + ((M,) if self.per_batch else ())
            fut = self._futures.get(done_key)
            if fut is None and done_key not in self.done:
                self.done.add(done_key)
                fut = self._pool.submit(_run_target, self.target, kind, cfg, args)
                self._futures[done_key] = fut
            if fut is not None and not fut.done():
                out[key] = fut
        return out

    def _broken(self, exc: BaseException) -> None:
        """The pool died (a worker could not start, e.g. no room for one more CUDA context):
        compile no more ahead of time; each config then compiles at its first launch, in the
        timing process (slower, same result)."""
        import sys
        if self.enabled:
            print(f"orch tune: compile workers unavailable ({type(exc).__name__}: {str(exc)[:200]}); "
                  "compiling in the timing process", file=sys.stderr)
        self.enabled = False
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def wait(self, key, fut) -> str | None:
        """Wait for one job of :meth:`submit`; the error text when it failed, else None (also
        when the pool broke: see :meth:`_broken`)."""
        import time
        t0 = time.perf_counter()
        try:
            ok, err = fut.result()
        except cf.process.BrokenProcessPool as exc:
            self._broken(exc)
            ok, err = True, ""
        self.seconds += time.perf_counter() - t0
        if not ok:
            self.failed[key] = err
            return err
        return None

    def compile(self, jobs, M: int | None = None):
        """Compile ``jobs`` (iterable of ``(kind, cfg)``) in parallel and wait for all; skip
        ones done before (per batch size ``M`` when ``per_batch``). Returns
        ``{(kind, cfg_key): error_text}`` for the jobs of this call that failed."""
        futs = self.submit(jobs, M)
        fails = {}
        for key, fut in futs.items():
            err = self.wait(key, fut)
            if err:
                fails[key] = err
        return fails

    def close(self):
        """Shut the pool down."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
