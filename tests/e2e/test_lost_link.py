"""Issue 32 end to end over real SSH: the host's link really cut (its veth down in the root namespace,
then up), the controller really killed (SIGKILL of the ``orch`` process), a failed earlier tune unit
of the run's name, a journalctl without ``--invocation``, a variable only in ``EnvironmentFile=``.

Each case asserts the end state (tests/e2e/test_faults.py): the files byte-identical or the new ones
installed and loaded, the unit active, the run recorded, the lock free. Waits are on conditions, kept
going by the progress of what they watch (tests/waiting.py); the only wall time is the fault's own
length: the 40 s the link stays down.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from orchestrator.records import new_run_id
from tests.e2e.helpers import inventory, orch, recap
from tests.e2e.test_faults import (DOWN, FAULTS_DIR, HOST_OPTS, LONG_TUNE, SITECUSTOMIZE, UP, _assert_restored,
                                   _events, _host_run_state, _lock, _payload_procs, _popen, _progress, _task_done,
                                   _wait_event, _wait_exit, _wait_payload_tune)
from tests.waiting import process_ended, wait_process, wait_until

pytestmark = pytest.mark.testbed

#: how long the link stays down in the reported fault (paramiko #2463, pyinfra #1336)
OUTAGE_S = 40


def _link(h, up: bool) -> None:
    subprocess.run(["ip", "link", "set", h.veth, "up" if up else "down"], check=True)


def _bed(testbed_factory, tmp_path, opts=None, **vars_):
    bed = testbed_factory(1, host_options={0: {**HOST_OPTS[0], **(opts or {})}})
    h = bed.hosts[0]
    h.wait_http("/health")
    return bed, h, inventory(bed, tmp_path / "hosts.yaml", **vars_), h.file_tree_hash(h.config_dir)


def _deadman_report(h, rid: str) -> dict | None:
    try:
        return json.loads(h.local_path(f"/var/lib/orch/runs/{rid}/state.json").read_text()).get("deadman")
    except (OSError, ValueError):
        return None


def _unit_loaded(h, unit: str) -> str:
    return h.sh(f"systemctl show -p LoadState {unit}", check=False).stdout.strip().partition("=")[2]


def _doctor(inv, tmp_path, name: str) -> tuple[int, dict]:
    """``orch doctor --json``: its status and its rows by host."""
    proc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / name)
    return proc.returncode, recap(proc)


# ------------------------------------------------------------------------------ row 1
def test_link_down_for_40_s_during_the_reap_is_waited_out_and_the_run_completes(testbed_factory, tmp_path):
    """The link goes down while the reap runs on the host (held there by a gate, so it is hit every
    time) and comes back 40 s later: the controller names the lost connection (never "crash"), logs
    in again with a backoff, runs the reap again (it is idempotent) and finishes the job: new files
    installed and loaded, the run ``completed``, the host's dead-man disarmed. Before: "payload reap
    failed (crash): no result line (exit -1)", restarted on the old configs, the host failed."""
    bed, h, inv, tree = _bed(testbed_factory, tmp_path, {"env": {"PYTHONPATH": f"{FAULTS_DIR}:/opt/sglang"}},
                             orch_connect_timeout=5)
    faults = h.local_path(FAULTS_DIR)
    faults.mkdir(parents=True, exist_ok=True)
    (faults / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (faults / "hold-reap").write_text("1")
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        wait_until((faults / "entered-reap").exists, "the reap on the host", progress=_progress(state, log, h),
                   alive=process_ended(proc))
        _link(h, up=False)
        cut = time.monotonic()
        (faults / "hold-reap").unlink()  # the reap finishes on the host; its answer is lost with the link
        _wait_event(state, rid, proc, lambda e: e.get("event") == "link_lost", "the lost link noticed")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut)))  # the fault: the link stays down 40 s
        _link(h, up=True)
        rc, result = _wait_exit(proc, log, h)
    finally:
        _link(h, up=True)
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, log.read_text()[-5000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "completed" and not r.get("cause"), r
    events = _events(state, rid)
    lost = next(e for e in events if e.get("event") == "link_lost")
    assert lost["task"] == "Reap leftover GPU processes" and "connection lost" in lost["error"], lost
    assert "crash" not in lost["error"]
    back = next(e for e in events if e.get("event") == "reconnected")
    assert back["after_s"] > 0 and back["attempts"] >= 1, back
    # the reap ran again once the link was back, and that run's answer ended the step
    order = [e.get("event") + (":" + e.get("task", "") if e.get("event") == "task" else "") for e in events]
    assert order.index("link_lost") < order.index("reconnected") < order.index("task:Reap leftover GPU processes")
    assert r["summary"]["reconnects"][0]["task"] == "Reap leftover GPU processes", r["summary"]
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode == 0
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]
    assert h.unit_state() == "active" and _host_run_state(h, rid) == "completed" and _lock(h) is None
    assert _unit_loaded(h, f"orch-deadman-{rid}.service") == "not-found" and not _payload_procs(h)


def test_link_down_during_the_tune_is_waited_out_and_the_controller_reattaches(testbed_factory, tmp_path):
    """The link goes down for 40 s while the tune runs in its transient unit: the controller's poll
    loses the link, it logs in again and reattaches to the same unit (no second tuner), which
    finished meanwhile or runs on; the run completes."""
    bed, h, inv, tree = _bed(testbed_factory, tmp_path, orch_connect_timeout=5, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_payload_tune(h, proc, state)
        _link(h, up=False)
        cut = time.monotonic()
        _wait_event(state, rid, proc, lambda e: e.get("event") == "link_lost", "the lost link noticed", h)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut)))  # the fault: the link stays down 40 s
        _link(h, up=True)
        rc, result = _wait_exit(proc, log, h)
    finally:
        _link(h, up=True)
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, log.read_text()[-5000:]
    assert result["hosts"][h.name]["outcome"] == "completed"
    events = _events(state, rid)
    assert [e["unit"] for e in events if e.get("event") == "tune_launch"] == [f"orch-tune-{rid}.service"]
    assert any(e.get("event") == "tune_reattach" for e in events), [e.get("event") for e in events]
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode == 0
    assert h.unit_state() == "active" and _host_run_state(h, rid) == "completed" and _lock(h) is None


def test_host_unreachable_past_the_deadline_fails_and_the_host_restores_itself(testbed_factory, tmp_path):
    """The link stays down: past ``orch_reconnect_timeout`` the controller fails the host
    unreachable, naming the deadline and the host's dead-man; with the link still down, the
    dead-man (its deadline after the last heartbeat) stops the tune, puts the old files back and
    starts the unit by itself. Once the link is back, ``orch doctor`` says what the host did and
    names ``orch recover`` (exit 1), ``orch tune`` refuses, and ``orch recover`` proves the restored
    files from a start's log and records the run. Before: the unit stayed stopped until an operator
    came."""
    bed, h, inv, tree = _bed(testbed_factory, tmp_path, orch_connect_timeout=5, orch_reconnect_timeout=20,
                             orch_lock_heartbeat_interval=2, orch_host_deadline=70, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_payload_tune(h, proc, state)
        _link(h, up=False)
        rc, result = _wait_exit(proc, log, h)
        assert rc == 1, log.read_text()[-5000:]
        r = result["hosts"][h.name]
        assert r["outcome"] == "unreachable", r
        assert "unreachable for 20 s (orch_reconnect_timeout)" in r["cause"] and "dead-man" in r["cause"], r["cause"]
        assert "crash" not in r["cause"]
        # the link is still down: the host restores itself (its own files, watched from this machine)
        fired = wait_until(lambda: _deadman_report(h, rid), "the host's dead-man",
                           progress=_progress(state, h=h) + [lambda: (_lock(h) or {}).get("heartbeat_ts")])
        assert fired["fired"] and fired["heartbeat_age_s"] >= 70, fired
        h.wait_http("/health")
        assert h.unit_state() == "active" and h.file_tree_hash(h.config_dir) == tree
        assert _unit_loaded(h, f"orch-tune-{rid}.service") == "not-found"
        assert not _payload_procs(h)
        assert _host_run_state(h, rid) == "stopped" and (_lock(h) or {}).get("deadman"), _lock(h)
    finally:
        _link(h, up=True)
        if proc.poll() is None:
            proc.kill()
    rc, doc = _doctor(inv, tmp_path, "doc")
    row = doc[h.name]
    assert rc == 1 and row["verdict"] == "unfinished-run", row
    assert "dead-man fired" in row["why"] and "orch recover" in row["why"], row["why"]
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state2")
    assert again.returncode == 1 and "orch recover" in recap(again)["hosts"][h.name]["cause"]
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "s3"),
               state_dir=tmp_path / "s3")
    assert rec.returncode == 0, rec.stderr[-4000:]
    summary = recap(rec)["hosts"][h.name]["summary"]
    assert summary["deadman"][0]["run_id"] == rid and summary["deadman"][0]["unit_state"] == "active", summary
    _assert_restored(h, tree, rid)


# ------------------------------------------------------------------------------ row 2
def test_controller_killed_mid_tune_doctor_names_recover_and_the_host_restores_itself(testbed_factory, tmp_path):
    """SIGKILL of ``orch`` mid-tune: ``orch doctor`` says the unit is down, held by the unfinished
    run, names ``orch recover`` and exits 1 (before: ``tuned``, exit 0, "unit is inactive"); with no
    controller back, the host's dead-man restarts the unit on its old files; doctor still names
    ``orch recover``, which works after it fired and says what the host did."""
    bed, h, inv, tree = _bed(testbed_factory, tmp_path, orch_connect_timeout=5, orch_reconnect_timeout=10,
                             orch_lock_heartbeat_interval=2, orch_host_deadline=60, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_payload_tune(h, proc, state)
        # the dead-man is held still (SIGSTOP) while doctor looks, so the order does not depend on speed
        guard = wait_until(lambda: h.sh(f"pgrep -f '^[^ ]*python[^ ]* -m remote deadman --run-id {rid}'",
                                        check=False).stdout.split(), "the dead-man's process",
                           progress=_progress(state, log, h))
        proc.kill()  # SIGKILL: no rescue, no always
        wait_process(proc, "orch's end after SIGKILL")
        h.sh("kill -STOP " + " ".join(guard))
        assert h.unit_state() in ("inactive", "failed")
        rc, doc = _doctor(inv, tmp_path, "doc1")
        row = doc[h.name]
        assert rc == 1 and row["verdict"] == "unfinished-run", row
        assert f"held down by unfinished orch run {rid} (state stopped)" in row["why"], row["why"]
        assert "orch recover" in row["why"] and "dead-man" not in row["why"], row["why"]
    finally:
        if proc.poll() is None:
            proc.kill()
        h.sh("pkill -CONT -f '^[^ ]*python[^ ]* -m remote deadman'", check=False)
    fired = wait_until(lambda: _deadman_report(h, rid), "the host's dead-man", progress=_progress(state, h=h))
    assert fired["unit"].startswith("started"), fired
    h.wait_http("/health")
    assert h.unit_state() == "active" and h.file_tree_hash(h.config_dir) == tree
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]
    rc, doc = _doctor(inv, tmp_path, "doc2")
    row = doc[h.name]
    assert rc == 1 and row["verdict"] == "unfinished-run" and "dead-man fired" in row["why"], row
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "s3"),
               state_dir=tmp_path / "s3")
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    assert r["summary"]["deadman"][0]["run_id"] == rid, r["summary"]
    _assert_restored(h, tree, rid)
    assert not _payload_procs(h)


# ----------------------------------------------------------------------------- row 10
def test_a_failed_earlier_tune_unit_of_the_same_name_does_not_block_the_tune(testbed_factory, tmp_path):
    """A failed transient unit named as the run's tune unit (``systemd-run`` without ``--collect``)
    keeps its name until ``reset-failed`` (systemd PR #31990): orch unloads it and starts its tune
    there (before: systemd-run refused the name and the tune fell back to the SSH session), with
    ``--collect`` (the bed's systemd-run stands for 252 >= 236): the tune's unit is gone at the end."""
    bed, h, inv, tree = _bed(testbed_factory, tmp_path)
    rid = new_run_id("tune")
    unit = f"orch-tune-{rid}.service"
    h.sh(f"systemd-run --unit={unit} --quiet -- /bin/false")
    wait_until(lambda: h.unit_state(unit) == "failed", "the earlier unit's failure")
    state, log = tmp_path / "state", tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        rc, result = _wait_exit(proc, log, h)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and result["hosts"][h.name]["outcome"] == "completed", log.read_text()[-4000:]
    launch = [e for e in _events(state, rid) if e.get("event") == "tune_launch"]
    assert launch and launch[-1]["unit"] == unit, launch
    assert _unit_loaded(h, unit) == "not-found"


# ----------------------------------------------------------------------------- row 11
def test_a_journalctl_without_invocation_is_all_orch_needs(testbed_factory, tmp_path):
    """Debian 12 / RHEL 9 have systemd 252, whose journalctl has no ``--invocation`` (257, systemd
    #33794): on such a host a tune is proven from the log (cursor and invocation IDs of ``-o
    json``), and no journalctl call orch made asked for it (the shim logs every call)."""
    bed, h, inv, tree = _bed(testbed_factory, tmp_path, {"journalctl_version": 252})
    assert h.sh("journalctl --invocation=0123 -u sglang-qwen", check=False).returncode == 1
    h.sh("rm -f /run/orchtb/journalctl.calls")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    calls = [json.loads(x) for x in h.local_path("/run/orchtb/journalctl.calls").read_text().splitlines()]
    assert calls and any("--after-cursor" in c for c in calls), calls  # the log proof read the journal
    assert not [c for c in calls if any(a.startswith("--invocation") for a in c if a != "--invocation=0123")]


# ----------------------------------------------------------------------------- row 15
def test_the_tune_sees_a_variable_set_only_in_the_units_environment_file(testbed_factory, tmp_path):
    """``TRITON_PTXAS_PATH`` (GB10, triton #10331) set only in the unit's ``EnvironmentFile=``, and
    ``CUDA_HOME`` only in a drop-in's ``Environment=``: the tuner process in its transient unit has
    both, as the server has them (before: a transient unit gets its manager's environment only)."""
    env_file = "/etc/default/sglang-qwen"
    opts = {"files": {env_file: "# the server's toolchain\nTRITON_PTXAS_PATH=/opt/ptxas-sm121/bin/ptxas\n",
                      "/etc/systemd/system/sglang-qwen.service.d/cuda.conf":
                          "[Service]\nEnvironment=CUDA_HOME=/usr/local/cuda-13.0\n"},
            "env_files": [env_file]}
    bed, h, inv, tree = _bed(testbed_factory, tmp_path, opts, **LONG_TUNE)
    main = h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip().partition("=")[2]
    server_env = h.sh(f"tr '\\0' '\\n' < /proc/{main}/environ").stdout
    # the bed's unit as its manager gives it (EnvironmentFile= and the drop-in read)
    assert "TRITON_PTXAS_PATH=/opt/ptxas-sm121/bin/ptxas" in server_env and "CUDA_HOME=/usr/local/cuda-13.0" in server_env
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        tuner = _wait_payload_tune(h, proc, state).split()[0]
        env = h.sh(f"tr '\\0' '\\n' < /proc/{tuner}/environ", check=False).stdout.splitlines()
        rc, result = _wait_exit(proc, log, h)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "TRITON_PTXAS_PATH=/opt/ptxas-sm121/bin/ptxas" in env and "CUDA_HOME=/usr/local/cuda-13.0" in env, env
    assert rc == 0 and result["hosts"][h.name]["outcome"] == "completed", log.read_text()[-4000:]
    # the environment file of the tune's unit (the server's secrets, if any) is gone with it
    assert not list(h.local_path("/var/lib/orch/units").glob("*.env"))
