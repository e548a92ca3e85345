"""ServerAlive: OpenSSH's ServerAliveInterval/ServerAliveCountMax on a Paramiko transport (issue 21 row 2)."""

import threading

from orchestrator.connection.ssh import ServerAlive


class FakeTransport:
    """A transport whose peer answers global requests (``answers``) or never does."""

    def __init__(self, answers: bool):
        self.answers = answers
        self.active = True
        self.closed = threading.Event()
        self.requests = []
        self.released = threading.Event()

    def is_active(self):
        return self.active

    def global_request(self, kind, data=None, wait=True):
        self.requests.append((kind, wait))
        if not self.answers:  # a frozen sshd: no reply until the transport closes
            self.released.wait()
            return None
        return None  # OpenSSH answers keepalive@openssh.com with a failure: a reply all the same

    def close(self):
        self.active = False
        self.released.set()
        self.closed.set()


def test_a_silent_peer_is_closed_after_count_max_unanswered_requests():
    t = FakeTransport(answers=False)
    dead = threading.Event()
    alive = ServerAlive(t, 0.02, 3, on_dead=dead.set).start()
    assert t.closed.wait(30) and dead.is_set() and alive.dead
    assert t.requests[0] == ("keepalive@openssh.com", True)  # wants a reply, unlike Paramiko's own


def test_an_answering_peer_is_kept_and_stop_ends_the_thread():
    t = FakeTransport(answers=True)
    alive = ServerAlive(t, 0.01, 2).start()
    while len(t.requests) < 5:  # five rounds answered
        threading.Event().wait(0.01)
    alive.stop()
    alive._thread.join(30)
    assert not alive._thread.is_alive() and not t.closed.is_set() and not alive.dead
