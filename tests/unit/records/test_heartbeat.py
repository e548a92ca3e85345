"""The host lock's heartbeat thread (orchestrator.host.records): it renews the lock until stopped and
ends when the lock is lost (moved from the e2e faults file: it needs no test bed)."""

from __future__ import annotations

import time

from tests.waiting import wait_until


def _fake_ctx(calls, tmp_path, fail_with=None):
    """A host context with a fake payload client whose ``lock`` calls are recorded."""
    from tests.fakes import FakePayload, make_ctx

    def lock(args, _request):
        calls.append(("lock", list(args)))
        if fail_with is not None:
            raise fail_with
        return {}

    ctx = make_ctx(tmp_path, payload=FakePayload({"lock": lock}), run_id="r-1")
    return ctx, ctx.events, ctx.lines


def _until(pred):
    # progress, not wall time: the thread's condition, stalled only when nothing moves (tests/waiting.py)
    wait_until(pred, "the heartbeat thread's condition", poll=0.01)


def test_lock_heartbeat_thread_renews_until_stopped_and_ends_when_the_lock_is_lost(tmp_path):
    from orchestrator.payload.client import PayloadFailed
    from orchestrator.host.records import start_heartbeat, stop_heartbeat

    calls = []
    ctx, events, _ = _fake_ctx(calls, tmp_path)
    hb = start_heartbeat(ctx, 0.02)
    _until(lambda: hb.beats >= 3)
    assert calls[0] == ("lock", ["heartbeat", "--run-id", "r-1", "--state-dir", "/var/lib/orch"])
    assert ctx.run.on_done == [stop_heartbeat]  # the engine stops it when the host ends
    stop_heartbeat(ctx)
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n and not hb._thread.is_alive() and ctx.run.heartbeat is None

    # the lock was broken by someone else: the heartbeats end, with an event and a warning
    calls = []
    ctx, events, lines = _fake_ctx(calls, tmp_path, PayloadFailed("lock", "not_found",
                                                                   "no host lock to renew for run r-1"))
    hb = start_heartbeat(ctx, 0.02)
    _until(lambda: not hb._thread.is_alive())
    assert len(calls) == 1 and events[0][0] == "lock_lost" and "no longer holds the host lock" in lines[0]

    # a failed renewal (link down) is recorded and retried
    calls = []
    ctx, events, _ = _fake_ctx(calls, tmp_path, OSError("link down"))
    hb = start_heartbeat(ctx, 0.02)
    _until(lambda: len(calls) >= 3)
    stop_heartbeat(ctx)
    assert {e for e, _ in events} == {"lock_heartbeat_failed"} and "link down" in events[0][1]["error"]
