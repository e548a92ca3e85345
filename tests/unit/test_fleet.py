"""GroupCoordinator: who tunes, who reuses, and nobody waits forever."""

import threading

import pytest

from orchestrator.fleet import GroupCoordinator
from tests.waiting import CEILING_S  # a hang guard only: the waits end on their condition


def _in_threads(fns):
    out, errs = {}, {}

    def run(name, fn):
        try:
            out[name] = fn()
        except Exception as exc:  # collected for the assertion
            errs[name] = exc

    ts = [threading.Thread(target=run, args=(n, f)) for n, f in fns.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=CEILING_S)
    assert not any(t.is_alive() for t in ts), "a host is still waiting"
    return out, errs


def test_first_host_tunes_others_reuse_and_late_starter_reuses():
    g = GroupCoordinator()
    g.start_batch(["a", "b", "c"])
    for h in ("a", "b"):  # --forks 2: c has not started yet
        g.host_started(h)

    def host(h, key):
        def fn():
            g.report_key(h, key)
            return g.assign(h, [1, 4], timeout=CEILING_S)
        return fn

    out, errs = _in_threads({"a": host("a", "K"), "b": host("b", "K")})
    assert not errs and out["a"].kind == "tune" and out["b"].kind == "reuse" and out["b"].tuner == "a"
    g.host_started("c")
    g.report_key("c", "K")
    assert g.assign("c", [1, 4], timeout=CEILING_S).kind == "reuse"
    g.publish("K", {"configs": {"up": {"1": {}}}})
    assert g.wait_result("K", timeout=CEILING_S)["configs"]["up"] == {"1": {}}


def test_tuner_that_ends_early_fails_its_waiters():
    g = GroupCoordinator()
    g.start_batch(["a", "b"])
    for h in ("a", "b"):
        g.host_started(h)
        g.report_key(h, "K")
    assert g.assign("a", [1]).kind == "tune"
    assert g.assign("b", [1]).kind == "reuse"
    g.host_done("a")  # e.g. its stop failed before tuning
    with pytest.raises(RuntimeError, match="a ended before publishing"):
        g.wait_result("K", timeout=5)


def test_shards_merge_and_a_lost_shard_fails_the_rest():
    g = GroupCoordinator(shard_tuning=True)
    g.start_batch(["a", "b"])
    for h in ("a", "b"):
        g.host_started(h)
        g.report_key(h, "K")
    ra, rb = g.assign("a", [1, 2, 4, 8]), g.assign("b", [1, 2, 4, 8])
    assert (ra.batch_sizes, rb.batch_sizes) == ([1, 4], [2, 8])
    g.publish("K", {"configs": {"up": {"4": 1, "1": 0}}}, shard=0, merge=g.merged)
    g.publish("K", {"configs": {"up": {"8": 3, "2": 2}}}, shard=1, merge=g.merged)
    assert list(g.wait_result("K", timeout=CEILING_S)["configs"]["up"]) == ["1", "2", "4", "8"]
    g.start_batch(["a", "b"])  # a new batch forgets the old result
    for h in ("a", "b"):
        g.host_started(h)
        g.report_key(h, "K")
    g.assign("a", [1, 2]), g.assign("b", [1, 2])
    g.publish("K", {"configs": {"up": {"1": 0}}}, shard=0, merge=g.merged)
    g.host_done("b")
    with pytest.raises(RuntimeError, match="b ended before publishing"):
        g.wait_result("K", timeout=5)


def test_cancel_ends_the_barrier():
    g = GroupCoordinator()
    g.start_batch(["a", "b"])
    g.host_started("a")
    g.host_started("b")
    g.report_key("a", "K")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(TimeoutError, match="interrupted"):
        g.assign("a", [1], cancel=cancel)


def test_tune_on_picks_the_named_host():
    g = GroupCoordinator(tune_on="b")
    g.start_batch(["a", "b", "c"])
    for h in ("a", "b", "c"):
        g.host_started(h)
        g.report_key(h, "K" if h != "c" else "L")
    assert g.assign("a", [1]).kind == "reuse" and g.assign("a", [1]).tuner == "b"
    assert g.assign("b", [1]).kind == "tune"
    # another key has no such host: its first host tunes
    assert g.assign("c", [1]).kind == "tune"
