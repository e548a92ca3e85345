"""Task ``connect``: open the host's transport (SSH with verified host keys, or local)."""

from __future__ import annotations

from ..connection import connect as _connect
from ..engine.results import TaskResult


def connect(ctx) -> TaskResult:
    """Open ``ctx.transport`` from the host's inventory variables.

    Raises :class:`orchestrator.connection.HostUnreachable` (the host is then
    reported unreachable) on a refused or changed host key, failed auth or timeout.
    """
    if ctx.transport is None:
        ctx.transport = _connect(ctx.name, ctx.vars, accept_new_host_keys=ctx.options.accept_new_host_keys,
                                 echo_output=ctx.options.echo_output)
    who = ctx.transport.run(["id", "-un"], timeout=30).stdout.strip()
    return TaskResult.ok(f"connected as {who}", user=who)


connect.check_safe = True
