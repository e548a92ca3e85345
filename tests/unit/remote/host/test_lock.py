"""Host lock: contention, re-entry, heartbeat, staleness, break, release (remote/host/lock.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from remote.host import lock
from remote.protocol import PayloadError
from tests.paths import REPO
from tests.waiting import run_watched

ROOT = str(REPO)


@pytest.fixture
def sd(tmp_path):
    return str(tmp_path / "state")


def age_heartbeat(sd: str, seconds: float) -> None:
    """Move the recorded heartbeat ``seconds`` into the past (as if the controller went quiet)."""
    p = os.path.join(sd, "lock.json")
    obj = json.load(open(p))
    obj["heartbeat_ts"] -= seconds
    obj["created_ts"] -= seconds
    json.dump(obj, open(p, "w"))


def test_acquire_contention_and_reentry(sd):
    r = lock.acquire(sd, "run-a", "alice@ctl1 pid 42")
    assert r["acquired"] and not r["reentrant"] and r["held"] and not r["stale"]
    on_disk = json.load(open(os.path.join(sd, "lock.json")))
    assert on_disk["run_id"] == "run-a" and on_disk["controller"] == "alice@ctl1 pid 42"
    assert oct(os.stat(sd).st_mode & 0o777) == "0o700"
    with pytest.raises(PayloadError) as ei:
        lock.acquire(sd, "run-b", "bob@ctl2")
    e = ei.value
    assert e.kind == "locked" and "run-a" in e.msg and "alice@ctl1" in e.msg and "age" in e.msg
    assert "STALE" not in e.msg
    again = lock.acquire(sd, "run-a", "alice@ctl1 pid 42")
    assert again["reentrant"] is True
    assert json.load(open(os.path.join(sd, "lock.json")))["created"] == on_disk["created"]


def test_heartbeat_keeps_lock_fresh_and_stale_detection(sd):
    lock.acquire(sd, "run-a", "ctl")
    age_heartbeat(sd, 100)
    st = lock.status(sd, stale_after=60)
    assert st["held"] and st["stale"] and st["heartbeat_age_s"] >= 100
    assert not lock.status(sd, stale_after=600)["stale"]
    hb = lock.heartbeat(sd, "run-a", stale_after=60)
    assert hb["heartbeat_age_s"] < 60 and not hb["stale"]
    assert hb["age_s"] >= 100  # created is kept
    with pytest.raises(PayloadError) as ei:
        lock.heartbeat(sd, "run-b")
    assert ei.value.kind == "locked"


def test_stale_lock_refused_until_broken(sd):
    lock.acquire(sd, "run-a", "ctl-a")
    with pytest.raises(PayloadError) as ei:      # fresh: break refused without --force
        lock.break_lock(sd, stale_after=60)
    assert ei.value.kind == "locked"
    age_heartbeat(sd, 120)
    with pytest.raises(PayloadError) as ei:      # stale: acquire still refuses, says so
        lock.acquire(sd, "run-b", "ctl-b", stale_after=60)
    assert "STALE" in ei.value.msg
    with pytest.raises(PayloadError):            # guard: wrong holder named
        lock.break_lock(sd, holder="run-x", stale_after=60)
    b = lock.break_lock(sd, holder="run-a", stale_after=60, breaker="run-b")
    assert b["broken"] and b["previous"]["run_id"] == "run-a" and not b["held"]
    rec = json.load(open(os.path.join(sd, "lock.broken.json")))
    assert rec["broken_by"] == "run-b" and rec["previous"]["run_id"] == "run-a" and rec["stale"]
    assert lock.acquire(sd, "run-b", "ctl-b")["acquired"]
    with pytest.raises(PayloadError) as ei:      # the old holder notices it lost the lock
        lock.heartbeat(sd, "run-a")
    assert ei.value.kind == "locked"


def test_force_break_and_release(sd):
    lock.acquire(sd, "run-a", "ctl")
    with pytest.raises(PayloadError):
        lock.release(sd, "run-b")
    assert lock.status(sd)["held"]
    assert lock.break_lock(sd, force=True)["broken"]
    assert lock.release(sd, "run-a")["released"] is False
    with pytest.raises(PayloadError) as ei:
        lock.heartbeat(sd, "run-a")
    assert ei.value.kind == "not_found"
    lock.acquire(sd, "run-a", "ctl")
    r = lock.release(sd, "run-a")
    assert r["released"] and not os.path.exists(os.path.join(sd, "lock.json"))


def test_corrupt_lock_counts_as_held_and_stale(sd):
    os.makedirs(sd)
    open(os.path.join(sd, "lock.json"), "w").write("{half")
    st = lock.status(sd)
    assert st["held"] and st["stale"]
    with pytest.raises(PayloadError):
        lock.acquire(sd, "run-a", "ctl")
    assert lock.break_lock(sd)["broken"]
    assert lock.acquire(sd, "run-a", "ctl")["acquired"]


def test_concurrent_acquire_exactly_one_wins(sd):
    procs = [subprocess.Popen([sys.executable, "-m", "remote", "lock", "acquire", "--state-dir", sd,
                               "--run-id", f"run-{i}", "--controller", f"c{i}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    outs = [(p.wait(timeout=60), p.stdout.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    codes = sorted(rc for rc, _ in outs)
    assert codes == [0, 2, 2, 2]
    (winner,) = [json.loads(o.splitlines()[-1]) for rc, o in outs if rc == 0]
    losers = [json.loads(o.splitlines()[-1]) for rc, o in outs if rc == 2]
    assert all(l["type"] == "error" and l["kind"] == "locked" for l in losers)
    holder = winner["data"]["lock"]["run_id"]
    assert json.load(open(os.path.join(sd, "lock.json")))["run_id"] == holder
    assert all(holder in l["msg"] for l in losers)


def test_cli_status_and_bad_input(sd):
    cp = run_watched([sys.executable, "-m", "remote", "lock", "status", "--state-dir", sd], cwd=ROOT)
    last = json.loads(cp.stdout.splitlines()[-1])
    assert cp.returncode == 0 and last["data"]["held"] is False
    cp = run_watched([sys.executable, "-m", "remote", "lock", "acquire", "--state-dir", sd,
                         "--run-id", "../x", "--controller", "c"], cwd=ROOT)
    assert cp.returncode == 2 and json.loads(cp.stdout.splitlines()[-1])["kind"] == "bad_input"
    assert not os.path.exists(os.path.join(sd, "lock.json"))


def test_cli_break_run_id_is_the_breaker(sd):
    """``lock break --run-id ME --force`` (as the controller calls it) breaks another run's lock."""
    lock.acquire(sd, "run-a", "ctl-a")
    cp = run_watched([sys.executable, "-m", "remote", "lock", "break", "--state-dir", sd,
                         "--run-id", "run-b", "--force"], cwd=ROOT)
    last = json.loads(cp.stdout.splitlines()[-1])
    assert cp.returncode == 0 and last["data"]["broken"] and last["data"]["previous"]["run_id"] == "run-a"
    lock.acquire(sd, "run-a", "ctl-a")
    cp = run_watched([sys.executable, "-m", "remote", "lock", "break", "--state-dir", sd,
                         "--holder", "run-x", "--force"], cwd=ROOT)
    assert cp.returncode == 2 and lock.status(sd)["held"]
