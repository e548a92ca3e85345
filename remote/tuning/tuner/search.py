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
  3 replays of a graph of at most 10 calls (``--screen adaptive``: fewer calls for a candidate
  slower than 100 µs, so a replay lasts about 1 ms; ``--screen fixed``: always 10); (2) for the three best BLOCK_SIZE_M, coordinate descent from the two best
  configs of each GEMM over one-step neighbours (stages, warps, group, BN/BK halved or
  doubled), at most 3 rounds, every (BLOCK_SIZE_M, GEMM) in lockstep so that a round's candidates
  compile together; (3) the 4 best of each GEMM per finalist BM re-timed with
  the full protocol, side by side.
Final stage (every space): for the 3 best BLOCK_SIZE_M, the pairs of the 2 best up and 2
best down configs (joint providers: the best configs), plus the preferred pairs the caller
names (the shipped/installed config for M, SGLang's default), are timed as the whole fused
MoE, interleaved over 3 rounds (side by side, so drift hits all alike; median per pair).
Stability rule: the fastest wins unless a preferred pair is within :data:`TIE` (1%) of it,
timing noise on these machines; then the preferred pair wins (shipped before default), so
two tunes of the same shape land on the same config where candidates tie
(``_whole_stage``).
``USE_TMA``: for the GEMMs in the provider's ``tma_kinds`` (SGLang's kernel on Hopper and
newer), TMA on/off is one more coordinate: ``full`` times every config both ways, ``fast``
adds it to the neighbours of coordinate descent and tries the hints both ways.
- ``smoke``: the few configs of ``space.smoke_space`` (CPU test bed).
Candidates that fail to compile or launch are logged and skipped.
"""

from __future__ import annotations

import time

from . import space as sp

FULL_PROTOCOL = dict(n_calls=10, reps=10)
#: Whole-kernel times within this fraction of the fastest are a tie: timing noise on the H200 (two tunes of one
#: shape on two GPUs differed by up to 1.9% at large M, docs/benchmarks.md section 4, "Against the targets").
TIE = 0.01
#: Interleaved rounds of the whole-kernel final stage on a GPU.
WHOLE_ROUNDS = 3
SCREEN_PROTOCOL = dict(n_calls=10, reps=3)
#: The screening protocol of ``--screen adaptive`` (the default): a graph of 10 calls for kernels
#: under 100 µs, fewer for slower ones so each replay lasts about 1 ms (timing.Timer, "Adaptive
#: screening"). Only screening adapts; finalists and the whole-kernel stage use FULL_PROTOCOL.
ADAPTIVE_SCREEN_PROTOCOL = dict(n_calls=10, reps=3, replay_us=1000.0)
#: ``--screen`` values: the screening protocol each names.
SCREEN_PROTOCOLS = {"adaptive": ADAPTIVE_SCREEN_PROTOCOL, "fixed": SCREEN_PROTOCOL}
#: the ``--screen`` value when none is given
DEFAULT_SCREEN = "adaptive"
CPU_PROTOCOL = dict(n_calls=1, reps=1)


class Evaluator:
    """Times candidates for one Problem, caching results per (kind, config, protocol).

    ``kinds``: the provider's ``kinds`` when it has them, else ``("up", "down")`` for a
    separable provider and ``("joint",)`` (timed as the whole kernel) otherwise.
    ``tma_kinds``: the provider's GEMMs whose ``USE_TMA`` may be searched (default none).
    ``log``: callable(msg, level) for skipped candidates. ``cpu``: use the CPU protocol.
    ``screen``: the ``fast`` search's screening protocol, ``"adaptive"`` (fewer graph calls for
    slow candidates, :data:`ADAPTIVE_SCREEN_PROTOCOL`) or ``"fixed"`` (:data:`SCREEN_PROTOCOL`);
    ValueError for another name.
    """

    def __init__(self, provider, problem, timer, compiler=None, log=None, cpu=False, screen: str = DEFAULT_SCREEN):
        self.provider, self.p, self.timer, self.compiler = provider, problem, timer, compiler
        if screen not in SCREEN_PROTOCOLS:
            raise ValueError(f"screen must be one of {sorted(SCREEN_PROTOCOLS)}, got {screen!r}")
        #: the screening protocol of the ``fast`` search (``screen``: a key of SCREEN_PROTOCOLS)
        self.screen = SCREEN_PROTOCOLS[screen]
        bind = getattr(compiler, "bind", None)
        if bind is not None:  # a TargetCompiler captures compile requests from this problem's launches
            bind(provider, problem)
        own = getattr(provider, "kinds", None)
        self.kinds = tuple(own) if own else (("up", "down") if provider.separable else ("joint",))
        self._joint_gemm = bool(own) and "joint" in self.kinds
        per_problem = getattr(provider, "tma_kinds_for", None)
        self.tma_kinds = frozenset((per_problem(problem) if per_problem else getattr(provider, "tma_kinds", ())) or ())
        self.log = log or (lambda msg, level="info": None)
        self.cpu = cpu
        self.cache: dict = {}
        self.evaluated = 0
        self.failed = 0
        self.pick_reason = ""

    def clean(self, kind: str, cfg: dict) -> dict:
        """``cfg`` reduced to what ``kind`` can use: the six fields, and ``USE_TMA`` only
        for a GEMM in ``tma_kinds`` (a joint config never has it)."""
        c = {k: int(cfg[k]) for k in sp.KEYS if k in cfg}
        if cfg.get("USE_TMA") and kind in self.tma_kinds:
            c["USE_TMA"] = True
        return c

    def _fn(self, kind, cfg):
        if kind == "joint" and not self._joint_gemm:
            return self.provider.full_fn(self.p, cfg, cfg)
        return self.provider.gemm_fn(self.p, kind, cfg)

    def whole(self, pairs: list, rounds: int = 1) -> dict:
        """Time each ``(up_key, down_key)`` as the whole fused MoE (``full_fn``), full
        protocol, interleaved over ``rounds`` rounds; ``{pair: median us}``, failures absent."""
        import statistics
        proto = CPU_PROTOCOL if self.cpu else FULL_PROTOCOL
        samples: dict = {pr: [] for pr in pairs}
        for _ in range(1 if self.cpu else max(1, rounds)):
            for pr in pairs:
                if samples[pr] is None:
                    continue
                try:
                    samples[pr].append(self.timer.time(self.provider.full_fn(self.p, sp.from_key(pr[0]),
                                                                             sp.from_key(pr[1])), **proto))
                    self.evaluated += 1
                except Exception as exc:
                    samples[pr] = None
                    self.failed += 1
                    self.log(f"skip whole {pr}: {type(exc).__name__}: {str(exc)[:200]}", "debug")
        return {pr: statistics.median(v) for pr, v in samples.items() if v}

    def prefetch(self, kind: str, cfgs: list[dict]) -> None:
        """Start compiling ``cfgs`` for ``kind`` in the compile workers without timing them (a later
        :meth:`measure` of them waits for these compiles instead of sending new ones); nothing
        without a compiler or for a config already timed."""
        if self.compiler is None or (kind == "joint" and not self._joint_gemm):
            return
        timed = {ck[1] for ck in self.cache if ck[0] == kind}
        todo = {}
        for c in cfgs:
            c = self.clean(kind, c)
            key = sp.cfg_key(c)
            if key not in timed:
                todo[key] = c
        if todo:
            self.compiler.submit(((kind, c) for c in todo.values()), M=getattr(self.p, "M", None))

    def measure(self, kind: str, cfgs: list[dict], protocol: dict) -> dict:
        """Time ``cfgs`` for ``kind``; returns ``{cfg_key: microseconds}`` (failures absent)."""
        if self.cpu:
            protocol = CPU_PROTOCOL
        pname = (protocol["n_calls"], protocol["reps"], protocol.get("replay_us"))
        uniq = {}
        for c in cfgs:
            c = self.clean(kind, c)
            uniq[sp.cfg_key(c)] = c
        todo = [k for k in uniq if (kind, k, pname) not in self.cache]
        if self.compiler is not None and (kind != "joint" or self._joint_gemm):
            # compile in parallel; time each config as soon as its binary is ready, while the
            # others still compile (a failed ahead-of-time compile is only logged: the launch
            # below retries in this process and decides whether the candidate is skipped)
            import concurrent.futures as cf
            futs = self.compiler.submit(((kind, uniq[k]) for k in todo), M=getattr(self.p, "M", None))
            for key in [k for k in todo if (kind, k) not in futs]:
                self._time(kind, key, uniq[key], protocol, pname)
            by_fut = {f: key[1] for key, f in futs.items()}
            for f in _waited(cf.as_completed(by_fut), self.compiler):
                key = by_fut[f]
                err = self.compiler.wait((kind, key), f)
                if err:
                    self.log(f"precompile {kind} {sp.from_key(key)} failed: {err}", "debug")
                self._time(kind, key, uniq[key], protocol, pname)
        for key in todo:
            self._time(kind, key, uniq[key], protocol, pname)
        out = {}
        for key in uniq:
            v = self.cache.get((kind, key, pname))
            if v is not None:
                out[key] = v
        return out

    def _time(self, kind, key, cfg, protocol, pname):
        ck = (kind, key, pname)
        if ck in self.cache:
            return
        try:
            self.cache[ck] = self.timer.time(self._fn(kind, cfg), **protocol)
            self.evaluated += 1
        except Exception as exc:  # OutOfResources, compile errors, launch failures
            self.cache[ck] = None
            self.failed += 1
            self.log(f"skip {kind} {cfg}: {type(exc).__name__}: {str(exc)[:200]}", "debug")


def _waited(futures, compiler):
    """Yield from ``futures`` (``as_completed``), adding the time blocked on each next one to
    ``compiler.seconds``: that is the timing process waiting for the compile workers, and
    report.json's ``time_split`` counts it as ``compile`` (before 2026-12-03 it fell into
    ``search_other``)."""
    it = iter(futures)
    while True:
        t0 = time.perf_counter()
        try:
            f = next(it)
        except StopIteration:
            return
        if hasattr(compiler, "seconds"):
            compiler.seconds += time.perf_counter() - t0
        yield f


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
        if "joint" in times_by_kind:
            t = times_by_kind["joint"]
            pairs += [(c, c) for c in sorted((k for k in t if k[0] == bm), key=lambda k: t[k])[:n_each]]
            continue
        ups = sorted((k for k in times_by_kind["up"] if k[0] == bm), key=lambda k: times_by_kind["up"][k])[:n_each]
        downs = sorted((k for k in times_by_kind["down"] if k[0] == bm),
                       key=lambda k: times_by_kind["down"][k])[:n_each]
        pairs += [(u, d) for u in ups for d in downs]
    return pairs


def _prefer_keys(ev: Evaluator, prefer) -> list:
    """``[(tag, (up_key, down_key))]`` of the caller's preferred pairs that this provider can
    run: configs cleaned per GEMM (:meth:`Evaluator.clean`), down BLOCK_SIZE_M = up's (one
    alignment), joint providers: the up config for both."""
    out = []
    for tag, up, down in prefer or ():
        if not up or any(k not in up or k not in (down or up) for k in sp.KEYS):
            continue
        if "joint" in ev.kinds:
            u = sp.cfg_key(ev.clean("joint", up))
            pr = (u, u)
        else:
            d = dict(down or up, BLOCK_SIZE_M=up["BLOCK_SIZE_M"])
            pr = (sp.cfg_key(ev.clean("up", up)), sp.cfg_key(ev.clean("down", d)))
        if len(pr[0]) >= 6 and pr not in [p for _, p in out]:
            out.append((tag, pr))
    return out


def _whole_stage(ev: Evaluator, times_by_kind: dict, prefer=None):
    """Final stage of every search: time the finalist pairs and the preferred pairs
    (``prefer``: ``[(tag, up_cfg, down_cfg)]``, e.g. ``("shipped", ...)``, ``("default", ...)``)
    as the whole fused MoE (the quantity report.json compares), interleaved over
    :data:`WHOLE_ROUNDS` rounds, and pick by the stability rule: the fastest, unless a
    preferred pair (in ``prefer`` order) is within :data:`TIE` of it.

    Why whole-kernel: a GEMM timed alone with L2 flushed ranks close candidates differently
    from the same GEMM inside the fused sequence (measured on the H200 at M=2048: the
    GEMM-sum pick was 4.5% slower as a whole kernel than the full search's pick). Returns
    ``(bm, picks, ts, whole_us, final)`` or None when no pair ran; ``final`` lists every
    pair timed with its tag and time."""
    # on the CPU (interpreter) the numbers mean nothing: one pair keeps the path exercised
    pairs = _finalists(times_by_kind, 1, 1) if ev.cpu else _finalists(times_by_kind)
    tagged = _prefer_keys(ev, prefer)
    if ev.cpu:
        tagged = tagged[:1]
    cands = list(dict.fromkeys(pairs + [pr for _, pr in tagged]))
    t = ev.whole(cands, WHOLE_ROUNDS)
    if not t:
        return None
    fastest = min(t, key=t.get)
    pick, why = fastest, "fastest"
    for tag, pr in tagged:
        if pr in t and t[pr] <= t[fastest] * (1 + TIE):
            pick, why = pr, f"{tag} (within {TIE:.0%} of the fastest)" if pr != fastest else tag
            break
    tags = {pr: tag for tag, pr in tagged}
    final = [{"up": sp.from_key(pr[0]), "down": sp.from_key(pr[1]), "whole_us": round(v, 3), "tag": tags.get(pr)}
             for pr, v in sorted(t.items(), key=lambda kv: kv[1])]
    u, d = pick
    ts = {}
    for kind, key in (("up", u), ("down", d), ("joint", u)):
        if kind in times_by_kind and key in times_by_kind[kind]:
            ts[kind] = times_by_kind[kind][key]
    ev.pick_reason = why
    return u[0], ({"joint": u} if "joint" in times_by_kind else {"up": u, "down": d}), ts, t[pick], final


def _decide(ev: Evaluator, times_by_kind: dict, prefer=None):
    """``(bm, picks, ts, whole_us, final)``: the whole-kernel final stage; when no pair runs
    as a whole kernel, the best by the sum of the GEMM times."""
    r = _whole_stage(ev, times_by_kind, prefer)
    if r is not None:
        return r
    bm, picks, ts = _pick(times_by_kind)
    return bm, picks, ts, None, []


def final_stage(ev: Evaluator, times_by_kind: dict, prefer=None):
    """The final stage every search ends with, for a caller that screened candidates itself
    (e.g. ``bench/sglang_kernel_h200.py`` section ``exhaustive``): ``times_by_kind`` is
    ``{kind: {cfg_key: us}}`` (full protocol); the finalists and the ``prefer`` pairs are timed as
    the whole fused MoE and picked by the stability rule (:func:`_whole_stage`). Returns
    ``(bm, picks, ts, whole_us, final)`` (see :func:`_decide`); RuntimeError when nothing ran."""
    return _decide(ev, times_by_kind, prefer)


def _result(bm, picks, ts, ev: Evaluator, t0: float, gpu0: float, space: str, whole_us=None, final=None) -> dict:
    if "joint" in picks:
        up = down = sp.from_key(picks["joint"])
    else:
        up, down = sp.from_key(picks["up"]), sp.from_key(picks["down"])
    return {"up": up, "down": down, "kernel_us": whole_us if whole_us is not None else sum(ts.values()),
            "whole_us": whole_us,
            "gemm_us": {k: v for k, v in ts.items()}, "evaluated": ev.evaluated, "failed": ev.failed,
            "search_gpu_s": round(ev.timer.stats.seconds - gpu0, 3), "search_wall_s": round(time.perf_counter() - t0, 3),
            "space": space, "final": final or [], "pick": getattr(ev, "pick_reason", "best GEMM sum")}


def search_fixed(ev: Evaluator, cfgs: list[dict], space: str, progress=None, prefer=None) -> dict:
    """Exhaustive search over ``cfgs`` (the ``full`` and ``smoke`` spaces); for a GEMM in
    the provider's ``tma_kinds`` every config is also timed with ``USE_TMA``."""
    t0, gpu0 = time.perf_counter(), ev.timer.stats.seconds
    times = {}
    for kind in ev.kinds:
        kcfgs = cfgs + ([sp.with_tma(c, True) for c in cfgs] if kind in ev.tma_kinds else [])
        times[kind] = ev.measure(kind, kcfgs, FULL_PROTOCOL)
        if progress and times[kind]:
            progress(min(times[kind].values()))
    bm, picks, ts, whole, final = _decide(ev, times, prefer)
    return _result(bm, picks, ts, ev, t0, gpu0, space, whole, final)


def search_fast(ev: Evaluator, M: int, E: int, top_k: int, feasible, progress=None, max_rounds: int = 3,
                hints=None, n_bm: int = 3, n_frontier: int = 2, n_final: int = 4, prefer=None) -> dict:
    """The ``fast`` search (module docstring). ``feasible(cfg) -> bool`` applies the
    device's resource limits. ``progress(best_us)`` is called after each stage.
    ``hints``: optional list of ``(up_cfg, down_cfg)`` pairs added to the seeds (warm start:
    the previous batch size's winner, the shipped/installed config for M), tried with and
    without ``USE_TMA`` for a GEMM in ``ev.tma_kinds``.
    ``n_bm`` BLOCK_SIZE_M finalists, ``n_frontier`` configs refined per GEMM and BM,
    ``n_final`` configs per GEMM and BM re-timed with the full protocol. ``prefer``: see
    :func:`_whole_stage`; the preferred pairs also seed the search."""
    t0, gpu0 = time.perf_counter(), ev.timer.stats.seconds
    seeds = [c for c in sp.seed_configs(M, E, top_k) if feasible(c)]
    extra = {kind: [] for kind in ev.kinds}
    for up, down in list(hints or []) + [(u, d) for _, u, d in prefer or ()]:
        for kind, c in (("up", up), ("down", down or up), ("joint", up)):
            if kind in extra and c:
                c = ev.clean(kind, c)
                if len(c) >= len(sp.KEYS) and feasible(c):
                    extra[kind].append(c)
                    if kind in ev.tma_kinds:
                        extra[kind].append(sp.with_tma(c, not c.get("USE_TMA")))
    for kind in ev.kinds:  # every GEMM's seeds compile at once (the workers stay busy while the first is timed)
        ev.prefetch(kind, seeds + extra[kind])
    screened = {kind: ev.measure(kind, seeds + extra[kind], ev.screen) for kind in ev.kinds}
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
    # coordinate descent per (BLOCK_SIZE_M, GEMM), all of them in lockstep: each round's neighbours of
    # every frontier are sent to the compile workers together before any is timed (one compile
    # latency per round instead of one per BLOCK_SIZE_M and GEMM; the same candidates and decisions
    # as refining them one after another, the BLOCK_SIZE_M and GEMM being independent)
    states = []
    for bm in finalists:
        for kind in ev.kinds:
            t = screened[kind]
            frontier = sorted((k for k in t if k[0] == bm), key=lambda k: t[k])[:n_frontier]
            states.append({"bm": bm, "kind": kind, "frontier": frontier, "seen": set(frontier)})
    for _ in range(max_rounds):
        for st in states:
            cands = []
            for key in st["frontier"]:
                for nb in sp.neighbours(sp.from_key(key), tma=st["kind"] in ev.tma_kinds):
                    nk = sp.cfg_key(nb)
                    if nk not in st["seen"] and feasible(nb):
                        st["seen"].add(nk)
                        cands.append(nb)
            st["cands"] = cands
            if cands:
                ev.prefetch(st["kind"], cands)
        for st in states:
            cands, kind, bm = st.pop("cands"), st["kind"], st["bm"]
            if not cands:
                st["frontier"] = []
                continue
            t = screened[kind]
            before = min(t[k] for k in t if k[0] == bm)
            t.update(ev.measure(kind, cands, ev.screen))
            ranked = sorted((k for k in t if k[0] == bm), key=lambda k: t[k])
            new_frontier = [k for k in ranked[:n_frontier] if k not in st["frontier"]]
            if t[ranked[0]] >= before * 0.999 and not new_frontier:
                st["frontier"] = []  # converged
                continue
            st["frontier"] = new_frontier or ranked[:1]
        states = [st for st in states if st["frontier"]]
        if not states:
            break
    if progress:
        progress(min(sum(min(v for k, v in t.items() if k[0] == bm) for t in screened.values()) for bm in finalists))
    final = {}
    for kind in ev.kinds:
        t = screened[kind]
        top = []
        for bm in finalists:
            top += sorted((k for k in t if k[0] == bm), key=lambda k: t[k])[:n_final]
        final[kind] = ev.measure(kind, [sp.from_key(k) for k in top], FULL_PROTOCOL)
    bm, picks, ts, whole, fin = _decide(ev, final, prefer)
    return _result(bm, picks, ts, ev, t0, gpu0, "fast", whole, fin)


def search(ev: Evaluator, space: str, M: int, E: int, top_k: int, smem_limit, elem_bytes: int, dims=None,
           progress=None, hints=None, block_k: int | None = None, prefer=None) -> dict:
    """Run the search of ``space`` (``full``/``fast``/``smoke``) for batch size M.

    ``smem_limit``: bytes of shared memory a block may use (None: unknown/CPU);
    ``elem_bytes``: weight element size; ``dims``: optional ``(K_max, N_max)`` of the GEMMs
    (unused block sizes beyond them are pruned); ``hints``: warm-start pairs for ``fast``
    (see :func:`search_fast`); ``block_k``: the fp8 block's K for block-quantized weights
    (configs whose BLOCK_SIZE_K does not divide it are ruled out, :func:`space.fits`);
    ``prefer``: ``[(tag, up_cfg, down_cfg)]`` for the stability rule of the final stage
    (:func:`_whole_stage`), e.g. the shipped config for M, SGLang's default.
    Returns the dict of :func:`_result` (``final``: every pair of the final stage with its
    whole-kernel time; ``pick``: why the winner won).
    Raises RuntimeError when no candidate runs, ValueError for an unknown space.
    """
    def feasible(c):
        return sp.fits(c, smem_limit, elem_bytes, block_k)[0]

    if space == "smoke":
        return search_fixed(ev, [c for c in sp.smoke_space() if feasible(c)], "smoke", progress, prefer)
    if space == "full":
        keep, ruled_out = sp.prune(sp.full_space(), smem_limit, elem_bytes, block_k=block_k)
        ev.log(f"M={M}: full space {len(keep)} configs, {len(ruled_out)} ruled out before timing", "info")
        return search_fixed(ev, keep, "full", progress, prefer)
    if space == "fast":
        # a provider may narrow the refinement (fewer BLOCK_SIZE_M finalists / rounds) where
        # compiling candidates costs more, e.g. SGLang's kernel, compiled per batch-size class
        params = dict(getattr(ev.provider, "fast_params", None) or {})
        return search_fast(ev, M, E, top_k, feasible, progress, hints=hints, prefer=prefer, **params)
    raise ValueError(f"unknown space {space!r}")
