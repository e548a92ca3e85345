"""Issue 32 row 1: a command whose SSH channel ended with the transport (no exit status) raises
:class:`LinkLost`, not an exit status the payload client would call a crash."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.connection.base import HostUnreachable, LinkLost
from orchestrator.connection.handshake import SessionSlots
from orchestrator.connection.reconnect import is_transient
from orchestrator.connection.ssh import SSHConnection


class FakeFabric:
    """Fabric's Connection as ``_invoke_run`` uses it: ``run`` answers ``exited``; the transport is
    active while ``up``."""

    def __init__(self, exited: int, up: bool):
        self.exited, self.up = exited, up
        self.transport = SimpleNamespace(is_active=lambda: self.up)
        self.is_connected = True

    def run(self, command, **kw):
        return SimpleNamespace(exited=self.exited, stdout="", stderr="")


def _conn(exited: int, up: bool) -> SSHConnection:
    c = object.__new__(SSHConnection)
    c.host, c._conn, c.sessions = "gpu-a", FakeFabric(exited, up), SessionSlots(8)
    return c


def test_no_exit_status_and_a_dead_transport_is_a_lost_link_naming_the_command():
    with pytest.raises(LinkLost, match="gpu-a: connection lost while running .*python -m remote reap") as exc:
        _conn(-1, up=False)._invoke_run("sudo -n -- env X=1 python -m remote reap --devices /dev/nvidia0", timeout=5)
    assert is_transient(exc.value) and isinstance(exc.value, HostUnreachable)


def test_an_exit_status_or_a_live_transport_is_the_commands_own_answer():
    assert _conn(-1, up=True)._invoke_run("false", timeout=5).exited == -1
    assert _conn(1, up=False)._invoke_run("false", timeout=5).exited == 1
