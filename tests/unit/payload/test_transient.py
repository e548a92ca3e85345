"""The tune as a transient systemd unit (orchestrator/payload/transient.py, PayloadClient.call_in_unit),
against a scripted host: the launch command, the polls, the end states, the fallback signal."""

from __future__ import annotations

import json

import pytest

from orchestrator.connection.base import LinkLost
from orchestrator.facts.systemd_env import parse_env_file
from orchestrator.payload.client import PayloadClient, PayloadFailed
from orchestrator.payload.transient import UnitUnavailable, memory_max, unit_name
from tests.fakes import ScriptedConnection

UNIT = "orch-tune-r1.service"
SHOW = r"^systemctl show -p LoadState,ActiveState"
RESULT = json.dumps({"proto": 1, "type": "result", "data": {"files": {"up": "/w/up.json"}}})
PROGRESS = json.dumps({"proto": 1, "type": "progress", "stage": "tune", "done": 1, "total": 2})


def _state(active: str, result: str = "success", loaded: str = "loaded") -> str:
    return f"LoadState={loaded}\nActiveState={active}\nSubState=x\nResult={result}\nExecMainCode=2\nExecMainStatus=9\n"


def _client(script) -> tuple[PayloadClient, ScriptedConnection]:
    conn = ScriptedConnection(script)
    return PayloadClient(conn, "/usr/bin/python3", "/var/lib/orch/payload/abc", "/var/lib/orch"), conn


def test_unit_name_and_memory_max():
    assert unit_name("20260101T000000Z-tune-abcdef") == "orch-tune-20260101T000000Z-tune-abcdef.service"
    for bad in ("a b", "x;y", "$(id)", ""):
        with pytest.raises(ValueError):
            unit_name(bad)
    meminfo = "MemTotal:       24683520 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n"
    assert memory_max(meminfo) == int(20000000 * 1024 * 0.8)
    assert memory_max("MemTotal: 1 kB\n") is None  # no MemAvailable line: no limit


def test_launch_polls_progress_and_returns_the_result():
    seen = []
    client, conn = _client([
        (r"^systemd-run ", (0, "", "")),
        (SHOW, {"seq": [(0, _state("active"), ""), (0, _state("inactive", loaded="not-found"), "")]}),
        (r"^tail -c \+1 ", (0, PROGRESS + "\n" + RESULT[:20], "")),
        (r"^tail -c \+\d+ ", (0, RESULT[20:] + "\n", "")),
        (r"", (0, "", "")),
    ])
    data = client.call_in_unit("tune", ["--space", "smoke"], UNIT, memory_max=123, timeout=600,
                               on_progress=seen.append, poll_s=0)
    assert data == {"files": {"up": "/w/up.json"}}
    assert [m["done"] for m in seen] == [1]
    launch = next(a for a, _ in conn.calls if a[0] == "systemd-run" and "--version" not in a)
    assert launch[:2] == ["systemd-run", f"--unit={UNIT}"]
    assert "--property=MemoryMax=123" in launch and "--property=RuntimeMaxSec=600" in launch
    assert f"--property=StandardOutput=file:/var/lib/orch/units/{UNIT}.out" in launch
    assert launch[launch.index("--") + 1:][-4:] == ["remote", "tune", "--space", "smoke"]
    assert all(b for a, b in conn.calls if a[0] in ("systemd-run", "systemctl", "tail"))  # through sudo


def test_oom_kill_is_reported_as_out_of_host_memory():
    client, _ = _client([
        (r"^systemd-run ", (0, "", "")),
        (SHOW, (0, _state("failed", "oom-kill"), "")),
        (r"^tail -n 20 ", (0, "Killed\n", "")),
        (r"", (0, "", "")),
    ])
    with pytest.raises(PayloadFailed) as exc:
        client.call_in_unit("tune", [], UNIT, memory_max=1000, poll_s=0)
    assert exc.value.kind == "out of host memory"
    assert str(exc.value).startswith("payload tune failed (out of host memory): ") and "MemoryMax=1000" in str(exc.value)


def test_no_usable_systemd_run_is_unit_unavailable_but_never_while_the_unit_runs():
    client, _ = _client([
        (r"^systemd-run ", (1, "", "System has not been booted with systemd as init system (PID 1). Can't operate.")),
        (SHOW, (0, _state("inactive", loaded="not-found"), "")),
        (r"", (0, "", "")),
    ])
    with pytest.raises(UnitUnavailable, match="PID 1"):
        client.call_in_unit("tune", [], UNIT, poll_s=0)
    # systemd-run said no, but its unit runs: polled as started, never a second tuner
    client, _ = _client([
        (r"^systemd-run ", (1, "", "odd")),
        (SHOW, {"seq": [(0, _state("active"), ""), (0, _state("active"), ""),
                        (0, _state("inactive", loaded="not-found"), "")]}),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    assert client.call_in_unit("tune", [], UNIT, poll_s=0)["files"]


def test_a_failed_poll_is_tried_again_while_the_link_holds():
    calls = {"n": 0}

    def flaky(argv):
        calls["n"] += 1
        if calls["n"] <= 2:
            return (1, "", "")  # no state read (sudo refused, a cut session): not an ended unit
        return (0, _state("inactive", loaded="not-found"), "")

    client, _ = _client([
        (r"^systemd-run ", (0, "", "")),
        (SHOW, flaky),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    assert client.call_in_unit("tune", [], UNIT, poll_s=0)["files"]
    assert calls["n"] == 3


def test_a_lost_link_during_the_polls_is_raised_and_the_next_call_reattaches():
    """Issue 32 row 1: the engine logs in again and runs the step again; the second call polls the
    unit the first one started (its output read from the start), never a second tuner."""
    calls = {"n": 0}

    def flaky(argv):
        calls["n"] += 1
        if calls["n"] == 2:
            raise LinkLost("gpu-a: connection lost while running systemctl show")
        return (0, _state("active") if calls["n"] < 3 else _state("inactive", loaded="not-found"), "")

    seen = []
    client, conn = _client([
        (r"^systemd-run ", (0, "", "")),
        (SHOW, flaky),
        (r"^tail -c \+1 ", (0, PROGRESS + "\n" + RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    with pytest.raises(LinkLost):
        client.call_in_unit("tune", [], UNIT, poll_s=0, on_progress=seen.append)
    assert client.call_in_unit("tune", [], UNIT, poll_s=0, on_progress=seen.append)["files"]
    assert sum(1 for a, _ in conn.calls if a[0] == "systemd-run" and "--version" not in a) == 1
    assert [m["done"] for m in seen] == [1, 1]  # the first poll's progress, read again from the start
    assert not client._units  # ended: a third call would start a new unit


def test_a_failed_earlier_unit_of_the_name_is_unloaded_and_the_launch_tried_again():
    """Issue 32 row 10: without --collect (or from an older orch) a failed unit keeps its name."""
    launches = {"n": 0}

    def launch(argv):
        launches["n"] += 1
        if launches["n"] == 1:
            return (1, "", f"Failed to start transient service unit: Unit {UNIT} was already loaded or has a "
                           "fragment file.")  # systemd 252's words (src/run/run.c via the bus error)
        return (0, "", "")

    client, conn = _client([
        (r"^systemd-run --version", (0, "systemd 252 (252.38-1~deb12u1)\n", "")),
        (r"^systemd-run ", launch),
        (SHOW, {"seq": [(0, _state("failed", "exit-code"), ""), (0, _state("inactive", loaded="not-found"), "")]}),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    assert client.call_in_unit("tune", [], UNIT, poll_s=0)["files"]
    assert launches["n"] == 2
    order = [" ".join(a[:3]) for a, _ in conn.calls if a[0] in ("systemd-run", "systemctl")]
    assert order.index(f"systemctl reset-failed {UNIT}") < len(order) - 1 - order[::-1].index(
        next(o for o in order if o.startswith("systemd-run --unit")))
    launch_argv = [a for a, _ in conn.calls if a[0] == "systemd-run" and "--version" not in a][-1]
    assert "--collect" in launch_argv  # systemd 252 >= 236


def test_collected_unit_reports_how_it_ended_from_its_exec_stop_post_file():
    client, conn = _client([
        (r"^systemd-run --version", (0, "systemd 252\n", "")),
        (r"^systemd-run ", (0, "", "")),
        (SHOW, (0, "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\n", "")),
        (r"^cat -- /var/lib/orch/units/" + UNIT + r"\.result", (0, "oom-kill killed KILL\n", "")),
        (r"", (0, "", "")),
    ])
    with pytest.raises(PayloadFailed) as exc:
        client.call_in_unit("tune", [], UNIT, memory_max=1000, poll_s=0)
    assert exc.value.kind == "out of host memory"
    launch = next(a for a, _ in conn.calls if a[0] == "systemd-run" and "--version" not in a)
    post = next(p for p in launch if p.startswith("--property=ExecStopPost="))
    assert post.endswith(f"> /var/lib/orch/units/{UNIT}.result'") and "$$SERVICE_RESULT" in post


def test_the_tune_unit_reads_the_servers_environment_from_an_environment_file():
    """Issue 32 row 15: the transient unit gets its manager's environment only; the server's
    effective environment goes into a root-only EnvironmentFile= of the unit, removed at its end."""
    client, conn = _client([
        (r"^systemd-run ", (0, "", "")),
        (SHOW, (0, _state("inactive", loaded="not-found"), "")),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    env = {"TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas", "CUDA_HOME": "/usr/local/cuda", "A": 'x"$y'}
    client.call_in_unit("tune", [], UNIT, poll_s=0, environment=env)
    launch = next(a for a, _ in conn.calls if a[0] == "systemd-run" and "--version" not in a)
    assert f"--property=EnvironmentFile=/var/lib/orch/units/{UNIT}.env" in launch
    assert parse_env_file(conn.put_files[f"/var/lib/orch/units/{UNIT}.env"].decode()) == env
    assert any(a[:2] == ["rm", "-f"] and f"/var/lib/orch/units/{UNIT}.env" in a for a, _ in conn.calls[-4:])


def test_a_link_lost_during_the_launch_reattaches_and_never_removes_the_running_units_output():
    """The launch reached the host (its unit runs) but its answer was lost with the link: the step
    run again polls that unit; a second launch would first remove the running tuner's output."""
    launches = {"n": 0}

    def launch(argv):
        launches["n"] += 1
        raise LinkLost("gpu-a: connection lost while running systemd-run")

    client, conn = _client([
        (r"^systemd-run --version", (0, "systemd 252\n", "")),
        (r"^systemd-run ", launch),
        (r"^test -e ", (0, "", "")),
        (SHOW, {"seq": [(0, _state("active"), ""), (0, _state("active"), ""),
                        (0, _state("inactive", loaded="not-found"), "")]}),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    with pytest.raises(LinkLost):
        client.call_in_unit("tune", [], UNIT, poll_s=0)
    removes = sum(1 for a, _ in conn.calls if a[:2] == ["rm", "-f"])
    assert client.call_in_unit("tune", [], UNIT, poll_s=0)["files"]
    assert launches["n"] == 1 and sum(1 for a, _ in conn.calls if a[:2] == ["rm", "-f"]) == removes + 1  # .env only


def test_a_link_lost_before_the_launch_reached_the_host_launches_on_the_next_call():
    answers = {"n": 0}

    def launch(argv):
        answers["n"] += 1
        if answers["n"] == 1:
            raise LinkLost("gpu-a: connection lost while running systemd-run")
        return (0, "", "")

    client, conn = _client([
        (r"^systemd-run --version", (0, "systemd 252\n", "")),
        (r"^systemd-run ", launch),
        (r"^test -e ", (1, "", "")),  # no output: nothing of the first launch ran
        (SHOW, (0, _state("inactive", loaded="not-found"), "")),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    with pytest.raises(LinkLost):
        client.call_in_unit("tune", [], UNIT, poll_s=0)
    assert client.call_in_unit("tune", [], UNIT, poll_s=0)["files"] and answers["n"] == 2
