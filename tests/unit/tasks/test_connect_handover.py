"""The ``connect`` task takes over the connection the discovery pass left open for the host
(RunOptions.connections, orchestrator.cli.run.find_servers) only when the play would open the same
one: play ``vars:`` can set a host's login variables (ansible_host, ansible_user, ansible_become,
...), which the discovery pass, a play without vars, never saw."""

from __future__ import annotations

from orchestrator.tasks import TASKS
from tests.fakes import make_ctx

LOCAL = {"ansible_connection": "local", "orch_command_timeout": 300}


def _discovery(tmp_path, variables):
    """Run ``connect`` as the discovery pass does and hand its connection over (HostContext.close)."""
    ctx = make_ctx(tmp_path, dict(variables), keep_connections=True)
    TASKS["connect"].fn(ctx, require_root=False)
    opened = ctx.connection
    ctx.close()
    assert ctx.options.connections == {"h1": opened}
    return ctx.options.connections, opened


def test_the_play_takes_over_the_discovery_pass_connection_with_the_same_login(tmp_path):
    connections, opened = _discovery(tmp_path, LOCAL)
    ctx = make_ctx(tmp_path, dict(LOCAL), connections=connections)
    TASKS["connect"].fn(ctx, require_root=False)
    assert ctx.connection is opened
    assert connections == {}
    ctx.close()


def test_play_vars_that_change_the_login_open_a_new_connection_and_close_the_handed_one(tmp_path):
    connections, opened = _discovery(tmp_path, LOCAL)
    closed = []
    opened.close = lambda: closed.append(True)  # the real close of a local connection leaves no trace
    # the play's `vars:` say otherwise than the inventory the discovery pass logged in with
    ctx = make_ctx(tmp_path, dict(LOCAL, orch_command_timeout=30), connections=connections)
    TASKS["connect"].fn(ctx, require_root=False)
    assert ctx.connection is not opened
    assert ctx.connection.default_timeout == 30.0
    assert closed == [True]
    assert connections == {}
    ctx.close()


def test_login_vars_name_every_variable_the_connection_is_built_from():
    """Each variable orchestrator.connection reads from the host's variables is in LOGIN_VARS, so a
    play that changes it never gets the discovery pass's connection."""
    import re
    from pathlib import Path

    import orchestrator.connection as pkg
    from orchestrator.tasks.connect import LOGIN_VARS

    read = set()
    for src in Path(pkg.__file__).parent.glob("*.py"):
        read |= set(re.findall(r'(?:hostvars\.get\(|hostvars\[|var\(hostvars, )"([a-z_]+)"', src.read_text()))
    assert read and read <= set(LOGIN_VARS), sorted(read - set(LOGIN_VARS))
