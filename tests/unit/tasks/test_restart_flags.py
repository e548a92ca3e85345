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
