"""Parallel ahead-of-time compilation of candidate configs on the host's CPU cores.

Compilation dominates a search: on the H200 host the ``full`` space's 2512 GEMM candidates of one
batch size took 55.9 s to compile on 15 processes against 16.1 s of timing (docs/benchmarks.md
section 3, run 2; bench/results/h200-2026-11-29/run2_log.txt). Triton compiles for a signature and
device without launching (``JITFunction.warmup``), and its on-disk cache (``TRITON_CACHE_DIR``,
default ``~/.triton/cache``) is shared by processes, so worker processes compile and the timing
process then loads binaries. Two ways to compile, one interface:

- :class:`TargetCompiler` (default where it works): the timing process captures each candidate's
  compile request from the kernel's own launch code (the provider's ``kernel_specs``) and CPU
  processes that never create a CUDA context compile it for the GPU's target
  (:mod:`remote.tuning.tuner.aot`); parallelism follows the host's CPU cores.
- :class:`Compiler` (the fallback, and ``--compile-mode context``): worker processes with a CUDA
  context each run the provider's ``compile_target`` (e.g.
  :func:`remote.tuning.providers.builtin.compile_one`), which launches in compile-only mode;
  for SGLang's kernel each holds the problem's buffers on the GPU, so their number follows GPU memory.

This module knows no provider. Under TRITON_INTERPRET=1 nothing is compiled.
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


#: what a compile worker's error text starts with or holds when Triton's compiler refused the kernel
#: for the kernel's own IR (its MLIR pass pipeline; a ``static_assert`` of the kernel), whatever process
#: compiles it; not ``CompilationError`` in general, which also wraps a Python error of the worker's own
#: module globals (a failure of the worker, which the timing process may not have)
COMPILER_REFUSALS = ("PassManager::run failed", "CompileTimeAssertionFailure")


def compiler_refused(err: str) -> bool:
    """Whether a compile worker's error text ``err`` (``"ExcType: message"``, as the providers'
    ``compile_one`` return it) is Triton's compiler refusing the kernel: the same compile in the timing
    process would fail the same way (:data:`COMPILER_REFUSALS`)."""
    return any(mark in err for mark in COMPILER_REFUSALS)


def _finished_error(fut) -> str | None:
    """The error text of a compile future that has finished and failed, else None (still running,
    cancelled, compiled, or the pool broke: no answer about the kernel). Never waits."""
    if fut is None or not fut.done() or fut.cancelled():
        return None
    try:
        ok, text = fut.result()
    except Exception:  # noqa: BLE001 - a broken pool is no refusal
        return None
    return None if ok else text


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
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.fallback_reason: str | None = None
        if self.enabled:
            n = self.workers
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

    def refused(self, kind: str, cfg: dict, M: int | None = None) -> str | None:
        """The error text of a finished compile of ``(kind, cfg)`` (at ``M`` when ``per_batch``) that
        Triton's compiler refused (:func:`compiler_refused`), else None (not sent, still running,
        compiled, or failed otherwise). Never waits."""
        from .space import cfg_key
        key = (kind, cfg_key(cfg))
        err = self.failed.get(key) or _finished_error(self._futures.get(key + ((M,) if self.per_batch else ())))
        return err if err and compiler_refused(err) else None

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

    mode = "context"

    def stats(self) -> dict:
        """What the tune report records about compilation (see :meth:`TargetCompiler.stats`)."""
        return {"mode": self.mode if self.enabled else "none", "workers": self.workers if self.enabled else None,
                "fallback_reason": self.fallback_reason, "sent": len(self.done), "capture_s": 0.0,
                "wait_s": round(self.seconds, 3)}

    def close(self):
        """Shut the pool down."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _compile_job(specs):
    from .aot import compile_specs
    return compile_specs(specs)


class TargetCompiler:
    """Compiles for the GPU's target in CPU-only worker processes (:mod:`remote.tuning.tuner.aot`),
    with :class:`Compiler`'s interface (``submit``/``wait``/``compile``/``close``, ``seconds``,
    ``failed``, ``enabled``).

    ``bind(provider, problem)`` (the Evaluator does it per batch size) names what a job's compile
    request is captured from: ``provider.kernel_specs(problem, kind, cfg) -> [KernelSpec]``, run
    in this (timing) process. A compile request seen before (same kernel, specialisation and
    options, e.g. the same GEMM at two batch sizes of one class) is not sent again.
    ``workers``: process count (default: CPU cores - 1, at least 1). ``fallback``: a
    zero-argument factory of the :class:`Compiler` to use from then on when a capture fails
    (``fallback_reason`` says why; it goes to the tune report). Stats: ``seconds`` (time waiting
    for compiles), ``capture_s`` (time capturing), ``sent`` (compile requests sent), ``mode``
    (``"target"``, or ``"context"`` after a fallback).

    ``prepared``: identities (:meth:`~.aot.KernelSpec.ident`) of compile requests already
    compiled into this process's Triton cache before the unit stopped (``python -m remote
    prepare``, :mod:`.prepared`): such a request is not sent again (``prepared_jobs`` counts the jobs
    whose requests were all prepared, ``sent`` the rest), and the worker processes are started
    without waiting for them, so the first launches of prepared kernels go on while they start (on
    the H200 the wait for 15 workers took about 20 s, docs/benchmarks.md §4.8).
    """

    mode = "target"

    def __init__(self, workers: int | None = None, fallback=None, prepared=None):
        self.workers = workers or max(1, (os.cpu_count() or 2) - 1)
        self.enabled = True
        self.failed: dict = {}
        self.seconds = 0.0
        self.capture_s = 0.0
        self.sent = 0
        self.fallback_reason: str | None = None
        self._fallback_factory = fallback
        self._inner: Compiler | None = None
        self._capture = None
        self._M = None
        self._specs: dict = {}  # spec ident -> future
        self._job_specs: dict = {}  # (kind, cfg_key) -> the spec idents its launch compiles
        self.notes: set = set()
        self._worker_fails = 0
        self._worker_oks = 0
        self.launch_hits = 0
        self.launch_compiles = 0
        self._names: set = set()
        self.prepared = 0
        self.prepared_jobs = 0
        self._pool = None
        if prepared is not None:
            done = cf.Future()
            done.set_result((True, ""))
            self._specs = {ident: done for ident in prepared}
            self.prepared = len(self._specs)
        self._ensure_pool(wait=prepared is None)
        self._listen()

    def _ensure_pool(self, wait: bool = True):
        """The worker pool, started now if it is not yet (``wait``: until every worker is up)."""
        if self._pool is None:
            from .aot import worker_init
            self._pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                                initializer=worker_init)
            self._start_workers(wait)
        return self._pool

    def _start_workers(self, wait: bool = True) -> None:
        """Start every worker now with no GPU visible from its first instruction (a site hook that
        imports torch runs before the initializer). This process's CUDA is initialised already
        (the timer's buffers), so the environment change for the spawn does not reach it. Each
        ``submit`` spawns its process before it returns (a spawned pool starts one per job while
        none is idle), so the environment holds for every worker also without ``wait``."""
        from .aot import HIDE_GPUS
        saved = {k: os.environ.get(k) for k in HIDE_GPUS}
        os.environ.update(HIDE_GPUS)
        try:
            futs = [self._pool.submit(os.getpid) for _ in range(self.workers)]
            for f in futs if wait else ():
                f.result()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _listen(self) -> None:
        """Count, in this process, launches of kernels sent to the workers that found their binary
        in Triton's cache (``launch_hits``) or compiled it (``launch_compiles``: the workers'
        artifact did not match the launch's key); Triton's compilation listener, where it has one."""
        try:
            from triton import knobs
            before = knobs.compilation.listener
        except Exception:
            return

        def listener(src=None, cache_hit=None, **kw):
            name = getattr(getattr(src, "fn", None), "fn", None)
            if name is not None and f"{name.__module__}:{name.__qualname__}" in self._names:
                if cache_hit:
                    self.launch_hits += 1
                else:
                    self.launch_compiles += 1
            if before is not None:
                before(src=src, cache_hit=cache_hit, **kw)
        knobs.compilation.listener = listener
        self._unlisten = lambda: setattr(knobs.compilation, "listener", before)

    def bind(self, provider, problem) -> None:
        """Capture compile requests from ``provider.kernel_specs(problem, kind, cfg)`` from now on."""
        self._capture = lambda kind, cfg: provider.kernel_specs(problem, kind, cfg)

    def _fall_back(self, why: str) -> None:
        import sys
        self.fallback_reason = why
        print(f"orch tune: compiling for the GPU target off the GPU is not possible here ({why}); "
              "compiling in worker processes with a CUDA context", file=sys.stderr)
        self.mode = "context"
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._inner = self._fallback_factory() if self._fallback_factory else None
        self.enabled = self._inner is not None and self._inner.enabled

    def submit(self, jobs, M: int | None = None) -> dict:
        """Capture each job's compile request here and send the new ones to the pool; returns
        ``{(kind, cfg_key): future}`` for jobs with a compile under way (see :meth:`Compiler.submit`)."""
        import time

        from .aot import CaptureError
        from .space import cfg_key
        if self._inner is None and self.launch_compiles >= 8 and not self.launch_hits:
            self._fall_back(f"binaries compiled off the GPU missed the launch's cache key ({self.launch_compiles} "
                            "launches compiled, none found its binary)")
        if self._inner is not None:
            return self._inner.submit(jobs, M)
        if not self.enabled or self._capture is None:
            return {}
        out = {}
        jobs = list(jobs)
        for i, (kind, cfg) in enumerate(jobs):
            t0 = time.perf_counter()
            try:
                specs = self._capture(kind, cfg)
            except CaptureError as exc:
                self.capture_s += time.perf_counter() - t0
                self._fall_back(str(exc))
                rest = jobs[i:]
                return dict(out, **self._inner.submit(rest, M)) if self._inner is not None else out
            except Exception as exc:  # a config SGLang's launch code rejects: its launch will say so
                self.capture_s += time.perf_counter() - t0
                self.failed[(kind, cfg_key(cfg))] = f"{type(exc).__name__}: {str(exc)[:300]}"
                continue
            self.capture_s += time.perf_counter() - t0
            new = [s for s in specs if s.ident() not in self._specs]
            if self.prepared and specs and not new:
                self.prepared_jobs += 1
                self._names.update(s.fn for s in specs)  # their first launches count as hits or compiles
            if new:
                try:
                    fut = self._ensure_pool().submit(_compile_job, new)
                except (cf.process.BrokenProcessPool, RuntimeError) as exc:
                    self._fall_back(f"CPU compile workers unavailable: {type(exc).__name__}: {exc}")
                    return out
                self.sent += len(new)
                for s in new:
                    self._specs[s.ident()] = fut
                    self._names.add(s.fn)
            self._job_specs[(kind, cfg_key(cfg))] = [s.ident() for s in specs]
            # a job waits on the last of its compiles still under way (one GEMM launch compiles one kernel)
            pending = [f for f in (self._specs[s.ident()] for s in specs) if not f.done()]
            if pending:
                out[(kind, cfg_key(cfg))] = pending[-1]
        return out

    def refused(self, kind: str, cfg: dict, M: int | None = None) -> str | None:
        """As :meth:`Compiler.refused`: the error text of a finished compile of one of the kernels
        ``(kind, cfg)``'s launch compiles that Triton's compiler refused, else None. Never waits."""
        from .space import cfg_key
        if self._inner is not None:
            return self._inner.refused(kind, cfg, M)
        key = (kind, cfg_key(cfg))
        err = self.failed.get(key) or next(
            (e for e in (_finished_error(self._specs.get(i)) for i in self._job_specs.get(key, ())) if e), None)
        return err if err and compiler_refused(err) else None

    def wait(self, key, fut) -> str | None:
        """Wait for one job of :meth:`submit`; its error text, or None."""
        import time
        t0 = time.perf_counter()
        try:
            ok, err = fut.result()
        except cf.CancelledError:  # sent before a fallback: its launch compiles it
            ok, err = True, ""
        except cf.process.BrokenProcessPool as exc:
            if self._inner is None:
                self._fall_back(f"CPU compile workers died: {exc}")
            else:
                self._inner._broken(exc)
            ok, err = True, ""
        self.seconds += time.perf_counter() - t0
        if not ok:
            self.failed[key] = err
            self._worker_fails += 1
            if self._inner is None and self._worker_fails >= 8 and not self._worker_oks:
                self._fall_back(f"the CPU compile workers failed every compile ({self._worker_fails}), e.g. {err}")
            return err
        self._worker_oks += 1
        if err:  # compiled, with a note (e.g. the kernel module initialised CUDA on import)
            self.notes.add(err)
        return None

    def compile(self, jobs, M: int | None = None):
        """Compile ``jobs`` and wait for all; ``{(kind, cfg_key): error_text}`` of the failed ones."""
        fails = {}
        for key, fut in self.submit(jobs, M).items():
            err = self.wait(key, fut)
            if err:
                fails[key] = err
        return fails

    def stats(self) -> dict:
        """What the tune report records about compilation."""
        return {"mode": self.mode, "workers": self.workers if self._inner is None else None,
                "fallback_reason": self.fallback_reason, "sent": self.sent, "failed": len(self.failed),
                "prepared": self.prepared, "prepared_jobs": self.prepared_jobs,
                "pool_started": self._pool is not None or self._inner is not None,
                "launch_cache_hits": self.launch_hits, "launch_compiles": self.launch_compiles,
                "notes": sorted(self.notes),
                "capture_s": round(self.capture_s, 3), "wait_s": round(self.seconds + (self._inner.seconds
                                                                                        if self._inner else 0), 3)}

    def close(self):
        """Shut the pools down (and restore Triton's compilation listener)."""
        unlisten = getattr(self, "_unlisten", None)
        if unlisten is not None:
            unlisten()
            self._unlisten = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._inner is not None:
            self._inner.close()

