"""End to end: the MoE runner trial (`orch tune --moe-runners`) and the rollback of a kept runner,
over real SSH on the test bed. The stand-in's per-runner knobs (``ORCH_STANDIN_RUNNER_SPEED``,
``ORCH_STANDIN_WRONG_RUNNERS``, tests/testbed/README.md) make ``flashinfer_cutlass`` twice as fast
as the Triton runner, and, in the second test, wrong."""

from __future__ import annotations

import json

import pytest

from orchestrator.records import new_run_id
from tests.e2e.helpers import flat, inventory, orch, recap
from tests.e2e.test_faults import FAULTS_DIR, SITECUSTOMIZE, _popen, _wait_file
from tests.waiting import wait_process

pytestmark = pytest.mark.testbed

DROPIN_DIR = "/etc/systemd/system/sglang-qwen.service.d"
DROPIN = DROPIN_DIR + "/orch-moe-runner.conf"
CACHE = "/srv/sglang-cache/flashinfer/autotune/0.6.0/sm90/0123456789abcdef"


def _runner(host) -> str:
    """The runner the stand-in server runs (``standin_moe.runner`` of ``/get_server_info``)."""
    out = host.py("import sys,urllib.request;print(urllib.request.urlopen(sys.argv[1]).read().decode())",
                  host.url + "/get_server_info").stdout
    return json.loads(out)["standin_moe"]["runner"]


def _bed(testbed_factory, wrong: bool):
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    if wrong:
        env["ORCH_STANDIN_WRONG_RUNNERS"] = "flashinfer_cutlass"
    return testbed_factory(1, host_options={"gpu-a": {"env": env}})


def test_trial_keeps_the_faster_runner_and_rollback_undoes_it(testbed_factory, tmp_path):
    bed = _bed(testbed_factory, wrong=False)
    h = bed.hosts[0]
    h.sh(f"mkdir -p {CACHE} && printf '{{\"tactics\": 1}}' > {CACHE}/rank_tp0_pp0_dp0.json")
    units_before = h.file_tree_hash("/etc/systemd/system")
    cache_before = h.file_tree_hash("/srv/sglang-cache")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"

    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton,flashinfer_cutlass",
                "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    assert trial["reference"] == "auto" and trial["kept"] == "flashinfer_cutlass" and trial["changed"]
    assert rows["flashinfer_cutlass"]["kept"] and rows["flashinfer_cutlass"]["agreement"] == 1.0
    fast = max(v for v in rows["flashinfer_cutlass"]["tokens_per_s"].values() if v)
    ref = max(v for v in rows["auto"]["tokens_per_s"].values() if v)
    assert fast > ref, (fast, ref)
    # auto resolves to triton here: the reference row measures it on the host's files, the triton
    # row on freshly tuned ones (no stored tune), put back since it was not kept
    assert rows["triton"]["triton_files"] == "tuned" and not rows["triton"]["kept"]
    # the drop-in sets the runner, the server runs it, its log says so
    text = h.sh(f"cat {DROPIN}").stdout
    assert "ExecStart=\n" in text and text.rstrip().endswith("--moe-runner-backend flashinfer_cutlass")
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
    assert "moe_runner_backend='flashinfer_cutlass'" in h.unit_log()
    # the autotune cache was backed up into the run's folder on the host, untouched
    run_id = recap(proc)["run_id"]
    assert h.sh(f"test -f /var/lib/orch/runs/{run_id}/flashinfer-autotune/0.6.0/sm90/0123456789abcdef/"
                "rank_tp0_pp0_dp0.json", check=False).returncode == 0
    assert h.file_tree_hash("/srv/sglang-cache") == cache_before
    # the report and the recap show the table
    html = next((state / "runs" / run_id).rglob("*.html")).read_text()
    assert "flashinfer_cutlass" in html and "agreement" in html.lower()
    assert "flashinfer_cutlass" in flat(proc.stderr)

    # FlashInfer rewrote its cache meanwhile, and made a new file
    h.sh(f"printf '{{\"tactics\": 2}}' > {CACHE}/rank_tp0_pp0_dp0.json && echo '{{}}' > {CACHE}/rank_tp1_pp0_dp0.json")
    back = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    rb = recap(back)["hosts"][h.name]
    assert rb["outcome"] == "completed", rb
    assert h.file_tree_hash("/etc/systemd/system") == units_before  # byte-identical, the drop-in folder gone
    assert h.sh(f"test -e {DROPIN_DIR}", check=False).returncode != 0
    assert h.unit_state() == "active" and _runner(h) == "triton"
    events = (state / "runs" / recap(back)["run_id"] / "events.jsonl").read_text()
    assert "log shows moe_runner_backend=auto (unit: auto)" in events  # verify_runner's proof
    cache_now = h.file_tree_hash("/srv/sglang-cache")
    for path, digest in cache_before.items():
        assert cache_now[path] == digest  # restored to its bytes
    assert any(p.endswith("rank_tp1_pp0_dp0.json") for p in cache_now)  # never deleted


def test_trial_rejects_the_faster_runner_with_wrong_answers(testbed_factory, tmp_path):
    bed = _bed(testbed_factory, wrong=True)
    h = bed.hosts[0]
    units_before = h.file_tree_hash("/etc/systemd/system")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "flashinfer_cutlass", "--json",
                state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    cand = rows["flashinfer_cutlass"]
    assert cand["agreement"] == 0.0 and not cand["passed"] and not cand["kept"]
    assert "output check failed" in cand["why"]
    # it was faster: rejected for its answers, not its speed
    assert max(v for v in cand["tokens_per_s"].values() if v) > max(v for v in rows["auto"]["tokens_per_s"].values() if v)
    assert trial["kept"] == "auto" and not trial["changed"] and rows["auto"]["kept"]
    # the unit restarted twice (the candidate, then back to its runner): restarts are changes
    assert r["changed"] >= 1, r
    assert "the unit restarted 2 times, and runs as before" in flat(proc.stderr), proc.stderr[-4000:]
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    # the host's record of the run shows no change left: `orch rollback` has nothing of it to undo
    run_id = recap(proc)["run_id"]
    manifest = json.loads(h.sh(f"cat /var/lib/orch/runs/{run_id}/manifest.json").stdout)
    assert [f["action"] for f in manifest["files"]] == ["absent"]
    assert h.unit_state() == "active" and _runner(h) == "triton"


def test_bad_runner_name_and_check_mode(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    inv = inventory(bed, tmp_path / "hosts.yaml")
    units_before, pid = h.file_tree_hash("/etc/systemd/system"), h.sh("systemctl show -p MainPID sglang-qwen").stdout
    bad = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton,flashinfer_cutlas", "--json",
               state_dir=tmp_path / "state")
    assert bad.returncode != 0
    r = recap(bad)["hosts"][h.name]
    assert "'flashinfer_cutlas' is not a --moe-runner-backend choice of SGLang 0.5.23" in r["cause"], r
    assert "Traceback" not in bad.stderr
    check = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "auto", "--check", "--json",
                 state_dir=tmp_path / "state")
    assert check.returncode == 0, check.stderr[-4000:]
    assert "candidates: deep_gemm, triton, triton_kernel, flashinfer_trtllm" in flat(check.stderr)
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.sh("systemctl show -p MainPID sglang-qwen").stdout == pid  # nothing restarted


def test_recover_after_a_controller_killed_mid_trial(testbed_factory, tmp_path):
    """SIGKILL while the candidate runs (its start autotuned into a new cache folder, a rank file
    of the unit's own rewritten): `orch recover` puts the drop-in and FlashInfer's autotune cache
    back byte-identical, the run's new cache files removed, and the unit runs its own runner."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache",
           "PYTHONPATH": f"{FAULTS_DIR}:/opt/sglang"}
    # FlashInfer installed (a stand-in package): the candidate's start autotunes (SM90)
    bed = testbed_factory(1, host_options={"gpu-a": {"env": env, "flashinfer_version": "0.6.0"}})
    h = bed.hosts[0]
    faults = h.local_path(FAULTS_DIR)
    faults.mkdir(parents=True, exist_ok=True)
    (faults / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (faults / "hold-bench").write_text("2")  # the candidate's benchmark (the first is the reference's)
    h.sh(f"mkdir -p {CACHE} && printf '{{\"tactics\": 1}}' > {CACHE}/rank_tp0_pp0_dp0.json")
    units_before = h.file_tree_hash("/etc/systemd/system")
    cache_before = h.file_tree_hash("/srv/sglang-cache")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state, rid = tmp_path / "state", new_run_id("tune")
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "flashinfer_cutlass"], state, rid,
                  tmp_path / "orch.log")
    try:  # held in the candidate's benchmark: its drop-in in place, its start autotuned
        _wait_file(h, proc, "entered-bench")
        # a start that re-tunes rewrites the rank file (under EP > 1 every boot does, sglang #40320)
        h.sh(f"printf '{{\"tactics\": 2}}' > {CACHE}/rank_tp0_pp0_dp0.json")
        proc.kill()  # SIGKILL: no rescue
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
        (faults / "hold-bench").unlink(missing_ok=True)
    assert h.sh(f"test -f {DROPIN}", check=False).returncode == 0
    cache_mid = h.file_tree_hash("/srv/sglang-cache")
    made = [p for p in cache_mid if p not in cache_before]
    assert made and all("/flashinfer/autotune/" in p for p in made), cache_mid  # the candidate's autotune
    assert cache_mid[f"{CACHE}/rank_tp0_pp0_dp0.json"] != cache_before[f"{CACHE}/rank_tp0_pp0_dp0.json"]
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "state2"),
               state_dir=tmp_path / "state2")
    assert rec.returncode == 0, rec.stderr[-4000:]
    r = recap(rec)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.file_tree_hash("/srv/sglang-cache") == cache_before  # byte-identical, the run's files removed
    assert h.sh(f"find /srv/sglang-cache -mindepth 1 -type d -empty", check=False).stdout.strip() == ""
    got = r["summary"]["autotune_cache"]["recovered"]
    assert [g["run_id"] for g in got] == [rid]
    actions = {f["path"]: f["action"] for f in got[0]["files"]}
    assert actions[f"{CACHE}/rank_tp0_pp0_dp0.json"] == "restored"
    assert all(actions[p] == "removed" for p in made), actions
    assert h.unit_state() == "active" and _runner(h) == "triton"  # restarted on its own runner
    assert json.loads(h.sh(f"cat /var/lib/orch/runs/{rid}/state.json").stdout)["state"] == "restored"


def test_trial_once_per_tuning_group_the_other_host_reuses_the_verdict(testbed_factory, tmp_path):
    """Two identical hosts: one runs the trial (one reference and one candidate benchmark), the
    other reuses its verdict, starts the kept runner through its own drop-in and verifies that
    start (log, answers); its recap and run record name the measuring host."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(2, host_options={0: {"env": env}, 1: {"env": env}})
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton,flashinfer_cutlass",
                "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = recap(proc)
    trials = {h.name: out["hosts"][h.name]["summary"]["runner_trial"] for h in bed.hosts}
    measured = [n for n, t in trials.items() if not t.get("measured_on")]
    assert len(measured) == 1, trials
    other = next(n for n in trials if n not in measured)
    assert trials[other]["measured_on"] == measured[0]
    assert trials[other]["candidates"] == trials[measured[0]]["candidates"]
    assert f"measured on {measured[0]}" in flat(proc.stderr)
    run_dir = state / "runs" / out["run_id"]
    benches = {n: sorted(p.name for p in (run_dir / "hosts" / n).glob("bench_runner_*.json")) for n in trials}
    assert benches[measured[0]] == ["bench_runner_flashinfer_cutlass.json", "bench_runner_reference.json",
                                    "bench_runner_triton_tuned.json"]  # triton on the files it tuned
    assert benches[other] == []  # nothing measured (or tuned) there
    for h in bed.hosts:  # each started the kept runner through its own drop-in
        assert trials[h.name]["kept"] == "flashinfer_cutlass" and trials[h.name]["changed"]
        assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
        assert h.sh(f"test -f {DROPIN}", check=False).returncode == 0
    html = next(run_dir.rglob("*.html")).read_text()
    assert f"Measured on {measured[0]} (same tuning group)" in html
    reused = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()
              if '"runner_trial_reused"' in x]
    assert [e.get("measured_on") for e in reused] == [measured[0]], reused


#: the fault hook of test_faults, plus: the payload's ``bench`` exits at once with an error while
#: ``fail-bench`` exists (the benchmark client crashed)
FAIL_BENCH = SITECUSTOMIZE + r'''
if _cmd == "bench" and os.path.exists(os.path.join(_D, "fail-bench")):
    import sys
    sys.stderr.write("injected fault: the benchmark client crashed\n")
    os._exit(3)
'''


def test_measuring_host_fails_before_its_verdict_the_other_host_measures_itself(testbed_factory, tmp_path):
    """Two identical hosts; the measuring host's reference benchmark fails (its trial fails, its
    rescue puts it back): the host that was to reuse its verdict runs the trial itself instead of
    failing, keeps the faster runner, and its recap and table say why it measured."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(2, host_options={0: {"env": dict(env, PYTHONPATH=f"{FAULTS_DIR}:/opt/sglang")},
                                           1: {"env": env}})
    bad, good = bed.hosts
    faults = bad.local_path(FAULTS_DIR)
    faults.mkdir(parents=True, exist_ok=True)
    (faults / "sitecustomize.py").write_text(FAIL_BENCH)
    (faults / "fail-bench").write_text("")
    units_before = bad.file_tree_hash("/etc/systemd/system")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton,flashinfer_cutlass",
                "--tune-on", bad.name, "--json", state_dir=state)
    assert proc.returncode != 0, proc.stderr[-6000:]  # the measuring host failed
    out = recap(proc)
    assert out["hosts"][bad.name]["outcome"] != "completed", out["hosts"][bad.name]
    assert bad.file_tree_hash("/etc/systemd/system") == units_before and bad.unit_state() == "active"
    r = out["hosts"][good.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    assert not trial.get("measured_on") and trial["measuring_failed"].startswith(bad.name), trial
    assert trial["kept"] == "flashinfer_cutlass" and trial["changed"]
    run_dir = state / "runs" / out["run_id"]
    assert sorted(p.name for p in (run_dir / "hosts" / good.name).glob("bench_runner_*.json")) == [
        "bench_runner_flashinfer_cutlass.json", "bench_runner_reference.json",
        "bench_runner_triton_tuned.json"]  # measured (and tuned) there
    assert good.unit_state() == "active" and _runner(good) == "flashinfer_cutlass"
    assert f"measuring host {bad.name}" in flat(proc.stderr) and "measured here" in flat(proc.stderr)
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()
              if '"runner_trial_measuring_failed"' in x]
    assert [e.get("measuring_host") for e in events] == [bad.name], events


def _events(state, run_id: str, kind: str) -> list[dict]:
    return [json.loads(x) for x in (state / "runs" / run_id / "events.jsonl").read_text().splitlines()
            if f'"{kind}"' in x]


def test_triton_candidate_runs_on_freshly_tuned_files_put_back_when_not_kept(testbed_factory, tmp_path):
    """The host has an earlier Triton file and no stored tune: the trial measures the unit as it is,
    then stops it, tunes (transient unit), installs the tuned files (backed up first) and starts
    the Triton candidate on them (its log shows them loaded). FlashInfer CUTLASS is kept: the Triton
    files are back to their bytes, the host as before apart from the drop-in."""
    from tests.e2e.test_faults import OLD_UP, UP

    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(1, host_options={0: {"env": env, "config_files": {UP: OLD_UP}}})
    h = bed.hosts[0]
    configs_before = h.file_tree_hash(h.config_dir)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton,flashinfer_cutlass",
                "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = recap(proc)
    r = out["hosts"][h.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    assert rows["triton"]["triton_files"] == "tuned" and rows["triton"]["agreement"] == 1.0, rows["triton"]
    assert trial["kept"] == "flashinfer_cutlass" and rows["flashinfer_cutlass"]["kept"]
    launches = _events(state, out["run_id"], "tune_launch")
    assert len(launches) == 1 and launches[0].get("unit"), launches  # tuned in the transient unit
    # the Triton candidate's start loaded the tuned files, not the earlier one
    up = r["summary"]["plan"]["paths"]["up"]
    assert up.endswith("/" + UP), up
    assert f"Using MoE kernel config from {up}" in h.unit_log()
    assert not rows["triton"]["why"].startswith(("did not", "the start did not load")), rows["triton"]
    tuned = json.loads((state / "runs" / out["run_id"] / "hosts" / h.name / "configs" / UP).read_text())
    assert tuned != OLD_UP  # the candidate's start loaded these (orch checks its log), not the earlier file
    # put back byte-identical; the sub-run's record says so, and orch rollback would not touch it
    assert h.file_tree_hash(h.config_dir) == configs_before
    sub = json.loads(h.sh(f"cat /var/lib/orch/runs/{out['run_id']}.triton/state.json").stdout)
    assert sub["state"] == "restored", sub
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
    assert "--moe-runner-backend flashinfer_cutlass" in h.sh(f"cat {DROPIN}").stdout


def test_triton_kept_on_tuned_files_rollback_and_a_current_tune_is_not_redone(testbed_factory, tmp_path):
    """No Triton file on the host (the default config): the freshly tuned Triton files beat the
    unit's runner and FlashInfer CUTLASS, so they stay, with no drop-in (the unit's own runner is
    Triton). A second trial finds them current (the store's result, installed and loaded): no tune.
    `orch rollback` then removes them."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=1.2", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(1, host_options={0: {"env": env}})
    h = bed.hosts[0]
    configs_before = h.file_tree_hash(h.config_dir)
    units_before = h.file_tree_hash("/etc/systemd/system")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    args = ("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton,flashinfer_cutlass", "--json")
    proc = orch(*args, state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = recap(proc)
    r = out["hosts"][h.name]
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    assert trial["kept"] == "triton" and trial["changed"] and rows["triton"]["kept"], trial
    assert rows["triton"]["triton_files"] == "tuned"
    assert h.file_tree_hash("/etc/systemd/system") == units_before  # no drop-in: the unit runs Triton itself
    after = h.file_tree_hash(h.config_dir)
    assert after != configs_before and any(p.endswith(".json") for p in after if p not in configs_before)
    assert h.unit_state() == "active" and "Using MoE kernel config from" in h.unit_log()

    again = orch(*args, state_dir=state)
    assert again.returncode == 0, again.stderr[-6000:]
    rid2 = recap(again)["run_id"]
    assert _events(state, rid2, "tune_launch") == []  # current: no tune
    rows2 = {c["runner"]: c for c in recap(again)["hosts"][h.name]["summary"]["runner_trial"]["candidates"]}
    assert "triton" not in rows2  # the reference row is Triton on these files
    assert h.file_tree_hash(h.config_dir) == after

    back = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    rb = recap(back)["hosts"][h.name]
    assert rb["outcome"] == "completed" and rb["summary"]["rolled_back"] == out["run_id"] + ".triton", rb
    assert h.file_tree_hash(h.config_dir) == configs_before
    assert h.unit_state() == "active"


def test_triton_kept_over_another_runner_rollback_undoes_drop_in_and_files_together(testbed_factory, tmp_path):
    """The unit runs FlashInfer CUTLASS; Triton on freshly tuned files is faster, so the trial keeps
    it: a drop-in (the run) and the Triton files (its sub-run). `orch rollback` undoes both, byte-identical."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=1.2", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(1, host_options={0: {"env": env, "extra_args": ["--moe-runner-backend", "flashinfer_cutlass"]}})
    h = bed.hosts[0]
    configs_before, units_before = h.file_tree_hash(h.config_dir), h.file_tree_hash("/etc/systemd/system")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "triton", "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = recap(proc)
    trial = out["hosts"][h.name]["summary"]["runner_trial"]
    assert trial["reference"] == "flashinfer_cutlass" and trial["kept"] == "triton" and trial["changed"], trial
    assert h.unit_state() == "active" and _runner(h) == "triton"
    assert h.file_tree_hash(h.config_dir) != configs_before and h.sh(f"test -f {DROPIN}", check=False).returncode == 0
    back = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    rb = recap(back)["hosts"][h.name]
    assert rb["outcome"] == "completed" and rb["summary"]["rolled_back"] == out["run_id"], rb
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.file_tree_hash(h.config_dir) == configs_before
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"


ENV_FILE = "/etc/default/sglang-qwen"
ENV_TEXT = "# the MoE runner of sglang-qwen\nMODEL_NOTE=keep me\nMOE_RUNNER=triton  \n\n# end of file\n"


def test_trial_edits_the_environment_file_that_sets_the_runner_and_rollback_restores_it(testbed_factory, tmp_path):
    """A unit whose ExecStart takes the runner from ``${MOE_RUNNER}``, set in its EnvironmentFile=:
    the trial changes that one value in that file (no drop-in, no daemon-reload), the server comes
    up on the kept runner, and `orch rollback` puts the file back byte-identical."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(1, host_options={"gpu-a": {
        "env": env, "env_files": [ENV_FILE], "files": {ENV_FILE: ENV_TEXT},
        "exec_start": "{python} -m sglang.launch_server {args} --moe-runner-backend ${{MOE_RUNNER}}"}})
    h = bed.hosts[0]
    assert _runner(h) == "triton"
    units_before = h.file_tree_hash("/etc/systemd/system")
    env_before = h.file_tree_hash("/etc/default")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "flashinfer_cutlass", "--json",
                state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    assert trial["reference"] == "triton" and trial["kept"] == "flashinfer_cutlass" and trial["changed"]
    assert trial["dropin"] == ENV_FILE
    # only that value changed: comments, the other line, the blank line and the order kept
    assert h.sh(f"cat {ENV_FILE}").stdout == ENV_TEXT.replace("MOE_RUNNER=triton  ", "MOE_RUNNER=flashinfer_cutlass")
    assert h.file_tree_hash("/etc/systemd/system") == units_before  # no drop-in
    assert h.sh(f"test -e {DROPIN_DIR}", check=False).returncode != 0
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
    assert "moe_runner_backend='flashinfer_cutlass'" in h.unit_log()
    run_id = recap(proc)["run_id"]
    events = (state / "runs" / run_id / "events.jsonl").read_text()
    assert '"daemon_reload"' not in events  # systemd reads the file at each start
    manifest = json.loads(h.sh(f"cat /var/lib/orch/runs/{run_id}/manifest.json").stdout)
    assert manifest["dest_dir"] == "/etc/default" and manifest["unit_file"]
    assert [(f["name"], f["action"]) for f in manifest["files"]] == [("sglang-qwen", "replaced")]

    back = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    rb = recap(back)["hosts"][h.name]
    assert rb["outcome"] == "completed", rb
    assert h.file_tree_hash("/etc/default") == env_before  # byte-identical
    assert h.sh(f"cat {ENV_FILE}").stdout == ENV_TEXT
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.unit_state() == "active" and _runner(h) == "triton"
    events = (state / "runs" / recap(back)["run_id"] / "events.jsonl").read_text()
    assert "log shows moe_runner_backend=triton" in events  # verify_runner's proof


CONFIG = "/etc/sglang/qwen3.yaml"
CONFIG_TEXT = ("# SGLang server flags\nmodel-path: /models/tiny-moe\nport: 30000\nhost: 0.0.0.0\n"
               "moe-runner-backend: triton   # the operator's choice\ntp-size: 1\n")


def test_trial_edits_the_config_yaml_that_sets_the_runner_and_rollback_restores_it(testbed_factory, tmp_path):
    """A unit whose SGLang ``--config`` YAML sets ``moe-runner-backend`` (no flag on its command
    line): the trial changes that value in the YAML, comments and order kept, no drop-in; `orch
    rollback` puts the YAML back byte-identical and proves the runner it gives."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache"}
    bed = testbed_factory(1, host_options={"gpu-a": {
        "env": env, "launch_args": ["--config", CONFIG], "files": {CONFIG: CONFIG_TEXT}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    assert _runner(h) == "triton"
    units_before = h.file_tree_hash("/etc/systemd/system")
    cfg_before = h.file_tree_hash("/etc/sglang")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", "flashinfer_cutlass", "--json",
                state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    trial = r["summary"]["runner_trial"]
    assert trial["kept"] == "flashinfer_cutlass" and trial["changed"] and trial["dropin"] == CONFIG, trial
    assert h.sh(f"cat {CONFIG}").stdout == CONFIG_TEXT.replace("backend: triton ", "backend: flashinfer_cutlass ")
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
    back = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    assert h.file_tree_hash("/etc/sglang") == cfg_before and h.sh(f"cat {CONFIG}").stdout == CONFIG_TEXT
    assert h.unit_state() == "active" and _runner(h) == "triton"
    events = (state / "runs" / recap(back)["run_id"] / "events.jsonl").read_text()
    assert "log shows moe_runner_backend=triton (unit: triton)" in events


def _trial(testbed_factory, tmp_path, env: dict, runners: str, host_opts: dict | None = None, **inv_vars):
    """One host with the stand-in knobs ``env``: `orch tune --moe-runners RUNNERS`; returns
    ``(host, recap of the host, rows by runner, trial, units before, state dir)``."""
    bed = testbed_factory(1, host_options={"gpu-a": {"env": env, **(host_opts or {})}})
    h = bed.hosts[0]
    units_before = h.file_tree_hash("/etc/systemd/system")
    inv = inventory(bed, tmp_path / "hosts.yaml", **inv_vars)
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--moe-runners", runners, "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    return h, r, {c["runner"]: c for c in trial["candidates"]}, trial, units_before, state / "runs" / recap(proc)["run_id"]


def test_non_deterministic_runner_is_judged_against_the_references_own_agreement(testbed_factory, tmp_path):
    """Issue 32 row 3: the unit's runner and the faster candidate are both correct and both
    non-deterministic (5 of the 18 check prompts answer two ways); the candidate agrees with the
    reference on fewer than 90% of the prompts, as the reference does with itself, gets every known
    answer, and is kept. A wrong candidate misses the known answers and is rejected."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5,triton_kernel=0.4",
           "ORCH_STANDIN_NONDETERMINISTIC_RUNNERS": "triton=3,flashinfer_cutlass=3",
           "ORCH_STANDIN_WRONG_RUNNERS": "triton_kernel"}
    h, _r, rows, trial, _units, _run = _trial(testbed_factory, tmp_path, env, "flashinfer_cutlass,triton_kernel")
    assert 0.5 < trial["self_agreement"] < 0.9, trial  # the reference disagrees with itself
    assert trial["known_answers"] == 3 and trial["known_checked"] == 3, trial
    fc = rows["flashinfer_cutlass"]
    assert fc["agreement"] < 0.9 and fc["batch_agreement"] < 0.9, fc  # the old 90% rule rejected it
    assert fc["agreement"] >= 0.9 * trial["self_agreement"] and fc["passed"] and fc["kept"], fc
    assert fc["known_missed"] == [], fc
    wrong = rows["triton_kernel"]
    assert not wrong["passed"] and not wrong["kept"] and len(wrong["known_missed"]) == 3, wrong
    assert "known answer(s) missed" in wrong["why"] and "-> 391" in wrong["why"], wrong
    assert trial["kept"] == "flashinfer_cutlass" and h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"


def test_candidate_whose_scheduler_dies_on_the_first_request_is_rejected_and_the_runner_restored(testbed_factory,
                                                                                                 tmp_path):
    """Issue 32 row 4: the candidate starts and answers /health, then its scheduler dies on the
    output check's first request (SGLang's "Scheduler hit an exception" and the server gone): it is
    rejected, and the unit runs its own runner again, its unit files byte-identical."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "ORCH_STANDIN_CRASH_ON_REQUEST": "flashinfer_cutlass"}
    h, _r, rows, trial, units_before, run = _trial(testbed_factory, tmp_path, env, "flashinfer_cutlass")
    fc = rows["flashinfer_cutlass"]
    assert fc["ready_s"] is not None and not fc["passed"] and not fc["kept"], fc  # it started and got ready
    assert "the server died on the output check's requests" in fc["why"], fc
    assert "Scheduler hit an exception" in fc["crashed"] or "sigquit" in fc["crashed"], fc
    assert trial["kept"] == "auto" and not trial["changed"], trial
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.unit_state() == "active" and _runner(h) == "triton"
    assert _events_of(run, "runner_candidate_crashed")[0]["stage"] == "output check"


def _events_of(run_dir, kind: str) -> list[dict]:
    """The events of ``kind`` in the run folder ``run_dir`` (as :func:`_events`)."""
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if f'"{kind}"' in x]


@pytest.mark.parametrize("knob", ["ORCH_STANDIN_WRONG_BATCHED_RUNNERS", "ORCH_STANDIN_WRONG_SINGLE_RUNNERS"])
def test_runner_wrong_only_batched_or_only_alone_is_rejected(testbed_factory, tmp_path, knob):
    """Issue 32 row 5: the check prompts go one at a time and as one concurrent batch; a runner
    wrong only when requests decode together (or only alone) fails one of the two and is rejected."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", knob: "flashinfer_cutlass"}
    h, _r, rows, trial, units_before, _run = _trial(testbed_factory, tmp_path, env, "flashinfer_cutlass")
    fc = rows["flashinfer_cutlass"]
    assert trial["self_agreement"] == 1.0 and not fc["passed"] and not fc["kept"], (trial, fc)
    if knob == "ORCH_STANDIN_WRONG_BATCHED_RUNNERS":
        assert fc["agreement"] == 1.0 and fc["batch_agreement"] < 0.9, fc["why"]
        assert "agree as one batch" in fc["why"] and "one at a time" not in fc["why"], fc
    else:
        assert fc["agreement"] == 0.0 and fc["batch_agreement"] > fc["agreement"], fc
        assert "agree one at a time" in fc["why"], fc
    assert trial["kept"] == "auto" and h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.unit_state() == "active" and _runner(h) == "triton"


def test_warm_autotune_cache_that_hangs_the_next_start_is_put_back_and_the_unit_started_again(testbed_factory,
                                                                                             tmp_path):
    """Issue 32 row 6: the kept candidate's first start autotunes into a new cache file; the next
    start (the trial's last) reads it warm and hangs in FlashInfer's autotune (its start line, no
    end line, no more log). orch bounds that by the log (orch_autotune_stall_timeout), stops the
    unit, puts the autotune cache back as it was before the run (the new file removed, the old one
    untouched) and starts it again: it autotunes cold and serves the kept runner."""
    env = {"ORCH_STANDIN_RUNNER_SPEED": "flashinfer_cutlass=0.5", "SGLANG_CACHE_DIR": "/srv/sglang-cache",
           "ORCH_STANDIN_AUTOTUNE_HANG": "warm"}
    bed_opts = {"flashinfer_version": "0.6.0"}
    h, r, rows, trial, _units, run = _trial(testbed_factory, tmp_path, env, "flashinfer_cutlass", bed_opts,
                                            orch_autotune_stall_timeout=5)
    assert trial["kept"] == "flashinfer_cutlass" and trial["autotune_hangs"] == 1, trial
    hang = _events_of(run, "autotune_hang")
    assert len(hang) == 1 and "/flashinfer/autotune/0.6.0/sm90/" in hang[0]["path"], hang
    cache = r["summary"]["autotune_cache"]
    assert cache["hang"] == hang[0]["path"] and cache["hang_removed"] >= 1, cache
    log = h.unit_log()
    assert log.count("[Autotuner]: Autotuning process starts") == log.count("[Autotuner]: Autotuning process ends") + 1
    assert h.unit_state() == "active" and _runner(h) == "flashinfer_cutlass"
    assert h.sh(f"test -f {hang[0]['path']}", check=False).returncode == 0  # the last start wrote it again



def test_trial_on_a_vllm_unit_ends_on_the_kept_backend_and_rollback_restores_the_unit(testbed_factory, tmp_path):
    """Issue 29: the runner trial on a ``vllm serve`` unit that reads ``VLLM_TUNED_CONFIG_FOLDER``
    (no ``--moe-backend``: ``auto``, Triton for unquantized weights on SM90) across vLLM's
    ``--moe-backend`` values ``triton`` and ``flashinfer_cutlass``. Each start logs the release's
    ``Using <backend> Unquantized MoE backend out of potential backends: [...]`` line; the ``triton``
    candidate runs on freshly tuned files installed into the unit's folder (the old file backed up),
    put back byte for byte unless kept; the unit ends on the kept backend (a drop-in when it is not
    the unit's own) and answers; ``orch rollback`` puts the unit files and the folder back."""
    from tests.e2e.test_vllm_units import ENTRY, NAME
    from tests.testbed.bed import HOST_PRESETS

    bed = testbed_factory(1, host_options={0: dict(HOST_PRESETS["vllm-tuned-folder"], config_files={NAME: ENTRY})})
    h = bed.hosts[0]
    h.wait_http("/health")
    unit, folder = "vllm-qwen.service", "/srv/vllm-moe"
    dropin = f"/etc/systemd/system/{unit}.d/orch-moe-runner.conf"
    units_before, files_before = h.file_tree_hash("/etc/systemd/system"), h.file_tree_hash(folder)
    assert f"{folder}/{NAME}" in files_before
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", unit, "--moe-runners", "triton,flashinfer_cutlass", "--json",
                state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    assert set(rows) == {"auto", "triton", "flashinfer_cutlass"}, trial
    assert rows["triton"]["triton_files"] == "tuned" and rows["flashinfer_cutlass"]["agreement"] == 1.0, rows
    log = h.unit_log()
    fi = ("Using FlashInfer CUTLASS Unquantized MoE backend out of potential backends: "
          "['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS'].")
    assert fi in log and f"Using configuration from {folder}/{NAME} for MoE layer." in log, log[-3000:]
    kept = trial["kept"]
    assert h.unit_state() == "active"
    last = log[log.rfind("vLLM server version"):]
    if kept == "flashinfer_cutlass":
        text = h.sh(f"cat {dropin}").stdout
        assert "ExecStart=\n" in text and text.rstrip().endswith("--moe-backend flashinfer_cutlass"), text
        assert fi in last and h.file_tree_hash(folder) == files_before  # the tuned files put back
    else:
        assert h.sh(f"test -e {dropin}", check=False).returncode != 0, "a drop-in for the unit's own runner"
        assert "Using TRITON Unquantized MoE backend" in last
        if kept == "triton":  # kept on the tuned files
            assert h.file_tree_hash(folder) != files_before
        else:
            assert h.file_tree_hash(folder) == files_before
    back = orch("rollback", str(inv), "--service", unit, "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    assert recap(back)["hosts"][h.name]["outcome"] == "completed"
    assert h.file_tree_hash("/etc/systemd/system") == units_before
    assert h.file_tree_hash(folder) == files_before
    assert h.unit_state() == "active"
    last = h.unit_log()
    last = last[last.rfind("vLLM server version"):]
    assert "Using TRITON Unquantized MoE backend" in last and f"Using configuration from {folder}/{NAME}" in last, \
        last[-2000:]


def test_trial_on_a_vllm_unit_without_a_tuned_folder_tries_triton_on_the_host_s_files(testbed_factory, tmp_path):
    """Issue 29: a ``vllm serve`` unit that sets no ``VLLM_TUNED_CONFIG_FOLDER`` reads only its package's
    ``configs/`` (orch never writes there): the ``triton`` candidate runs on the files the host has
    (``triton_files`` none, with the reason), nothing is written into the package, and the trial ends
    with the unit on the kept backend; rollback puts the unit files back byte for byte."""
    from tests.testbed.bed import HOST_PRESETS

    bed = testbed_factory(1, host_options={0: dict(HOST_PRESETS["vllm-serve"])})
    h = bed.hosts[0]
    h.wait_http("/health")
    unit = "vllm-qwen.service"
    units_before, package = h.file_tree_hash("/etc/systemd/system"), h.file_tree_hash("/srv/vllm")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", unit, "--moe-runners", "triton,flashinfer_cutlass", "--json",
                state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    events = (state / "runs" / recap(proc)["run_id"] / "events.jsonl").read_text()
    assert "the unit reads no folder orch may write" in events
    trial = r["summary"]["runner_trial"]
    rows = {c["runner"]: c for c in trial["candidates"]}
    assert "flashinfer_cutlass" in rows and not rows.get("triton", {}).get("triton_files"), rows
    assert h.file_tree_hash("/srv/vllm") == package
    assert h.sh("test -e /var/lib/orch/configs-vllm-qwen.service", check=False).returncode != 0
    assert h.unit_state() == "active"
    back = orch("rollback", str(inv), "--service", unit, "--json", state_dir=state)
    assert back.returncode == 0, back.stderr[-6000:]
    assert h.file_tree_hash("/etc/systemd/system") == units_before and h.unit_state() == "active"
