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

Bounded time (``Evaluator.budget``, a :class:`~.floor.Budget`: this batch size's share of
``tune --budget``; ``Evaluator.pruner``, a :class:`~.floor.Pruner`: the bandwidth/FLOP floor of each
candidate, ``remote.tuning.tuner.floor``). With a budget, ``fast`` screens the hints and the
caller's preferred configs first (always timed), then the seeds round-robin over BLOCK_SIZE_M, each
BLOCK_SIZE_M's seeds in the order of their floors (so a cut leaves every BLOCK_SIZE_M sampled), and
each stage stops timing new candidates once its part of the share is spent (:data:`STAGE_SHARE`:
screening, refinement rounds, finalists' re-timing; the whole-kernel stage times the preferred pairs
and as many finalist pairs as the rest allows, at least one). A screening measurement whose one call
is already :data:`RACE` times slower than the time to beat at its BLOCK_SIZE_M stops there (the
timer's race cut-off). Without a budget nothing is cut and the order is the earlier one. The floor
rule applies with or without a budget, wherever the device's ceilings are known: a candidate whose
floor exceeds the time to beat is not timed. The counts land in the batch size's ``budget`` report
entry. Kernels already measured slower than 1 ms keep 10 full-protocol replays of a shorter graph
(``timing.SLOW_CALL_US``).
"""

from __future__ import annotations

import math
import time

from . import space as sp
from .compile import compiler_refused
from .floor import SLOW_CALL_US, SLOW_REPLAY_US, Budget

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
#: With a budget: the fraction of the batch size's share each stage may have spent when it times a
#: new candidate (screening, refinement rounds, finalists re-timed with the full protocol); the
#: whole-kernel stage gets the rest.
STAGE_SHARE = {"screen": 0.45, "refine": 0.75, "final": 0.88}
#: Race cut-off of a screening measurement with a budget: its one call exceeds the time to beat at
#: its BLOCK_SIZE_M by more than this fraction (far beyond timing noise: it cannot win).
RACE = 0.5


class Evaluator:
    """Times candidates for one Problem, caching results per (kind, config, protocol).

    ``kinds``: the provider's ``kinds`` when it has them, else ``("up", "down")`` for a
    separable provider and ``("joint",)`` (timed as the whole kernel) otherwise.
    ``tma_kinds``: the provider's GEMMs whose ``USE_TMA`` may be searched (default none).
    ``log``: callable(msg, level) for skipped candidates. ``cpu``: use the CPU protocol.
    ``screen``: the ``fast`` search's screening protocol, ``"adaptive"`` (fewer graph calls for
    slow candidates, :data:`ADAPTIVE_SCREEN_PROTOCOL`) or ``"fixed"`` (:data:`SCREEN_PROTOCOL`);
    ValueError for another name. ``budget``: this batch size's :class:`~.floor.Budget` (default:
    unbounded); ``pruner``: the floor rule (:class:`~.floor.Pruner`) or None (module docstring).
    """

    def __init__(self, provider, problem, timer, compiler=None, log=None, cpu=False, screen: str = DEFAULT_SCREEN,
                 budget: Budget | None = None, pruner=None):
        self.provider, self.p, self.timer, self.compiler = provider, problem, timer, compiler
        #: this batch size's share of the tune's budget (``limit_s`` None: unbounded) and its counters
        self.budget = budget if budget is not None else Budget(None, timer)
        #: the floor rule (:class:`~.floor.Pruner`), or None where the device's ceilings are unknown
        self.pruner = pruner
        #: best measured time per GEMM and BLOCK_SIZE_M ``{kind: {bm: us}}`` (the floor rule's and the
        #: race cut-off's time to beat)
        self.best: dict = {}
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

    @property
    def bounded(self) -> bool:
        """A budget limits this batch size's search."""
        return self.budget.limit_s is not None

    def known_us(self, kind: str, key: tuple) -> float | None:
        """The least time any protocol measured for ``(kind, key)``, or None."""
        ts = [v for (k, kk, _p), v in self.cache.items() if k == kind and kk == key and v is not None]
        return min(ts) if ts else None

    def _note_best(self, kind: str, key: tuple, us: float) -> None:
        bm = int(key[0])
        cur = self.best.setdefault(kind, {}).get(bm)
        if cur is None or us < cur:
            self.best[kind][bm] = us

    def _floor_why(self, kind: str, cfg: dict) -> str | None:
        if self.pruner is None or kind not in ("up", "down", "joint"):
            return None
        try:
            return self.pruner.why(kind, cfg, self.best)
        except Exception:  # a floor that cannot be computed prunes nothing
            return None

    def cutoff_us(self, kind: str, bm: int) -> float | None:
        """The race cut-off of a screening measurement at BLOCK_SIZE_M ``bm`` (module docstring),
        or None (no budget, nothing measured yet)."""
        if not self.bounded:
            return None
        to_beat = []
        same = (self.best.get(kind) or {}).get(bm)
        if same is not None:
            to_beat.append(same)
        others = [k for k in self.kinds if k != kind]
        if others and all(self.best.get(k) for k in self.kinds):
            common = set.intersection(*[set(self.best[k]) for k in self.kinds])
            if common:
                total = min(sum(self.best[k][b] for k in self.kinds) for b in common)
                lb = 0.0
                if self.pruner is not None:
                    lb = sum(self.pruner.f.min_gemm_us(k, bm) for k in others)
                to_beat.append(total - lb)
        return (1 + RACE) * max(to_beat) if to_beat else None

    def _protocol_for(self, kind: str, key: tuple, protocol: dict) -> dict:
        """The protocol ``protocol`` with the slow-kernel rule: a full-protocol measurement (no
        ``replay_us``) of a candidate already measured slower than ``timing.SLOW_CALL_US`` gets
        ``replay_us = timing.SLOW_REPLAY_US`` (10 replays of a shorter graph)."""
        if self.cpu or protocol.get("replay_us"):
            return protocol
        t = self.known_us(kind, key)
        if t is not None and t >= SLOW_CALL_US:
            return dict(protocol, replay_us=SLOW_REPLAY_US)
        return protocol

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
        protos = {pr: proto if self.cpu else self._pair_protocol(pr) for pr in pairs}
        kinds = ("joint", "joint") if "joint" in self.kinds else ("up", "down")
        for pr in pairs:
            why = next((w for w in (self.refused(k, sp.from_key(c)) for k, c in zip(kinds, pr)) if w), None)
            if why:
                samples[pr] = None
                self._skip_refused(f"whole {pr}", why)
        for _ in range(1 if self.cpu else max(1, rounds)):
            for pr in pairs:
                if samples[pr] is None:
                    continue
                try:
                    samples[pr].append(self.timer.time(self.provider.full_fn(self.p, sp.from_key(pr[0]),
                                                                             sp.from_key(pr[1])), **protos[pr]))
                    self.evaluated += 1
                except Exception as exc:
                    samples[pr] = None
                    self.failed += 1
                    self.log(f"skip whole {pr}: {type(exc).__name__}: {str(exc)[:200]}", "debug")
        return {pr: statistics.median(v) for pr, v in samples.items() if v}

    def pair_estimate_us(self, pr: tuple) -> float | None:
        """A whole-kernel time estimate of ``(up_key, down_key)`` from its GEMMs' measured times
        (the joint config's for a joint provider), or None."""
        if "joint" in self.kinds:
            return self.known_us("joint", pr[0])
        u, d = self.known_us("up", pr[0]), self.known_us("down", pr[1])
        return None if u is None or d is None else u + d

    def _pair_protocol(self, pr: tuple) -> dict:
        t = self.pair_estimate_us(pr)
        if t is not None and t >= SLOW_CALL_US:
            return dict(FULL_PROTOCOL, replay_us=SLOW_REPLAY_US)
        return FULL_PROTOCOL

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

    def measure(self, kind: str, cfgs: list[dict], protocol: dict, stage: str | None = None,
                mandatory: int = 0) -> dict:
        """Time ``cfgs`` for ``kind``; returns ``{cfg_key: microseconds}`` (failures absent).

        ``stage``: a key of :data:`STAGE_SHARE`; with a budget, a candidate after the first
        ``mandatory`` (deduplicated) ones is not timed once that stage's part of the budget is
        spent (counted in ``budget.pruned_budget``). Candidates the floor rule rules out are not
        timed (``budget.pruned_floor``), except the ``mandatory`` ones."""
        if self.cpu:
            protocol = CPU_PROTOCOL
        pname = (protocol["n_calls"], protocol["reps"], protocol.get("replay_us"))
        uniq = {}
        for c in cfgs:
            c = self.clean(kind, c)
            uniq[sp.cfg_key(c)] = c
        must = set(list(uniq)[:max(0, mandatory)])
        todo = [k for k in uniq if (kind, k, pname) not in self.cache]
        frac = STAGE_SHARE.get(stage, 1.0) if stage else 1.0
        skipped = {"budget": 0}

        def run(key):
            if key not in must:
                if self.bounded and stage and self.budget.over(frac):
                    skipped["budget"] += 1
                    return
                why = self._floor_why(kind, uniq[key])
                if why:
                    self.budget.pruned_floor += 1
                    if len(self.budget.reasons) < 3:
                        self.budget.reasons.append(f"{kind} {sp.from_key(key)}: {why}")
                    self.cache[(kind, key, pname)] = None
                    return
            self._time(kind, key, uniq[key], protocol, pname)

        if self.compiler is not None and (kind != "joint" or self._joint_gemm):
            # compile in parallel; time each config as soon as its binary is ready, while the
            # others still compile. A worker's failure that Triton's compiler itself raised
            # (compiler_refused) skips the candidate: compiling it again here would meet the same
            # failure in the timing process, and Triton 3.3-3.6's RemoveLayoutConversions failure
            # on vLLM's fused_moe_kernel (triton-lang/triton#9809) left the process unable to
            # compile configs it compiled before (H200, vLLM 0.26.0, docs/benchmarks.md 4.9). Any
            # other failure (the worker's own environment) is only logged: the launch retries here.
            import concurrent.futures as cf
            send = [k for k in todo if k in must or not self._floor_why(kind, uniq[k])]
            futs = self.compiler.submit(((kind, uniq[k]) for k in send), M=getattr(self.p, "M", None))
            for key in [k for k in todo if (kind, k) not in futs]:
                run(key)
            by_fut = {f: key[1] for key, f in futs.items()}
            for f in _waited(cf.as_completed(by_fut), self.compiler):
                key = by_fut[f]
                err = self.compiler.wait((kind, key), f)
                if err and compiler_refused(err):
                    self.cache[(kind, key, pname)] = None
                    self._skip_refused(f"{kind} {sp.from_key(key)}", err)
                    continue
                if err:
                    self.log(f"precompile {kind} {sp.from_key(key)} failed: {err}", "debug")
                run(key)
        for key in todo:
            if (kind, key, pname) not in self.cache:
                run(key)
        if skipped["budget"]:
            self.budget.cut(stage, skipped["budget"])
        out = {}
        for key in uniq:
            v = self.cache.get((kind, key, pname))
            if v is not None:
                out[key] = v
        return out

    def refused(self, kind: str, cfg: dict) -> str | None:
        """Why ``(kind, cfg)`` must not be launched in this process: the compile workers' Triton
        refused it (``compiler.refused``; comment in :meth:`measure`), else None."""
        fn = getattr(self.compiler, "refused", None)
        return fn(kind, cfg, getattr(self.p, "M", None)) if fn is not None else None

    def _skip_refused(self, what: str, why: str) -> None:
        """Count and log a candidate :meth:`refused` keeps from being launched."""
        self.failed += 1
        self.log(f"skip {what}: the compile worker's Triton refused it: {why}", "debug")

    def _time(self, kind, key, cfg, protocol, pname):
        ck = (kind, key, pname)
        if ck in self.cache:
            return
        why = self.refused(kind, cfg)
        if why:
            self.cache[ck] = None
            self._skip_refused(f"{kind} {cfg}", why)
            return
        proto = self._protocol_for(kind, key, protocol)
        if protocol.get("replay_us") and self.bounded and not self.cpu:  # a screening measurement
            cut = self.cutoff_us(kind, int(key[0]))
            if cut is not None:
                proto = dict(proto, cutoff_us=cut)
        try:
            stats = getattr(self.timer, "stats", None)  # a timer may keep none (the Timer protocol is time())
            before = getattr(stats, "race_stopped", 0)
            self.cache[ck] = self.timer.time(self._fn(kind, cfg), **proto)
            if getattr(stats, "race_stopped", 0) > before:
                self.budget.race_stopped += 1
            self.evaluated += 1
            self._note_best(kind, key, self.cache[ck])
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
    if ev.bounded and not ev.cpu:
        pairs = _pairs_within_budget(ev, pairs, [pr for _, pr in tagged])
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


def whole_cost_s(t_us: float | None) -> float:
    """Expected timer seconds of one whole-kernel measurement (full protocol, with the slow-kernel
    rule) of a kernel taking ``t_us``: the eager launch, 11 replays of the graph, and capture
    overhead (:data:`~.floor.MEASUREMENT_OVERHEAD_S`)."""
    from .floor import MEASUREMENT_OVERHEAD_S
    if t_us is None:
        return 0.05
    n = FULL_PROTOCOL["n_calls"] if t_us < SLOW_CALL_US else max(1, math.ceil(SLOW_REPLAY_US / t_us))
    return MEASUREMENT_OVERHEAD_S + (FULL_PROTOCOL["reps"] + 1) * n * t_us * 1e-6 + 2 * t_us * 1e-6


def _pairs_within_budget(ev: Evaluator, pairs: list, preferred: list) -> list:
    """The finalist pairs (best first) the rest of the budget can time as whole kernels over
    :data:`WHOLE_ROUNDS` rounds beside the ``preferred`` pairs (always timed): at least one."""
    left = ev.budget.left(1.0)
    est = {pr: whole_cost_s(ev.pair_estimate_us(pr)) * WHOLE_ROUNDS for pr in list(pairs) + list(preferred)}
    left -= sum(est[pr] for pr in preferred)
    ranked = sorted(pairs, key=lambda pr: ev.pair_estimate_us(pr) or math.inf)
    keep = []
    for pr in ranked:
        if keep and (pr in preferred or est[pr] > left):
            continue
        keep.append(pr)
        if pr not in preferred:
            left -= est[pr]
    ev.budget.cut("whole", len([p for p in pairs if p not in keep and p not in preferred]))
    return keep


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
        times[kind] = ev.measure(kind, kcfgs, FULL_PROTOCOL, stage="final" if ev.bounded else None)
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
    kseeds = {kind: _ordered_seeds(ev, kind, seeds) if ev.bounded else seeds for kind in ev.kinds}
    for kind in ev.kinds:  # every GEMM's seeds compile at once (the workers stay busy while the first is timed)
        ev.prefetch(kind, extra[kind] + kseeds[kind] if ev.bounded else kseeds[kind] + extra[kind])
    if ev.bounded:
        # the hints and the preferred configs first, always timed; then the seeds until the screening share
        # is spent (both GEMMs alternate in slices, so a cut leaves them sampled alike)
        # (and the first seed of every BLOCK_SIZE_M: each BLOCK_SIZE_M is ranked on something)
        screened = {}
        for kind in ev.kinds:
            first = _first_round(kseeds[kind])
            screened[kind] = ev.measure(kind, extra[kind] + kseeds[kind][:first], ev.screen,
                                        mandatory=len(extra[kind]) + first)
        slices = {kind: [kseeds[kind][i:i + 8] for i in range(_first_round(kseeds[kind]), len(kseeds[kind]), 8)]
                  for kind in ev.kinds}
        for i in range(max((len(v) for v in slices.values()), default=0)):
            for kind in ev.kinds:
                if i < len(slices[kind]):
                    screened[kind].update(ev.measure(kind, slices[kind][i], ev.screen, stage="screen"))
    else:
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
    for rnd in range(max_rounds):
        if ev.bounded and ev.budget.over(STAGE_SHARE["refine"]):
            ev.budget.stages_cut.append(f"refine: stopped before round {rnd + 1} of {max_rounds}")
            break
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
            t.update(ev.measure(kind, cands, ev.screen, stage="refine" if ev.bounded else None))
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
        per_bm = [sorted((k for k in t if k[0] == bm), key=lambda k: t[k])[:n_final] for bm in finalists]
        if ev.bounded:
            # the best of each BLOCK_SIZE_M first (always re-timed), then the next best of each, ...
            top = [lst[i] for i in range(n_final) for lst in per_bm if i < len(lst)]
            final[kind] = ev.measure(kind, [sp.from_key(k) for k in top], FULL_PROTOCOL, stage="final",
                                     mandatory=len([x for x in per_bm if x]))
        else:
            top = [k for lst in per_bm for k in lst]
            final[kind] = ev.measure(kind, [sp.from_key(k) for k in top], FULL_PROTOCOL)
    bm, picks, ts, whole, fin = _decide(ev, final, prefer)
    return _result(bm, picks, ts, ev, t0, gpu0, "fast", whole, fin)


def _first_round(ordered: list) -> int:
    """How many of :func:`_ordered_seeds`' list make its first round (one seed, and its ``USE_TMA``
    twin, per BLOCK_SIZE_M)."""
    seen, n = set(), 0
    for c in ordered:
        bm = int(c["BLOCK_SIZE_M"])
        if bm in seen and not c.get("USE_TMA"):
            break
        seen.add(bm)
        n += 1
    return n


def _ordered_seeds(ev: Evaluator, kind: str, seeds: list) -> list:
    """Seeds for a budgeted screen: round-robin over BLOCK_SIZE_M, each BLOCK_SIZE_M's seeds by
    ascending floor (their order when no floor is known), each followed by its ``USE_TMA`` twin for
    a GEMM in ``tma_kinds`` (SGLang's separate tuner times every down config both ways)."""
    by_bm: dict = {}
    for c in seeds:
        by_bm.setdefault(int(c["BLOCK_SIZE_M"]), []).append(c)
    if ev.pruner is not None and kind in ("up", "down", "joint"):
        for bm in by_bm:
            by_bm[bm].sort(key=lambda c: ev.pruner.f.gemm_us(kind, c))
    out = []
    for i in range(max((len(v) for v in by_bm.values()), default=0)):
        for bm in sorted(by_bm):
            if i < len(by_bm[bm]):
                c = by_bm[bm][i]
                out.append(c)
                if kind in ev.tma_kinds:
                    out.append(sp.with_tma(c, True))
    return out


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
    # the provider's own rule for what its engine may read at this M (vLLM: the compiled WNA16 kernel's checks)
    allowed = getattr(ev.provider, "config_allowed", None)

    def feasible(c):
        return sp.fits(c, smem_limit, elem_bytes, block_k)[0] and (allowed is None or allowed(ev.p, c))

    if space == "smoke":
        return search_fixed(ev, [c for c in sp.smoke_space() if feasible(c)], "smoke", progress, prefer)
    if space == "full":
        keep, ruled_out = sp.prune(sp.full_space(), smem_limit, elem_bytes, block_k=block_k)
        if allowed is not None:
            ruled_out += [(c, "the engine would not run it at this M") for c in keep if not allowed(ev.p, c)]
            keep = [c for c in keep if allowed(ev.p, c)]
        ev.log(f"M={M}: full space {len(keep)} configs, {len(ruled_out)} ruled out before timing", "info")
        return search_fixed(ev, keep, "full", progress, prefer)
    if space == "fast":
        # a provider may narrow the refinement (fewer BLOCK_SIZE_M finalists / rounds) where
        # compiling candidates costs more, e.g. SGLang's kernel, compiled per batch-size class
        params = dict(getattr(ev.provider, "fast_params", None) or {})
        return search_fast(ev, M, E, top_k, feasible, progress, hints=hints, prefer=prefer, **params)
    raise ValueError(f"unknown space {space!r}")
