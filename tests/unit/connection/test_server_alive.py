"""ServerAlive: OpenSSH's ServerAliveInterval/ServerAliveCountMax on a Paramiko transport (issue 21 row 2)."""

import threading

from orchestrator.connection.ssh import ServerAlive
from tests.fakes import FakeSSHTransport


def test_a_silent_peer_is_closed_after_count_max_unanswered_requests():
    t = FakeSSHTransport(answers=False)
    dead = threading.Event()
    alive = ServerAlive(t, 0.02, 3, on_dead=dead.set).start()
    assert t.closed.wait(30) and dead.is_set() and alive.dead
    assert t.requests[0] == ("keepalive@openssh.com", True)  # wants a reply, unlike Paramiko's own


def test_an_answering_peer_is_kept_and_stop_ends_the_thread():
    t = FakeSSHTransport(answers=True)
    alive = ServerAlive(t, 0.01, 2).start()
    while len(t.requests) < 5:  # five rounds answered
        threading.Event().wait(0.01)
    alive.stop()
    alive._thread.join(30)
    assert not alive._thread.is_alive() and not t.closed.is_set() and not alive.dead
