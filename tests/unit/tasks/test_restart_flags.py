"""A restart orch issued counts as this run's (``stopped_by_orch``/``started_by_orch``) even when a
command after it fails, so the rescue (``only_if_stopped_by_orch``) starts the unit again: the
invocation-ID read that follows the restart (note_invocation) can time out or lose the link."""

from __future__ import annotations

import pytest

from orchestrator.connection import CommandTimeout
from orchestrator.facts.plan import Endpoint
from orchestrator.facts.systemd_unit import Unit
from orchestrator.host.runner_trial import restart_ready
from tests.fakes import ScriptedConnection, make_ctx


def _hung(argv):
    raise CommandTimeout("h1: systemctl show -p InvocationID sglang.service: no answer in 60 s")


def test_a_runner_trial_restart_counts_as_this_runs_when_the_command_after_it_fails(tmp_path):
    conn = ScriptedConnection([(r"^journalctl .*--show-cursor", "-- cursor: s=1\n"), (r"^journalctl ", ""),
                               (r"-p InvocationID", _hung), (r"^systemctl restart", "")])
    ctx = make_ctx(tmp_path, connection=conn)
    with pytest.raises(CommandTimeout):
        restart_ready(ctx, Unit("sglang.service"), Endpoint(url="http://127.0.0.1:30000", via="host"), 60, 60)
    assert "systemctl restart sglang.service" in conn.commands()
    assert ctx.run.stopped_by_orch and ctx.run.started_by_orch


def test_a_silent_autotune_on_a_warm_cache_is_bounded_by_the_log(tmp_path, monkeypatch):
    """Issue 32 row 6: the start logged SGLang's autotune line on a cache file that exists and
    FlashInfer's start line, then nothing: past the bound it is hung. A log that grows, a cold cache
    (the file not there yet) or a finished autotune is not."""
    from orchestrator.host import runner_trial as rt

    now = [100.0]
    monkeypatch.setattr(rt.time, "monotonic", lambda: now[0])
    files = {"/c/flashinfer/autotune/0.6.0/sm90/0123456789abcdef/rank_tp0_pp0_dp0.json": "{}"}
    monkeypatch.setattr(rt, "read_host_file", lambda conn, path, what: files.get(path))
    path = next(iter(files))
    start = (f"[t TP0] Running FlashInfer autotune with cache: {path}\n"
             "2026-01-01 00:00:01,000 - INFO - autotuner.py:446 - flashinfer.jit: [Autotuner]: Autotuning process starts ...\n")
    ctx = make_ctx(tmp_path)
    watch = rt._AutotuneWatch(ctx, Unit("sglang.service"), 30.0)
    watch.check(start)
    now[0] += 20
    watch.check(start + "[t] some progress\n")  # the log grew: the bound starts again
    now[0] += 25
    watch.check(start + "[t] some progress\n")
    now[0] += 10
    with pytest.raises(rt.AutotuneHung, match="logged nothing for 35 s"):
        watch.check(start + "[t] some progress\n")
    done = start + "... - flashinfer.jit: [Autotuner]: Autotuning process ends\n[t TP0] FlashInfer autotune completed.\n"
    watch.check(done)  # finished
    now[0] += 1000
    watch.check(done)
    cold = rt._AutotuneWatch(ctx, Unit("sglang.service"), 30.0)
    other = start.replace("0123456789abcdef", "fedcba9876543210")
    cold.check(other)
    now[0] += 1000
    cold.check(other)  # the file is not there: a cold autotune, ready_timeout bounds it
