"""The host's dead-man (remote/host/deadman.py, issue 32 rows 1 and 2): disarmed when the run is
done with the host, fired when no controller renewed the run's lock in time; what it does to the
lock, the files, the tune and the unit (``systemctl`` is a recording stand-in on PATH)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from remote.host import changes
from remote.host import deadman as dm
from remote.host import install as inst
from remote.host import lock
from remote.host.fs import update_state
from remote.protocol import PayloadError

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
OLD = b'{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}}'
NEW = json.dumps({"1": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                        "num_warps": 4, "num_stages": 3}})
SYSTEMCTL = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  is-active) unit="$2"; if [ -e "{d}/active-$unit" ]; then echo active; else echo inactive; exit 3; fi ;;
  start|restart) touch "{d}/active-$2" ;;
  stop) rm -f "{d}/active-$2" ;;
  show) echo "InvocationID=0123456789abcdef0123456789abcdef" ;;
esac
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A state folder with run r1 holding the lock and having installed new files over old ones,
    and a ``systemctl`` stand-in (its calls logged to ``calls``; a unit is active while
    ``d/active-UNIT`` exists)."""
    d = tmp_path / "sd"
    d.mkdir()
    (d / "systemctl").write_text(SYSTEMCTL.format(log=d / "calls", d=d))
    (d / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    state, dest = tmp_path / "state", tmp_path / "configs" / "triton_3_6_0"
    dest.mkdir(parents=True)
    (dest / UP).write_bytes(OLD)
    lock.acquire(str(state), "r1", "ops@ctl pid 1")
    update_state(str(state), "r1", state="stopped")
    inst.install({"run_id": "r1", "state_dir": str(state), "dest_dir": str(dest),
                  "files": [{"name": UP, "content": NEW}, {"name": DOWN, "content": NEW}]})
    return {"state": str(state), "dest": dest, "d": d}


def _age_lock(state: str, seconds: float) -> None:
    path = os.path.join(state, "lock.json")
    lk = json.loads(open(path).read())
    lk["heartbeat_ts"] = time.time() - seconds
    open(path, "w").write(json.dumps(lk))


def _calls(host) -> list[str]:
    p = host["d"] / "calls"
    return p.read_text().splitlines() if p.exists() else []


def test_no_heartbeat_past_the_deadline_fires_restores_and_starts_the_unit(host):
    _age_lock(host["state"], 100)
    out = dm.watch(host["state"], "r1", "sglang-qwen.service", 90, "orch-tune-r1.service", poll=0.05)
    assert out["fired"] and out["heartbeat_age_s"] >= 100 and out["deadline_s"] == 90
    assert (host["dest"] / UP).read_bytes() == OLD and not (host["dest"] / DOWN).exists()
    assert {f["action"] for f in out["files"]} == {"restored", "deleted"}
    assert "start sglang-qwen.service" in _calls(host) and out["unit_state"] == "active"
    assert out["unit"].startswith("started") and out["invocation_id"] == "0123456789abcdef0123456789abcdef"
    st = json.loads(open(os.path.join(host["state"], "runs", "r1", "state.json")).read())
    assert st["state"] == "stopped"  # unfinished: `orch recover` proves and records it
    assert st["deadman"]["fired_at"] == out["fired_at"]
    # the lock stays, marked: a controller that comes back late is refused its heartbeat and its changes
    lk = json.loads(open(os.path.join(host["state"], "lock.json")).read())
    assert lk["run_id"] == "r1" and lk["deadman"]["deadline_s"] == 90
    with pytest.raises(PayloadError, match="dead-man took run r1 over") as exc:
        lock.heartbeat(host["state"], "r1")
    assert exc.value.kind == "locked"
    assert changes.held_by_other(host["state"], {"r1"}) is not None
    with pytest.raises(PayloadError, match="host lock held by the host's dead-man"):
        inst.install({"run_id": "r1", "state_dir": host["state"], "dest_dir": str(host["dest"]),
                      "files": [{"name": UP, "content": NEW}]})


def test_a_unit_the_dead_run_had_started_on_its_files_is_restarted_one_it_never_touched_left(host):
    (host["d"] / "active-sglang-qwen.service").touch()
    _age_lock(host["state"], 100)
    out = dm.watch(host["state"], "r1", "sglang-qwen.service", 90, "orch-tune-r1.service", poll=0.05)
    assert "restart sglang-qwen.service" in _calls(host) and out["unit"].startswith("restarted")


def test_a_running_tune_unit_is_stopped_before_the_unit_starts(host):
    (host["d"] / "active-orch-tune-r1.service").touch()
    _age_lock(host["state"], 100)
    out = dm.watch(host["state"], "r1", "sglang-qwen.service", 90, "orch-tune-r1.service", poll=0.05)
    calls = _calls(host)
    assert out["tune"].startswith("stopped orch-tune-r1.service")
    assert calls.index("stop orch-tune-r1.service") < calls.index("start sglang-qwen.service")


def test_a_heartbeat_in_time_keeps_it_watching_and_the_release_disarms_it(host):
    result = {}
    t = threading.Thread(target=lambda: result.update(dm.watch(host["state"], "r1", "sglang-qwen.service", 1.0,
                                                                "orch-tune-r1.service", poll=0.05)))
    t.start()
    for _ in range(6):  # 1.5 s of heartbeats, past its 1 s deadline
        time.sleep(0.25)
        lock.heartbeat(host["state"], "r1")
    assert t.is_alive()
    lock.release(host["state"], "r1")
    t.join(30)
    assert result == {"fired": False, "why": "the run released its lock"}
    assert not _calls(host) and (host["dest"] / UP).read_bytes() == NEW.encode()


def test_a_finished_run_or_another_holder_disarms_it(host):
    update_state(host["state"], "r1", state="completed")
    _age_lock(host["state"], 100)
    assert dm.watch(host["state"], "r1", "u.service", 90, "t.service", poll=0.05) == {"fired": False,
                                                                                     "why": "the run is completed"}
    update_state(host["state"], "r1", state="stopped")
    lock.break_lock(host["state"], force=True)
    lock.acquire(host["state"], "r2", "other")
    assert dm.watch(host["state"], "r1", "u.service", 90, "t.service", poll=0.05)["why"] == "the lock is held by r2"
    assert not _calls(host)


def test_bad_input_is_refused():
    from argparse import Namespace

    for unit, deadline in (("a;b", 10), ("-x", 10), ("u.service", 0)):
        with pytest.raises(PayloadError) as exc:
            dm.run(Namespace(run_id="r1", unit=unit, deadline=deadline, state_dir="/nonexistent", tune_unit=None,
                             poll=1))
        assert exc.value.kind == "bad_input"
