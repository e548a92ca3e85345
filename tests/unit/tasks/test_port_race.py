"""A start that lost a race for a port is started once more, the new files kept (issue 32 row 9,
orchestrator/host/port_race.py), on a scripted host: the lines SGLang's start logs then (uvicorn's
bind error, torch's TCPStore EADDRINUSE), one retry per start, none for another failure."""

from __future__ import annotations

from orchestrator.facts.journal import LogMark
from orchestrator.host.port_race import dist_port, port_race_line, restart_after_port_race
from tests.fakes import ScriptedConnection, make_ctx

CURSOR = "s=ab;i=2a;b=01;m=2a;t=2a;x=ff"
UVICORN = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use"
TORCH = ("RuntimeError: The server socket has failed to listen on any local network address. port: 5000, useIpv6: "
         "false, code: -98, name: EADDRINUSE, message: address already in use")


def test_the_lines_of_a_port_race():
    assert port_race_line(f"x: start\nx: {UVICORN}\n") == f"x: {UVICORN}"
    assert port_race_line(f"y: {TORCH}\n") == f"y: {TORCH}"
    assert port_race_line("RuntimeError: CUDA out of memory\n") is None
    assert dist_port("gpu-a:5000") == 5000 and dist_port("[fd00::1]:29500") == 29500 and dist_port("gpu-a") is None


def _ctx(tmp_path, log: str):
    conn = ScriptedConnection([(r"--show-cursor", f"-- cursor: {CURSOR}\n"), (r"--after-cursor", log),
                               (r"^journalctl -u sglang-qwen --no-pager -n", ""),
                               (r"^systemctl show -p InvocationID", "InvocationID=\n"),
                               (r"^systemctl start sglang-qwen", "")])
    ctx = make_ctx(tmp_path, {}, connection=conn)
    ctx.run.start_mark = LogMark(CURSOR, {}, "")
    return ctx, conn


def test_one_more_start_after_a_port_race_and_only_one(tmp_path):
    ctx, conn = _ctx(tmp_path, f"x: {UVICORN}\n")
    assert restart_after_port_race(ctx, "sglang-qwen", 60) is True
    assert [c for c, _ in conn.calls if c[:2] == ["systemctl", "start"]] == [["systemctl", "start", "sglang-qwen"]]
    assert ctx.run.summary.start_retried == [{"unit": "sglang-qwen", "why": f"x: {UVICORN}"}]
    assert [e for e, _ in ctx.events] == ["start_retried"]
    # the retry's own start died of a race again: no second retry, the start fails as any other
    assert restart_after_port_race(ctx, "sglang-qwen", 60) is False
    assert len([c for c, _ in conn.calls if c[:2] == ["systemctl", "start"]]) == 1


def test_another_failure_is_not_retried(tmp_path):
    ctx, conn = _ctx(tmp_path, "x: RuntimeError: CUDA out of memory\n")
    assert restart_after_port_race(ctx, "sglang-qwen", 60) is False
    assert not [c for c, _ in conn.calls if c[:2] == ["systemctl", "start"]] and not ctx.run.summary.start_retried
