"""Kernel timing: CUDA graphs with L2 flushes on a GPU, wall clock under the interpreter.

GPU protocol (:meth:`Timer.time`): the callable is launched once eagerly (loads/compiles
the kernel), captured ``n_calls`` times into one CUDA graph, the graph is replayed once
untimed, then ``reps`` times, each replay preceded by an L2 flush (a write over a buffer
twice the L2 size) and bracketed by CUDA events; the result is the median replay time
divided by ``n_calls``, in microseconds. This is SGLang's tuner protocol (graph of 10
calls, L2 flushed, 10 replays) with a median. Before the first measurement in a process,
:meth:`Timer.warm_up` captures and replays throw-away graphs (on the H200 the first few
graphs of a process replayed about 5% fast at M=1, docs/benchmarks.md "What kernel time means").

CPU protocol (TRITON_INTERPRET=1): median wall clock of ``reps`` calls. These numbers
measure the Python interpreter of Triton, not a GPU: they mean nothing for performance and
exist only so the search logic runs in CI.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass
class TimerStats:
    """Accounting of one :class:`Timer`: seconds spent in ``time`` calls (wall clock,
    capture + replays + sync: the GPU time a search costs), the part of it spent in each
    call's first eager launch (``first_s``: loading the binary, from Triton's on-disk cache or by
    compiling it when no worker did, plus one run) and the number of calls."""
    seconds: float = 0.0
    first_s: float = 0.0
    calls: int = 0
    failures: int = 0
    errors: list = field(default_factory=list)


class Timer:
    """Times zero-argument callables on ``device`` (``"cuda:i"`` or ``"cpu"``)."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stats = TimerStats()
        self._flush = None
        self._pool = None
        self._warm = False
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 1024 * 1024)
            self._flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device=self.device)
            self._pool = torch.cuda.graph_pool_handle()

    def warm_up(self, fn, graphs: int = 5) -> None:
        """Capture and replay ``graphs`` throw-away graphs of ``fn`` (GPU only)."""
        if not self.cuda or self._warm:
            return
        first = self.stats.first_s
        for _ in range(graphs):
            self._time_cuda(fn, n_calls=10, reps=3)
        self.stats.first_s = first  # warm-up is not a candidate's first launch
        self._warm = True

    def time(self, fn, n_calls: int = 10, reps: int = 10) -> float:
        """Median time of one call of ``fn`` in microseconds (see module docstring).

        Exceptions from ``fn`` (compile errors, OutOfResources) propagate; the caller
        decides to skip the candidate.
        """
        t0 = time.perf_counter()
        try:
            if self.cuda:
                return self._time_cuda(fn, n_calls, reps)
            return self._time_cpu(fn, reps)
        finally:
            self.stats.seconds += time.perf_counter() - t0
            self.stats.calls += 1

    def _time_cpu(self, fn, reps: int) -> float:
        t0 = time.perf_counter()
        fn()
        self.stats.first_s += time.perf_counter() - t0
        ts = []
        for _ in range(max(1, reps)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    def _time_cuda(self, fn, n_calls: int, reps: int) -> float:
        with torch.cuda.device(self.device):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            self.stats.first_s += time.perf_counter() - t0
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool, stream=stream):
                for _ in range(n_calls):
                    fn()
            torch.cuda.synchronize()
            g.replay()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                self._flush.zero_()
                starts[i].record()
                g.replay()
                ends[i].record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
            del g
            return statistics.median(times) * 1e3 / n_calls
