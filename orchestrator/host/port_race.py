"""A start that lost a race for a port, started once more (issue 32 row 9), and the rendezvous of a
multi-node server's rank 0, shared by the ``service`` and ``wait_ready`` tasks.

A server start can die because a port it binds was taken a moment before: the HTTP port just
released by the old process (``[Errno 98] error while attempting to bind on address``: uvicorn), or
the ``--dist-init-addr`` port of rank 0's store taken by an ephemeral connection (torch's
``The server socket has failed to listen on any local network address ... EADDRINUSE``, sglang #37215).
Nothing about the new config files is wrong then, so rolling them back would undo a good tune for
a race: :func:`restart_after_port_race` starts the unit once more instead, once per start, and says
so (event ``start_retried``, ``summary.start_retried``). A second race fails as any failed start.

:func:`wait_rendezvous`: rank 0 of a multi-node server serves the store at ``--dist-init-addr`` that
the other ranks join (SGLang 0.5.23 ``srt/distributed/bootstrap.py`` ``_init_parallel_groups``:
``init_distributed_environment`` with ``tcp://<dist-init-addr>``, rank 0 listening); a rank that
starts before that store listens fails or waits its ``--dist-timeout`` out, depending on the
torch release (sglang #3099). The ranks >= 1 are started only once it listens.
"""

from __future__ import annotations

import json
import re
import time

from ..engine.results import TaskFailed
from ..facts.journal import mark_start, note_invocation, read_start
from ..payload.client import PayloadFailed

#: what a start that lost a port race logs (uvicorn's bind error, Python's OSError, torch's TCPStore)
PORT_RACE = re.compile(r"Address already in use|address already in use|EADDRINUSE|\[Errno 98\]")


def port_race_line(text: str) -> str | None:
    """The first line of a start's log ``text`` that says a port it binds was in use, or None. Pure."""
    for line in text.splitlines():
        if PORT_RACE.search(line):
            return line.strip()[-300:]
    return None


def restart_after_port_race(ctx, unit: str, timeout: float) -> bool:
    """When the unit's last start (by this run: ``ctx.run.start_mark``) died of a port race
    (:func:`port_race_line`) and that start was not itself such a retry: start it once more and
    return True (the caller waits again); else False."""
    mark = ctx.run.start_mark
    if mark is None or ctx.run.port_race_retried_for is mark:
        return False
    handle = ctx.facts.unit_handle(unit)
    got = read_start(ctx.connection, handle, mark)
    line = port_race_line(got.text)
    if line is None:
        return False
    ctx.emit("start_retried", unit=unit, why=line)
    ctx.say(f"{unit}'s start lost a race for a port ({line[-160:]}): starting it once more, the new files kept")
    ctx.run.summary.start_retried = (ctx.run.summary.start_retried or []) + [{"unit": unit, "why": line}]
    ctx.run.start_mark = mark_start(ctx.connection, handle)
    ctx.run.log_mark = ctx.run.start_mark.text
    ctx.run.port_race_retried_for = ctx.run.start_mark
    # a start that fails is read from the unit next (the error below names its output)
    res = handle.systemctl(ctx.connection, "start", timeout=timeout + 30, check=False)
    note_invocation(ctx.connection, ctx.run.start_mark, handle)
    if not res.ok:
        raise TaskFailed(f"{unit} did not start again after a port race: {(res.stderr or res.stdout).strip()[-300:]}")
    return True


def dist_port(dist_init_addr: str | None) -> int | None:
    """The port of ``--dist-init-addr HOST:PORT`` (``[v6]:PORT`` too); None when it names none. Pure."""
    host, sep, port = (dist_init_addr or "").rpartition(":")
    return int(port) if sep and port.isdigit() else None


def wait_rendezvous(ctx, unit: str, timeout: float, poll_s: float = 0.5) -> str:
    """On rank 0 of a multi-node server, after its start: wait until a process of the unit listens
    on the ``--dist-init-addr`` port (payload ``port``, no ``--free``: nothing is signalled), at most
    ``timeout`` s, starting it once more after a port race (:func:`restart_after_port_race`). Returns
    what was seen. Raises :class:`TaskFailed` when the unit fails (no race) or the time runs out.
    A container unit, or one without a port in ``--dist-init-addr``, is only checked to be active."""
    facts = ctx.facts.unit
    server = facts.server if facts is not None else None
    port = dist_port(server.dist_init_addr if server is not None else None)
    if port is None or facts.container is not None or ctx.payload is None:
        return "active"
    args = ["--port", str(port), "--unit", unit if "." in unit else f"{unit}.service"]
    if facts.launch is not None:
        args += ["--owner-args", json.dumps(facts.launch.entry_args)]
    deadline = ctx.deadline(timeout)
    handle = ctx.facts.unit_handle(unit)
    while True:
        state = handle.is_active(ctx.connection)
        if state in ("failed", "inactive"):
            if restart_after_port_race(ctx, unit, timeout):
                continue
            tail = read_start(ctx.connection, handle, ctx.run.start_mark).text.strip().splitlines()[-6:]
            raise TaskFailed(f"{unit} (rank 0) became {state} before it listened at --dist-init-addr "
                             f"{server.dist_init_addr}; log tail:\n" + "\n".join(tail))
        try:
            data = ctx.payload.call("port", args, timeout=60)
        except PayloadFailed:
            data = {}
        if any(h.get("owner") for h in data.get("holders") or []):
            return f"rank 0 listens at {server.dist_init_addr}"
        if ctx.cancelled():
            raise TaskFailed("interrupted while waiting for rank 0 to listen at --dist-init-addr")
        if time.monotonic() > deadline:
            raise TaskFailed(f"{unit} (rank 0) did not listen at --dist-init-addr {server.dist_init_addr} within "
                             f"{timeout:.0f} s; the other ranks were not started")
        time.sleep(poll_s)
