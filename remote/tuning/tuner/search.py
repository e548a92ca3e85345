"""Per-batch-size config search (spaces ``full``, ``fast``, ``smoke``).

For the builtin provider the search is *separable*: with BLOCK_SIZE_M fixed, the up GEMM
and the down GEMM are independent kernels, so each is timed on its own; the result is the
BLOCK_SIZE_M minimising ``best_up(BM) + best_down(BM)`` with the best up and down configs
for it (SGLang needs one BLOCK_SIZE_M for both GEMMs). For a joint provider (SGLang's
own entry, one forced config) the candidate is timed as the whole fused MoE.

- ``full``: every config of SGLang's 1920-config space that fits the device
  (``space.prune``), timed with the full protocol (graph of 10 calls, 10 replays).
- ``fast``: (1) one seed per (BM, BN, BK) with BM limited to the useful range for the
  expected tokens per expert (``space.seed_configs``), plus optional warm-start hints (the
  previous batch size's winner and the shipped config for M, when given), screened with
  3 replays; (2) for the three best BLOCK_SIZE_M, coordinate descent from the two best
  configs of each GEMM over one-step neighbours (stages, warps, group, BN/BK halved or
  doubled), at most 3 rounds; (3) the 4 best of each GEMM per finalist BM re-timed with
  the full protocol, side by side.
Final stage (every space, separable provider): for the 3 best BLOCK_SIZE_M, the pairs of
the 2 best up and 2 best down configs are timed as the whole fused MoE and the fastest
pair wins (``_whole_stage``).
- ``smoke``: the few configs of ``space.smoke_space`` (CPU test bed).
Candidates that fail to compile or launch are logged and skipped.
"""

from __future__ import annotations

import time

from . import space as sp

FULL_PROTOCOL = dict(n_calls=10, reps=10)
SCREEN_PROTOCOL = dict(n_calls=10, reps=3)
CPU_PROTOCOL = dict(n_calls=1, reps=1)


class Evaluator:
    """Times candidates for one Problem, caching results per (kind, config, protocol).

    ``kinds``: ``("up", "down")`` for a separable provider, ``("joint",)`` otherwise.
    ``log``: callable(msg, level) for skipped candidates. ``cpu``: use the CPU protocol.
    """

    def __init__(self, provider, problem, timer, compiler=None, log=None, cpu=False):
        self.provider, self.p, self.timer, self.compiler = provider, problem, timer, compiler
        self.kinds = ("up", "down") if provider.separable else ("joint",)
        self.log = log or (lambda msg, level="info": None)
        self.cpu = cpu
        self.cache: dict = {}
        self.evaluated = 0
        self.failed = 0

    def _fn(self, kind, cfg):
        if kind == "joint":
            return self.provider.full_fn(self.p, cfg, cfg)
        return self.provider.gemm_fn(self.p, kind, cfg)

    def measure(self, kind: str, cfgs: list[dict], protocol: dict) -> dict:
        """Time ``cfgs`` for ``kind``; returns ``{cfg_key: microseconds}`` (failures absent)."""
        if self.cpu:
            protocol = CPU_PROTOCOL
        pname = (protocol["n_calls"], protocol["reps"])
        uniq = {sp.cfg_key(c): c for c in cfgs}
        if self.compiler is not None and kind != "joint":
            fails = self.compiler.compile((kind, c) for k, c in uniq.items() if (kind, k, pname) not in self.cache)
            for (_kind, key), err in fails.items():
                # ahead-of-time compilation is an optimisation: the launch below retries
                # in this process and decides whether the candidate is skipped
                self.log(f"precompile {kind} {sp.from_key(key)} failed: {err}", "debug")
        out = {}
        for key, cfg in uniq.items():
            ck = (kind, key, pname)
            if ck not in self.cache:
                try:
                    self.cache[ck] = self.timer.time(self._fn(kind, cfg), **protocol)
                    self.evaluated += 1
                except Exception as exc:  # OutOfResources, compile errors, launch failures
                    self.cache[ck] = None
                    self.failed += 1
                    self.log(f"skip {kind} {cfg}: {type(exc).__name__}: {str(exc)[:200]}", "debug")
            if self.cache[ck] is not None:
                out[key] = self.cache[ck]
        return out


def _pick(times_by_kind: dict) -> tuple[int, dict, dict]:
    """From ``{kind: {cfg_key: us}}`` pick the BLOCK_SIZE_M minimising the sum over kinds of
    each kind's best time at that BM. Returns ``(bm, {kind: cfg_key}, {kind: us})``."""
    best = None
    bms = set.intersection(*[{k[0] for k in t} for t in times_by_kind.values()]) if times_by_kind else set()
    for bm in sorted(bms):
        picks, ts = {}, {}
        for kind, t in times_by_kind.items():
            key = min((k for k in t if k[0] == bm), key=lambda k: t[k])
            picks[kind], ts[kind] = key, t[key]
        total = sum(ts.values())
        if best is None or total < best[0]:
            best = (total, bm, picks, ts)
    if best is None:
        raise RuntimeError("no candidate config ran for every GEMM")
    return best[1], best[2], best[3]


def _finalists(times_by_kind: dict, n_bm: int = 3, n_each: int = 2) -> list[tuple[tuple, tuple]]:
    """Up/down pairs for the whole-kernel final stage: for the ``n_bm`` best BLOCK_SIZE_M
    (by the sum of each GEMM's best time), every pair of the ``n_each`` best up and down
    configs."""
    bms = set.intersection(*[{k[0] for k in t} for t in times_by_kind.values()])
    ranked = sorted(bms, key=lambda bm: sum(min(v for k, v in t.items() if k[0] == bm)
                                             for t in times_by_kind.values()))
    pairs = []
    for bm in ranked[:n_bm]:
        ups = sorted((k for k in times_by_kind["up"] if k[0] == bm), key=lambda k: times_by_kind["up"][k])[:n_each]
        downs = sorted((k for k in times_by_kind["down"] if k[0] == bm),
                       key=lambda k: times_by_kind["down"][k])[:n_each]
        pairs += [(u, d) for u in ups for d in downs]
    return pairs


def _whole_stage(ev: Evaluator, times_by_kind: dict):
    """Final stage of every separable search: time the finalist up/down pairs as the whole
    fused MoE (the quantity report.json compares), full protocol, and pick the fastest.

    Why: a GEMM timed alone with L2 flushed ranks close candidates differently from the
    same GEMM inside the fused sequence (measured on the H200 at M=2048: the GEMM-sum pick
    was 4.5% slower as a whole kernel than the full search's pick). Returns
    ``(bm, picks, ts, whole_us)`` or None when no pair ran."""
    best = None
    # on the CPU (interpreter) the numbers mean nothing: one pair keeps the path exercised
    for u, d in (_finalists(times_by_kind, 1, 1) if ev.cpu else _finalists(times_by_kind)):
        ck = ("whole", u, d, (FULL_PROTOCOL["n_calls"], FULL_PROTOCOL["reps"]))
        if ck not in ev.cache:
            try:
                proto = CPU_PROTOCOL if ev.cpu else FULL_PROTOCOL
                ev.cache[ck] = ev.timer.time(ev.provider.full_fn(ev.p, sp.from_key(u), sp.from_key(d)), **proto)
                ev.evaluated += 1
            except Exception as exc:
                ev.cache[ck] = None
                ev.log(f"skip whole {u}/{d}: {type(exc).__name__}: {str(exc)[:200]}", "debug")
        w = ev.cache[ck]
        if w is not None and (best is None or w < best[0]):
            best = (w, u, d)
    if best is None:
        return None
    w, u, d = best
    return u[0], {"up": u, "down": d}, {"up": times_by_kind["up"][u], "down": times_by_kind["down"][d]}, w


def _decide(ev: Evaluator, times_by_kind: dict):
    """``(bm, picks, ts, whole_us)``: whole-kernel final stage for separable providers,
    else (joint) the best measured config."""
    if "joint" not in times_by_kind:
        r = _whole_stage(ev, times_by_kind)
        if r is not None:
            return r
    bm, picks, ts = _pick(times_by_kind)
    return bm, picks, ts, None


def _result(bm, picks, ts, ev: Evaluator, t0: float, gpu0: float, space: str, whole_us=None) -> dict:
    if "joint" in picks:
        up = down = sp.from_key(picks["joint"])
    else:
        up, down = sp.from_key(picks["up"]), sp.from_key(picks["down"])
    return {"up": up, "down": down, "kernel_us": whole_us if whole_us is not None else sum(ts.values()),
            "whole_us": whole_us,
            "gemm_us": {k: v for k, v in ts.items()}, "evaluated": ev.evaluated, "failed": ev.failed,
            "search_gpu_s": round(ev.timer.stats.seconds - gpu0, 3), "search_wall_s": round(time.perf_counter() - t0, 3),
            "space": space}


def search_fixed(ev: Evaluator, cfgs: list[dict], space: str, progress=None) -> dict:
    """Exhaustive search over ``cfgs`` (the ``full`` and ``smoke`` spaces)."""
    t0, gpu0 = time.perf_counter(), ev.timer.stats.seconds
    times = {}
    for kind in ev.kinds:
        times[kind] = ev.measure(kind, cfgs, FULL_PROTOCOL)
        if progress and times[kind]:
            progress(min(times[kind].values()))
    bm, picks, ts, whole = _decide(ev, times)
    return _result(bm, picks, ts, ev, t0, gpu0, space, whole)


def search_fast(ev: Evaluator, M: int, E: int, top_k: int, feasible, progress=None, max_rounds: int = 3,
                hints=None, n_bm: int = 3, n_frontier: int = 2, n_final: int = 4) -> dict:
    """The ``fast`` search (module docstring). ``feasible(cfg) -> bool`` applies the
    device's resource limits. ``progress(best_us)`` is called after each stage.
    ``hints``: optional list of ``(up_cfg, down_cfg)`` pairs added to the seeds (warm start:
    the previous batch size's winner, the shipped/installed config for M).
    ``n_bm`` BLOCK_SIZE_M finalists, ``n_frontier`` configs refined per GEMM and BM,
    ``n_final`` configs per GEMM and BM re-timed with the full protocol."""
    t0, gpu0 = time.perf_counter(), ev.timer.stats.seconds
    seeds = [c for c in sp.seed_configs(M, E, top_k) if feasible(c)]
    extra = {kind: [] for kind in ev.kinds}
    for up, down in hints or []:
        for kind, c in (("up", up), ("down", down), ("joint", up)):
            if kind in extra and c:
                c = {k: int(c[k]) for k in sp.KEYS if k in c}
                if len(c) == len(sp.KEYS) and feasible(c):
                    extra[kind].append(c)
    screened = {kind: ev.measure(kind, seeds + extra[kind], SCREEN_PROTOCOL) for kind in ev.kinds}
    # rank BLOCK_SIZE_M by the sum of each GEMM's best seed
    bm_rank = []
    bms = set.intersection(*[{k[0] for k in t} for t in screened.values()])
    for bm in bms:
        bm_rank.append((sum(min(v for k, v in t.items() if k[0] == bm) for t in screened.values()), bm))
    bm_rank.sort()
    if not bm_rank:
        raise RuntimeError("no seed config ran")
    if progress:
        progress(bm_rank[0][0])
    finalists = [bm for _, bm in bm_rank[:n_bm]]
    for bm in finalists:
        for kind in ev.kinds:
            t = screened[kind]
            frontier = sorted((k for k in t if k[0] == bm), key=lambda k: t[k])[:n_frontier]
            seen = set(frontier)
            for _ in range(max_rounds):
                cands = []
                for key in frontier:
                    for nb in sp.neighbours(sp.from_key(key)):
                        nk = sp.cfg_key(nb)
                        if nk not in seen and feasible(nb):
                            seen.add(nk)
                            cands.append(nb)
                if not cands:
                    break
                before = min(t[k] for k in t if k[0] == bm)
                t.update(ev.measure(kind, cands, SCREEN_PROTOCOL))
                ranked = sorted((k for k in t if k[0] == bm), key=lambda k: t[k])
                new_frontier = [k for k in ranked[:n_frontier] if k not in frontier]
                if t[ranked[0]] >= before * 0.999 and not new_frontier:
                    break
                frontier = new_frontier or ranked[:1]
    if progress:
        progress(min(sum(min(v for k, v in t.items() if k[0] == bm) for t in screened.values()) for bm in finalists))
    final = {}
    for kind in ev.kinds:
        t = screened[kind]
        top = []
        for bm in finalists:
            top += sorted((k for k in t if k[0] == bm), key=lambda k: t[k])[:n_final]
        final[kind] = ev.measure(kind, [sp.from_key(k) for k in top], FULL_PROTOCOL)
    bm, picks, ts, whole = _decide(ev, final)
    return _result(bm, picks, ts, ev, t0, gpu0, "fast", whole)


def search(ev: Evaluator, space: str, M: int, E: int, top_k: int, smem_limit, elem_bytes: int, dims=None,
           progress=None, hints=None, block_k: int | None = None) -> dict:
    """Run the search of ``space`` (``full``/``fast``/``smoke``) for batch size M.

    ``smem_limit``: bytes of shared memory a block may use (None: unknown/CPU);
    ``elem_bytes``: weight element size; ``dims``: optional ``(K_max, N_max)`` of the GEMMs
    (unused block sizes beyond them are pruned); ``hints``: warm-start pairs for ``fast``
    (see :func:`search_fast`); ``block_k``: the fp8 block's K for block-quantized weights
    (configs whose BLOCK_SIZE_K does not divide it are ruled out, :func:`space.fits`).
    Returns the dict of :func:`_result`.
    Raises RuntimeError when no candidate runs, ValueError for an unknown space.
    """
    def feasible(c):
        return sp.fits(c, smem_limit, elem_bytes, block_k)[0]

    if space == "smoke":
        return search_fixed(ev, [c for c in sp.smoke_space() if feasible(c)], "smoke", progress)
    if space == "full":
        keep, ruled_out = sp.prune(sp.full_space(), smem_limit, elem_bytes, block_k=block_k)
        ev.log(f"M={M}: full space {len(keep)} configs, {len(ruled_out)} ruled out before timing", "info")
        return search_fixed(ev, keep, "full", progress)
    if space == "fast":
        return search_fast(ev, M, E, top_k, feasible, progress, hints=hints)
    raise ValueError(f"unknown space {space!r}")
