"""Issue 32 row 1: a lost link is named as such; the engine logs in again with a bounded backoff and
runs a ``rerun`` step again; past ``orch_reconnect_timeout`` it gives the host up (in-process: a
scripted connection whose link is down for a number of login attempts)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import pytest

from orchestrator.connection.base import Connection, HostUnreachable, LinkLost
from orchestrator.connection.reconnect import reconnect
from orchestrator.engine.context import RunOptions
from orchestrator.engine.playbook import load_playbook
from orchestrator.engine.results import TaskResult
from orchestrator.engine.runner import Engine
from orchestrator.engine.task import task


@dataclass
class H:
    name: str
    groups: list = field(default_factory=list)


class Rep:
    def __init__(self):
        self.lines = []

    def task_result(self, host, name, result):
        self.lines.append((host, name, result.status, result.msg))

    def progress(self, *a, **k):
        pass

    def line(self, text):
        self.lines.append(text)


class FlakyLink(Connection):
    """A connection whose link is down for ``down`` login attempts after a command lost it."""

    def __init__(self, down: int, refused: bool = False):
        super().__init__("h1")
        self.down, self.refused, self.logins = down, refused, 0

    def open(self):
        self.logins += 1
        if self.refused:
            raise HostUnreachable("h1: unknown host key")  # an answer: never retried
        if self.logins <= self.down:
            raise HostUnreachable("h1: connect timed out after 5 s", transient=True)

    def reconnect(self, within, *, cancel=None, on_retry=None):
        import orchestrator.connection.reconnect as rc

        saved = (rc.BACKOFF_S, rc.JITTER_S)
        rc.BACKOFF_S, rc.JITTER_S = 0.001, 0.0  # the schedule is tested below; here only the count
        try:
            return reconnect(self.open, within, cancel=cancel, on_retry=on_retry)
        finally:
            rc.BACKOFF_S, rc.JITTER_S = saved


PB = """
- hosts: all
  tasks:
    - block:
        - connect_fake: {}
        - idem: {what: reap}
        - once: {what: install}
      rescue:
        - idem: {what: restore}
"""


def _engine(tmp_path, link, lose: dict, reconnect_timeout=300):
    mods, calls = {}, []

    @task("connect_fake", registry=mods)
    def connect_fake(ctx):
        ctx.connection = link
        return TaskResult.ok("connected")

    def body(ctx, what):
        calls.append((what, ctx.attempt))
        if lose.get(what, 0) > 0:
            lose[what] -= 1
            raise LinkLost(f"h1: connection lost while running python -m remote {what}")
        return TaskResult.changed(what)

    @task("idem", rerun=True, registry=mods)
    def idem(ctx, what: str):
        return body(ctx, what)

    @task("once", registry=mods)
    def once(ctx, what: str):
        return body(ctx, what)

    pb = tmp_path / "pb.yaml"
    pb.write_text(textwrap.dedent(PB))
    events, rep = [], Rep()
    opts = RunOptions(run_id="r1", run_dir=tmp_path / "run")
    eng = Engine(mods, opts, rep, lambda ev, **f: events.append((ev, f)))
    recap = eng.run_play(load_playbook(pb, mods)[0], [H("h1")],
                         lambda h: {"orch_reconnect_timeout": reconnect_timeout})["h1"]
    return recap, calls, events, rep


def test_a_lost_link_is_waited_out_and_the_idempotent_step_runs_again(tmp_path):
    link = FlakyLink(down=3)
    recap, calls, events, rep = _engine(tmp_path, link, {"reap": 1})
    assert recap.outcome == "completed", recap.cause
    assert calls == [("reap", 1), ("reap", 2), ("install", 1)]
    assert link.logins == 4  # three refused while the link was down, the fourth got through
    names = [e for e, _ in events]
    assert names.count("link_lost") == 1 and names.count("reconnect_retry") == 3 and names.count("reconnected") == 1
    lost = next(f for e, f in events if e == "link_lost")
    assert "connection lost while running python -m remote reap" in lost["error"]
    assert recap.summary.reconnects == [{"task": "idem", "attempts": 4, "after_s": pytest.approx(0, abs=5)}]
    assert any("reconnecting for up to" in str(line) for line in rep.lines)


def test_a_step_that_is_not_idempotent_fails_the_host_unreachable_at_once(tmp_path):
    link = FlakyLink(down=0)
    recap, calls, events, _ = _engine(tmp_path, link, {"install": 1})
    assert recap.outcome == "unreachable" and "connection lost while running python -m remote install" in recap.cause
    assert ("install", 2) not in calls and "link_lost" not in [e for e, _ in events]
    assert ("restore", 1) in calls  # the rescue ran, on the link that is back


def test_past_orch_reconnect_timeout_the_host_is_given_up_and_the_rescue_tries_once(tmp_path):
    link = FlakyLink(down=10 ** 6)
    recap, calls, events, _ = _engine(tmp_path, link, {"reap": 1, "restore": 1}, reconnect_timeout=0.3)
    assert recap.outcome == "unreachable"
    assert "unreachable for 0.3 s (orch_reconnect_timeout) after the connection was lost in 'idem'" in recap.cause
    assert "connect timed out" in recap.cause
    assert calls.count(("reap", 1)) == 1 and ("reap", 2) not in calls
    # given up: the rescue's step is tried once, not waited for again
    assert calls.count(("restore", 1)) == 1 and ("restore", 2) not in calls
    assert [e for e, _ in events].count("link_given_up") == 1


def test_a_refused_login_is_not_retried(tmp_path):
    link = FlakyLink(down=0, refused=True)
    recap, calls, events, _ = _engine(tmp_path, link, {"reap": 1})
    assert recap.outcome == "unreachable" and "unknown host key" in recap.cause
    assert link.logins == 1


def test_the_backoff_doubles_to_its_bound_and_never_passes_the_deadline():
    import orchestrator.connection.reconnect as rc

    now = {"t": 0.0}
    waits = []

    def failing():
        raise HostUnreachable("h1: cannot reach it: No route to host", transient=True)

    retrying = rc.reconnecting(60, clock=lambda: now["t"],
                               on_retry=lambda n, exc, wait_s: waits.append(wait_s))
    retrying.sleep = lambda s: now.__setitem__("t", now["t"] + s)
    with pytest.raises(HostUnreachable, match="No route"):
        for attempt in retrying:
            with attempt:
                failing()
    assert waits[0] <= rc.BACKOFF_S + rc.JITTER_S and max(waits) <= rc.BACKOFF_MAX_S + rc.JITTER_S
    assert waits[4] >= 2 ** 4 * rc.BACKOFF_S or waits[4] >= rc.BACKOFF_MAX_S  # doubling
    assert now["t"] == pytest.approx(60)  # the last wait is cut to the deadline, then it stops
