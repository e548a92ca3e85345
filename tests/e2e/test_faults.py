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
from tests.e2e.helpers import REPO, flat, inventory, orch, recap
from tests.waiting import files_state, process_ended, wait_process, wait_until

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
def _popen(args: list[str], state_dir: Path, run_id: str, log: Path, new_session: bool = False) -> subprocess.Popen:
    """Start ``orch ARGS`` in the background (its own run id, output to ``log``).

    ``new_session``: orch leads its own process group, which the test can signal as a whole,
    as a terminal's Ctrl-C does (``os.killpg``)."""
    cmd = [sys.executable, "-m", "orchestrator", *args, "--state-dir", str(state_dir), "--run-id", run_id, "--json"]
    env = dict(os.environ, XDG_STATE_HOME=str(state_dir), COLUMNS="200")
    fh = open(log, "w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True,
                            start_new_session=new_session)


def _events(state_dir: Path, run_id: str) -> list[dict]:
    p = state_dir / "runs" / run_id / "events.jsonl"
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _progress(state_dir: Path, log: Path | None = None, h=None) -> list:
    """What shows a run moving on (tests/waiting.py): its records under ``state_dir``, its output
    ``log``, and on host ``h`` the payload's files (the tune's output and checkpoint, run records)."""
    probes = [lambda: files_state(state_dir)]
    if log is not None:
        probes.append(lambda: files_state(log))
    if h is not None:
        probes.append(lambda: files_state(h.local_path("/var/lib/orch/units"), h.local_path("/var/lib/orch/runs"),
                                          h.local_path("/var/lib/orch/work")))
    return probes


def _wait_event(state_dir: Path, run_id: str, proc: subprocess.Popen, pred, what: str, h=None) -> dict:
    """Poll the run's events.jsonl until ``pred(event)``; fail if the process ends first, or hangs
    (no progress, tests/waiting.py)."""
    return wait_until(lambda: next((e for e in _events(state_dir, run_id) if pred(e)), None), what,
                      progress=_progress(state_dir, h=h), alive=process_ended(proc))


def _task_done(name: str):
    return lambda e: e.get("event") == "task" and e.get("task") == name and e.get("status") in ("ok", "changed")


def _wait_exit(proc: subprocess.Popen, log: Path, h=None) -> tuple[int, dict]:
    """Wait for orch to end while it (or, on ``h``, its payload) makes progress; its status and recap."""
    rc = wait_process(proc, "orch's exit", progress=_progress(log.parent, log, h))
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
    h.wait_http("/health")
    assert _lock(h) is None
    # no temp file or half-written config anywhere in the SGLang tree
    assert not [p for p in h.file_tree_hash(h.config_dir) if "orch-tmp" in p or p.endswith(".tmp")]
    if run_id:
        assert _host_run_state(h, run_id) == "restored"


def _payload_procs(h) -> str:
    return h.sh("pgrep -af '[ ]-m remote (tune|bench)( |$)'", check=False).stdout.strip()


def _wait_payload_tune(h, proc: subprocess.Popen | None = None, state_dir: Path | None = None) -> str:
    """Wait until the payload's Python ``tune`` process runs on the host (not only its shell), while
    orch (``proc``, its records under ``state_dir``) makes progress."""
    return wait_until(lambda: h.sh("pgrep -af '^[^ ]*python[^ ]* -m remote tune( |$)'", check=False).stdout.strip(),
                      "the payload tune", progress=_progress(state_dir, h=h) if state_dir else (),
                      alive=process_ended(proc) if proc is not None else None)


def _ready_bed(testbed_factory, tmp_path, opts=None, **vars_):
    bed = testbed_factory(1, host_options=opts or HOST_OPTS)
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml", **vars_)
    return bed, h, inv, h.file_tree_hash(h.config_dir)


# ------------------------------------------------------------------- controller interrupts
#: Fault hooks installed on the step bed's host (``/srv/orch-faults``, first on the unit's
#: PYTHONPATH, which the payload inherits). Nothing of this is in the product.
#: - ``hold-<cmd>`` (content: N, default 1): the N-th ``python -m remote <cmd>`` writes
#:   ``entered-<cmd>`` and waits until ``hold-<cmd>`` is removed (a gate the test opens).
#: - ``oom-tune``: inside ``python -m remote tune`` only, ``torch.randn`` (which builds the
#:   tuning problem's inputs) raises ``torch.cuda.OutOfMemoryError`` as a full GPU does.
#: - ``hog-tune`` (content: a byte count): inside ``python -m remote tune`` only, once its
#:   ``checkpoint.json`` exists (the first batch size is done), a thread allocates and touches
#:   host memory in 32 MiB steps up to that count (a tuner whose host memory grows).
FAULTS_DIR = "/srv/orch-faults"
SITECUSTOMIZE = r"""
import os, time

_D = "/srv/orch-faults"


def _payload_command():
    try:
        argv = open("/proc/self/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    for i in range(len(argv) - 2):
        if argv[i] == b"-m" and argv[i + 1] == b"remote":
            return argv[i + 2].decode()
    return None


_cmd = _payload_command()
if _cmd:
    _hold = os.path.join(_D, "hold-" + _cmd)
    if os.path.exists(_hold):
        _count = os.path.join(_D, "count-" + _cmd)
        _n = (int(open(_count).read() or 0) if os.path.exists(_count) else 0) + 1
        open(_count, "w").write(str(_n))
        if _n == int(open(_hold).read().strip() or 1):
            open(os.path.join(_D, "entered-" + _cmd), "w").write(str(os.getpid()))
            while os.path.exists(_hold):
                time.sleep(0.05)
    if _cmd == "tune" and os.path.exists(os.path.join(_D, "oom-tune")):
        import torch

        def _oom(*a, **k):
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
                "of which 1.19 GiB is free.")

        torch.randn = _oom
    if _cmd == "tune" and os.path.exists(os.path.join(_D, "hog-tune")):
        import threading

        def _hog():
            # once the first batch size is checkpointed, grow host memory as vllm PR #31604's tuner did
            argv = open("/proc/self/cmdline", "rb").read().decode().split("\0")
            ckpt = os.path.join(argv[argv.index("--out") + 1], "checkpoint.json")
            while not os.path.exists(ckpt):
                time.sleep(0.05)
            cap = int(open(os.path.join(_D, "hog-tune")).read().strip() or 0)
            held = []
            while sum(len(b) for b in held) < cap:
                held.append(bytearray(32 << 20))  # zero-filled: every page touched, resident
                time.sleep(0.02)

        threading.Thread(target=_hog, daemon=True).start()
"""
#: gate for a host binary (bind-mounted over it inside the host's own mount namespace):
#: ``hold-<name>`` holds ``WANT [N]``: the N-th call (default the first) whose first argument is
#: WANT (empty: any call) writes ``entered-<name>`` and waits while ``hold-<name>`` exists; then
#: every call runs the real binary (copied beside it). Matching calls are counted in ``count-<name>``.
GATE_SH = """#!/bin/sh
name=$(basename "$0")
d=/srv/orch-faults
hold=$d/hold-$name
if [ -e "$hold" ]; then
  read -r want nth < "$hold"
  if [ -z "$want" ] || [ "$want" = "$1" ]; then
    n=$(( $(cat "$d/count-$name" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$d/count-$name"
    if [ "$n" = "${nth:-1}" ]; then
      echo $$ > "$d/entered-$name"
      while [ -e "$hold" ]; do sleep 0.05; done
    fi
  fi
fi
exec "$d/real/$name" "$@"
"""
#: ``id`` (Connect's ``id -un``), ``systemctl`` (show/cat, stop, restart), ``journalctl`` (the
#: log mark before a start and verify-log), ``sha256sum`` (the payload check)
GATED_BINARIES = ("sha256sum", "systemctl", "journalctl", "id")


@pytest.fixture(scope="module")
def step_bed(tmp_path_factory):
    """One host for every interrupt case (each case leaves it restored, and checks it is on entry).

    The unit's PYTHONPATH starts with ``/srv/orch-faults`` (the payload inherits it), which holds
    :data:`SITECUSTOMIZE`; ``sha256sum`` and ``systemctl`` are gated by :data:`GATE_SH`.
    """
    from tests.conftest import _require_testbed

    _require_testbed()
    from tests.testbed.bed import TestBed

    opts = {0: {"config_files": {UP: OLD_UP}, "warmup_s": 6,
                "env": {"PYTHONPATH": f"{FAULTS_DIR}:/opt/sglang"}}}
    bed = TestBed(n_hosts=1, host_options=opts, workdir=tmp_path_factory.mktemp("stepbed"))
    bed.__enter__()
    try:
        h = bed.hosts[0]
        d = h.local_path(FAULTS_DIR)
        (d / "real").mkdir(parents=True)
        (d / "sitecustomize.py").write_text(SITECUSTOMIZE)
        for name in GATED_BINARIES:
            (d / name).write_text(GATE_SH)
            (d / name).chmod(0o755)
            h.sh(f"cp /usr/bin/{name} {FAULTS_DIR}/real/{name} && mount --bind {FAULTS_DIR}/{name} /usr/bin/{name}")
        h.wait_http("/health")
        bed.tree0 = h.file_tree_hash(h.config_dir)
        yield bed
    finally:
        bed.destroy()


def _faults(h):
    return h.local_path(FAULTS_DIR)


def _reset_faults(h) -> None:
    for p in _faults(h).iterdir():
        if p.name.startswith(("hold-", "entered-", "count-", "oom-")):
            p.unlink()


def _wait_file(h, proc, name: str) -> None:
    """Wait until the host's fault hook wrote ``name`` (a gate was entered); fail if orch ends first
    or hangs (no progress of its output or records)."""
    path = _faults(h) / name
    wait_until(path.exists, name, progress=_progress(Path(proc.args[proc.args.index("--state-dir") + 1]), h=h),
               alive=process_ended(proc), poll=0.1)


def _wait_log(log: Path, text: str, proc) -> None:
    try:
        wait_until(lambda: text in log.read_text(), f"orch printing {text!r}", progress=_progress(log.parent, log),
                   alive=process_ended(proc), poll=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{log.read_text()[-3000:]}") from None


def _main_pid(h) -> str:
    out = h.sh("systemctl show sglang-qwen -p MainPID").stdout
    return out.strip().partition("=")[2]


#: (step, gate): ``gate`` = (name, content of ``hold-<name>``) holds the step's own command on
#: the host while the signal arrives: for a payload command (``probe``, ``bench``, ...) the
#: content is which call to hold (default the first); for a gated binary, its first argument
#: (empty: any), then which matching call (default the first). ``None``: the step is hit by
#: watching the run (the tune process, the start).
STEPS = [
    ("connect", ("id", "-un")),            # Connect's check of who orch is on the host
    ("read_unit", ("systemctl", "show")),  # Read the unit (`systemctl show`, then `systemctl cat`)
    ("payload_push", ("sha256sum", "")),   # checking the pushed payload's checksums on the host
    ("probe", ("probe", "")),
    ("bench_before", ("bench", "")),       # interruptible: orch stops the tagged benchmark itself
    ("stop", ("systemctl", "stop")),
    ("reap", ("reap", "")),
    ("tune", None),                        # also: the lock heartbeat advances while it tunes
    ("install", ("install", "")),
    ("wait_ready", None),                  # new configs installed, the server warming up
    # verify-log reads the unit's log; the 1st `journalctl -u` is the plan's read of the last
    # start's lookups, the 2nd the "before" benchmark's read of what the server loaded, the 3rd and 4th the mark
    # before the start
    ("verify_log", ("journalctl", "-u 5")),
    ("bench_after", ("bench", "2")),       # the new configs loaded and proven from the log
]
#: steps before the unit is stopped: nothing to restore, the unit is never restarted
BEFORE_STOP = {"connect": None, "read_unit": None, "payload_push": None, "probe": None, "bench_before": "failed"}


@pytest.mark.parametrize("step,gate", [pytest.param(s, g, id=s) for s, g in STEPS])
def test_interrupted_controller_restores_host(step_bed, tmp_path, step, gate):
    """Ctrl-C (SIGINT) or SIGTERM to ``orch tune`` in each step that talks to the host, from
    Connect to the benchmark after: exit 130; the host restored byte for byte (or never touched,
    before the stop), running, its record final, unlocked, no payload process left."""
    bed, h = step_bed, step_bed.hosts[0]
    sig = signal.SIGINT if STEPS.index((step, gate)) % 2 == 0 else signal.SIGTERM
    # the previous case left the host as every case must: restored, running, unlocked
    _reset_faults(h)
    assert h.file_tree_hash(h.config_dir) == bed.tree0 and _lock(h) is None
    h.wait_http("/health")
    pid0 = _main_pid(h)
    extra = dict(LONG_TUNE, orch_lock_heartbeat_interval=1) if step == "tune" else {}
    inv = inventory(bed, tmp_path / "hosts.yaml", **extra)
    hold = None
    if gate:
        name = gate[0]
        hold = _faults(h) / f"hold-{name}"
        hold.write_text(gate[1])
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        if gate:
            _wait_file(h, proc, f"entered-{name}")
            proc.send_signal(sig)
            _wait_log(log, "finishing the current step", proc)
            hold.unlink()  # the held command goes on (or was already stopped by orch)
        elif step == "tune":
            _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
            _wait_payload_tune(h)
            # the lock's heartbeat is renewed while the payload tunes (no task boundary in between)
            first = (_lock(h) or {}).get("heartbeat_ts")
            seen = {first}

            def renewed() -> bool:
                lk = _lock(h) or {}
                assert lk.get("run_id") == rid, lk
                seen.add(lk.get("heartbeat_ts"))
                return len(seen) >= 3

            # the tuner's checkpoint and output move while it runs: the wait lasts as long as they do
            wait_until(renewed, "two new heartbeats while tuning", progress=_progress(state, log, h))
            assert len(seen) >= 3 and min(seen) == first, f"heartbeat not renewed while tuning: {seen}"
            assert h.sh("pgrep -f '^[^ ]*python[^ ]* -m remote tune( |$)'", check=False).stdout.strip(), \
                "the tune must still run"
            proc.send_signal(sig)
        else:
            _wait_event(state, rid, proc, lambda e: e.get("event") == "service_started", "the start on new configs")
            assert h.sh(f"test -f '{h.triton_dir}/{DOWN}'", check=False).returncode == 0, "new files installed"
            proc.send_signal(sig)
        rc, result = _wait_exit(proc, log)
    finally:
        if hold is not None and hold.exists():
            hold.unlink()
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "failed" and "interrupted by the operator" in r["cause"], r
    assert not _payload_procs(h), "the interrupted payload must not keep running"
    if step in BEFORE_STOP:
        assert h.file_tree_hash(h.config_dir) == bed.tree0 and _lock(h) is None
        assert h.unit_state() == "active" and _main_pid(h) == pid0, "the unit was never stopped"
        h.wait_http("/health")
        record = h.local_path(f"/var/lib/orch/runs/{rid}/state.json")
        if BEFORE_STOP[step] is None:  # interrupted before the run recorded anything
            assert not record.exists()
        else:  # recorded `started`, ended before the stop: the release records it final
            assert _host_run_state(h, rid) == BEFORE_STOP[step]
        return
    assert r["rescued"] == 1, r
    if step == "verify_log":  # hit in verify-log: it finished, the benchmark after never started
        tasks = {e["task"]: e["status"] for e in _events(state, rid) if e.get("event") == "task"}
        assert tasks.get("Prove the new configs were loaded") == "ok" and "Benchmark after" not in tasks, tasks
    _assert_restored(h, bed.tree0, rid)
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode != 0
    # the server runs on the old file again (the log of its last start)
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]


def _wait_log_count(log: Path, text: str, count: int, proc) -> None:
    """Wait until orch's output holds ``text`` at least ``count`` times; fail if orch ends first."""
    try:
        wait_until(lambda: log.read_text().count(text) >= count, f"orch printing {text!r} {count} times",
                   progress=_progress(log.parent, log), alive=process_ended(proc), poll=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{log.read_text()[-3000:]}") from None


#: the rescue steps of tune.yaml after ``stop_payload``, each of which must run to the end
RESCUE_TASKS = ("Restore the earlier configs", "Start the unit again", "Wait for readiness on the earlier configs",
                "Record the restore on the host")


def test_second_signal_during_the_rescue_does_not_cut_it_short(step_bed, tmp_path):
    """Ctrl-C while the new files are installed, then the operator insists while the rescue runs:
    Ctrl-C while it restores the files, SIGTERM while it restarts the unit, Ctrl-C while it waits
    for readiness. (Interrupted during the tune instead, the rescue has no file to restore.)
    Each later signal only prints that orch is still restoring; the rescue runs to the end:
    restored byte for byte, running on the old files, recorded ``restored``, unlocked, no payload
    left, exit 130. Ctrl-C goes to orch's whole process group, as a terminal sends it."""
    bed, h = step_bed, step_bed.hosts[0]
    _reset_faults(h)
    assert h.file_tree_hash(h.config_dir) == bed.tree0 and _lock(h) is None
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    faults = _faults(h)
    # held: the payload install, the rescue's payload restore, the rescue's restart (the first:
    # the run's own start never comes)
    holds = {"install": "", "restore": "", "systemctl": "restart"}
    for name, content in holds.items():
        (faults / f"hold-{name}").write_text(content)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log, new_session=True)
    again = "interrupted again: still restoring hosts"

    def ctrl_c():
        os.killpg(proc.pid, signal.SIGINT)

    try:
        _wait_file(h, proc, "entered-install")
        ctrl_c()
        _wait_log(log, "SIGINT: finishing the current step", proc)
        (faults / "hold-install").unlink()  # the install finishes: the new files are in place
        _wait_file(h, proc, "entered-restore")  # the rescue's payload restore
        assert h.sh(f"test -f '{h.triton_dir}/{DOWN}'", check=False).returncode == 0, "new files installed"
        ctrl_c()
        _wait_log_count(log, again, 1, proc)
        assert proc.poll() is None
        (faults / "hold-restore").unlink()
        _wait_file(h, proc, "entered-systemctl")  # the rescue's `systemctl restart`
        proc.send_signal(signal.SIGTERM)
        _wait_log_count(log, again, 2, proc)
        assert proc.poll() is None
        (faults / "hold-systemctl").unlink()
        _wait_event(state, rid, proc, lambda e: e.get("event") == "service_started", "the rescue's start")
        ctrl_c()
        _wait_log_count(log, again, 3, proc)
        # the third signal came while the readiness wait was still running (the server warms up 6 s)
        assert not [e for e in _events(state, rid) if e.get("event") == "task"
                    and e.get("task") == "Wait for readiness on the earlier configs"], log.read_text()[-3000:]
        rc, result = _wait_exit(proc, log)
    finally:
        for name in holds:
            (faults / f"hold-{name}").unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, log.read_text()[-4000:]
    assert log.read_text().count(again) == 3
    r = result["hosts"][h.name]
    assert r["outcome"] == "failed" and "interrupted by the operator" in r["cause"], r
    assert "rescue also failed" not in r["cause"] and r["rescued"] == 1, r
    status = {e["task"]: e["status"] for e in _events(state, rid) if e.get("event") == "task"}
    assert {t: status.get(t) for t in RESCUE_TASKS} == {
        "Restore the earlier configs": "changed", "Start the unit again": "changed",
        "Wait for readiness on the earlier configs": "ok", "Record the restore on the host": "ok"}, status
    assert not _payload_procs(h), "the interrupted payload must not keep running"
    _assert_restored(h, bed.tree0, rid)
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode != 0
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]


def test_cuda_oom_in_payload_restored_with_stderr_tail(step_bed, tmp_path):
    """The payload's tune runs out of GPU memory building its inputs (simulated: ``torch.randn``
    raises ``torch.cuda.OutOfMemoryError`` in that process only): the payload ends with a clear
    error instead of trying every batch size; the host is restored, running, recorded, unlocked."""
    bed, h = step_bed, step_bed.hosts[0]
    _reset_faults(h)
    assert h.file_tree_hash(h.config_dir) == bed.tree0 and _lock(h) is None
    (_faults(h) / "oom-tune").write_text("")
    try:
        # (batch sizes of their own: no checkpoint of an earlier case to resume from)
        inv = inventory(bed, tmp_path / "hosts.yaml", orch_tune_batch_sizes=[1, 2, 4, 8])
        proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    finally:
        _reset_faults(h)
    assert proc.returncode == 1, proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    cause = r["cause"]
    assert "Tune the fused-MoE kernel" in cause and "payload tune failed (runtime)" in cause, cause
    assert "out of GPU memory" in cause and "batch size 1," in cause, cause  # stopped at the first
    hr = json.loads((Path(res["run_dir"]) / "hosts" / h.name / "result.json").read_text())
    # the payload's stderr tail: the traceback ending in the OOM
    assert "Traceback" in hr["cause"] and "OutOfMemoryError: CUDA out of memory" in hr["cause"], hr["cause"]
    _assert_restored(h, bed.tree0, res["run_id"])
    assert not _payload_procs(h)


def test_tuner_over_memory_max_is_ended_alone_reported_restored_and_a_rerun_resumes(testbed_factory, tmp_path):
    """The tuner's host memory grows past its unit's ``MemoryMax=`` (``orch_tune_memory_max``; the
    ``hog-tune`` hook, after the first batch size is checkpointed): only the tuner is ended
    (``Result=oom-kill``), the cause says ``payload tune failed (out of host memory)``, the host is
    restored and running; a rerun without the hog resumes from the checkpoint and completes."""
    opts = {0: {**HOST_OPTS[0], "env": {"PYTHONPATH": f"{FAULTS_DIR}:/opt/sglang"}}}
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, opts, orch_tune_batch_sizes=[1, 2, 4, 16],
                                   orch_tune_memory_max=1536 << 20)
    _faults(h).mkdir(parents=True, exist_ok=True)
    (_faults(h) / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (_faults(h) / "hog-tune").write_text(str(4 << 30))  # past the limit; a bound if nothing enforces it
    server_pid = _main_pid(h)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "s1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    assert "payload tune failed (out of host memory)" in r["cause"] and "MemoryMax=1610612736" in r["cause"], \
        r["cause"]
    _assert_restored(h, tree, res["run_id"])
    assert not _payload_procs(h)
    assert _main_pid(h) != server_pid  # the server was stopped for the tune and started again, not killed
    (_faults(h) / "hog-tune").unlink()
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "s2")
    assert again.returncode == 0, again.stderr[-3000:]
    rid2 = recap(again)["run_id"]
    out = h.sh(f"cat /var/lib/orch/units/orch-tune-{rid2}.service.out").stdout
    assert "resuming: batch sizes [1" in out, out[-2000:]
    assert _host_run_state(h, rid2) == "completed" and h.unit_state() == "active"


def test_sigkill_leaves_record_next_tune_refuses_recover_restores(testbed_factory, tmp_path):
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        tuner = _wait_payload_tune(h).split()[0]  # the dead controller leaves its tune running
        proc.kill()  # SIGKILL: no rescue, no always
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
    unit = f"orch-tune-{rid}.service"
    assert h.sh(f"systemctl is-active {unit}", check=False).stdout.strip() == "active"
    assert h.sh(f"kill -0 {tuner}", check=False).returncode == 0
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

    # what a dead controller can leave running (its SSH session gone, a tune that has not yet
    # written to the closed pipe): a tagged `timeout` wrapper and its Python child. Recover must
    # stop it, and leave alone two look-alikes: a payload tune started by hand (no tag) and one
    # of another run (another tag).
    sleeper = "import time; time.sleep(900)"
    left = h.sh(f"nohup timeout 900 env ORCH_TAG={rid}.beef python3 -c '{sleeper}' -m remote tune --left "
                ">/dev/null 2>&1 & echo $!").stdout.split()
    decoys = h.sh(
        f"nohup python3 -c '{sleeper}' -m remote tune --by-hand >/dev/null 2>&1 & echo $!; "
        f"nohup timeout 900 env ORCH_TAG=20260101T000000Z-tune-0a0b0c.1234 python3 -c '{sleeper}' -m remote tune "
        ">/dev/null 2>&1 & echo $!").stdout.split()
    assert len(left) == 1 and len(decoys) == 2, (left, decoys)
    wait_until(lambda: h.sh(f"pgrep -P {left[0]}", check=False).returncode == 0, "the payload's Python child",
               progress=_progress(state, h=h))  # its Python child runs
    child = h.sh(f"pgrep -P {left[0]}").stdout.split()[0]

    # orch recover: restores the files, breaks the dead holder's lock, starts the unit
    try:
        rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir",
                   str(tmp_path / "state3"), state_dir=tmp_path / "state3")
        assert rec.returncode == 0, rec.stderr[-4000:]
        assert recap(rec)["hosts"][h.name]["outcome"] == "completed"
        _assert_restored(h, tree, rid)
        # the dead run's transient unit, found by name, is stopped and unloaded; its tuner is gone
        assert h.sh(f"systemctl show -p LoadState {unit}").stdout.strip() == "LoadState=not-found"
        assert h.sh(f"kill -0 {tuner}", check=False).returncode != 0, "the dead run's tuner still runs"
        rec_events = [json.loads(x) for p in (tmp_path / "state3" / "runs").glob("*/events.jsonl")
                      for x in p.read_text().splitlines() if x.strip()]
        assert [e for e in rec_events if e.get("event") == "tune_unit_stopped" and e.get("unit") == unit], \
            [e for e in rec_events if "unit" in e.get("event", "")]
        for pid in (left[0], child):  # the dead run's wrapper and its Python child are gone
            assert h.sh(f"kill -0 {pid}", check=False).returncode != 0, f"leftover {pid} still runs"
        assert not h.sh("pgrep -af '^[^ ]*python[^ ]* -m remote tune --model'", check=False).stdout.strip()
        for pid in decoys:  # recover stopped only the dead run's tagged processes
            assert h.sh(f"kill -0 {pid}", check=False).returncode == 0, f"decoy {pid} was killed"
    finally:
        h.sh(f"kill {' '.join(left + decoys)}", check=False)
    broken = json.loads(h.sh("cat /var/lib/orch/lock.broken.json").stdout)
    assert broken["previous"]["run_id"] == rid


def _gate(h, name: str, content: str) -> None:
    """Hold the host's ``name`` binary (:data:`GATE_SH`): ``content`` as for ``hold-<name>``."""
    d = _faults(h)
    (d / "real").mkdir(parents=True, exist_ok=True)
    (d / name).write_text(GATE_SH)
    (d / name).chmod(0o755)
    h.sh(f"cp /usr/bin/{name} {FAULTS_DIR}/real/{name} && mount --bind {FAULTS_DIR}/{name} /usr/bin/{name}")
    (d / f"hold-{name}").write_text(content)


def _recover_events(state: Path, rid: str) -> list[dict]:
    return [e for p in (state / "runs").glob("*/events.jsonl") if p.parent.name != rid
            for e in (json.loads(x) for x in p.read_text().splitlines() if x.strip())]


def test_recover_collects_a_finished_tune_and_the_next_tune_reuses_it_without_tuning(testbed_factory, tmp_path):
    """Issue 21 row 3: the controller dies (SIGKILL) after the tune's transient unit finished and
    before it fetched the files (held at its ``systemctl reset-failed`` of the ended unit). ``orch
    recover`` restores the host as before and collects the tune's result: the files are fetched
    into the controller's store, not installed. The next ``orch tune`` reuses them: no tune runs
    (before, the finished tune was lost and the next run tuned again)."""
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    unit = f"orch-tune-{rid}.service"
    # the controller's first call after the tune's unit ended: its second reset-failed (the first
    # one unloads the prepare step's unit, orch-prepare-RUN, before the stop)
    _gate(h, "systemctl", "reset-failed 2")
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_file(h, proc, "entered-systemctl")
        proc.kill()  # SIGKILL: the result is on the host only
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
        _reset_faults(h)
    out = h.sh(f"cat /var/lib/orch/units/{unit}.out").stdout
    assert '"type": "result"' in out, out[-2000:]
    assert not list((state / "store").glob("*/provenance.json")), "the dead controller had stored the result"
    assert _host_run_state(h, rid) == "stopped" and (_lock(h) or {}).get("run_id") == rid
    work_up = json.loads([x for x in out.splitlines() if '"type": "result"' in x][-1])["data"]["files"]["up"]
    tuned = h.sh(f"cat {work_up}").stdout

    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(state), state_dir=state)
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    _assert_restored(h, tree, rid)  # the service is restored as before: nothing collected is installed

    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert again.returncode == 0, again.stderr[-3000:]
    res = recap(again)
    assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
    events = [json.loads(x) for x in (Path(res["run_dir"]) / "events.jsonl").read_text().splitlines() if x.strip()]
    tasks = {e["task"]: e for e in events if e.get("event") == "task" and e.get("host") == h.name}
    assert "reusing stored result" in tasks["Choose where the configs come from (tune once per group)"]["msg"]
    assert tasks["Tune the fused-MoE kernel"]["status"] == "skipped", tasks["Tune the fused-MoE kernel"]
    assert not [e for e in events if e.get("event") == "tune_launch"], "a new tune ran"
    assert h.sh(f"test -e /var/lib/orch/units/orch-tune-{res['run_id']}.service.out", check=False).returncode != 0
    assert h.sh(f"cat {h.triton_dir}/{UP}").stdout == tuned  # the collected bytes were installed
    # what the recover said and did
    collected = r["summary"].get("collected") or []
    assert [c["state"] for c in collected] == ["collected"], r["summary"]
    assert [e for e in _recover_events(state, rid) if e.get("event") == "tune_result_collected"]
    entries = list((state / "store").glob("*/provenance.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["run_id"] == rid


def test_recover_keeps_a_stopped_tunes_progress_and_the_rerun_resumes(testbed_factory, tmp_path):
    """Issue 21 rows 3 and 10: the controller dies mid-tune, once the first batch size is in the
    tune's checkpoint. ``orch recover`` stops the tune's unit, restores the host and says what the
    checkpoint keeps; the next ``orch tune`` resumes from it (before, the recap said nothing of it)."""
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_payload_tune(h, proc, state)
        # the tuner checkpoints each batch size it finished
        wait_until(lambda: h.sh("ls /var/lib/orch/work/*/checkpoint.json", check=False).returncode == 0,
                   "the tune's first checkpoint", progress=_progress(state, log, h), alive=process_ended(proc))
        proc.kill()
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(state), state_dir=state)
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    _assert_restored(h, tree, rid)
    kept = [c for c in r["summary"].get("collected") or [] if c["state"] == "progress kept"]
    assert kept and 1 in kept[0]["batch_sizes"], r["summary"]
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert again.returncode == 0, again.stderr[-3000:]
    rid2 = recap(again)["run_id"]
    out = h.sh(f"cat /var/lib/orch/units/orch-tune-{rid2}.service.out").stdout
    assert f"resuming: batch sizes {kept[0]['batch_sizes']}" in out, out[-2000:]


def _hooked_bed(testbed_factory, tmp_path):
    """One host whose payload loads :data:`SITECUSTOMIZE` (``hold-<cmd>`` gates), old file installed."""
    opts = {0: {"config_files": {UP: OLD_UP}, "env": {"PYTHONPATH": f"{FAULTS_DIR}:/opt/sglang"}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    _faults(h).mkdir(parents=True, exist_ok=True)
    (_faults(h) / "sitecustomize.py").write_text(SITECUSTOMIZE)
    h.sh("systemctl restart sglang-qwen")  # the unit's processes see the hooks from now on
    h.wait_http("/health")
    return bed, h, inventory(bed, tmp_path / "hosts.yaml"), h.file_tree_hash(h.config_dir)


def _sigkill_at_bench(h, inv, state: Path, rid: str, log: Path, which: str) -> None:
    """Run ``orch tune`` until its ``which``-th benchmark is held on the host, then SIGKILL it."""
    (_faults(h) / "hold-bench").write_text(which)
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_file(h, proc, "entered-bench")
        proc.kill()  # SIGKILL: no rescue, no always
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
        _reset_faults(h)  # the held benchmark goes on; recover stops it as the dead run's
    assert (_lock(h) or {}).get("run_id") == rid


def test_recover_restarts_a_unit_the_dead_run_had_started_on_its_new_files(testbed_factory, tmp_path):
    """Issue 21: the controller dies (SIGKILL) after it restarted the unit on the installed files
    and proved them loaded (held in the benchmark after). ``orch recover`` puts the old files back
    and, since the running process was started by that run, restarts the unit, waits for it and
    proves from the new start's log that the old file was loaded (before, it left the server
    running on the new files while the disk held the old ones, and recorded the run restored)."""
    bed, h, inv, tree = _hooked_bed(testbed_factory, tmp_path)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    _sigkill_at_bench(h, inv, state, rid, log, "2")
    assert h.unit_state() == "active" and _host_run_state(h, rid) == "installed"
    assert h.sh(f"test -f '{h.triton_dir}/{DOWN}'", check=False).returncode == 0, "new files installed"
    pid_new = _main_pid(h)

    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(state), state_dir=state)
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    _assert_restored(h, tree, rid)
    assert _main_pid(h) not in (pid_new, "0", ""), "the unit runs the process the dead run started"
    # the log of the new start shows the old file loaded, and no new one
    last = h.unit_log().rsplit("server_args=", 1)[1]
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in last, last[-2000:]
    assert f"Using MoE kernel config from {h.triton_dir}/{DOWN}." not in last
    assert rid in (r["summary"].get("recover_restart") or ""), r["summary"]
    tasks = {e["task"]: e for e in _recover_events(state, rid) if e.get("event") == "task"}
    proof = tasks["Prove the restored configs were loaded (a running unit a dead run had started was restarted)"]
    assert proof["status"] == "ok" and UP in proof["msg"], proof


def test_recover_leaves_running_a_unit_the_dead_run_never_stopped(testbed_factory, tmp_path):
    """The controller dies (SIGKILL) at its stop of the unit, after it backed up FlashInfer's
    autotune cache: its ``systemctl stop`` is held on the host and ended with it, so the unit
    still runs the process it ran before the tune. ``orch recover`` records the run restored and
    restarts nothing (same MainPID): a run that would change nothing restarts nothing (before, the
    autotune backup alone made recover stop and start the unit)."""
    bed, h, inv, tree = _hooked_bed(testbed_factory, tmp_path)
    pid0 = _main_pid(h)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    _gate(h, "systemctl", "stop")
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_file(h, proc, "entered-systemctl")
        proc.kill()  # SIGKILL: no rescue, no always
        wait_process(proc, "orch's end after SIGKILL")
        held = (_faults(h) / "entered-systemctl").read_text().strip()
        h.sh(f"kill -9 {held}")  # the stop dies with the controller's session, never reaching systemd
    finally:
        if proc.poll() is None:
            proc.kill()
        _reset_faults(h)
    assert _host_run_state(h, rid) == "started" and (_lock(h) or {}).get("run_id") == rid
    # the autotune cache was backed up before the stop (remote/host/fs.py AUTOTUNE_BACKUP's index)
    assert h.sh(f"test -f /var/lib/orch/runs/{rid}/flashinfer-autotune.json", check=False).returncode == 0
    assert _main_pid(h) == pid0 and h.unit_state() == "active"

    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(state), state_dir=state)
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    _assert_restored(h, tree, rid)
    assert _main_pid(h) == pid0, "recover restarted a unit no run had touched"
    assert not r["summary"].get("recover_restart"), r["summary"]
    assert not [e for e in _recover_events(state, rid) if e.get("event") in ("recover_restart", "service_started")]


# ------------------------------------------------------------------------- SSH / network
def _session_processes(h) -> list[int]:
    """What logind's ``KillUserProcesses=yes`` ends at logout (konstruktoid/ansible-role-hardening
    #719): every process of the SSH login sessions. Without logind's session scopes (cgroups) in
    the bed, a session is told by its session id: each ``sshd: USER@...`` process, the command it
    started (sshd makes it a session leader) and every process in that session, children and a
    ``nohup ... &`` re-parented to PID 1 alike. A process that made a session of its own (a service
    manager's unit) is outside, as it is outside logind's scope; the listening sshd is too."""
    rows = [line.split(None, 3) for line in h.sh("ps -eo pid=,ppid=,sid=,args=").stdout.splitlines()]
    procs = {int(r[0]): (int(r[1]), int(r[2]), r[3] if len(r) > 3 else "") for r in rows}
    sshd = {p for p, (_, _, args) in procs.items() if args.startswith("sshd: ") and "@" in args}
    sids = {procs[p][1] for p in procs if p in sshd or procs[p][0] in sshd} - {0, 1}
    return sorted(sshd | {p for p, (_, sid, _) in procs.items() if sid in sids})


def test_logind_kill_of_the_login_sessions_leaves_the_transient_tune_running(testbed_factory, tmp_path):
    """Every process of the SSH sessions SIGKILLed mid-tune, as logind does at logout on a hardened
    host: the tune runs as the transient unit ``orch-tune-RUN``, outside them, so it goes on; the
    controller's next poll reconnects; the run completes with the new files installed."""
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    unit = f"orch-tune-{rid}.service"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        tuner = _wait_payload_tune(h).split()[0]
        assert h.sh(f"systemctl is-active {unit}", check=False).stdout.strip() == "active"
        victims = _session_processes(h)
        assert victims and int(tuner) not in victims, (victims, tuner)
        h.sh("kill -KILL " + " ".join(map(str, victims)), check=False)
        assert h.sh(f"kill -0 {tuner}", check=False).returncode == 0, "the tuner died with the sessions"
        rc, result = _wait_exit(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert _host_run_state(h, rid) == "completed"
    tuned = [e for e in _events(state, rid) if e.get("event") == "tune_launch"]
    assert tuned and tuned[-1]["unit"] == unit and tuned[-1]["memory_max"] > 0, tuned
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode == 0
    assert h.unit_state() == "active" and _lock(h) is None
    assert h.sh(f"systemctl show -p LoadState {unit}").stdout.strip() == "LoadState=not-found"


def test_ssh_dropped_during_a_tune_in_the_session_is_run_again_and_completes(testbed_factory, tmp_path):
    """A host without a usable ``systemd-run`` (none, or PID 1 is no systemd) tunes in the SSH
    session as before, and says so; the SSH sessions killed mid-tune lose the controller its
    connection (issue 32 row 1: named so, never a crash): it logs in again, ends the first tuner (by
    its run's tag: it outlived its session), and runs the tune again in the new session, which
    resumes from the checkpoint; the run completes. (Before: the tune step failed and the rescue
    restored the host.)"""
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, {0: {**HOST_OPTS[0], "systemd_run": False}},
                                   **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        first = _wait_payload_tune(h, proc, state).split()[0]
        # kill every SSH session process of the host (not the listening sshd)
        h.sh("pkill -KILL -f '^sshd: root@'", check=False)
        rc, result = _wait_exit(proc, log, h)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "completed" and r["rescued"] == 0, r
    events = _events(state, rid)
    lost = [e for e in events if e.get("event") == "link_lost"]
    assert lost and lost[0]["task"] == "Tune the fused-MoE kernel" and "crash" not in lost[0]["error"], lost
    fallback = [e for e in events if e.get("event") == "tune_launch" and e.get("unit") is None]
    assert len(fallback) == 2 and all("systemd-run" in e["fallback"] for e in fallback), fallback
    assert h.sh(f"kill -0 {first}", check=False).returncode != 0  # the first tuner was ended, not left beside
    assert _host_run_state(h, rid) == "completed" and h.unit_state() == "active" and _lock(h) is None
    assert h.sh(f"test -e '{h.triton_dir}/{DOWN}'", check=False).returncode == 0
    assert not _payload_procs(h)


def test_host_lost_after_stop_reported_unreachable_then_recovered(testbed_factory, tmp_path):
    """The link dies while the unit is stopped and stays down: the controller notices (TCP_USER_TIMEOUT
    under its keep-alives), logs in again with a backoff until ``orch_reconnect_timeout`` (issue 32
    row 1), then gives the host up: its rescue cannot reach it, it is reported unreachable; once the
    link is back, `orch tune` refuses (unfinished run) and `orch recover` restores it. (The host's
    dead-man, default deadline, has not fired by then: tests/e2e/test_lost_link.py shows it firing.)"""
    bed, h, inv, tree = _ready_bed(testbed_factory, tmp_path, orch_connect_timeout=5, orch_reconnect_timeout=15,
                                   **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        subprocess.run(["ip", "link", "set", h.veth, "down"], check=True)
        rc, result = _wait_exit(proc, log)
    finally:
        subprocess.run(["ip", "link", "set", h.veth, "up"], check=False)
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, log.read_text()[-4000:]
    r = result["hosts"][h.name]
    assert r["outcome"] == "unreachable" and "rescue also failed" in r["cause"], r
    assert "unreachable for 15 s (orch_reconnect_timeout) after the connection was lost" in r["cause"], r["cause"]
    # the dead link was noticed (a lost connection, not a crash), reconnects were tried, then given up
    events = [e["event"] for e in _events(state, rid)]
    assert "link_lost" in events and "reconnect_retry" in events and events.count("link_given_up") == 1, events
    assert "crash" not in r["cause"]
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
    assert "not started: " + h.name in flat(proc.stderr)
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
           # the server cannot read the files orch installs (only those present at its first start):
           # its lookup logs the default, so the proof from the log fails
           else {"ORCH_STANDIN_FAULT_ON_CHANGE": "unreadable"})
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


# ------------------------------------------------------------------- vLLM units (issue 29)
VLLM_UNIT = "vllm-qwen.service"
#: orch's own folder for a vLLM unit that sets no VLLM_TUNED_CONFIG_FOLDER, and the drop-in that points
#: the unit at it (docs/vllm.md, "Where the files go")
VLLM_OWN = f"/var/lib/orch/configs-{VLLM_UNIT}"
VLLM_DROPIN = f"/etc/systemd/system/{VLLM_UNIT}.d/orch-moe-configs.conf"


def _vllm_hooked_bed(testbed_factory, tmp_path):
    """One ``vllm serve`` host (no VLLM_TUNED_CONFIG_FOLDER) whose payload loads :data:`SITECUSTOMIZE`
    (the fault hooks first on the unit's PYTHONPATH, the stand-in vLLM tree after them)."""
    from tests.testbed.bed import HOST_PRESETS, VLLM_TREE

    opts = {0: dict(HOST_PRESETS["vllm-serve"], env={"PYTHONPATH": f"{FAULTS_DIR}:{VLLM_TREE}"})}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    _faults(h).mkdir(parents=True, exist_ok=True)
    (_faults(h) / "sitecustomize.py").write_text(SITECUSTOMIZE)
    h.sh(f"systemctl restart {VLLM_UNIT}")  # the unit's processes see the hooks from now on
    h.wait_http("/health")
    return bed, h, inventory(bed, tmp_path / "hosts.yaml")


def test_recover_on_a_vllm_unit_removes_the_dropin_and_restarts_it_on_the_default(testbed_factory, tmp_path):
    """Issue 29: a vLLM unit with no VLLM_TUNED_CONFIG_FOLDER is tuned through orch's own folder and the
    drop-in that points the unit at it; the controller dies (SIGKILL) after it restarted the unit on the
    new file (held in the benchmark after). ``orch recover`` removes the drop-in the run added (the
    unit files byte-identical to before), leaves the installed vLLM package untouched, breaks the dead
    run's lock, restarts the unit (the running process was the dead run's) and the new start's log shows
    vLLM's default config again; the unit answers."""
    from tests.e2e.test_vllm_units import NAME

    bed, h, inv = _vllm_hooked_bed(testbed_factory, tmp_path)
    units, package = h.file_tree_hash("/etc/systemd/system"), h.file_tree_hash("/srv/vllm")
    assert h.sh(f"test -e {VLLM_DROPIN}", check=False).returncode != 0
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    (_faults(h) / "hold-bench").write_text("2")  # the benchmark after the restart on the new file
    proc = _popen(["tune", str(inv), "--service", VLLM_UNIT], state, rid, log)
    try:
        _wait_file(h, proc, "entered-bench")
        proc.kill()  # SIGKILL: no rescue, no always
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
        _reset_faults(h)  # the held benchmark goes on; recover stops it as the dead run's
    # what the dead run left: the drop-in, its file loaded by the running unit, the lock held
    assert (_lock(h) or {}).get("run_id") == rid
    assert f'Environment="VLLM_TUNED_CONFIG_FOLDER={VLLM_OWN}"' in h.sh(f"cat {VLLM_DROPIN}").stdout
    assert h.sh(f"test -f '{VLLM_OWN}/{NAME}'", check=False).returncode == 0
    assert h.unit_state() == "active"
    assert f"Using configuration from {VLLM_OWN}/{NAME} for MoE layer." in h.unit_log(), h.unit_log()[-3000:]
    pid_new = h.sh(f"systemctl show -p MainPID {VLLM_UNIT}").stdout.strip()

    # the next tune is refused, naming the dead run and `orch recover`
    again = orch("tune", str(inv), "--service", VLLM_UNIT, "--json", state_dir=tmp_path / "state2")
    assert again.returncode == 1, again.stderr[-3000:]
    cause = recap(again)["hosts"][h.name]["cause"]
    assert rid in cause and "orch recover" in cause, cause

    rec = orch("recover", str(inv), "--service", VLLM_UNIT, "--json", "--state-dir", str(state), state_dir=state)
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert h.sh(f"test -e {VLLM_DROPIN}", check=False).returncode != 0, "the run's drop-in is still there"
    assert h.file_tree_hash("/etc/systemd/system") == units and h.file_tree_hash("/srv/vllm") == package
    assert not h.file_tree_hash(VLLM_OWN), "the run's file is still in orch's folder"
    assert "VLLM_TUNED_CONFIG_FOLDER" not in h.sh(f"systemctl show -p Environment {VLLM_UNIT}").stdout
    assert h.unit_state() == "active" and _lock(h) is None
    assert h.sh(f"systemctl show -p MainPID {VLLM_UNIT}").stdout.strip() not in (pid_new, "MainPID=0")
    h.wait_http("/health")
    status = h.py("import sys, urllib.request, json\n"
                  "req = urllib.request.Request(sys.argv[1], data=json.dumps({'model': '/models/tiny-moe', "
                  "'prompt': 'hello', 'max_tokens': 3, 'temperature': 0}).encode(), "
                  "headers={'content-type': 'application/json'})\n"
                  "print(json.load(urllib.request.urlopen(req, timeout=30))['usage']['completion_tokens'])\n",
                  h.url + "/v1/completions").stdout.strip()
    assert status == "3", status
    text = h.unit_log()
    last = text[text.rfind("vLLM server version"):]
    assert "Using default MoE config. Performance might be sub-optimal!" in last and VLLM_OWN not in last, last[-2000:]
    for sub in (rid, f"{rid}.triton"):
        if h.sh(f"test -e /var/lib/orch/runs/{sub}/state.json", check=False).returncode == 0:
            assert _host_run_state(h, sub) == "restored", sub
    assert _host_run_state(h, rid) == "restored"
    broken = json.loads(h.sh("cat /var/lib/orch/lock.broken.json").stdout)
    assert broken["previous"]["run_id"] == rid
