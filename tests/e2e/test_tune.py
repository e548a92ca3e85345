"""End to end: `orch tune` over real SSH against the network-namespace test bed.

Each host is a network namespace with its own sshd, mount and PID namespace, a real
unit file run by docker-systemctl-replacement, and the stand-in SGLang server; the
payload tunes the builtin Triton kernel on the CPU (TRITON_INTERPRET=1, smoke space).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.e2e.helpers import flat, inventory, orch, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


def _snapshot(host):
    """What --check must not change: SGLang tree, orch state, unit files, unit state and PID."""
    return {
        "sglang": host.file_tree_hash("/opt/sglang"),
        "state": host.file_tree_hash("/var/lib/orch"),
        "units": host.file_tree_hash("/etc/systemd/system"),
        "tmp": sorted(p for p in host.sh("ls -A /tmp", check=False).stdout.split() if p.startswith("orch")),
        "active": host.unit_state(),
        "pid": host.sh(f"systemctl show -p MainPID {host.unit}", check=False).stdout.strip(),
    }


def test_tune_two_hosts_end_to_end(testbed_factory, tmp_path):
    bed = testbed_factory(2)
    # 64 output tokens a request (the bed's default is 16): each level then runs seconds, not a
    # fraction of one, so the simulated 6 -> 4 ms per token shows through the CPU load of a
    # parallel test run (with 16 tokens one run measured 448 -> 432 tokens/s under that load)
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_bench_output_len=64)
    before = {h.name: h.pids_holding("/dev/nvidia0") for h in bed.hosts}
    for h in bed.hosts:
        assert any("scheduler" in c for _, c in before[h.name]), before[h.name]
        assert any("nvidia-persistenced" in c for _, c in before[h.name])
        assert not h.sh(f"test -e {h.triton_dir!r}", check=False).returncode == 0, "triton folder must start missing"

    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = recap(proc)
    for h in bed.hosts:
        r = result["hosts"][h.name]
        assert r["outcome"] == "completed", r
        # configs at the exact path SGLang looks in, valid JSON with integer keys
        for name in (UP, DOWN):
            text = h.sh(f"cat {h.triton_dir + '/' + name!r}").stdout
            cfg = json.loads(text)
            assert cfg and all(k.isdigit() for k in cfg) and {"1", "4"} <= set(cfg)
        assert h.unit_state() == "active"
        # the log proves the new files were loaded
        log = h.unit_log()
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in log
        assert f"Using MoE kernel config from {h.triton_dir}/{DOWN}." in log
        # stray scheduler reaped, nvidia-persistenced alive
        holders = h.pids_holding("/dev/nvidia0")
        assert not any("scheduler_TP0" in c and "holder" in c for _, c in holders), holders
        persist = [p for p, c in before[h.name] if "nvidia-persistenced" in c]
        assert persist and all(h.sh(f"test -d /proc/{p}", check=False).returncode == 0 for p in persist)
        # benchmark before and after, with the gain the stand-in simulates for tuned configs
        s = r["summary"]
        b, a = s["bench_before"]["output_throughput"], s["bench_after"]["output_throughput"]
        assert b > 0 and a > b, (b, a)
        # run record on the host, with the manifest of what was written
        runs = h.sh("ls /var/lib/orch/runs").stdout.split()
        assert result["run_id"] in runs
        manifest = json.loads(h.sh(f"cat /var/lib/orch/runs/{result['run_id']}/manifest.json").stdout)
        assert sorted(f["path"].rsplit("/", 1)[-1] for f in manifest["files"]) == sorted([UP, DOWN])
        state = json.loads(h.sh(f"cat /var/lib/orch/runs/{result['run_id']}/state.json").stdout)
        assert state["state"] == "completed"
    # run record on the controller
    run_dir = tmp_path / "state" / "runs" / result["run_id"]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "process_killed" for e in events)
    assert (run_dir / "hosts" / bed.hosts[0].name / "configs" / UP).exists()
    assert "PLAY RECAP" in proc.stderr and "SUMMARY" in proc.stderr


HEALTH = ("import sys,urllib.request\n"
          "print(urllib.request.urlopen(sys.argv[1],timeout=5).status)\n")


def _watch_prepare(h, seen: list, stop: threading.Event) -> None:
    """While orch runs: each time the prepare step's transient unit (``orch-prepare-<run id>``) is
    active on ``h``, ask the stand-in server ``/health`` and keep ``(unit, status, time)`` when the
    prepare unit was still active after the answer came."""
    while not stop.is_set():
        names = [n[:-len(".service")] for n in h.sh("ls /run/systemd/system", check=False).stdout.split()
                 if n.startswith("orch-prepare-") and n.endswith(".service")]
        for unit in names:
            if h.unit_state(unit) != "active":
                continue
            status = h.py(HEALTH, h.url + "/health", check=False).stdout.strip()
            if h.unit_state(unit) == "active":
                seen.append((unit, status, time.time(), h.unit_state()))


def test_prepare_runs_while_the_unit_serves_and_the_recap_splits_the_downtime(testbed_factory, tmp_path):
    """The prepare step runs before the stop, in its own transient unit, while the stand-in server
    answers; the recap (terminal and --json), the run record and the HTML report carry the unit's
    downtime split into stop, tune, install, start and readiness, from the steps' own clocks."""
    from orchestrator import report as rep

    bed = testbed_factory(1)
    h = bed.hosts[0]
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_bench=False)
    h.wait_http("/health")
    seen: list = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_prepare, args=(h, seen, stop), daemon=True)
    watcher.start()
    try:
        proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    finally:
        stop.set()
        watcher.join(timeout=120)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = recap(proc)
    r = result["hosts"][h.name]
    assert r["outcome"] == "completed", r
    # the server answered while the prepare step ran, in the prepare's own unit, with the unit active
    unit = f"orch-prepare-{result['run_id']}"
    assert any(u == unit and status == "200" and state == "active" for u, status, _, state in seen), seen
    s = r["summary"]
    assert s["prepared"]["ok"] is True and s["prepared"]["how"] == f"{unit}.service"
    assert s["prepared"]["nice"] == 10 and "compiles nothing" in s["prepared"]["reason"]  # the interpreter
    assert s["prepared_used"]["used"] is True
    # the downtime: its parts follow each other from the stop's start to the end of the readiness wait
    d = s["downtime"]
    parts = [d[k] for k in ("stop", "tune", "install", "start", "readiness")]
    assert d["ended"] and all(p > 0 for p in parts) and d["total"] == pytest.approx(sum(parts), abs=0.01)
    events = [json.loads(x) for x in (tmp_path / "state" / "runs" / result["run_id"] / "events.jsonl")
              .read_text().splitlines()]
    tasks = {e["module"]: e for e in events if e.get("event") == "task" and e.get("host") == h.name}
    stopped = next(e for e in events if e.get("module") == "service" and e.get("msg", "").endswith("stopped"))
    assert tasks["prepare_tune"]["time"] <= d["stopped_at"] == pytest.approx(stopped["start"], abs=0.01)
    assert d["back_at"] == pytest.approx(tasks["wait_ready"]["time"], abs=1.0)
    assert any(t < d["stopped_at"] for _, _, t, _ in seen)
    # the terminal recap and the HTML report show it
    assert "unit downtime" in proc.stderr and f"{d['total']:.1f} s" in proc.stderr
    html = rep.build_report(tmp_path / "state" / "runs" / result["run_id"], plots=False).read_text()
    assert "<h3>Unit downtime</h3>" in html and f"The unit was down for <b>{d['total']:.1f} s</b>" in html


def test_check_mode_changes_nothing(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    inv = inventory(bed, tmp_path / "hosts.yaml")
    h.wait_http("/health")
    snap = _snapshot(h)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _snapshot(h) == snap
    # it said what it would do: the exact paths, new files, and the prepare step before the stop
    assert f"would write {h.triton_dir}/{UP} (new)" in flat(proc.stderr)
    assert "would prepare the tune before the stop" in flat(proc.stderr)
    assert recap(proc)["hosts"][h.name]["outcome"] == "check"


def test_new_config_crashes_server_old_files_restored(testbed_factory, tmp_path):
    old_up = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                    "num_warps": 4, "num_stages": 2}}
    # the stand-in crashes at start (simulated OutOfResources) when its config files differ
    # from those of its first start: the old file loads fine again after the restore
    bed = testbed_factory(1, host_options={0: {"config_files": {UP: old_up},
                                               "env": {"ORCH_STANDIN_FAULT_ON_CHANGE": "crash"}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    tree_before = h.file_tree_hash(h.config_dir)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stderr[-4000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed" and r["rescued"] == 1
    assert "did not start" in r["cause"] or "became failed" in r["cause"], r["cause"]
    assert h.file_tree_hash(h.config_dir) == tree_before
    assert h.unit_state() == "active"
    h.wait_http("/health")
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]


def test_readme_demo_path_persistent_hosts(tmp_path):
    """The README's main job: `python -m tests.testbed up` then `orch tune` on the inventory it wrote."""
    import sys

    from tests.conftest import _require_testbed
    from tests.e2e.helpers import REPO
    from tests.waiting import run_watched

    _require_testbed()
    inv = tmp_path / "testbed.yaml"
    up = run_watched([sys.executable, "-m", "tests.testbed", "up", "--hosts", "2", "--inventory", str(inv)], cwd=REPO)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
        assert proc.returncode == 0, proc.stderr[-6000:]
        hosts = recap(proc)["hosts"]
        assert len(hosts) == 2 and all(h["outcome"] == "completed" for h in hosts.values())
        assert "report: " in proc.stderr
    finally:
        # this bed only: a demo's stays up
        down = run_watched([sys.executable, "-m", "tests.testbed", "down", "--inventory", str(inv)], cwd=REPO)
        assert down.returncode == 0, down.stderr[-2000:]


def test_fp8_block_model_tuned_and_loaded(testbed_factory, tmp_path):
    """A host serving an fp8 checkpoint with block [128, 128] scales (DeepSeek-V3 /
    Qwen3-*-FP8 style ``quantization_config``): orch tunes the fp8_w8a8 kernel and installs
    files under SGLang's exact fp8 names, and the server's log proves it loaded them."""
    from tests.testbed.bed import TINY_MOE_CONFIG

    cfg = dict(TINY_MOE_CONFIG, hidden_size=256, moe_intermediate_size=128, num_experts=4,
               quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128]})
    bed = testbed_factory(1, host_options={0: {"model_config": cfg}})
    h = bed.hosts[0]
    h.wait_http("/health")
    up = "E=4,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    down = up[: -len(".json")] + "_down.json"
    assert "Using default MoE kernel config" in h.unit_log()
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_tune_batch_sizes=[2])
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert recap(proc)["hosts"][h.name]["outcome"] == "completed"
    for name in (up, down):
        cfg_file = json.loads(h.sh(f"cat {h.triton_dir + '/' + name!r}").stdout)
        assert list(cfg_file) == ["2"] and 128 % cfg_file["2"]["BLOCK_SIZE_K"] == 0
    log = h.unit_log().rsplit("server_args=", 1)[1]
    assert f"Using MoE kernel config from {h.triton_dir}/{up}." in log
    assert f"Using MoE kernel config from {h.triton_dir}/{down}." in log


def test_rerun_with_the_same_files_changes_nothing(testbed_factory, tmp_path):
    """Idempotence: after a tune, `orch tune` again (same store, same key) finds the stored files
    byte-identical to the installed ones and the last start's log showing them loaded: the host is
    ok with nothing changed, the server is not stopped (same MainPID), no benchmark runs, and
    `--check` says "unchanged" instead of "would write". An installed file changed by hand makes
    the next run a change again (stop, install, start on a new MainPID)."""
    bed = testbed_factory(1)
    h = bed.hosts[0]
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_bench=False)
    first = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert first.returncode == 0, first.stderr[-6000:]
    assert recap(first)["hosts"][h.name]["changed"] > 0
    snap = _snapshot(h)
    check = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "state")
    assert check.returncode == 0, check.stderr[-4000:]
    text = flat(check.stderr)
    assert "unchanged:" in text and "nothing would be written, stopped" in text, text[-4000:]
    # the plan, before the compare step knows, does not say the installed files would be replaced
    assert "(replace)" not in text and "(replaced only if the new file differs)" in text, text[-4000:]
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert again.returncode == 0, again.stderr[-6000:]
    r = recap(again)["hosts"][h.name]
    assert r["outcome"] == "completed" and r["changed"] == 0, (r, again.stderr[-4000:])
    assert _snapshot(h)["pid"] == snap["pid"] and h.unit_state() == "active"
    assert _snapshot(h)["sglang"] == snap["sglang"]
    # no run folder on the host for the no-op run: nothing was recorded as started
    assert recap(again)["run_id"] not in h.sh("ls /var/lib/orch/runs").stdout.split()
    assert sorted(r["summary"]["unchanged"]) == sorted(f"{h.triton_dir}/{n}" for n in (UP, DOWN)), r["summary"]
    # `orch report latest` passes over the --check run and the run that changed nothing
    from orchestrator.report import find_run_dir
    assert find_run_dir("latest", tmp_path / "state").name == recap(first)["run_id"]
    # a changed installed file is a change again
    h.sh(f"sed -i 's/\"num_warps\": [0-9]*/\"num_warps\": 8/' {h.triton_dir + '/' + UP!r}")
    third = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert third.returncode == 0, third.stderr[-6000:]
    assert recap(third)["hosts"][h.name]["changed"] > 0
    assert find_run_dir("latest", tmp_path / "state").name == recap(third)["run_id"]
    assert h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip() != snap["pid"]
