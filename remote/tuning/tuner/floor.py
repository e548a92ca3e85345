"""Lower bounds on a candidate's kernel time (the floor), the GPU's ceilings, and the tune's time budget.

**The floor.** No config runs a GEMM faster than the bytes it must move over the memory bandwidth,
or the tensor-core work it issues over the peak throughput (``max`` of the two: the larger is the
floor; docs/benchmarks.md, "How a slow tune is bounded"). Per GEMM of SGLang's fused-MoE kernel
(one program per BLOCK_SIZE_M rows of the sorted, block-padded token list and BLOCK_SIZE_N
columns; the K loop in BLOCK_SIZE_K steps; programs past ``num_tokens_post_padded`` return at once):

- bytes (config-independent, each counted once: re-reads that L2 might serve are not counted):
  the weights of every expert that gets a row (``rows x cols x bits / 8``, plus the scales of the
  quantized formats), the activations read (``pairs x K`` for the down GEMM, ``M x K`` for the up
  GEMM: each token once) and the output written (``pairs x N``);
- tensor-core work (config-dependent): ``2 x P(BM) x ceil(N / BN) BN x ceil(K / BK) BK``
  multiply-adds, ``P(BM) = sum over experts of ceil(rows_e / BM) x BM`` the padded rows the
  programs compute (the MMA runs on whole tiles: padding rows and masked columns cost the same),
  at the dense peak of the format's MMA (bf16/fp16 for 16-bit activations and the weight-only
  int4/int8 formats, which dequantize to bf16; fp8/int8 for w8a8).

So a large BLOCK_SIZE_M at small M (``P(BM)`` many times the real rows) has a floor above the
time an already-measured candidate took: it cannot win and is not timed (:class:`Pruner`).
The floor is a lower bound only if the ceilings are upper bounds: :func:`device_ceilings` takes the
datasheet's peak numbers (:data:`NOMINAL`) and falls back to measured ones times
:data:`MEASURED_SLACK`. A candidate is pruned only when its floor exceeds the time to beat by
more than :data:`FLOOR_MARGIN` (measurement noise of the time it is compared with).

**The budget** (``orch_tune_budget``, ``tune --budget``: seconds of GPU timing per GPU, i.e. the
timer's own seconds: captures, replays, first launches): :func:`allocate` splits what is left over
the batch sizes still to tune by their expected cost (:func:`cost_weight`); unused seconds pass to
the next batch size. :class:`Budget` is one batch size's share: the search checks it between
candidates and stops screening or refining when a stage's part of it is spent; what it cut is
counted and reported (``budget`` in each batch size's report entry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: A kernel the search measured slower than this (µs) keeps 10 replays in the full protocol but a
#: graph of fewer calls (``remote.tuning.tuner.timing``'s module docstring).
SLOW_CALL_US = 1000.0
#: ... so that each replay of its graph lasts about this long (µs).
SLOW_REPLAY_US = 10000.0

#: A candidate is pruned only when its floor exceeds the time to beat by more than this fraction.
FLOOR_MARGIN = 0.02

#: Dense peaks by device name (SGLang's device-name form or torch's), datasheet numbers: bytes/s of
#: memory bandwidth, FLOP/s of dense tensor-core work per MMA class. NVIDIA H200 SXM: 4.8 TB/s HBM3e,
#: 989 TFLOP/s bf16, 1979 TFLOP/s fp8/int8 (H200 datasheet); H100 SXM: 3.35 TB/s, the same rates;
#: A100 SXM 80 GB: 2.039 TB/s, 312 TFLOP/s bf16, 624 TOP/s int8, no fp8.
NOMINAL = {
    "H200": {"bw": 4.8e12, "bf16": 989e12, "fp8": 1979e12, "int8": 1979e12},
    "H100": {"bw": 3.35e12, "bf16": 989e12, "fp8": 1979e12, "int8": 1979e12},
    "A100": {"bw": 2.039e12, "bf16": 312e12, "fp8": 312e12, "int8": 624e12},
}
#: Measured ceilings (a device copy, a bf16 matmul) are what torch reached, not what a kernel cannot
#: pass: they are multiplied by this before they bound anything.
MEASURED_SLACK = 1.5


@dataclass(frozen=True)
class Ceilings:
    """What no kernel on the device exceeds: ``bw`` bytes/s, ``flops`` {mma class: FLOP/s} for
    ``bf16`` (16-bit and weight-only formats), ``fp8`` and ``int8``; ``source`` says where they
    come from (a datasheet row of :data:`NOMINAL`, or a measurement)."""

    bw: float
    flops: dict
    source: str

    def to_dict(self) -> dict:
        """JSON-able (bytes/s and FLOP/s)."""
        return {"bw": self.bw, "flops": dict(self.flops), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> "Ceilings":
        """Inverse of :meth:`to_dict` (the tuner spec's ``ceilings`` override, e.g. in CPU tests)."""
        return cls(float(d["bw"]), {k: float(v) for k, v in d["flops"].items()}, str(d.get("source", "given")))


def nominal(device_name: str | None) -> Ceilings | None:
    """The datasheet ceilings of :data:`NOMINAL` whose key the device name contains, else None."""
    name = (device_name or "").upper()
    for key, v in NOMINAL.items():
        if key in name:
            return Ceilings(v["bw"], {k: v[k] for k in ("bf16", "fp8", "int8")}, f"nominal {key} datasheet")
    return None


def measure(device: str) -> Ceilings:
    """Ceilings from a device-to-device copy (bytes read + written over its time) and a bf16
    matmul of 8192^3, each the best of 3 after a warm-up, times :data:`MEASURED_SLACK` (about
    40 ms of GPU time on an H200). fp8/int8 are taken as twice bf16 (Hopper's ratio)."""
    import torch
    dev = torch.device(device)
    n = 1 << 28
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)

    def best(fn):
        fn()
        ts = []
        for _ in range(3):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize(dev)
            ts.append(s.elapsed_time(e) / 1e3)
        return min(ts)

    bw = 2 * n / best(lambda: b.copy_(a))
    fl = 2 * 8192 ** 3 / best(lambda: x @ x)
    del a, b, x
    return Ceilings(bw * MEASURED_SLACK, {"bf16": fl * MEASURED_SLACK, "fp8": 2 * fl * MEASURED_SLACK,
                                          "int8": 2 * fl * MEASURED_SLACK},
                    f"measured x {MEASURED_SLACK} (copy {bw / 1e12:.2f} TB/s, bf16 matmul {fl / 1e12:.0f} TFLOP/s)")


def device_ceilings(device: str, device_name: str | None = None) -> Ceilings | None:
    """The ceilings for ``device`` (``cuda:i``): nominal by name, else measured; None on the CPU."""
    if not str(device).startswith("cuda"):
        return None
    if device_name is None:
        import torch
        device_name = torch.cuda.get_device_name(torch.device(device))
    return nominal(device_name) or measure(device)


@dataclass(frozen=True)
class GemmShape:
    """What the floor of one problem needs (a provider's ``floor_inputs``): ``E`` experts, ``N``
    (intermediate per expert, logical: the down GEMM's K), ``hidden`` (K of the up GEMM), ``M``
    tokens, ``counts`` rows per expert (len E), ``w_bits`` bits per weight (16, 8, 4), ``a_bytes``
    bytes per activation element (2 for bf16), ``mma`` (``bf16``, ``fp8``, ``int8``),
    ``scale_bytes``: bytes of weight scales per weight element (e.g. 2 / group for int4 groups),
    ``gated``: the up GEMM writes 2N columns (gate and up)."""

    E: int
    N: int
    hidden: int
    M: int
    counts: tuple
    w_bits: int = 16
    a_bytes: int = 2
    mma: str = "bf16"
    scale_bytes: float = 0.0
    gated: bool = True

    @property
    def pairs(self) -> int:
        """Token-expert rows the GEMMs compute (top-k times M, fused shared expert included)."""
        return int(sum(self.counts))

    def padded_rows(self, bm: int) -> int:
        """``P(BM)``: rows the kernel's programs compute for BLOCK_SIZE_M ``bm``."""
        return sum(-(-c // bm) * bm for c in self.counts if c)


def planned(g: GemmShape, M: int) -> GemmShape:
    """``g`` at batch size ``M`` with an even routing (``M x top-k`` rows over as many experts as
    they can reach): the shape :func:`cost_weight` plans a batch size's budget share with, before
    its problem exists."""
    k = max(1, round(g.pairs / max(1, g.M)))
    pairs = M * k
    active = min(g.E, pairs)
    base, extra = divmod(pairs, active)
    counts = tuple(base + (1 if i < extra else 0) for i in range(active)) + (0,) * (g.E - active)
    return GemmShape(E=g.E, N=g.N, hidden=g.hidden, M=M, counts=counts, w_bits=g.w_bits, a_bytes=g.a_bytes,
                     mma=g.mma, scale_bytes=g.scale_bytes, gated=g.gated)


class Floors:
    """Floors (µs) of one problem on a device: :meth:`gemm_us` per GEMM (``up``, ``down``, or
    ``joint`` = both with one config) and :meth:`whole_us` of an up/down pair."""

    def __init__(self, g: GemmShape, ceil: Ceilings):
        self.g, self.c = g, ceil
        active = sum(1 for c in g.counts if c)
        w_el = g.w_bits / 8.0 + g.scale_bytes
        n1 = (2 if g.gated else 1) * g.N
        self._bytes = {
            "up": active * n1 * g.hidden * w_el + g.M * g.hidden * g.a_bytes + g.pairs * n1 * g.a_bytes,
            "down": active * g.hidden * g.N * w_el + g.pairs * g.N * g.a_bytes + g.pairs * g.hidden * g.a_bytes,
        }
        self._dims = {"up": (n1, g.hidden), "down": (g.hidden, g.N)}
        self._padded: dict = {}

    def _gemm(self, kind: str, cfg: dict) -> float:
        bm, bn, bk = int(cfg["BLOCK_SIZE_M"]), int(cfg["BLOCK_SIZE_N"]), int(cfg["BLOCK_SIZE_K"])
        if bm not in self._padded:
            self._padded[bm] = self.g.padded_rows(bm)
        n, k = self._dims[kind]
        flops = 2.0 * self._padded[bm] * (-(-n // bn) * bn) * (-(-k // bk) * bk)
        peak = self.c.flops.get(self.g.mma) or self.c.flops["bf16"]
        return max(self._bytes[kind] / self.c.bw, flops / peak) * 1e6

    def gemm_us(self, kind: str, cfg: dict) -> float:
        """Floor of GEMM ``kind`` with ``cfg`` in µs (``joint``: up + down with the same config)."""
        if kind == "joint":
            return self._gemm("up", cfg) + self._gemm("down", cfg)
        return self._gemm(kind, cfg)

    def min_gemm_us(self, kind: str, bm: int) -> float:
        """The least floor of ``kind`` over every config with BLOCK_SIZE_M ``bm`` (tiles that divide
        N and K exactly): what the other GEMM at that BLOCK_SIZE_M costs at the very least."""
        cfg = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16)
        return self.gemm_us(kind, cfg)

    def whole_us(self, up: dict, down: dict) -> float:
        """Floor of the whole fused MoE with this pair (the two GEMMs; the rest only adds)."""
        return self._gemm("up", up) + self._gemm("down", down)

    def planned_whole_us(self) -> float:
        """The least whole-kernel floor over SGLang's BLOCK_SIZE_M values (16 to 256)."""
        return min(self.min_gemm_us("up", bm) + self.min_gemm_us("down", bm) for bm in (16, 32, 64, 128, 256))


class Pruner:
    """The floor rule of the search (module docstring): ``why(kind, cfg, best)`` says why a
    candidate cannot win, or None. ``best`` is the search's state: ``{kind: {bm: us}}`` of the best
    measured time per GEMM and BLOCK_SIZE_M. A GEMM candidate at BLOCK_SIZE_M ``bm`` cannot win
    when its floor exceeds (by :data:`FLOOR_MARGIN`) the best measured time of its GEMM at ``bm``,
    or when its floor plus the other GEMM's least floor at ``bm`` exceeds the best up+down sum
    measured at any BLOCK_SIZE_M (the pick is the BLOCK_SIZE_M minimising that sum)."""

    def __init__(self, floors: Floors, kinds: tuple):
        self.f, self.kinds = floors, tuple(kinds)

    def why(self, kind: str, cfg: dict, best: dict) -> str | None:
        """The reason ``cfg`` cannot win for ``kind`` (a short text), or None."""
        bm = int(cfg["BLOCK_SIZE_M"])
        fl = self.f.gemm_us(kind, cfg)
        same = (best.get(kind) or {}).get(bm)
        if same is not None and fl > same * (1 + FLOOR_MARGIN):
            return f"floor {fl:.1f} us > best {kind} at BLOCK_SIZE_M {bm}: {same:.1f} us"
        others = [k for k in self.kinds if k != kind]
        if others:
            sums = [sum(best[k][b] for k in self.kinds) for b in set.intersection(
                *[set(best.get(k) or {}) for k in self.kinds])] if all(best.get(k) for k in self.kinds) else []
            if sums:
                to_beat = min(sums)
                lb = fl + sum(self.f.min_gemm_us(k, bm) for k in others)
                if lb > to_beat * (1 + FLOOR_MARGIN):
                    return f"floor {lb:.1f} us (with the other GEMM's) > best up+down {to_beat:.1f} us"
        return None


@dataclass
class Budget:
    """One batch size's share of the tune's budget: ``limit_s`` seconds of the timer's
    (``timer.stats.seconds``), counted from ``start_s``. Counters (the report's ``budget``):
    ``pruned_floor`` (candidates the floor ruled out), ``pruned_budget`` (candidates never timed
    because a stage's share was spent), ``race_stopped`` (screening measurements stopped after one
    call: slower than the cut-off), ``stages_cut`` (stages that stopped early), ``reasons``
    (a sample of the reasons)."""

    limit_s: float | None
    timer: object
    start_s: float = 0.0
    pruned_floor: int = 0
    pruned_budget: int = 0
    race_stopped: int = 0
    stages_cut: list = field(default_factory=list)  # (stage, n not timed) or a note
    reasons: list = field(default_factory=list)

    def __post_init__(self):
        self.start_s = self._seconds()

    def _seconds(self) -> float:
        # a timer that keeps no stats (any object with the Timer's time()) spends nothing the
        # budget can count: only an unlimited share is meaningful with it
        stats = getattr(self.timer, "stats", None)
        return float(getattr(stats, "seconds", 0.0))

    def spent(self) -> float:
        """Timer seconds since this share started."""
        return self._seconds() - self.start_s

    def over(self, frac: float = 1.0) -> bool:
        """True when ``frac`` of the share is spent (never without a limit)."""
        return self.limit_s is not None and self.spent() >= frac * self.limit_s

    def left(self, frac: float = 1.0) -> float:
        """Seconds left before ``frac`` of the share is spent (infinite without a limit)."""
        return math.inf if self.limit_s is None else frac * self.limit_s - self.spent()

    def cut(self, stage: str, n: int) -> None:
        """Record that ``stage`` left ``n`` candidates untimed (summed per stage in the report)."""
        if n > 0:
            self.pruned_budget += n
            self.stages_cut.append((stage, n))

    def report(self) -> dict:
        """The batch size's ``budget`` report entry (``stages_cut``: one line per stage that stopped,
        e.g. ``"screen: 118 not timed"``, ``"refine: stopped before round 2 of 2"``)."""
        per: dict = {}
        notes = []
        for item in self.stages_cut:
            if isinstance(item, tuple):
                per[item[0]] = per.get(item[0], 0) + item[1]
            else:
                notes.append(item)
        lines = [f"{st}: {n} not timed" for st, n in per.items()] + notes
        return {"limit_s": None if self.limit_s is None else round(self.limit_s, 3), "spent_s": round(self.spent(), 3),
                "pruned_floor": self.pruned_floor, "pruned_budget": self.pruned_budget,
                "race_stopped": self.race_stopped, "stages_cut": lines,
                "floor_examples": self.reasons[:3]}


#: :func:`cost_weight`: GPU seconds a candidate measurement costs besides its kernel runs (graph
#: capture, synchronisation, the first launch's load), and the kernel runs one takes (the eager
#: launch, one call alone, the screening replays); the floor times :data:`FLOOR_TO_TIME` stands in
#: for a call's time (measured kernels ran 2 to 4 times their floor on the H200).
MEASUREMENT_OVERHEAD_S = 0.004
RUNS_PER_MEASUREMENT = 6
FLOOR_TO_TIME = 3.0


def cost_weight(floor_us: float) -> float:
    """Expected GPU seconds of one candidate measurement for a whole kernel of floor ``floor_us``."""
    return MEASUREMENT_OVERHEAD_S + RUNS_PER_MEASUREMENT * FLOOR_TO_TIME * floor_us * 1e-6


def allocate(left_s: float, weights: dict, M: int) -> float:
    """The share of ``left_s`` seconds for batch size ``M`` among ``weights`` ({M: expected cost}
    of the batch sizes still to tune, ``M`` included): proportional to its weight."""
    total = sum(weights.values()) or 1.0
    return max(0.0, left_s) * weights[M] / total
