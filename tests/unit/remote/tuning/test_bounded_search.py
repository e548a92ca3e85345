"""Issue 30 on the CPU: the bandwidth/FLOP floor, the time budget, the server's routing (fused shared
expert, recorded routings, skew), the second opinion, and the group-quantization stand-in that skips
padding rows. Fakes stand in for the GPU timer (each measurement charges seconds the way GPU timing
does); no test depends on the machine's speed."""

import argparse
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from remote.protocol import DEFAULT_TUNE_BUDGET_S, PayloadError  # noqa: E402
from remote.tuning.tuner import floor as fl  # noqa: E402
from remote.tuning.tuner import routing as rt  # noqa: E402
from remote.tuning.tuner import space as sp  # noqa: E402
from remote.tuning.tuner.opinion import second_opinion, verdict  # noqa: E402
from remote.tuning.tuner.search import STAGE_SHARE, Evaluator, search  # noqa: E402

H200_SMEM = 232448


# ----------------------------------------------------------------------------- fakes


class Stats:
    def __init__(self):
        self.seconds = 0.0
        self.first_s = 0.0
        self.calls = 0
        self.race_stopped = 0
        self.shortened = 0
        self.calls_saved = 0


class GpuLikeTimer:
    """Returns the callable's value (µs) as its time and charges what a GPU measurement would: the
    runs of the protocol times that time, plus 2 ms; honours the race cut-off (one run, then stop)."""

    def __init__(self):
        self.stats = Stats()
        self._warm = True
        self.cutoffs = []

    def time(self, fn, n_calls=10, reps=10, replay_us=None, cutoff_us=None):
        t = fn()
        self.stats.calls += 1
        if cutoff_us is not None:
            self.cutoffs.append(cutoff_us)
            if t > cutoff_us:
                self.stats.race_stopped += 1
                self.stats.seconds += 0.002 + 2 * t * 1e-6
                return t
        self.stats.seconds += 0.002 + (reps + 1) * n_calls * t * 1e-6
        return t


def _floors(M=4, E=8, top_k=2):
    """Floors of a small problem: 8 experts, M * top_k rows spread over them, a device whose
    ceilings make the FLOP term dominate at large BLOCK_SIZE_M."""
    counts = [0] * E
    for i in range(M * top_k):
        counts[i % E] += 1
    g = fl.GemmShape(E=E, N=512, hidden=1024, M=M, counts=tuple(counts))
    return fl.Floors(g, fl.Ceilings(bw=4e12, flops={"bf16": 2e13, "fp8": 4e13, "int8": 4e13}, source="test"))


class FloorProvider:
    """Every config's time is its floor times a factor >= 1 that depends on the config (a landscape
    with a known optimum), so the floor is a true lower bound, as on a GPU."""

    name = "fake"
    separable = True

    def __init__(self, floors, whole_penalty=None):
        self.f = floors
        self.whole_penalty = whole_penalty or {}

    def cost(self, kind, c):
        tgt = dict(up=(16, 128, 64, 16, 8, 4), down=(16, 64, 128, 1, 4, 3))[kind]
        import math
        d = sum(w * abs(math.log2(v) - math.log2(t))
                for v, t, w in zip(sp.cfg_key(c), tgt, (0.05, 0.3, 0.2, 0.05, 0.2, 0.15)))
        return self.f.gemm_us(kind, c) * (1.3 + d)

    def gemm_fn(self, p, kind, cfg):
        return lambda: self.cost(kind, cfg)

    def full_fn(self, p, up, down):
        pen = self.whole_penalty.get((sp.cfg_key(up), sp.cfg_key(down)), 0.0)
        return lambda: self.cost("up", up) + self.cost("down", down) + 5.0 + pen


# ----------------------------------------------------------------------------- floor


def test_floor_is_bytes_or_padded_tensor_core_work_whichever_is_larger():
    f = _floors(M=4)
    small = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64)
    big = dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64)
    # 8 rows over 8 experts: BLOCK_SIZE_M 256 computes 8 x 256 padded rows, 16 times BLOCK_SIZE_M 16's
    assert f.g.padded_rows(16) == 8 * 16 and f.g.padded_rows(256) == 8 * 256
    flops_big = 2.0 * 8 * 256 * 1024 * 1024 / 2e13 * 1e6
    assert f.gemm_us("up", big) == pytest.approx(max(flops_big, f._bytes["up"] / 4e12 * 1e6))
    assert f.gemm_us("up", big) > 10 * f.gemm_us("up", small)
    # a tile wider than N pads the work too; the least floor at a BLOCK_SIZE_M is below every config's
    assert f.min_gemm_us("down", 16) <= f.gemm_us("down", small)
    assert f.gemm_us("joint", small) == pytest.approx(f.gemm_us("up", small) + f.gemm_us("down", small))


def test_pruner_rules():
    f = _floors(M=4)
    pr = fl.Pruner(f, ("up", "down"))
    big = dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64)
    small = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64)
    fb = f.gemm_us("up", big)
    assert pr.why("up", big, {}) is None  # nothing measured: nothing to beat
    # same BLOCK_SIZE_M: pruned only beyond the margin over the best measured there
    assert pr.why("up", big, {"up": {256: fb * 1.01}}) is None
    assert "best up at BLOCK_SIZE_M 256" in pr.why("up", big, {"up": {256: fb / 1.05}})
    # across BLOCK_SIZE_M: its floor plus the down GEMM's least floor beyond the best up+down sum
    best = {"up": {16: 2 * f.gemm_us("up", small)}, "down": {16: 2 * f.gemm_us("down", small)}}
    total = best["up"][16] + best["down"][16]
    assert fb > total  # the big tile alone cannot beat the best pair
    assert "best up+down" in pr.why("up", big, best)
    assert pr.why("up", small, best) is None


def test_the_floor_prunes_only_what_cannot_win():
    f = _floors(M=4)
    prov = FloorProvider(f)
    plain = search(Evaluator(prov, None, GpuLikeTimer()), "full", 4, 8, 2, H200_SMEM, 2)
    ev = Evaluator(prov, None, GpuLikeTimer())
    ev.pruner = fl.Pruner(f, ev.kinds)
    pruned = search(ev, "full", 4, 8, 2, H200_SMEM, 2)
    assert (pruned["up"], pruned["down"]) == (plain["up"], plain["down"])
    assert pruned["whole_us"] == pytest.approx(plain["whole_us"])
    assert ev.budget.pruned_floor > 0 and ev.evaluated < plain["evaluated"]
    # every candidate the floor ruled out is truly slower than the winner of its GEMM
    timed = {(k, key) for (k, key, _p), v in ev.cache.items() if v is not None}
    ruled = [(k, key) for (k, key, _p), v in ev.cache.items() if v is None]
    assert ruled
    win = {"up": prov.cost("up", pruned["up"]), "down": prov.cost("down", pruned["down"])}
    for k, key in ruled:
        assert (k, key) not in timed
        assert prov.cost(k, sp.from_key(key)) > win[k]
    assert ev.budget.report()["floor_examples"]


# ----------------------------------------------------------------------------- budget


def test_budget_split_follows_expected_cost_and_passes_on_what_is_left():
    w = {1: 1.0, 2: 1.0, 4: 2.0}
    assert fl.allocate(40.0, w, 4) == pytest.approx(20.0)
    assert fl.allocate(40.0, {2: 1.0, 4: 2.0}, 2) == pytest.approx(40.0 / 3)
    assert fl.allocate(-1.0, w, 1) == 0.0
    # a slow kernel's batch size weighs more than a fast one's
    assert fl.cost_weight(3000.0) > 5 * fl.cost_weight(30.0)
    g = _floors(M=4).g
    assert fl.planned(g, 4096).pairs == 4096 * 2 and fl.planned(g, 1).pairs == 2
    assert DEFAULT_TUNE_BUDGET_S > 0


def test_the_budget_stops_each_stage_and_reports_what_it_cut():
    f = _floors(M=64)
    prov = FloorProvider(f)
    free = Evaluator(prov, None, GpuLikeTimer())
    r_free = search(free, "fast", 64, 8, 2, H200_SMEM, 2)
    spent_free = free.timer.stats.seconds
    timer = GpuLikeTimer()
    limit = 0.25 * spent_free
    ev = Evaluator(prov, None, timer, budget=fl.Budget(limit, timer))
    shipped = (dict(r_free["up"]), dict(r_free["down"]))
    default = sp.default_config(64, 8)
    r = search(ev, "fast", 64, 8, 2, H200_SMEM, 2,
               prefer=[("shipped", *shipped), ("default", default, default)])
    rep = ev.budget.report()
    assert rep["pruned_budget"] > 0 and rep["stages_cut"], rep
    assert any(s.startswith("screen") for s in rep["stages_cut"])
    # the preferred pairs are always timed in the whole-kernel stage; the pick is one that was measured
    assert {"shipped", "default"} <= {x["tag"] for x in r["final"]}
    assert r["whole_us"] <= min(x["whole_us"] for x in r["final"] if x["tag"] == "shipped") * 1.0001
    # it stayed near its share: the mandatory measurements (preferred configs, one seed per
    # BLOCK_SIZE_M, the best finalists) come on top of what the stages may spend
    assert timer.stats.seconds < 2 * limit < spent_free
    assert ev.evaluated < free.evaluated


def test_the_race_cut_off_stops_a_screening_measurement_of_a_loser():
    f = _floors(M=64)
    timer = GpuLikeTimer()
    ev = Evaluator(FloorProvider(f), None, timer, budget=fl.Budget(1e9, timer))
    search(ev, "fast", 64, 8, 2, H200_SMEM, 2)
    assert timer.cutoffs and ev.budget.race_stopped == timer.stats.race_stopped > 0
    # no cut-off without a budget: the earlier protocol
    t2 = GpuLikeTimer()
    search(Evaluator(FloorProvider(f), None, t2), "fast", 64, 8, 2, H200_SMEM, 2)
    assert not t2.cutoffs


def test_slow_kernels_keep_ten_replays_of_a_shorter_graph():
    from remote.tuning.tuner.timing import SLOW_CALL_US, SLOW_REPLAY_US
    ev = Evaluator(FloorProvider(_floors()), None, GpuLikeTimer())
    key = (16, 64, 64, 1, 4, 3)
    ev.cache[("up", key, (10, 3, 1000.0))] = 2 * SLOW_CALL_US
    ev.cache[("down", key, (10, 3, 1000.0))] = 0.5 * SLOW_CALL_US
    full = dict(n_calls=10, reps=10)
    assert ev._protocol_for("up", key, full) == dict(full, replay_us=SLOW_REPLAY_US)
    assert ev._protocol_for("down", key, full) == full


# ----------------------------------------------------------------------------- routing


def test_fused_shared_expert_runs_in_every_row_as_sglang_routes_it():
    w, ids, info = rt.make(rt.Routing(shared=1), 64, 9, 2, 0, "cpu")
    assert ids.shape == (64, 3) and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert (ids[:, -1] == 8).all()  # the id after the 8 routed experts, SGLang's F.pad(value=num_experts)
    assert (ids[:, :2] < 8).all() and (ids[:, 0] != ids[:, 1]).all()
    assert torch.allclose(w[:, :2].sum(1), torch.ones(64)) and (w[:, 2] == 1.0).all()
    assert info["shared_expert"] and info["top_k"] == 3 and info["kind"] == "synthetic"
    assert info["max_load"] == 64  # the shared expert gets every row
    # the builtin problem runs top-(k+1) with it and sizes its buffers for it
    from remote.tuning.providers.builtin import BuiltinProvider
    p = BuiltinProvider().make_problem(dict(E=9, N=32, hidden=64, topk=2), 8, "float32", "cpu", 0,
                                       routing={"shared": 1})
    assert p.top_k == 3 and (p.topk_ids[:, -1] == 8).all() and p.act_in.shape[0] == 8 * 3
    # no shared expert, no file, no skew: exactly the routing of every earlier tune
    p0 = BuiltinProvider().make_problem(dict(E=8, N=32, hidden=64, topk=2), 8, "float32", "cpu", 0)
    p1 = BuiltinProvider().make_problem(dict(E=8, N=32, hidden=64, topk=2), 8, "float32", "cpu", 0,
                                        routing=rt.Routing().to_dict())
    assert torch.equal(p0.topk_ids, p1.topk_ids) and p1.routing_info["kind"] == "synthetic"


def test_recorded_topk_ids_folder_is_used_as_recorded(tmp_path):
    a = torch.tensor([[0, 1, 8], [2, 3, 8], [4, 5, 8]], dtype=torch.int32)
    b = torch.tensor([[6, 7, 8], [1, 0, 8]], dtype=torch.int32)
    torch.save(a, tmp_path / "topk_ids_layer3_idx0.pt")
    torch.save(b, tmp_path / "topk_ids_layer4_idx0.pt")
    (tmp_path / "notes.txt").write_text("not a recording")
    rec = rt.load_recorded(str(tmp_path))
    assert rec.kind == "topk_ids" and rec.files == 2
    # row i from file i % 2: a0, b0, a1, b1, a2
    assert rec.rows.tolist() == [[0, 1, 8], [6, 7, 8], [2, 3, 8], [1, 0, 8], [4, 5, 8]]
    w, ids, info = rt.make(rt.Routing(shared=1, file=str(tmp_path)), 7, 9, 2, 0, "cpu", rec)
    assert info["kind"] == "recorded top-k ids" and ids.shape == (7, 3)
    assert ids[:, :2].tolist() == [[0, 1], [6, 7], [2, 3], [1, 0], [4, 5], [0, 1], [6, 7]]  # cycled
    assert (ids[:, 2] == 8).all()
    # the recording must fit the shape: top-k and the experts
    with pytest.raises(rt.RoutingError, match="columns"):
        rt.make(rt.Routing(shared=0, file=str(tmp_path)), 4, 8, 1, 0, "cpu", rec)
    with pytest.raises(rt.RoutingError, match="shared expert id"):
        rt.make(rt.Routing(shared=1, file=str(tmp_path)), 4, 7, 2, 0, "cpu", rec)
    with pytest.raises(rt.RoutingError, match="outside"):  # id 8 read as a routed expert of 8
        rt.make(rt.Routing(shared=0, file=str(tmp_path)), 4, 8, 3, 0, "cpu", rec)
    # a routed-only recording of a shape with a fused shared expert gets the shared column added
    torch.save(a[:, :2].clone(), tmp_path / "routed.pt")
    w, ids, _ = rt.make(rt.Routing(shared=1, file=str(tmp_path / "routed.pt")), 3, 9, 2, 0, "cpu")
    assert ids.tolist() == [[0, 1, 8], [2, 3, 8], [4, 5, 8]]


def test_recorded_expert_distribution_dumps(tmp_path):
    # stat mode: counts [steps, layers, experts]; expert 0 holds 60% of every layer's rows
    counts = torch.ones(2, 3, 8, dtype=torch.int32)
    counts[:, :, 0] = 10 * 7 * 60 // 40
    torch.save({"rank": 0, "logical_count": counts, "average_utilization_rate_over_window": None},
               tmp_path / "expert_distribution_recorder_1.pt")
    rec = rt.load_recorded(str(tmp_path / "expert_distribution_recorder_1.pt"))
    assert rec.kind == "distribution" and rec.shares.numel() == 8 and rec.shares[0] > 0.5
    w, ids, info = rt.make(rt.Routing(file="x"), 512, 8, 2, 0, "cpu", rec)
    assert info["kind"] == "recorded distribution"
    load = torch.bincount(ids.reshape(-1).long(), minlength=8)
    assert load[0] > 2 * load[1:].max()  # the recorded hot expert is hot here
    assert (ids[:, 0] != ids[:, 1]).all()
    # per_token mode: physical ids mapped to logical ones, unfilled (-1) rows dropped
    p2l = torch.tensor([[3, 2, 1, 0]])
    recs = [{"forward_pass_id": 0, "rank": 0, "gatherer_key": "primary",
             "topk_ids_of_layer": torch.tensor([[[0, 1], [2, 3], [-1, -1]]])}]
    torch.save({"records": recs, "last_physical_to_logical_map": p2l}, tmp_path / "per_token.pt")
    rec = rt.load_recorded(str(tmp_path / "per_token.pt"))
    assert rec.rows.tolist() == [[3, 2], [1, 0]]
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(rt.RoutingError, match="other.pt"):
        rt.load_recorded(str(tmp_path / "other.pt"))


def test_skew_concentrates_the_load_and_sharpens_a_recording():
    loads = {}
    for s in (0.0, 1.5):
        _, ids, info = rt.make(rt.Routing(skew=s), 1024, 16, 2, 3, "cpu")
        loads[s] = info["max_load"]
        assert info["skew"] == s
    assert loads[1.5] > 2 * loads[0.0]
    rec = rt.Recorded("distribution", "test", shares=torch.tensor([0.4, 0.2, 0.2, 0.2], dtype=torch.float64))
    flat = torch.bincount(rt.make(rt.Routing(file="x"), 2048, 4, 1, 0, "cpu", rec)[1].reshape(-1).long())
    sharp = torch.bincount(rt.make(rt.Routing(file="x", skew=2.0), 2048, 4, 1, 0, "cpu", rec)[1].reshape(-1).long())
    assert sharp[0] > flat[0] * 1.3
    with pytest.raises(rt.RoutingError):
        rt.Routing(skew=-1)


def test_the_tune_command_checks_the_routing_file_before_anything_runs(tmp_path):
    from remote.tuning.command import tune_routing
    shape = dict(E=9, N=64, hidden=128, topk=2)
    naming = {"shared_experts": 1}
    ns = argparse.Namespace(routing_file=None, routing_skew=0.5)
    r = tune_routing(ns, shape, naming)
    assert r.shared == 1 and r.skew == 0.5 and r.file is None
    with pytest.raises(PayloadError) as e:
        tune_routing(argparse.Namespace(routing_file=str(tmp_path / "none.pt"), routing_skew=0), shape, naming)
    assert e.value.kind == "not_found" and "none.pt" in e.value.msg
    torch.save(torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), tmp_path / "wide.pt")
    with pytest.raises(PayloadError) as e:
        tune_routing(argparse.Namespace(routing_file=str(tmp_path / "wide.pt"), routing_skew=0), shape, naming)
    assert e.value.kind == "bad_input" and "wide.pt" in e.value.msg


def test_the_controller_passes_budget_and_routing_to_the_payload():
    from orchestrator.inventory.variables import KNOWN_VARS
    from orchestrator.tasks.tune import tuning_flags
    assert tuning_flags({}) == ["--budget", str(DEFAULT_TUNE_BUDGET_S)]
    assert tuning_flags({"orch_tune_budget": 0, "orch_tune_routing_file": "/var/lib/topk",
                         "orch_tune_routing_skew": 0.5}) == [
        "--budget", "0", "--routing-file", "/var/lib/topk", "--routing-skew", "0.5"]
    assert KNOWN_VARS["orch_tune_budget"].check("120") == 120
    assert KNOWN_VARS["orch_tune_budget"].default == DEFAULT_TUNE_BUDGET_S
    for bad in ("-1", "inf", True, "x"):
        with pytest.raises(ValueError):
            KNOWN_VARS["orch_tune_budget"].check(bad)
    with pytest.raises(ValueError):
        KNOWN_VARS["orch_tune_routing_file"].check("relative/path")
    with pytest.raises(ValueError):
        KNOWN_VARS["orch_tune_routing_skew"].check(-0.1)


# ----------------------------------------------------------------------------- second opinion


class OpinionProvider:
    def __init__(self, times):
        self.times = times

    def full_fn(self, p, up, down):
        return lambda: self.times[(None if up is None else up["BLOCK_SIZE_N"])]


def test_second_opinion_rounds_spread_and_the_replace_rule():
    up = lambda n: dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=n, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    timer = GpuLikeTimer()
    variants = {"tuned": (up(64), up(64)), "default": (None, None), "shipped": (up(128), up(128))}
    op = second_opinion(OpinionProvider({64: 101.0, None: 150.0, 128: 100.0}), None, timer, variants, cpu=False)
    assert op["rounds"] == 5 and timer.stats.calls == 15
    assert op["us"] == {"tuned": 101.0, "default": 150.0, "shipped": 100.0}
    assert op["spread_us"]["tuned"] == [101.0, 101.0]
    assert op["ratio_to_tuned"]["shipped"]["median"] == pytest.approx(100 / 101, abs=1e-4)
    replace, why = verdict(op, "shipped")
    assert replace and "lost to the shipped entry" in why
    assert verdict(op, "default")[0] is False
    # a variant that cannot run is reported, and decides nothing
    op = second_opinion(OpinionProvider({64: 101.0, None: 150.0}), None, timer, variants, cpu=False)
    assert op["us"]["shipped"] is None and "shipped" in op["failed"]
    assert verdict(op, "shipped")[0] is False


def test_a_pick_that_loses_the_second_opinion_is_replaced_by_the_shipped_entry(monkeypatch):
    """The driver end to end with a fake kernel: the search's winner is fastest on the search's
    inputs, but slower than the shipped pair on the fresh inputs of the second opinion: the shipped
    entry is written and the report says so."""
    import remote.tuning.providers as providers
    from remote.tuning.tuner import driver
    from remote.tuning.tuner import timing

    shipped_cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=3)

    class P:
        def __init__(self, seed):
            self.seed, self.M, self.weights = seed, 4, None

    class Fake:
        name = "fake"
        separable = True
        fallback_reason = None

        def make_problem(self, shape, M, dtype, device, seed, weights=None, quant=None, routing=None):
            return P(seed)

        def gemm_fn(self, p, kind, cfg):
            return lambda: 10.0 + cfg["BLOCK_SIZE_N"] / 100.0

        def full_fn(self, p, up, down):
            t = 30.0 if up is None else 20.0 + up["BLOCK_SIZE_N"] / 50.0
            if up is not None and up == shipped_cfg:
                t = 20.5 if p.seed > 1000 else 99.0  # loses the search, wins the second opinion
            return lambda: t

        def check(self, p, up, down):
            return 0.0

    monkeypatch.setattr(providers, "get_provider", lambda name: Fake())
    monkeypatch.setattr(timing, "Timer", lambda device: GpuLikeTimer())
    events = []
    spec = dict(shape=dict(E=8, N=64, hidden=128, topk=2), dtype="float32", space="smoke", provider="fake", seed=0,
                dtype_selector=None, block_shape=None, quant=None, check=True,
                shipped={"up": {"4": shipped_cfg}, "down": {"4": shipped_cfg}})
    driver.tune_on_device(spec, "cpu", [4], events.append)
    done = [e for e in events if type(e).__name__ == "Done"]
    assert done, events
    res = done[0].result
    assert res["replaced"]["by"] == "shipped" and res["pick"].startswith("shipped (replaced")
    assert sp.cfg_key(res["up"]) == sp.cfg_key(shipped_cfg) == sp.cfg_key(res["down"])
    assert res["replaced"]["search_pick"]["up"] != shipped_cfg  # the search picked another pair
    op = res["second_opinion"]
    assert op["baseline"] == "shipped" and op["us"]["shipped"] == 20.5 and op["us"]["tuned"] > 20.5
    assert res["tuned_us"] == res["shipped_us"] and res["speedup_vs_shipped"] == 1.0
    assert res["routing"]["kind"] == "synthetic" and res["budget"]["limit_s"] is None
    assert any(type(e).__name__ == "Log" and "lost to the shipped entry" in e.msg for e in events)


# ----------------------------------------------------------------------------- stand-in


def _sorted_layout():
    """A sorted, block-padded layout of BLOCK_SIZE_M 16: expert 0 has 5 rows (11 padding), expert 1
    has 3 (13 padding), then 8 rows past num_tokens_post_padded; 8 valid (token, expert) pairs."""
    rows, nv = 40, 8
    sid = torch.full((rows,), nv, dtype=torch.int32)
    sid[:5] = torch.arange(5)
    sid[16:19] = torch.arange(5, 8)
    return rows, sid, torch.tensor([32], dtype=torch.int32), nv


def test_group_quant_stand_in_skips_the_padding_rows_sglang_skips():
    from tests import sglang_standins as st
    rows, sid, ntpp, nv = _sorted_layout()
    # groups of 128: 8 lanes a group, 4 (row, group) items a warp; N = 256 is 2 groups: 2 rows a warp,
    # so the padding row sharing a warp with the last real row of an expert is quantized too
    keep = st.group_quant_keep(rows, 2, 128, sid, ntpp, nv)
    assert keep.any(1).nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 16, 17, 18, 19]
    assert (keep.all(1) == keep.any(1)).all()
    # N = 1024: 8 groups, a warp within a row: exactly the real rows
    keep8 = st.group_quant_keep(rows, 8, 128, sid, ntpp, nv)
    assert keep8.any(1).nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 16, 17, 18]
    torch.manual_seed(0)
    x = torch.randn(rows, 256, dtype=torch.float16)
    poison_q = torch.full((rows, 256), 7.0).to(torch.float8_e4m3fn)
    q, s = st.per_token_group_quant(x, poison_q.clone(), torch.full((rows, 2), -1.0), 128, sorted_token_ids=sid,
                                    num_tokens_post_padded=ntpp, num_valid_tokens=nv)
    ref_q, ref_s = st._group_quant(x, 128)
    done = keep.any(1)
    assert torch.equal(s[done], ref_s[done]) and (s[~done] == -1.0).all()
    assert torch.equal(q[done].view(torch.uint8), ref_q[done].view(torch.uint8))
    assert torch.equal(q[~done].view(torch.uint8), poison_q[~done].view(torch.uint8))  # left unwritten
    # without the sorted layout every row is quantized (the up GEMM's input, the non-TMA down path)
    q2, s2 = st.sglang_per_token_group_quant_fp8(x, 128)
    assert torch.equal(s2, ref_s)
    with pytest.raises(NotImplementedError):
        st.per_token_group_quant(x, group_size=128, scale_ue8m0=True)


def test_group_quant_stand_in_kernel_writes_the_same_rows_and_scales():
    """The Triton kernel the stand-in runs on a GPU, under the interpreter: the same (row, group)
    items as the rule above, and the same scales (its fp8 values are not checked here: the
    interpreter's fp32 -> fp8 cast is off by up to two fp8 steps)."""
    from tests import sglang_standins as st
    rows, sid, ntpp, nv = _sorted_layout()
    torch.manual_seed(1)
    x = torch.randn(rows, 256, dtype=torch.float16)
    s = torch.full((rows, 2), -1.0)
    q = torch.zeros(rows, 256, dtype=torch.int8)
    st.group_quant(x, 128, torch.int8, output_q=q, output_s=s, sorted_layout=(sid, ntpp, nv), use_triton=True)
    keep = st.group_quant_keep(rows, 2, 128, sid, ntpp, nv)
    _, ref_s = st._group_quant(x, 128, torch.int8)
    assert torch.equal(s != -1.0, keep)
    assert torch.allclose(s[keep], ref_s[keep])
    ref_q, _ = st._group_quant(x, 128, torch.int8)
    assert torch.equal(q[keep.any(1)], ref_q[keep.any(1)]) and (q[~keep.any(1)] == 0).all()


def test_a_provider_without_routing_runs_only_the_synthetic_one():
    from remote.tuning.tuner.driver import make_problem

    class Plain:
        name = "plain"

        def make_problem(self, shape, M, dtype, device, seed, weights=None, quant=None):
            return ("problem", M)

    assert make_problem(Plain(), {}, 4, "float32", "cpu", 0, None, None, None) == ("problem", 4)
    assert make_problem(Plain(), {}, 4, "float32", "cpu", 0, None, None, rt.Routing().to_dict()) == ("problem", 4)
    with pytest.raises(ValueError, match="fused shared expert"):
        make_problem(Plain(), {}, 4, "float32", "cpu", 0, None, None, {"shared": 1})


class RulingProvider(FloorProvider):
    """A provider whose engine would not read an entry with BLOCK_SIZE_M below 32 (as vLLM's compiled
    WNA16 kernel refuses some entries: ``VllmProvider.config_allowed``); it records what was timed."""

    def __init__(self, floors):
        super().__init__(floors)
        self.timed = []

    def config_allowed(self, p, cfg):
        return int(cfg["BLOCK_SIZE_M"]) >= 32

    def gemm_fn(self, p, kind, cfg):
        self.timed.append(dict(cfg))
        return super().gemm_fn(p, kind, cfg)


@pytest.mark.parametrize("space", ["full", "fast"])
def test_the_search_never_picks_or_times_what_the_provider_rules_out(space):
    prov = RulingProvider(_floors(M=64))
    free = search(Evaluator(FloorProvider(_floors(M=64)), None, GpuLikeTimer()), space, 64, 8, 2, H200_SMEM, 2)
    r = search(Evaluator(prov, None, GpuLikeTimer()), space, 64, 8, 2, H200_SMEM, 2)
    assert min(free["up"]["BLOCK_SIZE_M"], free["down"]["BLOCK_SIZE_M"]) < 32  # the rule changes the answer
    assert r["up"]["BLOCK_SIZE_M"] >= 32 and r["down"]["BLOCK_SIZE_M"] >= 32
    assert prov.timed and all(c["BLOCK_SIZE_M"] >= 32 for c in prov.timed)
