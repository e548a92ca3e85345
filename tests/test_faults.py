"""Fault injection on the test bed (issue 7): every case asserts the END STATE of the host.

End state = the unit is active and healthy, the SGLang config tree is byte-identical to the
one before the run (``file_tree_hash``), the host's run record says ``restored`` (or
``completed``), the host lock is free, and the cause is shown. The faults are real: signals
to the real ``orch`` process, SSH sessions killed on the host, the payload killed, a tmpfs
that fills up, a stand-in server that never gets ready or loads the wrong file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.records import new_run_id
from tests.e2e_helpers import REPO, inventory, orch, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
#: a valid earlier config that the runs replace (restores must give back exactly these bytes)
OLD_UP = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 2}}
#: more batch sizes than the default [1, 4]: the tune lasts long enough to be hit mid-way
LONG_TUNE = {"orch_tune_batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256]}
HOST_OPTS = {0: {"config_files": {UP: OLD_UP}}}


# ------------------------------------------------------------------------------ helpers
def _popen(args: list[str], state_dir: Path, run_id: str, log: Path) -> subprocess.Popen:
    """Start ``orch ARGS`` in the background (its own run id, output to ``log``)."""
    cmd = [sys.executable, "-m", "orchestrator", *args, "--state-dir", str(state_dir), "--run-id", run_id, "--json"]
    env = dict(os.environ, XDG_STATE_HOME=str(state_dir), COLUMNS="200")
    fh = open(log, "w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True)


def _events(state_dir: Path, run_id: str) -> list[dict]:
    p = state_dir / "runs" / run_id / "events.jsonl"
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _wait_event(state_dir: Path, run_id: str, proc: subprocess.Popen, pred, what: str, timeout: float = 240) -> dict:
    """Poll the run's events.jsonl until ``pred(event)``; fail if the process ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in _events(state_dir, run_id):
            if pred(e):
                return e
        if proc.poll() is not None:
            raise AssertionError(f"orch exited ({proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


def _task_done(name: str):
    return lambda e: e.get("event") == "task" and e.get("task") == name and e.get("status") in ("ok", "changed")


def _wait_exit(proc: subprocess.Popen, log: Path, timeout: float = 300) -> tuple[int, dict]:
    rc = proc.wait(timeout=timeout)
    text = log.read_text()
    start = text.rfind('\n{\n  "run_id"')
    assert start >= 0, f"no JSON recap (exit {rc}):\n{text[-5000:]}"
    return rc, json.loads(text[start + 1:])


def _host_run_state(h, run_id: str) -> str:
    return json.loads(h.sh(f"cat /var/lib/orch/runs/{run_id}/state.json").stdout)["state"]


def _lock(h) -> dict | None:
    res = h.sh("cat /var/lib/orch/lock.json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def _assert_restored(h, tree_before: dict, run_id: str | None = None) -> None:
    """The invariant of every fault: old files byte-identical, unit active and healthy, lock free."""
    assert h.file_tree_hash(h.config_dir) == tree_before
    assert h.unit_state() == "active"
    h.wait_http("/health", timeout=60)
    assert _lock(h) is None
    # no temp file or half-written config anywhere in the SGLang tree
    assert not [p for p in h.file_tree_hash(h.config_dir) if "orch-tmp" in p or p.endswith(".tmp")]
    if run_id:
        assert _host_run_state(h, run_id) == "restored"


def _payload_procs(h) -> str:
    return h.sh("pgrep -af '[ ]-m remote (tune|bench)( |$)'", check=False).stdout.strip()


def _wait_payload_tune(h, timeout: float = 60) -> str:
    """Wait until the payload's Python ``tune`` process runs on the host (not only its shell)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = h.sh("pgrep -af '^[^ ]*python[^ ]* -m remote tune( |$)'", check=False).stdout.strip()
        if procs:
            return procs
        time.sleep(0.2)
    raise AssertionError(f"the payload tune did not start within {timeout} s")


def _ready_bed(testbed_factory, tmp_path, opts=None, **vars_):
    bed = testbed_factory(1, host_options=opts or HOST_OPTS)
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml", **vars_)
    return bed, h, inv, h.file_tree_hash(h.config_dir)


# ------------------------------------------------------------------- controller interrupts
@pytest.mark.parametrize("sig,step", [
    pytest.param(signal.SIGINT, "tune", id="SIGINT-tune"),  # Ctrl-C while the payload tunes (unit stopped)
    pytest.param(signal.SIGTERM, "wait_ready", id="SIGTERM-wait_ready"),  # new configs installed, warming up
])
def test_interrupted_controller_restores_host(testbed_factory, tmp_path, sig, step):
    opts = {0: {"config_files": {UP: OLD_UP}, "warmup_s": 6}}
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, opts, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        if step == "tune":
            _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
            _wait_payload_tune(h)
        else:
            _wait_event(state, rid, proc, lambda e: e.get("event") == "service_started", "the start on new configs")
            assert h.sh(f"test -f '{h.triton_dir}/{DOWN}'", check=False).returncode == 0, "new files installed"
        proc.send_signal(sig)
        rc, result = _wait_exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "failed" and "interrupted by the operator" in r["cause"], r
    _assert_restored(h, tree, rid)
    assert not _payload_procs(h), "the interrupted payload must not keep running"
    # the server runs on the old file again (the log of its last start)
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]


def test_sigkill_leaves_record_next_tune_refuses_recover_restores(testbed_factory, tmp_path):
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        proc.kill()  # SIGKILL: no rescue, no always
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # what a killed controller leaves: unit stopped, lock held by its run, record not finished
    assert h.unit_state() in ("inactive", "failed")
    assert (_lock(h) or {}).get("run_id") == rid
    assert _host_run_state(h, rid) == "stopped"

    # the next tune detects it from the host's own records and refuses, offering `orch recover`
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state2")
    assert again.returncode == 1, again.stderr[-3000:]
    cause = recap(again)["hosts"][h.name]["cause"]
    assert rid in cause and "controller is gone" in cause and "orch recover" in cause, cause
    assert h.unit_state() in ("inactive", "failed"), "a refused run must change nothing"
    assert (_lock(h) or {}).get("run_id") == rid

    # orch recover: restores the files, breaks the dead holder's lock, starts the unit
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "state3"),
               state_dir=tmp_path / "state3")
    assert rec.returncode == 0, rec.stderr[-4000:]
    assert recap(rec)["hosts"][h.name]["outcome"] == "completed"
    _assert_restored(h, tree, rid)
    assert not _payload_procs(h), "the dead run's payload must be stopped"
    broken = json.loads(h.sh("cat /var/lib/orch/lock.broken.json").stdout)
    assert broken["previous"]["run_id"] == rid


# ------------------------------------------------------------------------- SSH / network
def test_ssh_dropped_during_tune_host_restored(testbed_factory, tmp_path):
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        _wait_payload_tune(h)
        # kill every SSH session process of the host (not the listening sshd)
        h.sh("pkill -KILL -f '^sshd: root@'", check=False)
        rc, result = _wait_exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    assert "Tune the fused-MoE kernel" in r["cause"], r["cause"]
    # the rescue reconnects and brings the host back at once: no operator step needed
    _assert_restored(h, tree, rid)
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode != 0


def test_host_lost_after_stop_reported_unreachable_then_recovered(testbed_factory, tmp_path):
    """The link dies while the unit is stopped: the controller notices (TCP_USER_TIMEOUT under its
    keep-alives), its rescue cannot reach the host, the host is reported unreachable; once the
    link is back, `orch tune` refuses (unfinished run) and `orch recover` restores it."""
    from orchestrator.connection.ssh import DEAD_PEER_S, KEEPALIVE_S

    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, orch_connect_timeout=5, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        subprocess.run(["ip", "link", "set", h.veth, "down"], check=True)
        lost = time.monotonic()
        rc, result = _wait_exit(proc, log, timeout=240)
        noticed = time.monotonic() - lost
    finally:
        subprocess.run(["ip", "link", "set", h.veth, "up"], check=False)
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "unreachable" and "rescue also failed" in r["cause"], r
    # the dead link is noticed within keep-alive + dead-peer timeout (+ the rescue's connect attempts)
    assert noticed < KEEPALIVE_S + DEAD_PEER_S + 4 * 5 + 30, noticed
    assert h.unit_state() in ("inactive", "failed") and _host_run_state(h, rid) == "stopped"
    assert (_lock(h) or {}).get("run_id") == rid
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state2")
    assert again.returncode == 1 and "orch recover" in recap(again)["hosts"][h.name]["cause"]
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "s3"),
               state_dir=tmp_path / "s3")
    assert rec.returncode == 0, rec.stderr[-4000:]
    _assert_restored(h, tree, rid)
    assert not _payload_procs(h)


def test_unreachable_host_reported_others_proceed(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    inv = inventory(bed, tmp_path / "hosts.yaml")
    data = yaml.safe_load(inv.read_text())
    group = next(iter(data["all"]["children"].values()))
    ghost = dict(group["hosts"][h.name], ansible_port=2222)  # the host's address, no sshd on that port
    group["hosts"] = {"ghost": ghost, **group["hosts"]}
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    h.wait_http("/health")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "s1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    hosts = recap(proc)["hosts"]
    assert hosts["ghost"]["outcome"] == "unreachable" and "2222" in hosts["ghost"]["cause"], hosts["ghost"]
    assert hosts[h.name]["outcome"] == "check"
    # with --serial 1 --any-errors-fatal the batch after the unreachable host is not started
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--serial", "1", "--any-errors-fatal",
                "--json", state_dir=tmp_path / "s2")
    assert proc.returncode == 1
    hosts = recap(proc)["hosts"]
    assert hosts["ghost"]["outcome"] == "unreachable" and hosts[h.name]["outcome"] == "not started", hosts
    assert "not started: " + h.name in proc.stderr.replace("\n", "")
    assert h.unit_state() == "active"


# ------------------------------------------------------------------------ two controllers
def test_second_controller_refused_by_lock_and_stale_lock_broken(testbed_factory, tmp_path):
    # (the benchmark runs while the second controller works: no regression verdict on that noise)
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, orch_regression_threshold=95)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Lock the host"), "the first run's lock")
        second = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state2")
        assert (_lock(h) or {}).get("run_id") == rid, "the refused run must not touch the holder's lock"
        rc, result = _wait_exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert second.returncode == 1
    cause = recap(second)["hosts"][h.name]["cause"]
    assert f"host lock held by run {rid}" in cause, cause
    assert "no longer running" in cause, "a live holder is not called gone"
    assert rc == 0 and result["hosts"][h.name]["outcome"] == "completed", log.read_text()[-3000:]
    assert _lock(h) is None

    # a lock left by a controller on another machine: never broken silently
    ghost_run = "20260101T000000Z-tune-0a0b0c"
    now = time.time()
    lock = {"run_id": ghost_run, "controller": "ops@other-machine pid 4242", "pid": 1, "host": "x",
            "created": "2026-01-01T00:00:00Z", "heartbeat": "2026-01-01T00:00:00Z",
            "created_ts": now, "heartbeat_ts": now}
    h.local_path("/var/lib/orch/lock.json").write_text(json.dumps(lock))
    refused = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state3")
    assert refused.returncode == 1 and ghost_run in recap(refused)["hosts"][h.name]["cause"]
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "s4"),
               state_dir=tmp_path / "s4")
    assert rec.returncode == 1
    assert "--break-lock" in recap(rec)["hosts"][h.name]["cause"]
    assert (_lock(h) or {}).get("run_id") == ghost_run
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--break-lock", "--json",
               "--state-dir", str(tmp_path / "s5"), state_dir=tmp_path / "s5")
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert _lock(h) is None
    assert json.loads(h.sh("cat /var/lib/orch/lock.broken.json").stdout)["previous"]["run_id"] == ghost_run
    assert h.unit_state() == "active"


# ----------------------------------------------------------------------------- payload
def test_payload_crash_and_kill_restore_with_stderr_tail(testbed_factory, tmp_path):
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, **LONG_TUNE)
    # 1) Python exception inside the payload: its work folder's parent is a regular file
    h.sh("mkdir -p /var/lib/orch && rm -rf /var/lib/orch/work && echo x > /var/lib/orch/work")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "s1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    assert "payload tune failed" in r["cause"] and "Traceback" in r["cause"], r["cause"]
    hr = json.loads((Path(res["run_dir"]) / "hosts" / h.name / "result.json").read_text())
    assert "Error" in hr["cause"]  # the exception's name from the payload's stderr
    _assert_restored(h, tree, res["run_id"])
    h.sh("rm -f /var/lib/orch/work")

    # 2) the payload killed by a signal mid-tune
    state, rid, log = tmp_path / "s2", new_run_id("tune"), tmp_path / "orch.log"
    p2 = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, p2, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        _wait_payload_tune(h)
        killed = h.sh("pkill -KILL -e -f '^[^ ]*python[^ ]* -m remote tune'", check=False)
        assert killed.returncode == 0, (killed.stdout, killed.stderr, _payload_procs(h))
        rc, result = _wait_exit(p2, log)
    finally:
        if p2.poll() is None:
            p2.kill()
    assert rc == 1
    cause = result["hosts"][h.name]["cause"]
    assert "payload tune failed (crash)" in cause, cause
    _assert_restored(h, tree, rid)


# --------------------------------------------------------------------------- the server
@pytest.mark.parametrize("fault", ["never_ready", "wrong_file_loaded"])
def test_server_fault_after_install_restored(testbed_factory, tmp_path, fault):
    env = ({"ORCH_STANDIN_FAULT_ON_CHANGE": "never_ready"} if fault == "never_ready"
           # the server believes it runs on another GPU: it never loads the H200 file, logs the default
           else {"ORCH_STANDIN_GPU_NAME": "NVIDIA H100 80GB HBM3"})
    opts = {0: {"config_files": {UP: OLD_UP}, "env": env}}
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, opts, orch_ready_timeout=25)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    if fault == "never_ready":
        assert "Wait for readiness" in r["cause"], r["cause"]
    else:
        assert "Prove the new configs were loaded" in r["cause"] and UP in r["cause"], r["cause"]
    _assert_restored(h, tree, res["run_id"])


# ---------------------------------------------------------------------------- disk full
def test_disk_full_during_install_no_partial_file(testbed_factory, tmp_path):
    bed, h, inv, _ = _ready_bed(testbed_factory, tmp_path)
    d = h.triton_dir
    # a full 16 KiB tmpfs over the folder the files go to, holding the earlier file
    # (inside the host's mount namespace: the root namespace does not see this mount)
    h.sh(f"cp -p '{d}/{UP}' /root/orch-old-up && mount -t tmpfs -o size=16k orchfull '{d}' "
         f"&& cp -p /root/orch-old-up '{d}/{UP}' && rm /root/orch-old-up")
    h.sh(f"dd if=/dev/zero of='{d}/filler' bs=4k count=64 2>/dev/null; sync", check=False)
    h.sh("systemctl restart sglang-qwen")
    h.wait_http("/health")
    tree = h.file_tree_hash(h.config_dir)
    try:
        proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
        assert proc.returncode == 1, proc.stderr[-3000:]
        res = recap(proc)
        r = res["hosts"][h.name]
        assert r["outcome"] == "failed" and "Install the configs" in r["cause"], r
        assert "space" in r["cause"].lower(), r["cause"]
        _assert_restored(h, tree)
        assert _host_run_state(h, res["run_id"]) == "restored"
        assert sorted(os.path.basename(p) for p in h.file_tree_hash(d)) == sorted([UP, "filler"])
    finally:
        h.sh(f"umount '{d}'", check=False)
