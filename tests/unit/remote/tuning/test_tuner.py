"""Tuner logic (remote/tuning/tuner): spaces, pruning, SGLang defaults, search, checkpoints.

The search tests use a fake provider and timer with a synthetic cost landscape whose
optimum is known, so they check the search itself, deterministically and fast.
"""

import itertools
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from remote.tuning.tuner import checkpoint, space as sp  # noqa: E402
from remote.tuning.tuner.driver import check_tuned, shipped_pair, split_batches  # noqa: E402
from remote.tuning.tuner.search import Evaluator, search  # noqa: E402

H200_SMEM = 232448  # shared_memory_per_block_optin read on the H200 (docs/benchmarks.md)


def test_full_space_is_sglangs_1920():
    full = sp.full_space()
    assert len(full) == 1920
    assert len({sp.cfg_key(c) for c in full}) == 1920
    vals = {k: sorted({c[k] for c in full}) for k in sp.KEYS}
    assert vals == {"BLOCK_SIZE_M": [16, 32, 64, 128, 256], "BLOCK_SIZE_N": [32, 64, 128, 256],
                    "BLOCK_SIZE_K": [64, 128, 256], "GROUP_SIZE_M": [1, 16, 32, 64], "num_warps": [4, 8],
                    "num_stages": [2, 3, 4, 5]}


def test_smem_formula_and_h200_failure_case():
    # BLOCK_SIZE_M < 64 keeps num_stages - 1 buffers
    assert sp.smem_bytes(dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_stages=3)) == 2 * 80 * 128 * 2
    assert sp.smem_bytes(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_stages=3)) == 3 * 128 * 128 * 2
    assert sp.smem_bytes(dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_stages=3), 1) == 3 * 128 * 128
    # Triton 3.6 on the H200 refused this one with "Required: 245760, Hardware limit: 232448"
    bad = dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=8, num_stages=3)
    assert sp.smem_bytes(bad) == 245760
    ok, why = sp.fits(bad, H200_SMEM)
    assert not ok and "shared memory" in why
    assert sp.fits(bad, None)[0], "unknown limit: not ruled out on shared memory"


def test_prune_partitions_by_rules():
    keep, out = sp.prune(sp.full_space(), H200_SMEM)
    assert len(keep) + len(out) == 1920
    assert all(sp.smem_bytes(c) <= H200_SMEM and sp.acc_regs_per_thread(c) <= 255 for c in keep)
    assert all(sp.smem_bytes(c) > H200_SMEM or sp.acc_regs_per_thread(c) > 255 for c, _ in out)
    assert any("registers" in why for _, why in out)  # 256x256 with 4 warps: 512 regs/thread
    small, _ = sp.prune(sp.full_space(), 101376)  # SM120-class limit prunes more
    assert len(small) < len(keep)


def test_fp8_block_rules_out_block_k_not_dividing_the_block():
    keep, out = sp.prune(sp.full_space(), None, elem_bytes=1, block_k=128)
    assert {c["BLOCK_SIZE_K"] for c in keep} == {64, 128}
    assert len(keep) == 1920 * 2 // 3 - sum(1 for c, why in out if "registers" in why)
    assert all("does not divide" in why for c, why in out if c["BLOCK_SIZE_K"] == 256)
    # fp8 operands take half the shared memory: more configs fit the same device
    fp8_keep, _ = sp.prune(sp.full_space(), 101376, elem_bytes=1)
    bf16_keep, _ = sp.prune(sp.full_space(), 101376, elem_bytes=2)
    assert len(fp8_keep) > len(bf16_keep)


def test_default_config_matches_sglang_rules():
    assert sp.default_config(128, 128) == dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                                               num_warps=4, num_stages=3)
    assert sp.default_config(129, 128)["BLOCK_SIZE_M"] == 64
    assert sp.default_config(129, 128)["GROUP_SIZE_M"] == 8
    assert sp.default_config(129, 128)["BLOCK_SIZE_K"] == 32
    fp8 = sp.default_config(1, 8, "fp8_w8a8")
    assert (fp8["BLOCK_SIZE_M"], fp8["BLOCK_SIZE_N"], fp8["BLOCK_SIZE_K"], fp8["num_warps"]) == (128, 256, 128, 8)
    blk = sp.default_config(1, 8, "fp8_w8a8", [128, 128])
    assert (blk["BLOCK_SIZE_M"], blk["BLOCK_SIZE_N"], blk["GROUP_SIZE_M"], blk["num_stages"]) == (64, 128, 32, 3)


def test_closest_entry_and_shipped_pair():
    up = {"1": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=3),
          "64": dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=3)}
    assert sp.closest_entry(up, 20)["BLOCK_SIZE_M"] == 16
    assert sp.closest_entry(up, 40)["BLOCK_SIZE_M"] == 32
    u, d = shipped_pair({"up": up, "down": None}, 40)
    assert u == d and u["BLOCK_SIZE_M"] == 32, "no _down file: the up entry is reused"
    down = {"1": dict(up["1"], BLOCK_SIZE_M=64, USE_TMA=True)}
    u, d = shipped_pair({"up": up, "down": down}, 1)
    assert d["BLOCK_SIZE_M"] == u["BLOCK_SIZE_M"] == 16
    assert d["USE_TMA"] is True, "USE_TMA stays: SGLang's kernel reads it from the down file"
    # a provider whose kernel does not read USE_TMA (builtin) never sees it
    assert "USE_TMA" not in Evaluator(FakeProvider(), None, FakeTimer()).clean("down", d)
    assert shipped_pair(None, 1) is None


def test_seeds_and_neighbours_stay_in_full_space():
    full = {sp.cfg_key(c) for c in sp.full_space()}
    for M in (1, 64, 4096):
        seeds = sp.seed_configs(M, 128, 8)
        assert seeds and all(sp.cfg_key(c) in full for c in seeds)
        for c in seeds[:5]:
            nb = sp.neighbours(c)
            assert all(sp.cfg_key(n) in full and n["BLOCK_SIZE_M"] == c["BLOCK_SIZE_M"] for n in nb)
            assert sp.cfg_key(c) not in {sp.cfg_key(n) for n in nb}
    assert {c["BLOCK_SIZE_M"] for c in sp.seed_configs(1, 128, 8)} == {16}
    assert {c["BLOCK_SIZE_M"] for c in sp.seed_configs(4096, 128, 8)} == {16, 32, 64, 128, 256}


# ----------------------------------------------------------------- fake search


class FakeStats:
    seconds = 0.0
    calls = 0


class FakeTimer:
    """Returns the callable's value as its 'time'; counts calls."""

    def __init__(self):
        self.stats = FakeStats()
        self._warm = True

    def time(self, fn, n_calls=10, reps=10, replay_us=None):
        self.stats.calls += 1
        self.stats.seconds += 0.001 * reps
        self.protocols = getattr(self, "protocols", [])
        self.protocols.append((n_calls, reps, replay_us))
        return fn()


def cost(kind, c):
    """Smooth synthetic landscape: optimum up at BM 64, BN 128, BK 64, G16, w8, s4; down
    at BM 64, BN 64, BK 128, G1, w4, s3. Configs with BLOCK_SIZE_N 32 'fail to compile'."""
    if c["BLOCK_SIZE_N"] == 32:
        raise RuntimeError("synthetic compile failure")
    tgt = dict(up=(64, 128, 64, 16, 8, 4), down=(64, 64, 128, 1, 4, 3))[kind]
    import math
    d = 0.0
    for v, t, w in zip(sp.cfg_key(c), tgt, (1.0, 0.6, 0.5, 0.05, 0.2, 0.15)):
        d += w * abs(math.log2(v) - math.log2(t))
    return 100.0 * (1 + d)


class FakeProvider:
    name = "fake"

    def __init__(self, separable=True):
        self.separable = separable
        self.whole = []

    def gemm_fn(self, p, kind, cfg):
        return lambda: cost(kind, cfg)

    def full_fn(self, p, up, down):
        self.whole.append((sp.cfg_key(up), sp.cfg_key(down)))
        return lambda: cost("up", up) + cost("down", down) + 5.0


def _best_pair_exhaustive():
    keep, _ = sp.prune(sp.full_space(), H200_SMEM)
    best = None
    for bm in sp.FULL_BM:
        ups = [c for c in keep if c["BLOCK_SIZE_M"] == bm and c["BLOCK_SIZE_N"] != 32]
        if not ups:
            continue
        t = min(cost("up", c) for c in ups) + min(cost("down", c) for c in ups)
        best = t if best is None or t < best else best
    return best


def test_full_search_finds_the_optimum_and_skips_failures():
    logs = []
    ev = Evaluator(FakeProvider(), None, FakeTimer(), log=lambda m, lvl="info": logs.append(m))
    r = search(ev, "full", 4096, 128, 8, H200_SMEM, 2)
    assert sp.cfg_key(r["up"]) == (64, 128, 64, 16, 8, 4)
    assert sp.cfg_key(r["down"]) == (64, 64, 128, 1, 4, 3)
    assert r["up"]["BLOCK_SIZE_M"] == r["down"]["BLOCK_SIZE_M"]
    assert r["failed"] > 0 and any("synthetic compile failure" in m for m in logs)
    assert r["whole_us"] == pytest.approx(_best_pair_exhaustive() + 5.0)


def test_fast_search_is_close_with_a_fraction_of_the_work():
    ev_full = Evaluator(FakeProvider(), None, FakeTimer())
    full = search(ev_full, "full", 4096, 128, 8, H200_SMEM, 2)
    ev_fast = Evaluator(FakeProvider(), None, FakeTimer())
    fast = search(ev_fast, "fast", 4096, 128, 8, H200_SMEM, 2)
    assert fast["up"]["BLOCK_SIZE_M"] == fast["down"]["BLOCK_SIZE_M"]
    assert fast["whole_us"] <= full["whole_us"] * 1.02
    # the fake timer charges per replay (screening: 3, full protocol: 10), as GPU time does
    assert ev_fast.timer.stats.seconds < 0.10 * ev_full.timer.stats.seconds
    assert ev_fast.evaluated < 0.2 * ev_full.evaluated


def test_fast_search_uses_hints():
    hint = (dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=16, num_warps=8, num_stages=4),
            dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3))
    ev = Evaluator(FakeProvider(), None, FakeTimer())
    r = search(ev, "fast", 1, 128, 8, H200_SMEM, 2, hints=[hint])
    # M=1 seeds only BLOCK_SIZE_M 16, the hint brings BM 64 (the synthetic optimum) in
    assert r["up"]["BLOCK_SIZE_M"] == 64


def test_joint_provider_writes_one_config_for_both():
    prov = FakeProvider(separable=False)
    ev = Evaluator(prov, None, FakeTimer())
    r = search(ev, "smoke", 4, 8, 2, None, 2)
    assert r["up"] == r["down"]
    assert ev.kinds == ("joint",)


class TmaProvider(FakeProvider):
    """Per-GEMM provider with SGLang's coordinates: kinds up/down, USE_TMA searchable for down;
    TMA makes the down GEMM 8% faster (the H200's large-M observation), costs 2% on up."""

    kinds = ("up", "down")
    tma_kinds = frozenset({"down"})

    def gemm_fn(self, p, kind, cfg):
        assert kind in self.kinds and (not cfg.get("USE_TMA") or kind in self.tma_kinds)
        f = 0.92 if cfg.get("USE_TMA") else 1.0
        return lambda: cost(kind, cfg) * f

    def full_fn(self, p, up, down):
        self.whole.append((sp.cfg_key(up), sp.cfg_key(down)))
        return lambda: cost("up", up) + cost("down", down) * (0.92 if down.get("USE_TMA") else 1.0) + 5.0


@pytest.mark.parametrize("space", ["fast", "full"])
def test_use_tma_is_a_search_coordinate_where_the_kernel_reads_it(space):
    ev = Evaluator(TmaProvider(), None, FakeTimer())
    r = search(ev, space, 4096, 128, 8, H200_SMEM, 2)
    assert r["down"].get("USE_TMA") is True, r["down"]
    assert "USE_TMA" not in r["up"], "the up GEMM is not in tma_kinds: never searched"
    assert sp.cfg_key(r["down"])[:6] == (64, 64, 128, 1, 4, 3)


def test_stability_rule_prefers_the_shipped_pair_within_noise():
    """Final stage: a preferred pair within 1% of the fastest wins (timing noise); beyond 1%,
    the fastest wins. The preferred pairs are timed as whole kernels beside the finalists."""
    best_up = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=16, num_warps=8, num_stages=4)
    best_down = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    # one step off the optimum in GROUP_SIZE_M: cost + 100 * 0.05 * log2(16) = +20 on ~205 (+10%)
    far = dict(best_down, GROUP_SIZE_M=16)
    near = dict(best_down, num_stages=4)  # + 100 * 0.15 * log2(4/3) = +6.2 (~3%): still beyond 1%

    class Noisy(FakeProvider):
        def full_fn(self, p, up, down):
            t = cost("up", up) + cost("down", down) + 5.0
            if sp.cfg_key(down) == sp.cfg_key(near):
                t = (cost("up", best_up) + cost("down", best_down) + 5.0) * 1.006  # a tie: within 1%
            return lambda: t

    for shipped_down, wins in ((far, False), (near, True)):
        ev = Evaluator(Noisy(), None, FakeTimer())
        r = search(ev, "fast", 4096, 128, 8, H200_SMEM, 2, prefer=[("shipped", best_up, shipped_down)])
        tags = {f["tag"] for f in r["final"]}
        assert "shipped" in tags, "the shipped pair is timed in the final stage"
        if wins:
            assert sp.cfg_key(r["down"]) == sp.cfg_key(near) and r["pick"].startswith("shipped")
        else:
            assert sp.cfg_key(r["down"]) == sp.cfg_key(best_down) and r["pick"] == "fastest"


def test_per_gemm_joint_kind_times_one_config_for_both_gemms():
    """A provider whose release reads no _down file (kinds == ("joint",)) times each config
    through gemm_fn("joint") (up + down with it), not the whole kernel; the result is one
    config for both GEMMs."""
    calls = []

    class Joint(FakeProvider):
        kinds = ("joint",)

        def gemm_fn(self, p, kind, cfg):
            calls.append(kind)
            return lambda: cost("up", cfg) + cost("down", cfg)

    prov = Joint(separable=False)
    r = search(Evaluator(prov, None, FakeTimer()), "smoke", 4, 8, 2, None, 2)
    assert r["up"] == r["down"] and set(calls) == {"joint"}


def test_no_candidate_runs_raises():
    class Broken(FakeProvider):
        def gemm_fn(self, p, kind, cfg):
            def f():
                raise RuntimeError("nope")
            return f
    with pytest.raises(RuntimeError):
        search(Evaluator(Broken(), None, FakeTimer()), "smoke", 4, 8, 2, None, 2)
    with pytest.raises(ValueError):
        search(Evaluator(FakeProvider(), None, FakeTimer()), "nope", 4, 8, 2, None, 2)


# ----------------------------------------------------------------- checkpoint, split


def test_checkpoint_roundtrip_and_key(tmp_path):
    key, kid = checkpoint.run_key(shape={"E": 8}, space="fast", device="NVIDIA_H200", triton="3.6.0")
    _, kid2 = checkpoint.run_key(shape={"E": 8}, space="fast", device="NVIDIA_H200", triton="3.5.1")
    assert kid != kid2
    assert checkpoint.load(tmp_path, kid) == ({}, None)
    checkpoint.save(tmp_path, key, kid, {"1": {"x": 1}})
    assert checkpoint.load(tmp_path, kid) == ({"1": {"x": 1}}, None)
    res, why = checkpoint.load(tmp_path, kid2)
    assert res == {} and "another run" in why
    (tmp_path / checkpoint.NAME).write_text("{not json")
    res, why = checkpoint.load(tmp_path, kid)
    assert res == {} and "unreadable" in why
    assert not list(tmp_path.glob("*.tmp"))
    assert not list(tmp_path.glob(".*orch-tmp*"))  # atomic_write leaves no temp file behind


def test_split_batches_covers_all_and_balances():
    bs = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
    parts = split_batches(bs, 4)
    assert sorted(itertools.chain(*parts)) == bs
    assert len(parts) == 4 and max(map(len, parts)) - min(map(len, parts)) <= 1
    big = sorted(bs)[-4:]
    assert all(sum(M in big for M in p) == 1 for p in parts), "the 4 largest go to different GPUs"
    assert split_batches([1, 2], 4) == [[2], [1]]


def test_cpu_timer_measures_something():
    from remote.tuning.tuner.timing import Timer
    t = Timer("cpu")
    us = t.time(lambda: sum(range(20000)), reps=3)
    assert us > 0 and t.stats.calls == 1 and t.stats.seconds > 0
    json.dumps(t.stats.__dict__)


def test_parallel_workers_relay_results():
    """Two spawned workers (CPU devices here; one per GPU on a host) each tune their share
    and every message reaches the caller."""
    from remote.tuning.tuner.driver import tune_parallel
    from remote.tuning.tuner.events import Done, Error, Progress
    spec = dict(shape=dict(E=4, N=32, hidden=64, topk=2), dtype="float16", space="smoke", provider="builtin",
                seed=0, dtype_selector=None, block_shape=None, shipped=None, check=True)
    msgs = []
    tune_parallel(spec, ["cpu", "cpu"], [1, 2], msgs.append)
    done = {m.batch_size: m.result for m in msgs if isinstance(m, Done)}
    assert set(done) == {1, 2}, [m for m in msgs if isinstance(m, Error)]
    assert all(r["rel_err"] < 1e-2 and r["up"]["BLOCK_SIZE_M"] == r["down"]["BLOCK_SIZE_M"] for r in done.values())
    assert any(isinstance(m, Progress) for m in msgs)


class _Checked:
    """A provider whose check returns set errors: ``errs[(up, down)]``; None/None is no file."""

    def __init__(self, errs, own_kernel):
        self.errs, self.calls = errs, []
        if own_kernel:
            self.default_config = lambda p: {"BLOCK_SIZE_M": 64}

    def check(self, problem, up, down):
        self.calls.append((up, down))
        return self.errs[(up and up["id"], down and down["id"])]


def test_correctness_bar_follows_the_servers_own_kernel():
    """SGLang's fp8 kernel on Hopper errs 1.19e-2 with no file at all (H200, block [128, 128], M=1):
    a tuned config near that passes; an O(1) error still fails; orch's builtin kernel keeps 1e-2."""
    up, down = {"id": "u"}, {"id": "d"}
    near = _Checked({("u", "d"): 0.0131, (None, None): 0.0119}, own_kernel=True)
    ok, v = check_tuned(near, None, up, down)
    assert ok and v["rel_err_default"] == 0.0119 and abs(v["rel_err_bar"] - 0.0238) < 1e-12
    wrong = _Checked({("u", "d"): 0.9, (None, None): 0.0119}, own_kernel=True)
    assert not check_tuned(wrong, None, up, down)[0]
    builtin = _Checked({("u", "d"): 0.0131}, own_kernel=False)
    ok, v = check_tuned(builtin, None, up, down)
    assert not ok and v["rel_err_bar"] == 1e-2 and "rel_err_default" not in v and builtin.calls == [(up, down)]
    good = _Checked({("u", "d"): 0.004}, own_kernel=True)
    ok, _ = check_tuned(good, None, up, down)
    assert ok and good.calls == [(up, down)]  # no second run when the fixed bar holds
    nan_floor = _Checked({("u", "d"): 0.0131, (None, None): float("inf")}, own_kernel=True)
    assert not check_tuned(nan_floor, None, up, down)[0]


class _RecordingCompiler:
    """Records when new compiles are sent (``("compile", n)``) between timings (``("time",)``);
    every compile is done at once (``submit`` returns no pending future)."""

    def __init__(self, events):
        self.events, self.seen = events, set()

    def submit(self, jobs, M=None):
        new = {(kind, sp.cfg_key(c)) for kind, c in jobs} - self.seen
        if new:
            self.seen |= new
            self.events.append(("compile", len(new)))
        return {}


def test_fast_refinement_compiles_each_round_at_once_with_the_same_result():
    events = []

    class Timer(FakeTimer):
        def time(self, fn, n_calls=10, reps=10, replay_us=None):
            events.append(("time",))
            return super().time(fn, n_calls, reps, replay_us)

    plain = search(Evaluator(FakeProvider(), None, FakeTimer()), "fast", 4096, 128, 8, H200_SMEM, 2)
    ev = Evaluator(FakeProvider(), None, Timer(), compiler=_RecordingCompiler(events))
    r = search(ev, "fast", 4096, 128, 8, H200_SMEM, 2)
    assert (r["up"], r["down"], r["evaluated"]) == (plain["up"], plain["down"], plain["evaluated"])
    # a compile sent after something was timed is a wait for the workers: the screen's seeds of both
    # GEMMs go before any timing, then one batch per refinement round (3 BLOCK_SIZE_M x 2 GEMMs each)
    waits = sum(1 for a, b in zip(events, events[1:]) if a[0] == "time" and b[0] == "compile")
    assert events[0][0] == events[1][0] == "compile" and events[2] == ("time",)
    assert 1 <= waits <= 3


def test_graph_calls_keep_each_screening_replay_near_a_millisecond():
    from remote.tuning.tuner.timing import graph_calls
    # fast kernels keep SGLang's graph of 10 calls; slow ones get fewer, never 0
    assert graph_calls(30.0, 10, 1000.0) == 10
    assert graph_calls(100.0, 10, 1000.0) == 10
    assert graph_calls(150.0, 10, 1000.0) == 7
    assert graph_calls(500.0, 10, 1000.0) == 2
    assert graph_calls(2500.0, 10, 1000.0) == 1
    assert graph_calls(0.0, 10, 1000.0) == 10  # no usable time: the fixed protocol


def test_fast_search_screens_adaptively_and_times_finalists_with_the_full_protocol():
    from remote.tuning.tuner.search import ADAPTIVE_SCREEN_PROTOCOL, FULL_PROTOCOL, SCREEN_PROTOCOL
    ev = Evaluator(FakeProvider(), None, FakeTimer())
    r = search(ev, "fast", 4096, 128, 8, H200_SMEM, 2)
    protos = set(ev.timer.protocols)
    adaptive = tuple(ADAPTIVE_SCREEN_PROTOCOL[k] for k in ("n_calls", "reps", "replay_us"))
    assert adaptive in protos and (FULL_PROTOCOL["n_calls"], FULL_PROTOCOL["reps"], None) in protos
    assert (SCREEN_PROTOCOL["n_calls"], SCREEN_PROTOCOL["reps"], None) not in protos
    # "fixed" is the earlier protocol, and on a timer whose times do not depend on the protocol both
    # modes make the same decisions
    ev_fixed = Evaluator(FakeProvider(), None, FakeTimer(), screen="fixed")
    rf = search(ev_fixed, "fast", 4096, 128, 8, H200_SMEM, 2)
    assert (SCREEN_PROTOCOL["n_calls"], SCREEN_PROTOCOL["reps"], None) in set(ev_fixed.timer.protocols)
    assert all(p[2] is None for p in ev_fixed.timer.protocols)
    assert (rf["up"], rf["down"]) == (r["up"], r["down"])
    with pytest.raises(ValueError, match="screen must be one of"):
        Evaluator(FakeProvider(), None, FakeTimer(), screen="quick")


def test_cpu_timer_accepts_the_adaptive_protocol():
    from remote.tuning.tuner.timing import Timer
    calls = []
    t = Timer("cpu")
    us = t.time(lambda: calls.append(1), n_calls=10, reps=3, replay_us=1000.0)
    assert us >= 0 and len(calls) == 4 and t.stats.shortened == 0


def test_time_blocked_on_compile_workers_is_counted_as_compile():
    """measure() times each config as soon as its compile finishes (``as_completed``); the time it
    blocks there is the wait for the workers and goes to ``compiler.seconds`` (report.json's
    ``time_split.compile``), not to ``search_other``."""
    import concurrent.futures as cf
    import threading

    gate = threading.Event()

    class SlowCompiler:
        seconds = 0.0

        def __init__(self):
            self.pool = cf.ThreadPoolExecutor(2)

        def submit(self, jobs, M=None):
            # each "compile" ends only once the gate opens, which the test opens 0.3 s later
            return {(kind, sp.cfg_key(c)): self.pool.submit(lambda: (gate.wait(5), (True, ""))[1])
                    for kind, c in jobs}

        def wait(self, key, fut):
            fut.result()
            return None

    comp = SlowCompiler()
    ev = Evaluator(FakeProvider(), None, FakeTimer(), compiler=comp)
    threading.Timer(0.3, gate.set).start()
    cfgs = [dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=g, num_warps=8, num_stages=4)
            for g in (1, 16)]
    out = ev.measure("up", cfgs, dict(n_calls=10, reps=3))
    assert len(out) == 2
    assert comp.seconds >= 0.25  # the blocked time, counted once
    comp.pool.shutdown()


class _RefusingCompiler:
    """Compile workers whose Triton refuses every config with BLOCK_SIZE_K 128 (the error text a
    provider's ``compile_one`` returns for Triton 3.6's pass failure) and whose own environment fails
    every config with GROUP_SIZE_M 32 (an error that is not the compiler's). As the real compilers,
    ``submit`` returns futures only for jobs still running: these finish at once, so it returns none,
    and the refusals are known only through ``refused``."""

    def __init__(self):
        self.seconds = 0.0
        self.sent = {}

    @staticmethod
    def _result(c):
        if c["BLOCK_SIZE_K"] == 128:
            return False, "RuntimeError: PassManager::run failed"
        if c["GROUP_SIZE_M"] == 32:
            return False, "ModuleNotFoundError: No module named 'x'"
        return True, ""

    def submit(self, jobs, M=None):
        for kind, c in jobs:
            self.sent[(kind, sp.cfg_key(c))] = self._result(c)
        return {}

    def refused(self, kind, cfg, M=None):
        from remote.tuning.tuner.compile import compiler_refused
        ok, err = self.sent.get((kind, sp.cfg_key(cfg)), (True, ""))
        return err if not ok and compiler_refused(err) else None

    def wait(self, key, fut):  # never called: submit returns no future
        raise AssertionError("no future was handed out")


def test_a_config_the_workers_triton_refused_is_never_compiled_in_the_timing_process():
    launched = []

    class Prov(FakeProvider):
        def gemm_fn(self, p, kind, cfg):
            def fn():
                launched.append(sp.cfg_key(cfg))
                if cfg["BLOCK_SIZE_K"] == 128:  # the timing process would fail the same way
                    raise RuntimeError("PassManager::run failed")
                return cost(kind, cfg)
            return fn

    logs = []
    prov = Prov()
    comp = _RefusingCompiler()
    ev = Evaluator(prov, None, FakeTimer(), compiler=comp, log=lambda m, lvl="info": logs.append(m))
    r = search(ev, "fast", 4096, 128, 8, H200_SMEM, 2)
    assert launched and not [k for k in launched if k[2] == 128]
    assert not [pr for pr in prov.whole if pr[0][2] == 128 or pr[1][2] == 128]
    assert r["up"]["BLOCK_SIZE_K"] != 128 and r["down"]["BLOCK_SIZE_K"] != 128
    assert r["failed"] > 0 and any("Triton refused it" in m for m in logs)
    assert any(k[1][2] == 128 for k in comp.sent)  # refused configs were sent, so the skip was exercised
    # a worker failure of its own (not Triton's compiler) is retried by the launch here
    assert [k for k in launched if k[3] == 32]


def test_compiler_refused_reads_the_compile_workers_error_text():
    from remote.tuning.tuner.compile import compiler_refused
    assert compiler_refused("RuntimeError: PassManager::run failed")
    assert compiler_refused("CompileTimeAssertionFailure: at 12:4: ...")
    # a CompilationError may wrap a Python error of the worker's own module: retried in the timing process
    assert not compiler_refused("CompilationError: at 3:8: NameError('x is not defined')")
    assert not compiler_refused("OutOfResources: out of resource: shared memory")
    assert not compiler_refused("BrokenProcessPool: a worker died")


def test_the_compilers_report_a_finished_refused_compile_without_waiting():
    import concurrent.futures as cf
    from remote.tuning.tuner.compile import Compiler
    c = Compiler(None, "x", enabled=False, per_batch=True)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    done, running = cf.Future(), cf.Future()
    done.set_result((False, "RuntimeError: PassManager::run failed"))
    c._futures[("up", sp.cfg_key(cfg), 8)] = done
    c._futures[("down", sp.cfg_key(cfg), 8)] = running
    assert "PassManager" in c.refused("up", cfg, 8)
    assert c.refused("up", cfg, 16) is None  # another batch size's compile is not this one's
    assert c.refused("down", cfg, 8) is None  # still running: not known yet, and never waited for
