"""The tune as a transient systemd unit (orchestrator/payload/transient.py, PayloadClient.call_in_unit),
against a scripted host: the launch command, the polls, the end states, the fallback signal."""

from __future__ import annotations

import json

import pytest

from orchestrator.connection.base import HostUnreachable
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
    launch = next(a for a, _ in conn.calls if a[0] == "systemd-run")
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


def test_a_dropped_connection_during_the_polls_is_retried():
    calls = {"n": 0}

    def flaky(argv):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise HostUnreachable("ssh session dropped")
        return (0, _state("inactive", loaded="not-found"), "")

    client, _ = _client([
        (r"^systemd-run ", (0, "", "")),
        (SHOW, flaky),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    assert client.call_in_unit("tune", [], UNIT, poll_s=0)["files"]
    assert calls["n"] == 3
