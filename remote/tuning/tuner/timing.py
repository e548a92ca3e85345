"""Kernel timing: CUDA graphs with L2 flushes on a GPU, wall clock under the interpreter.

GPU protocol (:meth:`Timer.time`): the callable is launched once eagerly (loads/compiles
the kernel), captured ``n_calls`` times into one CUDA graph, the graph is replayed once
untimed, then ``reps`` times, each replay preceded by an L2 flush (a write over a buffer
twice the L2 size) and bracketed by CUDA events; the result is the median replay time
divided by ``n_calls``, in microseconds. This is SGLang's tuner protocol (graph of 10
calls, L2 flushed, 10 replays) with a median. Before the first measurement in a process,
:meth:`Timer.warm_up` captures and replays throw-away graphs (on the H200 the first few
graphs of a process replayed about 5% fast at M=1, docs/benchmarks.md "What kernel time means").

Adaptive screening (``replay_us``): a screening measurement only ranks candidates, and a
graph of 10 calls of a slow candidate (int4 candidates at M=3072 averaged about 10 ms per run)
costs 41 runs of it. With ``replay_us`` set, a graph of one call, replayed after an L2 flush and timed with CUDA
events, gives the candidate's time t; the graph then holds ``ceil(replay_us / t)`` calls (at most ``n_calls``,
at least 1), so every replay lasts about ``replay_us`` or longer. Fast kernels (t below
``replay_us / n_calls``) keep the full graph; the final measurements use the fixed protocol, except
for kernels the search already measured slower than :data:`SLOW_CALL_US` (a graph of 10 such calls,
replayed 11 times, costs over 100 runs of a multi-millisecond kernel): they keep 10 replays of a
graph of ``ceil(`` :data:`SLOW_REPLAY_US` ``/ t)`` calls (``remote.tuning.tuner.search``).

Race cut-off (``cutoff_us``): a screening measurement of a candidate whose one call (above) already
took longer than ``cutoff_us`` stops there and returns that one call's time: the search sets the
cut-off well above the time to beat (``search.RACE``), so such a candidate cannot win, and ranking
it needs no more runs (``TimerStats.race_stopped``).

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
    #: adaptive screening: calls whose graph was shortened, and the graph calls saved
    shortened: int = 0
    calls_saved: int = 0
    #: measurements stopped after one call by the race cut-off (``cutoff_us``)
    race_stopped: int = 0
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

    def time(self, fn, n_calls: int = 10, reps: int = 10, replay_us: float | None = None,
             cutoff_us: float | None = None) -> float:
        """Median time of one call of ``fn`` in microseconds (see module docstring).

        ``replay_us``: adaptive screening on a GPU (module docstring): the graph holds
        ``min(n_calls, ceil(replay_us / t))`` calls, t being one call timed as a graph of one (µs); None:
        always ``n_calls``. Ignored on the CPU.
        ``cutoff_us``: with ``replay_us``, stop after the one-call measurement when t exceeds it and
        return t (module docstring, "Race cut-off"); ignored on the CPU and without ``replay_us``.
        Exceptions from ``fn`` (compile errors, OutOfResources) propagate; the caller
        decides to skip the candidate.
        """
        t0 = time.perf_counter()
        try:
            if self.cuda:
                return self._time_cuda(fn, n_calls, reps, replay_us, cutoff_us)
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

    def _time_cuda(self, fn, n_calls: int, reps: int, replay_us: float | None = None,
                   cutoff_us: float | None = None) -> float:
        with torch.cuda.device(self.device):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            self.stats.first_s += time.perf_counter() - t0
            if replay_us:
                one = self._one_call_us(fn)
                if cutoff_us is not None and one > cutoff_us:
                    self.stats.race_stopped += 1
                    return one
                n = graph_calls(one, n_calls, replay_us)
                if n < n_calls:
                    self.stats.shortened += 1
                    self.stats.calls_saved += n_calls - n
                n_calls = n
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

    def _one_call_us(self, fn) -> float:
        """One call of ``fn`` after an L2 flush, as a graph of one call timed with CUDA events (µs).

        A graph, not an eager call: between two events around an eager call the GPU also waits
        for the launch code on the CPU (SGLang's ``invoke_fused_moe_kernel`` takes 100 µs or
        more of Python), which made 15 µs kernels look slow (H200, 2026-12-03: graphs at M=1
        were shortened)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool, stream=stream):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._flush.zero_()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        del g
        return start.elapsed_time(end) * 1e3


def graph_calls(one_call_us: float, n_calls: int, replay_us: float) -> int:
    """Calls per graph for adaptive screening: enough that a replay lasts ``replay_us`` (µs)
    given one call of ``one_call_us`` (µs), at most ``n_calls``, at least 1."""
    import math
    if not one_call_us or one_call_us <= 0:
        return n_calls
    return max(1, min(n_calls, math.ceil(replay_us / one_call_us)))


# the slow-kernel protocol's thresholds live with the torch-free floor rules (floor.py), where the
# search (imported by the torch-free tune command) reads them too
from .floor import SLOW_CALL_US, SLOW_REPLAY_US  # noqa: E402,F401
