"""Issue 21 row 9: sshd's ``MaxStartups`` and ``MaxSessions`` against orch's SSH connections.

A real sshd in a bed host drops every unauthenticated connection past 2 at once (``MaxStartups
2:100:2``) and allows 3 sessions per connection (``MaxSessions 3``). Many connections logging in
at once get "Error reading SSH protocol banner" (paramiko #664, #528, fabric #1992) unless the
handshakes in flight are bounded (``orch_ssh_max_handshakes``) or the dropped ones retried; many
commands at once on one connection are refused ("administratively prohibited") unless the
sessions are bounded (``orch_ssh_max_sessions``). The connections are orch's own
(:class:`orchestrator.connection.ssh.SSHConnection`), made in the test process.
"""

from __future__ import annotations

import threading

import paramiko
import pytest

from orchestrator.connection import ConnectError, HostUnreachable, handshake
from orchestrator.connection.route import resolve_route
from orchestrator.connection.ssh import SSHConnection
from tests.e2e.ssh_fleet import sshd_log
from tests.waiting import CEILING_S, wait_until

pytestmark = pytest.mark.testbed

LIMITS = {0: {"start_unit": False, "strays": False, "sshd_max_startups": "2:100:2", "sshd_max_sessions": 3}}
#: connections (or commands) started at once
CROWD = 8


def _conn(bed, h, **kw) -> SSHConnection:
    route = resolve_route(h.name, {"ansible_host": h.address, "ansible_user": "root",
                                   "ansible_ssh_private_key_file": str(bed.key_path),
                                   "orch_known_hosts": str(bed.known_hosts_path)}, paramiko.SSHConfig())
    return SSHConnection(h.name, route, connect_timeout=10, **kw)


def _at_once(fns) -> list:
    """Run every function in ``fns`` in its own thread, released together; their results or
    exceptions, in order."""
    out = [None] * len(fns)
    start = threading.Barrier(len(fns))

    def one(i, fn):
        start.wait()
        try:
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at which ones failed and why
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_many_logins_at_once_past_max_startups(testbed_factory, monkeypatch):
    bed = testbed_factory(1, host_options=LIMITS)
    h = bed.hosts[0]
    def sshd_processes() -> int:
        """sshd's processes on the host (the listener, and a child per connection: sshd, sshd-session)."""
        return int((h.sh("pgrep -c sshd", check=False).stdout.split() or ["0"])[0])

    idle = sshd_processes()  # the listener alone: no login yet

    # no bound, no retry (the code before issue 21): sshd drops logins and orch reports them lost
    monkeypatch.setattr(handshake, "HANDSHAKE_ATTEMPTS", 1)
    conns = [_conn(bed, h, max_handshakes=CROWD) for _ in range(CROWD)]
    out = _at_once([c.open for c in conns])
    failed = [str(e) for e in out if e is not None]
    assert failed and all(isinstance(e, (HostUnreachable, type(None))) for e in out), out
    assert all("the SSH server closed the connection before login 1 times (Error reading SSH protocol banner"
               in f for f in failed), failed
    assert "past MaxStartups" in sshd_log(h)  # sshd's word for it (it logs the first drop of a burst)
    for c in conns:
        c.close()
    # sshd counts a connection against MaxStartups until its child for it has exited: the next wave
    # starts when the burst's children are gone (on a loaded machine they outlive the clients' close)
    wait_until(lambda: sshd_processes() <= idle, "sshd's children of the first burst to exit",
               progress=[sshd_processes])

    # one handshake in flight at a time (still no retry): sshd never has 2 unauthenticated, none dropped
    conns = [_conn(bed, h, max_handshakes=1) for _ in range(CROWD)]
    assert _at_once([c.open for c in conns]) == [None] * CROWD
    for c in conns:
        assert c.run(["true"]).ok
        c.close()

    # no bound but the retry: the dropped ones come back after a backoff and log in
    monkeypatch.undo()
    notes = []
    conns = [_conn(bed, h, max_handshakes=CROWD, echo=notes.append) for _ in range(CROWD)]
    assert _at_once([c.open for c in conns]) == [None] * CROWD, notes
    assert any("the SSH server closed the connection before login" in n for n in notes), notes
    for c in conns:
        assert c.run(["true"]).ok
        c.close()


def test_many_commands_at_once_past_max_sessions(testbed_factory, monkeypatch):
    bed = testbed_factory(1, host_options=LIMITS)
    h = bed.hosts[0]
    sleep = ["sh", "-c", "sleep 0.5; echo done"]

    # more sessions at once than sshd's MaxSessions 3, no second try: the extra ones are refused
    monkeypatch.setattr(handshake, "SESSION_ATTEMPTS", 1)
    loose = _conn(bed, h, max_sessions=CROWD)
    out = _at_once([lambda: loose.run(sleep, timeout=CEILING_S)] * CROWD)
    refused = [e for e in out if isinstance(e, Exception)]
    assert refused and all(isinstance(e, ConnectError) and "the SSH server refused a session" in str(e)
                           and "MaxSessions? lower orch_ssh_max_sessions (now 8)" in str(e) for e in refused), out
    assert len(refused) < CROWD  # the first 3 ran
    loose.close()

    # orch_ssh_max_sessions 3: the commands wait for a free session and all run (a session asked for
    # right behind a closed one can still be refused, before sshd has counted the close: opened again)
    monkeypatch.undo()
    bounded = _conn(bed, h, max_sessions=3)
    out = _at_once([lambda: bounded.run(sleep, timeout=CEILING_S)] * CROWD)
    assert [r.stdout.strip() for r in out] == ["done"] * CROWD, out
    assert bounded.sessions.peak == 3 and bounded.sessions.held == 0
    bounded.close()
