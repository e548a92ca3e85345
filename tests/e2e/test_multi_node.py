"""Multi-node SGLang servers (``--nnodes 2``) on the test bed: the ranks of one server are found
among the run's hosts before any change (orchestrator/cli/run.py find_servers,
orchestrator/facts/server_group.py), tuned and rolled back together. docs/multi-node.md says
what is built and what is left.

The tests that share ``bed`` (two ranks, each with the same earlier config files) run in file
order on one worker: the tune (``tuned``), then the rollbacks that undo it."""

from __future__ import annotations

import json

import pytest

from orchestrator.records import new_run_id
from tests.e2e.helpers import inventory, orch, ready_bed, recap
from tests.e2e.test_faults import LONG_TUNE, _host_run_state, _lock, _popen, _wait_event, _wait_payload_tune
from tests.waiting import files_state, wait_process, wait_until

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
#: the files both ranks hold before the tune, which a rollback must give back byte for byte
CFG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
             "num_warps": 4, "num_stages": 2}}
COMMON = ["--nnodes", "2", "--dist-init-addr", "gpu-a:5000"]


def _main_pid(host) -> int:
    out = host.sh(f"systemctl show -p MainPID {host.unit}").stdout.strip()
    return int(out.split("=", 1)[1] or 0)


def _two_ranks(testbed_factory, **rank1):
    bed = testbed_factory(2, {0: {"extra_args": COMMON + ["--node-rank", "0"]},
                              1: {"extra_args": COMMON + ["--node-rank", "1"], "cluster_with": "gpu-a", **rank1}})
    for h in bed.hosts:
        h.wait_http("/health")
    return bed


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """Two ranks of one server, both with CFG installed as their up and down files."""
    from tests.conftest import _require_testbed

    _require_testbed()
    tmp = tmp_path_factory.mktemp("multi_node")
    files = {UP: CFG, DOWN: CFG}
    yield from ready_bed(tmp, 2, {0: {"extra_args": COMMON + ["--node-rank", "0"], "config_files": files},
                                  1: {"extra_args": COMMON + ["--node-rank", "1"], "config_files": files,
                                      "cluster_with": "gpu-a"}})


def _state(bed) -> dict:
    """Each rank's config files (path -> sha256), main PID and unit state."""
    return {h.name: (h.file_tree_hash(h.config_dir), _main_pid(h), h.unit_state()) for h in bed.hosts}


@pytest.fixture(scope="module")
def tuned(bed):
    """The bed before and after one ``orch tune`` of both ranks."""
    bed, tmp = bed
    before = _state(bed)
    inv = inventory(bed, tmp / "hosts.yaml")
    state = tmp / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    return {"bed": bed, "inv": inv, "state": state, "proc": proc, "before": before, "after": _state(bed)}


def test_a_rank_left_out_by_limit_is_named_and_nothing_stops(bed, tmp_path):
    """``--limit gpu-a`` selects rank 0 only: the run is refused, naming rank 1 as missing, before
    anything is stopped; the unit keeps its process and no config file is written."""
    bed, _ = bed
    rank0 = bed.hosts[0]
    before = _state(bed)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "--limit", rank0.name,
                state_dir=tmp_path / "state")
    res = recap(proc)
    assert set(res["hosts"]) == {rank0.name}
    r = res["hosts"][rank0.name]
    assert r["outcome"] == "failed" and "Plan the files to write" in r["cause"], r
    assert "sglang-qwen@gpu-a:5000" in r["cause"] and "rank 1 of 2 is not a host of this run" in r["cause"], r["cause"]
    assert "Nothing was stopped" in r["cause"]
    assert _state(bed) == before and all(st == "active" for _, _, st in before.values())


def _events(state, run_id) -> list:
    path = state / "runs" / run_id / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_ranks_tuned_once_installed_on_both_and_restarted_together(tuned):
    """Rank 0 tunes; rank 1 takes the same bytes; both are stopped and restarted, both logs show
    the files loaded; readiness and the benchmark are at rank 0 only."""
    bed, proc, state = tuned["bed"], tuned["proc"], tuned["state"]
    rank0, rank1 = bed.hosts
    pids = {n: pid for n, (_, pid, _) in tuned["before"].items()}
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
        assert _main_pid(h) != pids[h.name] and h.unit_state() == "active"
        for name in (UP, DOWN):
            assert f"Using MoE kernel config from {h.triton_dir}/{name}." in h.unit_log()
    files = {h.name: [h.sh(f"cat {h.triton_dir}/{n}").stdout for n in (UP, DOWN)] for h in bed.hosts}
    assert files[rank0.name] == files[rank1.name] and all(files[rank0.name])
    assert all(json.loads(f) != CFG for f in files[rank0.name])  # the tune changed the files
    events = _events(state, res["run_id"])
    tuned = {e["host"] for e in events if e.get("event") == "task" and e.get("module") == "tune"
             and e.get("status") == "changed"}
    assert tuned == {rank0.name}
    benched = {e["host"] for e in events if e.get("event") == "task" and e.get("module") == "bench"
               and e.get("status") in ("ok", "changed")}
    assert benched == {rank0.name}
    assert res["hosts"][rank1.name]["summary"]["config_source"]["source"] == "reuse"


def test_a_rank_that_fails_to_start_rolls_back_both(testbed_factory, tmp_path):
    """Rank 1's server crashes on the new files: both ranks fail, both get their earlier files
    back (none: the folder is empty again) and both units run again."""
    bed = _two_ranks(testbed_factory, env={"ORCH_STANDIN_FAULT_ON_CHANGE": "crash"})
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    res = recap(proc)
    rank0, rank1 = bed.hosts
    assert res["hosts"][rank1.name]["outcome"] == "failed", res["hosts"][rank1.name]
    assert res["hosts"][rank0.name]["outcome"] == "failed", res["hosts"][rank0.name]
    assert rank1.name in res["hosts"][rank0.name]["cause"], res["hosts"][rank0.name]["cause"]
    for h in bed.hosts:
        assert h.unit_state() == "active"
        assert h.sh(f"ls {h.triton_dir}", check=False).stdout.strip() == ""


def test_a_rollback_leaving_out_rank_1_is_refused_with_nothing_changed(tuned, tmp_path):
    """``orch rollback --limit gpu-a`` after the tune: rank 1 is not a host of the run, so the
    rollback is refused on rank 0, naming the missing rank, before anything stops; both ranks keep
    their processes and the tuned files."""
    bed = tuned["bed"]
    assert tuned["proc"].returncode == 0, tuned["proc"].stderr[-3000:]
    rank0 = bed.hosts[0]
    before = _state(bed)
    proc = orch("rollback", str(tuned["inv"]), "--service", "sglang-qwen", "--json", "--limit", rank0.name,
                state_dir=tuned["state"])
    res = recap(proc)
    assert proc.returncode != 0 and set(res["hosts"]) == {rank0.name}
    cause = res["hosts"][rank0.name]["cause"]
    assert res["hosts"][rank0.name]["outcome"] == "failed" and "Choose the run to undo" in cause, cause
    assert "sglang-qwen@gpu-a:5000" in cause and "rank 1 of 2 is not a host of this run" in cause, cause
    assert _state(bed) == before


def test_a_rollback_with_a_rank_that_has_nothing_to_undo_is_refused_on_every_rank_with_nothing_changed(tuned):
    """After the tune, rank 1's records of it are gone (a host re-imaged, its state folder wiped):
    ``orch rollback`` finds the tune on rank 0 and nothing to undo on rank 1. The ranks are rolled
    back together, so both are refused before anything stops, the message naming each rank and its
    run; both keep their processes and the tuned files. Before, rank 0 was stopped, restored and
    started again alone on its earlier files while rank 1 kept the tuned ones."""
    bed = tuned["bed"]
    assert tuned["proc"].returncode == 0, tuned["proc"].stderr[-3000:]
    rank0, rank1 = bed.hosts
    rid = recap(tuned["proc"])["run_id"]
    before = _state(bed)
    rank1.sh(f"mv /var/lib/orch/runs/{rid} /var/lib/orch/aside-{rid}")
    try:
        proc = orch("rollback", str(tuned["inv"]), "--service", "sglang-qwen", "--json",
                    state_dir=tuned["state"])
    finally:
        rank1.sh(f"mv /var/lib/orch/aside-{rid} /var/lib/orch/runs/{rid}")
    res = recap(proc)
    assert proc.returncode != 0
    for h in bed.hosts:
        cause = res["hosts"][h.name]["cause"]
        assert res["hosts"][h.name]["outcome"] == "failed" and "Choose the run to undo" in cause, cause
        assert f"rank 0 ({rank0.name}): {rid}" in cause and f"rank 1 ({rank1.name}): nothing to undo" in cause, cause
        assert "Nothing was stopped" in cause, cause
    assert _state(bed) == before


def test_a_rollback_restores_both_ranks_byte_identical_and_restarts_them_together(tuned):
    """``orch rollback`` after the tune: both ranks get CFG back byte for byte and run again with new
    main processes that loaded it; rank 0 stopped first, every rank restored before any started,
    readiness and the benchmark at rank 0 only."""
    bed, state = tuned["bed"], tuned["state"]
    assert tuned["proc"].returncode == 0, tuned["proc"].stderr[-3000:]
    rank0, rank1 = bed.hosts
    tuned_state = _state(bed)
    proc = orch("rollback", str(tuned["inv"]), "--service", "sglang-qwen", "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    now = _state(bed)
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
        files, pid, active = now[h.name]
        assert files == tuned["before"][h.name][0], (h.name, files)  # byte-identical to before the tune
        assert active == "active" and pid not in (tuned_state[h.name][1], 0)
    all_events = _events(state, res["run_id"])
    proofs = {e["host"]: e["data"]["loaded"] for e in all_events
              if e.get("event") == "task" and e.get("module") == "verify_log" and e.get("status") == "ok"}
    for h in bed.hosts:  # each rank's own log, since its new start, names the files put back
        assert sorted(proofs.get(h.name) or []) == sorted(f"{h.triton_dir}/{n}" for n in (UP, DOWN)), proofs
    events = [e for e in all_events if e.get("event") in ("service_stopped", "service_started")
              or (e.get("event") == "task" and e.get("module") in ("rollback_restore", "bench", "wait_ready"))]
    order = [(e["event"] if e["event"] != "task" else e["module"], e["host"]) for e in events
             if e["event"] != "task" or e.get("status") in ("ok", "changed")]
    stops = [h for ev, h in order if ev == "service_stopped"]
    # rank 0 stops first; its shutdown broadcast ends rank 1 too (SGLang 0.5.23, as the stand-in
    # does), so orch's stop of rank 1 finds it stopped or stopping
    assert stops[0] == rank0.name and stops[1:] in ([], [rank1.name]), order
    assert "ShutdownReq from rank 0" in rank1.unit_log()
    first_start = next(i for i, (ev, _) in enumerate(order) if ev == "service_started")
    restored = [i for i, (ev, _) in enumerate(order) if ev == "rollback_restore"]
    assert len(restored) == 2 and max(restored) < first_start, order
    assert {h for ev, h in order if ev == "bench"} == {rank0.name}, order


def test_doctor_names_each_ranks_server_and_reports_ranks_missing_or_disagreeing(bed, tmp_path):
    """``orch doctor`` shows on each rank its server and rank; with ``--limit`` leaving out rank 1
    it reports the missing rank, and with another up file on rank 1 it reports that the ranks
    load different files (exit status 1 both times). Nothing is changed by doctor."""
    bed, _ = bed
    rank0, rank1 = bed.hosts
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    key = "sglang-qwen@gpu-a:5000"
    proc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    rows = json.loads(proc.stdout)
    for rank, h in enumerate(bed.hosts):
        assert rows[h.name]["server"] == {"key": key, "rank": rank, "nnodes": 2, "hosts": [rank0.name, rank1.name],
                                          "problems": []}, rows[h.name]
    text = orch("doctor", str(inv), "--service", "sglang-qwen", state_dir=state, env={"COLUMNS": "250"}).stdout
    assert "rank 0 of 2" in text and "rank 1 of 2" in text and key in text, text
    alone = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", "--limit", rank0.name, state_dir=state)
    (problem,) = json.loads(alone.stdout)[rank0.name]["server"]["problems"]
    assert alone.returncode == 1 and "rank 1 of 2 is not a host of this run" in problem, problem
    path = f"{rank1.triton_dir}/{UP}"
    earlier = rank1.sh(f"cat {path}").stdout
    rank1.sh(f"cat > {path}", input=json.dumps({"1": dict(CFG["1"], num_warps=8)}))
    try:
        before = _state(bed)
        differ = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
        assert _state(bed) == before
    finally:
        rank1.sh(f"cat > {path}", input=earlier)
    rows = json.loads(differ.stdout)
    assert differ.returncode == 1
    for h in bed.hosts:
        problems = rows[h.name]["server"]["problems"]
        assert len(problems) == 1 and "the ranks load different up files" in problems[0], problems


def test_a_recover_leaving_out_rank_1_is_refused_with_nothing_changed(bed, tmp_path):
    """``orch recover --limit gpu-a``: rank 1 is not a host of the run, so the recover is refused
    on rank 0 before it takes the host lock or starts anything (it would start one rank alone)."""
    bed, _ = bed
    rank0 = bed.hosts[0]
    before = _state(bed)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--limit", rank0.name,
                state_dir=tmp_path / "state")
    res = recap(proc)
    cause = res["hosts"][rank0.name]["cause"]
    assert proc.returncode != 0 and res["hosts"][rank0.name]["outcome"] == "failed", res
    assert "Find unfinished runs" in cause and "rank 1 of 2 is not a host of this run" in cause, cause
    assert _state(bed) == before


def _until(pred, what: str, progress=()) -> None:
    """Wait for ``pred()`` while ``progress`` moves (tests/waiting.py)."""
    wait_until(pred, what, progress=progress)


@pytest.mark.parametrize("rank1_started_again", [False, True], ids=["rank1-down", "rank1-waiting"])
def test_recover_after_a_controller_killed_mid_tune_restarts_every_rank(testbed_factory, tmp_path,
                                                                          rank1_started_again):
    """The controller is SIGKILLed while rank 0 tunes. Rank 0 is stopped and locked with its record
    unfinished; rank 1, locked too, went down with rank 0's shutdown broadcast (SGLang 0.5.23, as the
    stand-in does) before it recorded the run (it waits for rank 0's files). ``orch recover`` restores
    both ranks byte for byte and starts them together: new main processes on both, rank 0 ready,
    rank 1 joined and answering ``/health``, rank 0's record ``restored``, both hosts unlocked.
    ``rank1-waiting``: rank 1 was started again on its own before the recover (by hand, or a kill
    between the two starts) and waits at ``--dist-init-addr`` for a rank 0 that is not there; recover
    stops it and starts it with rank 0. Before, recover started rank 0 alone (rank 1 had nothing to
    recover), which waited for ever for rank 1 (``rank1-down``), and left a waiting rank 1 as it was."""
    files = {UP: CFG, DOWN: CFG}
    bed = testbed_factory(2, {0: {"extra_args": COMMON + ["--node-rank", "0"], "config_files": files},
                              1: {"extra_args": COMMON + ["--node-rank", "1"], "config_files": files,
                                  "cluster_with": "gpu-a"}})
    for h in bed.hosts:
        h.wait_http("/health")
    rank0, rank1 = bed.hosts
    trees = {h.name: h.file_tree_hash(h.config_dir) for h in bed.hosts}
    inv = inventory(bed, tmp_path / "hosts.yaml", **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    try:
        _wait_event(state, rid, proc, lambda e: e.get("event") == "task" and e.get("host") == rank0.name
                    and e.get("task") == "Reap leftover GPU processes" and e.get("status") in ("ok", "changed"),
                    "the reap on rank 0")
        _wait_payload_tune(rank0)
        proc.kill()  # SIGKILL: no rescue, no always
        wait_process(proc, "orch's end after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
    for h in bed.hosts:
        assert h.unit_state() in ("inactive", "failed"), h.name
        assert (_lock(h) or {}).get("run_id") == rid, h.name
    assert _host_run_state(rank0, rid) not in ("completed", "restored", "failed")
    assert rank1.sh(f"test -e /var/lib/orch/runs/{rid}", check=False).returncode != 0  # rank 1 recorded nothing
    assert "ShutdownReq from rank 0" in rank1.unit_log()
    waiting = None
    if rank1_started_again:
        seen = rank1.unit_log()
        joining, joined = seen.count("joining the other ranks at gpu-a:5000"), seen.count("all 2 ranks joined")
        rank1.sh(f"systemctl start {rank1.unit}")
        _until(lambda: rank1.unit_log().count("joining the other ranks at gpu-a:5000") > joining,
               "rank 1 waiting for rank 0", progress=[lambda: files_state(rank1.local_path("/var/log"))])
        assert rank1.unit_state() == "active" and rank1.unit_log().count("all 2 ranks joined") == joined
        assert rank1.sh(f"curl -s -o /dev/null -w %{{http_code}} {rank1.url}/health", check=False).stdout \
            in ("000", ""), "rank 1 serves /health without rank 0"
        waiting = _main_pid(rank1)

    joined = rank1.unit_log().count("all 2 ranks joined")
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "state2"),
               state_dir=tmp_path / "state2")
    assert rec.returncode == 0, rec.stdout[-3000:] + rec.stderr[-3000:]
    res = recap(rec)
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
        assert h.file_tree_hash(h.config_dir) == trees[h.name], h.name  # byte-identical
        assert h.unit_state() == "active" and _main_pid(h) != 0, h.name
        assert _lock(h) is None, h.name
    assert _host_run_state(rank0, rid) == "restored"
    if waiting is not None:
        assert _main_pid(rank1) != waiting, "rank 1, still waiting for rank 0, was not restarted with it"
    rank0.wait_http("/health")
    rank1.wait_http("/health")
    assert rank1.unit_log().count("all 2 ranks joined") == joined + 1  # it joined the restarted rank 0
    assert rank0.sh(f"systemctl is-active orch-tune-{rid}.service", check=False).stdout.strip() != "active"
    events = [e for p in (tmp_path / "state2" / "runs").glob("*/events.jsonl")
              for e in map(json.loads, p.read_text().splitlines())]
    order = [(e["event"], e["host"]) for e in events if e.get("event") in ("service_stopped", "service_started")]
    stops = [h for ev, h in order if ev == "service_stopped"]
    starts = [i for i, (ev, _) in enumerate(order) if ev == "service_started"]
    assert stops == ([rank1.name] if waiting else []), order  # only a running rank needs a stop
    assert sorted(h for ev, h in order if ev == "service_started") == sorted([rank0.name, rank1.name]), order
    assert not stops or order.index(("service_stopped", rank1.name)) < min(starts), order


def _dist_faults(host, **faults) -> None:
    """Start-up faults of the stand-in's rank meeting, read at each start (sglang._standin.dist)."""
    host.sh("mkdir -p /run/sglang-standin && cat > /run/sglang-standin/dist-faults.json", input=json.dumps(faults))


def test_rank_0_starts_first_and_the_others_once_its_store_listens(testbed_factory, tmp_path):
    """Issue 32 row 9 (sglang #3099): rank 0's store listens 5 s after its start (``listen_delay_s``)
    and rank 1 dies at once when its first connection is refused (``join: fail_fast``), so ranks
    started together fail. ``orch tune`` starts rank 0, waits until its unit listens at
    ``--dist-init-addr``, then starts rank 1: both complete on the new files. Then the fault itself:
    rank 1 started alone, before rank 0, fails with the refused connection."""
    bed = _two_ranks(testbed_factory)
    rank0, rank1 = bed.hosts
    _dist_faults(rank0, listen_delay_s=5)
    _dist_faults(rank1, join="fail_fast")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed", (res["hosts"][h.name], proc.stderr[-4000:])
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
    events = _events(state, res["run_id"])
    started = [e["host"] for e in events if e.get("event") == "service_started"]
    assert started == [rank0.name, rank1.name], started
    rank0_start = next(e for e in events if e.get("event") == "task" and e.get("host") == rank0.name
                       and e.get("task") == "Start the unit" and e.get("status") == "changed")
    assert f"rank 0 listens at {COMMON[-1]}" in rank0_start.get("msg", ""), rank0_start

    rank0.sh(f"systemctl stop {rank0.unit}")  # its shutdown broadcast ends rank 1 too
    rank1.sh(f"for i in $(seq 600); do systemctl is-active {rank1.unit} >/dev/null || exit 0; sleep 0.1; done; exit 1")
    rank1.sh(f"systemctl start {rank1.unit}", check=False)
    rank1.sh(f"for i in $(seq 600); do s=$(systemctl is-active {rank1.unit}); "
             "[ \"$s\" = active ] || [ \"$s\" = activating ] || exit 0; sleep 0.1; done; exit 1")
    assert "Connection refused" in rank1.unit_log() and rank1.unit_state() != "active"


def test_a_port_race_at_rank_0s_start_is_started_once_more_not_rolled_back(testbed_factory, tmp_path):
    """Issue 32 row 9 (sglang #37215): rank 0's store fails to bind once with torch's EADDRINUSE
    (``eaddrinuse_once``). orch starts rank 0 once more, keeping the new files, and both ranks
    complete on them; the retry is in the summary and the events, with the log line."""
    bed = _two_ranks(testbed_factory)
    rank0, _rank1 = bed.hosts
    _dist_faults(rank0, eaddrinuse_once=True)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    for h in bed.hosts:
        assert res["hosts"][h.name]["outcome"] == "completed", (res["hosts"][h.name], proc.stderr[-4000:])
        assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log().rsplit("server_args=", 1)[1]
    retried = res["hosts"][rank0.name]["summary"]["start_retried"]
    assert len(retried) == 1 and "EADDRINUSE" in retried[0]["why"], retried
    assert [e for e in _events(state, res["run_id"]) if e.get("event") == "start_retried"]
    assert "EADDRINUSE" in rank0.unit_log()
