"""Faults that real GPU fleets report (issue 21), on the test bed: each case fails on the code
before its change, and checks the end state of the host (docs/reliability.md, "Faults real
fleets report").
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import inventory, orch, recap
from tests.testbed.bed import VENV_PYTHON

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
#: a valid earlier config that the runs replace (restores must give back exactly these bytes)
OLD_UP = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 2}}


def _lock(h) -> dict | None:
    res = h.sh("cat /var/lib/orch/lock.json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def _host_run_state(h, run_id: str) -> str:
    return json.loads(h.sh(f"cat /var/lib/orch/runs/{run_id}/state.json").stdout)["state"]


def _events(res: dict) -> list[dict]:
    text = (Path(res["run_dir"]) / "events.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _task(res: dict, host: str, name: str) -> dict:
    """The last ``task`` event of ``name`` on ``host`` in the run's events.jsonl."""
    tasks = [e for e in _events(res) if e.get("event") == "task" and e.get("host") == host and e.get("task") == name]
    assert tasks, name
    return tasks[-1]


# ------------------------------------------------------------------- row 1: readiness
def test_hung_generation_behind_a_passing_health_is_a_failed_start(testbed_factory, tmp_path):
    """sglang #4191: after the new configs are installed, ``/health`` answers 200 but every
    generation hangs. Readiness sends a one-token /generate under a deadline: no answer is a
    failed start, and the rescue restores the old files and starts the unit on them."""
    opts = {0: {"config_files": {UP: OLD_UP}, "env": {"ORCH_STANDIN_FAULT_ON_CHANGE": "hang_generate"}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/health")
    tree = h.file_tree_hash(h.config_dir)
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_ready_generate_timeout=5)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    assert "Wait for readiness" in r["cause"] and "/health 200" in r["cause"], r["cause"]
    assert "one-token /generate got no answer" in r["cause"], r["cause"]
    # restored: old bytes, running and generating on them (the restored start does not hang)
    assert h.file_tree_hash(h.config_dir) == tree
    assert h.unit_state() == "active"
    out = h.py("import json,urllib.request;print(json.load(urllib.request.urlopen(urllib.request.Request("
               f"'{h.url}/generate',data=b'{{\"text\":\"x\",\"sampling_params\":{{\"max_new_tokens\":2}}}}',"
               "headers={'Content-Type':'application/json'}),timeout=30))['meta_info']['completion_tokens'])")
    assert out.stdout.strip() == "2"
    assert _lock(h) is None and _host_run_state(h, res["run_id"]) == "restored"


def test_health_503_while_generation_works_is_waited_through(testbed_factory, tmp_path):
    """sglang #22511, #10856: ``/health`` answers 503 long after the start (a health probe queued
    behind a long prefill, a JIT warm-up) while completions succeed. A 503 is no failure: orch
    keeps trying a one-token generation, and the one that returns a token ends the wait. Before,
    readiness waited for /health 200 only, ran past ``orch_ready_timeout`` and rolled back a good
    tune."""
    opts = {0: {"config_files": {UP: OLD_UP}, "env": {"ORCH_STANDIN_HEALTH_503_S": "3600"}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/v1/models")
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_ready_timeout=30)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed" and not r["rescued"], r
    ready = _task(res, h.name, "Wait for readiness")
    assert "/health answered 503, a one-token generation returned a token" in ready["msg"], ready
    # the server really was still saying 503 (the fault was on)
    code = h.py("import urllib.request,urllib.error\ntry: print(urllib.request.urlopen("
                f"'{h.url}/health',timeout=5).status)\nexcept urllib.error.HTTPError as e: print(e.code)")
    assert code.stdout.strip() == "503"
    assert _lock(h) is None and _host_run_state(h, res["run_id"]) == "completed"


# --------------------------------------------------- row 8: what "before" measured, and who
def test_before_benchmark_records_what_the_server_had_loaded(testbed_factory, tmp_path):
    """end2end-optimization's retraction: the "default" arm had loaded a tuned file from an
    older Triton folder. Here the running server falls back to ``triton_3_1_0/`` for its up file;
    the "before" benchmark reads the log of the server's start and the recap and the run summary
    (which the HTML report shows) say what it had loaded."""
    opts = {0: {"config_files": {f"triton_3_1_0/{UP}": OLD_UP}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    loaded = r["summary"]["before_loaded"]
    assert [f[1].rsplit("/", 2)[-2:] for f in loaded["fallback"]] == [["triton_3_1_0", UP]], loaded
    assert "fell back to" in loaded["text"] and "Triton 3.1.0" in loaded["text"], loaded
    before = _task(res, h.name, "Benchmark before")
    assert f"what the server had loaded (from its log): {loaded['text']}" in before["msg"], before["msg"]
    html = orch("report", res["run_dir"], "--out", str(tmp_path / "report.html"), state_dir=tmp_path / "state")
    assert html.returncode == 0, html.stderr[-2000:]
    page = (tmp_path / "report.html").read_text()
    assert "before_loaded" in page and "triton_3_1_0" in page


def _start_stray_server(h) -> int:
    """A server started by hand, outside the unit, on the unit's port (``SO_REUSEPORT``, so the
    kernel hands it part of the connections): a leaked server. Returns its PID."""
    cmd = (f"cd / && PYTHONPATH=/opt/sglang ORCH_STANDIN_REUSE_PORT=1 ORCH_STANDIN_WARMUP_S=0 setsid nohup "
           f"{VENV_PYTHON} -m sglang.launch_server --model-path /models/tiny-moe --tp 1 --port 30000 "
           "--host 0.0.0.0 >/var/log/stray.log 2>&1 </dev/null & echo $!")
    pid = int(h.sh(cmd).stdout.split()[-1])
    h.sh("for i in $(seq 600); do grep -q 'ready to roll' /var/log/stray.log && exit 0; sleep 0.1; done; "
         "cat /var/log/stray.log; exit 1")
    return pid


def test_leaked_server_on_the_port_is_detected_before_anything_stops(testbed_factory, tmp_path):
    """A leaked server answers on the unit's port beside (or instead of) the unit's own: the
    "before" benchmark checks the process listening there is the unit's main process, names the
    stranger, and nothing is stopped (both keep running)."""
    opts = {0: {"config_files": {UP: OLD_UP}, "env": {"ORCH_STANDIN_REUSE_PORT": "1"}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/health")
    tree = h.file_tree_hash(h.config_dir)
    main_before = h.sh("systemctl show sglang-qwen -p MainPID").stdout.strip()
    stray = _start_stray_server(h)
    try:
        inv = inventory(bed, tmp_path / "hosts.yaml")
        proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        res = recap(proc)
        r = res["hosts"][h.name]
        assert r["outcome"] == "failed", r
        assert "Benchmark before" in r["cause"] and f"{stray} (" in r["cause"], r["cause"]
        assert "not sglang-qwen's main server" in r["cause"], r["cause"]
        # nothing stopped or changed: same main process, same files, the stray untouched
        assert h.sh("systemctl show sglang-qwen -p MainPID").stdout.strip() == main_before
        assert h.file_tree_hash(h.config_dir) == tree and h.unit_state() == "active"
        assert h.sh(f"kill -0 {stray}", check=False).returncode == 0
        assert _lock(h) is None and _host_run_state(h, res["run_id"]) == "failed"
    finally:
        h.sh(f"kill -9 {stray}", check=False)


# ------------------------------------------------ row 14: after a SIGKILL, every request counts
def test_after_a_sigkill_every_request_of_the_benchmark_must_return_tokens(testbed_factory, tmp_path):
    """sglang #22779: after a leftover was SIGKILLed the new server answers /health but then
    stalls. The bed's leftover scheduler ignores SIGTERM, so the reaper SIGKILLs it; the next
    start answers one request of the benchmark after with no token (1 in 10 at concurrency 1:
    the 1% that a benchmark forgives is not forgiven here). orch fails the benchmark after,
    restores the old files, and the recap lists the SIGKILL."""
    env = {"ORCH_STANDIN_LEAK_SCHEDULER": "stubborn", "ORCH_STANDIN_NO_TOKENS_AFTER_SIGKILL": "3"}
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}, "env": env, "strays": False}})
    h = bed.hosts[0]
    h.wait_http("/health")
    tree = h.file_tree_hash(h.config_dir)
    leftover = h.sh("pgrep -f '^sglang::scheduler_TP0'").stdout.split()
    assert len(leftover) == 1, leftover
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1, r
    assert "Benchmark after" in r["cause"] and "every request must return tokens" in r["cause"], r["cause"]
    assert "9 of 10 requests returned tokens" in r["cause"] or "warm-up request(s) failed" in r["cause"], r["cause"]
    assert [(k["pid"], k["by"]) for k in r["summary"]["sigkilled"]] == [(int(leftover[0]), "reap")], r["summary"]
    assert [e["pid"] for e in _events(res) if e.get("event") == "sigkill"] == [int(leftover[0])]
    assert h.file_tree_hash(h.config_dir) == tree and h.unit_state() == "active"
    h.wait_http("/health")
    assert _lock(h) is None and _host_run_state(h, res["run_id"]) == "restored"


# --------------------------------------------- row 13: "free" means no compute process left
def test_gpu_free_means_no_compute_process_a_monitor_holding_the_device_is_left_alone(testbed_factory, tmp_path):
    """dra-driver-nvidia-gpu #1076, gpu-operator #118: a monitor (here ``gpud``, not in the
    protected list) keeps ``/dev/nvidia0`` open without being a compute process. With nvidia-smi
    answering, the reaper decides "free" from the compute processes of the unit's GPUs: the
    leftover SGLang scheduler is ended, the monitor and nvidia-persistenced are left alone, and
    the tune completes. Before, every unprotected holder was ended, the monitor too."""
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}, "nvidia_smi": True}})
    h = bed.hosts[0]
    h.wait_http("/health")
    holder = str(Path(__file__).resolve().parents[1] / "testbed" / "holder.py")
    h.py("import subprocess,sys; subprocess.run(['gpud', sys.argv[1], '--comm', 'gpud', '/dev/nvidia0'], "
         "executable='/usr/bin/python3', check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
         "stderr=subprocess.DEVNULL)", holder)
    monitor = [int(p) for p, cmd in h.pids_holding("/dev/nvidia0") if cmd.startswith("gpud")]
    leftover = [int(p) for p, cmd in h.pids_holding("/dev/nvidia0") if cmd.startswith("sglang::")]
    assert len(monitor) == 1 and len(leftover) == 1, h.pids_holding("/dev/nvidia0")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert [k["pid"] for k in r["summary"]["reaped"]] == leftover, r["summary"]["reaped"]
    reap = _task(res, h.name, "Reap leftover GPU processes")
    assert f"left alone, no compute process (nvidia-smi): {monitor[0]} (gpud" in reap["msg"], reap["msg"]
    assert h.sh(f"kill -0 {monitor[0]}", check=False).returncode == 0  # the monitor still runs
    assert any(cmd.startswith("nvidia-persistenced") for _, cmd in h.pids_holding("/dev/nvidia0"))


# ------------------------------------------- row 2: a peer that stops answering is noticed
def test_silent_ssh_peer_is_noticed_and_the_tune_run_again(testbed_factory, tmp_path):
    """paramiko #2463, pyinfra #1336: Paramiko's keep-alives want no answer, so a session whose
    sshd stops answering while the host's kernel still acknowledges TCP (here: orch's session
    processes frozen with SIGSTOP in the middle of the tune) is never noticed, and orch waits for
    the tune's result for ever. Now each transport asks for an answer every ``KEEPALIVE_S`` s and
    closes after ``ALIVE_COUNT_MAX`` unanswered ones: the lost connection is named (issue 32 row 1),
    orch logs in again on a new session, ends the first tuner by its run's tag and runs the tune
    again, resuming from its checkpoint; the run completes. (Issue 21: the rescue restored the host.)"""
    import subprocess

    from orchestrator.records import new_run_id
    from tests.e2e.helpers import REPO
    from tests.waiting import files_state, process_ended, wait_process, wait_until

    # the tune attached to one channel (a host without systemd-run): a tune in a transient unit is
    # polled in short commands, and the poll after the closed transport reconnects
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}, "systemd_run": False}})
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_tune_batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    cmd = [sys.executable, "-m", "orchestrator", "tune", str(inv), "--service", "sglang-qwen", "--state-dir",
           str(state), "--run-id", rid, "--json"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, XDG_STATE_HOME=str(state), COLUMNS="200"))
    progress = [lambda: files_state(state), lambda: files_state(log),
                lambda: files_state(h.local_path("/var/lib/orch/work"))]
    try:
        wait_until(lambda: h.sh("pgrep -f '^[^ ]*python[^ ]* -m remote tune( |$)'", check=False).stdout.strip(),
                   "the payload tune", progress=progress, alive=process_ended(proc))
        frozen = h.sh("pgrep -f '^sshd: (root|orchop)'").stdout.split()
        assert frozen
        h.sh("kill -STOP " + " ".join(frozen))
        # the code before issue 21 waited for the frozen session for ever (no progress: the stall ends it)
        wait_until(lambda: "link_lost" in (state / "runs" / rid / "events.jsonl").read_text(),
                   "the silent session noticed", progress=progress, alive=process_ended(proc))
        h.sh("kill -CONT " + " ".join(frozen), check=False)
        rc = wait_process(proc, "orch's end", progress=progress)
    finally:
        if proc.poll() is None:
            proc.kill()
        h.sh("pkill -CONT -f '^sshd: '", check=False)
    text = log.read_text()
    res = json.loads(text[text.rfind('\n{\n  "run_id"') + 1:])
    r = res["hosts"][h.name]
    assert rc == 0 and r["outcome"] == "completed" and r["rescued"] == 0, r
    events = [json.loads(x) for x in (state / "runs" / rid / "events.jsonl").read_text().splitlines() if x.strip()]
    lost = next(e for e in events if e.get("event") == "link_lost")
    assert lost["task"] == "Tune the fused-MoE kernel" and "crash" not in lost["error"], lost
    assert sum(1 for e in events if e.get("event") == "tune_launch" and e.get("unit") is None) == 2  # in the session
    assert h.unit_state() == "active" and _lock(h) is None and _host_run_state(h, rid) == "completed"
    h.wait_http("/health")


# --------------------------------------------- row 4: the tuner's own, fresh Triton cache
def test_tuner_uses_a_fresh_triton_cache_of_its_own_never_the_servers(testbed_factory, tmp_path):
    """triton #11512, prime-rl #2305, vllm #6103: a shared or NFS Triton cache breaks a tune. The
    unit names a shared cache (``TRITON_CACHE_DIR=/srv/triton-shared``); the tuner uses a new
    folder under its work folder for this run (named by the run's tag), leaves the shared one
    untouched, and removes its own at the end. (The retry after a cache error is
    ``tests/unit/remote/tuning/test_triton_cache.py``: the bed's interpreter runs compile
    nothing.)"""
    opts = {0: {"config_files": {UP: OLD_UP}, "env": {"TRITON_CACHE_DIR": "/srv/triton-shared"}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.sh("mkdir -p /srv/triton-shared")
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    report = json.loads((Path(res["run_dir"]) / "hosts" / h.name / "report.json").read_text())
    cache = report["triton_cache"]
    assert cache["dir"].startswith("/var/lib/orch/work/") and "/triton-cache/triton-cache-" in cache["dir"], cache
    assert res["run_id"] in cache["dir"] and cache["moved_aside"] is None, cache
    assert h.sh(f"test -e '{cache['dir']}'", check=False).returncode != 0  # removed at the end
    assert h.sh("ls -A /srv/triton-shared").stdout.strip() == ""  # the server's cache untouched


# ------------------------------------------------------ row 5: work folder on a noexec mount
def test_work_folder_on_a_noexec_mount_is_refused_at_probe(testbed_factory, tmp_path):
    """pytorch #123054: on a ``noexec`` mount Triton's compiled ``.so`` fails to map. The host's
    ``/var/lib/orch`` (the state folder, which holds the tuner's work folder, its Triton cache and
    temp files) is remounted ``noexec``: the probe refuses with the reason, before anything is
    stopped."""
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    h.sh("mkdir -p /var/lib/orch && (mountpoint -q /var/lib/orch || mount --bind /var/lib/orch /var/lib/orch) "
         "&& mount -o remount,bind,noexec /var/lib/orch")
    tree = h.file_tree_hash(h.config_dir)
    main_before = h.sh("systemctl show sglang-qwen -p MainPID").stdout.strip()
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed" and "Probe GPUs" in r["cause"], r
    assert "/var/lib/orch/work is on a noexec mount (/var/lib/orch" in r["cause"], r["cause"]
    assert "orch_state_dir" in r["cause"], r["cause"]
    assert h.sh("systemctl show sglang-qwen -p MainPID").stdout.strip() == main_before
    assert h.file_tree_hash(h.config_dir) == tree and _lock(h) is None


# ------------------------------------- row 6: sudo's secure_path does not choose the payload's PATH
def test_payload_commands_name_their_path_and_interpreter_under_a_secure_path_sudo(testbed_factory, tmp_path):
    """sudo-rs #1299, teleport #67522, triton #2878: sudo resets the environment and applies
    ``secure_path`` (sudo-rs also ignores ``-E``); a command run through it gets sudo's PATH, here
    ``/usr/bin:/bin``, without ``/usr/sbin`` (``ldconfig``) or ``/usr/local/sbin`` (this host's
    ``nvidia-smi``). Every payload command names the absolute interpreter and passes PATH
    explicitly (``sudo ... env PATH=<the unit's> /abs/python -m remote ...``): the reaper finds
    ``nvidia-smi`` where the server would."""
    from tests.testbed.bed import SUDO_LOG

    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}, "nvidia_smi": True}})
    h = bed.hosts[0]
    h.sh(f"printf 'Defaults:{bed.login_user} secure_path=\"/usr/bin:/bin\"\\nDefaults:{bed.login_user} env_reset\\n' "
         f">> /etc/sudoers.d/{bed.login_user} && visudo -cf /etc/sudoers.d/{bed.login_user}")
    h.wait_http("/health")
    hv = {"ansible_user": bed.login_user, "ansible_become": True, "ansible_become_password": bed.become_password}
    inv = inventory(bed, tmp_path / "hosts.yaml", host_vars={h.name: hv})
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    reap = _task(res, h.name, "Reap leftover GPU processes")
    assert reap["data"]["nvidia_smi"] == "used", reap["data"]  # found on the unit's PATH, not sudo's
    lines = h.sh(f"cat {SUDO_LOG}").stdout.splitlines()
    payload = [x.split("COMMAND=", 1)[1] for x in lines if " -m remote " in x]
    assert payload
    for cmd in payload:
        words = cmd.split()
        env_at = words.index("env") if "env" in words else -1
        assert env_at >= 0, cmd
        assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in words[env_at:], cmd
        python = words[words.index("-m") - 1]
        assert python.startswith("/"), cmd


# ------------------------------------------------ row 7: the log where the unit really writes it
def test_unit_logging_to_a_file_is_read_there(testbed_factory, tmp_path):
    """dcgm-exporter #606, puppet-systemd #500: a unit with ``StandardOutput=append:FILE`` writes
    SGLang's lines to that file, not to the journal. orch reads the unit's ``StandardOutput=``/
    ``StandardError=`` targets too: the proof that the new files were loaded is found in the file
    and the tune completes (before, the journal held no lookup line: a good tune was rolled back)."""
    opts = {0: {"config_files": {UP: OLD_UP}, "service_lines": ["StandardOutput=append:/var/log/sglang.log"]}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/health")
    assert "Using MoE kernel config" not in h.unit_log()  # the journal does not have them
    assert "Using MoE kernel config" in h.sh("cat /var/log/sglang.log").stdout
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    assert res["hosts"][h.name]["outcome"] == "completed"
    proof = _task(res, h.name, "Prove the new configs were loaded")
    assert proof["data"]["loaded"] and all(p.endswith((UP, UP.replace(".json", "_down.json")))
                                           for p in proof["data"]["loaded"]), proof


# ------------------------------------- row 7: one start read by journal cursor, gaps as gaps
def _journald_fault(h, **fault) -> None:
    """Turn on a journald fault of the bed's ``journalctl`` (tests/testbed/journalctl_shim.py) for
    the lines the unit writes from now on."""
    have = len(h.unit_log().splitlines())
    h.sh(f"cat > /run/orchtb/journald.json <<'X'\n{json.dumps({k: dict(v, **{'from': have}) for k, v in fault.items()})}\nX")


def _proof(res: dict, h) -> dict:
    return _task(res, h.name, "Prove the new configs were loaded")


def test_backward_clock_step_does_not_hide_the_new_start(testbed_factory, tmp_path):
    """systemd #43805: the clock steps back an hour, so the new start's entries carry stamps
    earlier than the old start's and ``journalctl --since`` (a time window) hides them. orch reads
    the start after its journal cursor: the lines are found and the new files are proven loaded."""
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    since = h.sh("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    _journald_fault(h, clock_step={"seconds": -3600})
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = recap(proc)
    assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
    proof = _proof(res, h)
    assert proof["data"]["by_cursor"] and any(p.endswith(UP) for p in proof["data"]["loaded"]), proof
    # the fault was on: a time window from before the run misses the new start's lookup lines
    window = h.sh(f"journalctl -u sglang-qwen --no-pager --since {json.dumps(since)}").stdout
    assert "Using MoE kernel config" not in window and "Using MoE kernel config" in h.unit_log()


def test_rate_limited_journal_is_a_gap_not_a_missing_line(testbed_factory, tmp_path):
    """systemd #2913: journald's rate limiting drops the new start's MoE lookup lines and logs
    "Suppressed N messages from UNIT". The proof says the lines are not proven (log gap), the
    benchmark decides, the recap and the events say there was a gap (before, verify-log read the
    missing line as "not loaded" and rolled a good tune back)."""
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: OLD_UP}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    _journald_fault(h, suppress={"match": "MoE kernel config|MoE config file"})
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    res = recap(proc)
    r = res["hosts"][h.name]
    proof = _proof(res, h)
    assert proof["status"] != "failed" and "not proven (log gap" in proof["msg"], proof
    assert any(p.endswith(UP) for p in proof["data"]["not_proven"]), proof
    assert any("Suppressed" in e.get("gap", "") or "suppressed" in e.get("gap", "")
               for e in _events(res) if e.get("event") == "log_gap"), "no log_gap event"
    assert any("suppressed" in g for g in r["summary"]["log_gaps"]), r["summary"]
    assert r["outcome"] in ("completed", "rolled_back"), r
    assert "Suppressed" in h.unit_log()


def test_log_file_truncated_during_the_start_is_a_gap(testbed_factory, tmp_path):
    """logrotate's ``copytruncate`` of a unit's ``StandardOutput=append:`` file during a start: the
    file shrinks under orch. orch notices (its recorded size is past the end), reads the file from
    its start and reports the rotation as a gap; the lookup lines rotated away are not proven,
    not absent (before, the missing line rolled a good tune back)."""
    log = "/var/log/sglang.log"
    opts = {0: {"config_files": {UP: OLD_UP}, "service_lines": [f"StandardOutput=append:{log}"]}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/health")
    starts = h.sh(f"grep -c 'Using MoE kernel config' {log}").stdout.strip()
    # the host's logrotate: once the next start logged its lookups, copy the file and truncate it
    h.sh(f"setsid nohup sh -c 'while [ $(grep -c \"Using MoE kernel config\" {log}) -le {starts} ]; do "
         f"sleep 0.05; done; cp {log} {log}.1 && : > {log}' >/dev/null 2>&1 </dev/null &")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    res = recap(proc)
    r = res["hosts"][h.name]
    assert "Using MoE kernel config" in h.sh(f"cat {log}.1").stdout  # the rotation happened
    proof = _proof(res, h)
    assert proof["status"] != "failed" and "not proven (log gap" in proof["msg"], proof
    assert any(log in g and "truncated" in g for g in r["summary"]["log_gaps"]), r["summary"]
    assert r["outcome"] in ("completed", "rolled_back"), r


# ---------------------------- row 7: one start's journal kept to its invocation ID (and cursor)
def test_an_earlier_invocations_straggler_line_after_the_cursor_is_not_read_as_the_new_start(testbed_factory,
                                                                                             tmp_path):
    """A process of the unit's previous invocation (a child of the old main process that outlived
    the stop) writes that invocation's MoE lookup lines again after orch's cursor, once the new
    start logged its own: SGLang's real lines, among them "Down MoE config file not found" (the old
    start had no ``_down`` file). journald tags them with the old invocation's ID (the old stream's
    cached metadata). orch keeps the start's journal entries to the invocation ID the start got
    (``systemctl show -p InvocationID``): the straggler's lines are dropped and said, the proof
    passes (before, the old line read as this start's failed the proof and a good tune was rolled
    back)."""
    unit = "sglang-qwen.service"
    opts = {0: {"config_files": {UP: OLD_UP}, "env": {"ORCH_STANDIN_STRAGGLER": unit}}}
    bed = testbed_factory(1, host_options=opts)
    h = bed.hosts[0]
    h.wait_http("/health")
    old = h.sh(f"systemctl show -p InvocationID {unit}").stdout.strip().partition("=")[2]
    assert len(old) == 32, old
    assert "Down MoE config file not found" in h.unit_log()  # the old start's own line
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    res = recap(proc)
    r = res["hosts"][h.name]
    new = h.sh(f"systemctl show -p InvocationID {unit}").stdout.strip().partition("=")[2]
    # the fault happened: after the new start, lines of the old invocation in the unit's journal
    entries = [json.loads(x) for x in h.sh(f"journalctl -u {unit} -o json --no-pager").stdout.splitlines()]
    ids = [e.get("_SYSTEMD_INVOCATION_ID") for e in entries]
    first_new = next(i for i, x in enumerate(ids) if x not in (old, None))  # orch's start (a rescue's later)
    late = [e["MESSAGE"] for e in entries[first_new:] if e.get("_SYSTEMD_INVOCATION_ID") == old]
    assert any("Down MoE config file not found" in m for m in late), late
    assert proc.returncode == 0 and r["outcome"] == "completed", (r.get("cause"), proc.stderr[-3000:])
    proof = _proof(res, h)
    assert proof["data"]["invocations"] == [new], proof
    assert [o["invocation"] for o in proof["data"]["other_invocations"]] == [old], proof
    assert not proof["data"]["down_missing"] and any(p.endswith("_down.json") for p in proof["data"]["loaded"])
    assert [o["invocation"] for o in r["summary"]["log_other_invocations"]] == [old], r["summary"]
    assert [e for e in _events(res) if e.get("event") == "log_other_invocation" and e.get("invocation") == old]
