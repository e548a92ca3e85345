"""Bounds on SSH handshakes and sessions (orchestrator/connection/handshake.py) and their use in
SSHConnection: which failures count as a drop before login (sshd past MaxStartups: paramiko #664,
fabric #1992), the retry policy (only drops; never a refused login or host key), the gates, the
shared jump host login, and the inventory's bounds."""

from __future__ import annotations

import socket
import threading
import time

import paramiko
import pytest

from orchestrator.connection import HostUnreachable, handshake
from orchestrator.connection.base import CommandTimeout
from orchestrator.connection.handshake import (BANNER_ERROR, HANDSHAKE_ATTEMPTS, HandshakeGate, SessionSlots,
                                               handshake_retrying, is_handshake_drop)
from orchestrator.connection.route import resolve_route
from orchestrator.connection.ssh import HostKeyRefused, SSHConnection
from orchestrator.inventory import InventoryError, load_inventory
from tests.waiting import CEILING_S  # a hang guard only: the waits end on their condition


def _raised_like_paramiko(inner: BaseException) -> paramiko.SSHException:
    """The exception Paramiko's Transport._check_banner raises when reading the banner failed
    with ``inner`` (raised inside its ``except``, so ``inner`` is the context)."""
    try:
        try:
            raise inner
        except Exception as e:
            raise paramiko.SSHException(BANNER_ERROR + str(e))
    except paramiko.SSHException as exc:
        return exc


def test_drops_before_login_are_told_apart_from_answers():
    assert is_handshake_drop(_raised_like_paramiko(EOFError()))  # sshd closed it: past MaxStartups
    assert is_handshake_drop(_raised_like_paramiko(ConnectionResetError(104, "Connection reset by peer")))
    assert is_handshake_drop(EOFError())  # closed during the key exchange
    assert is_handshake_drop(ConnectionResetError(104, "Connection reset by peer"))
    assert is_handshake_drop(paramiko.SSHException(BANNER_ERROR))  # message only: no cause kept
    # answers, or a server that is there but hung: asking again changes nothing
    assert not is_handshake_drop(_raised_like_paramiko(socket.timeout()))
    assert not is_handshake_drop(paramiko.SSHException(BANNER_ERROR + "timed out"))
    assert not is_handshake_drop(paramiko.AuthenticationException("Authentication failed."))
    assert not is_handshake_drop(paramiko.BadAuthenticationType("Bad authentication type", ["password"]))
    assert not is_handshake_drop(HostKeyRefused("gpu-a: unknown host key for 10.0.0.1:22"))
    assert not is_handshake_drop(paramiko.ChannelException(2, "Connect failed"))
    assert not is_handshake_drop(ConnectionRefusedError(111, "Connection refused"))
    assert not is_handshake_drop(socket.timeout("timed out"))
    assert not is_handshake_drop(paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"))


def _attempts(fail, sleeps):
    calls = []
    try:
        for attempt in handshake_retrying(sleep=sleeps.append):
            with attempt:
                calls.append(1)
                exc = fail(len(calls))
                if exc is not None:
                    raise exc
    except BaseException as exc:  # the last one, re-raised as it is
        return len(calls), exc
    return len(calls), None


def test_retry_policy_backs_off_on_drops_only():
    sleeps = []
    n, exc = _attempts(lambda i: _raised_like_paramiko(EOFError()) if i < 3 else None, sleeps)
    assert (n, exc) == (3, None)
    # exponential (0.5 s, then 1 s) plus 0..1 s of jitter each
    assert 0.5 <= sleeps[0] <= 1.5 and 1.0 <= sleeps[1] <= 2.0, sleeps

    sleeps = []
    n, exc = _attempts(lambda i: _raised_like_paramiko(EOFError()), sleeps)
    assert n == HANDSHAKE_ATTEMPTS == 5 and isinstance(exc, paramiko.SSHException), exc
    assert len(sleeps) == 4 and 4.0 <= sleeps[3] <= 5.0, sleeps

    for answer in (paramiko.AuthenticationException("Authentication failed."),
                   HostKeyRefused("gpu-a: host key CHANGED"), ConnectionRefusedError(111, "refused")):
        sleeps = []
        n, exc = _attempts(lambda i: answer, sleeps)
        assert (n, exc, sleeps) == (1, answer, []), answer


def test_handshake_gate_holds_at_most_its_limit_per_server():
    gate, other = HandshakeGate.of(("test-gate", 1)), HandshakeGate.of(("test-gate", 2))
    assert HandshakeGate.of(("test-gate", 1)) is gate and other is not gate
    release = threading.Event()
    inside = threading.Semaphore(0)

    def one():
        with gate.slot(2):
            inside.release()
            release.wait(5)

    threads = [threading.Thread(target=one) for _ in range(5)]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=CEILING_S) and inside.acquire(timeout=CEILING_S)
    assert not inside.acquire(timeout=0.2)  # the third waits while two are in flight
    assert gate.in_flight == 2
    with other.slot(1):  # another server's handshakes are not held up
        assert other.in_flight == 1
    release.set()
    for t in threads:
        t.join(5)
    assert gate.peak == 2 and gate.in_flight == 0


def test_session_slots_bound_and_time_out():
    slots = SessionSlots(3)
    for _ in range(3):
        slots.take(0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no free SSH session within 0.1 s"):
        slots.take(0.1)
    assert time.monotonic() - t0 >= 0.1
    slots.give()
    with slots.hold(0):
        assert slots.held == 3
    assert slots.peak == 3 and slots.held == 2


def _route(host="10.9.0.5", **hv):
    return resolve_route(host, {"ansible_host": host, "ansible_user": "root", **hv}, paramiko.SSHConfig())


class _FakeFabric:
    """Stands for a Fabric Connection in SSHConnection._login: ``open`` raises what ``fail``
    gives for the n-th call; counts the closes of its client."""

    def __init__(self, fail):
        self.fail, self.opens, self.closes = fail, 0, 0
        self.connect_kwargs, self.user = {}, "root"
        self.client = self

    def open(self):
        self.opens += 1
        exc = self.fail(self.opens)
        if exc is not None:
            raise exc

    def close(self):
        self.closes += 1

    def get_transport(self):
        """Paramiko's ``SSHClient.get_transport``: none here (the banner check has nothing to read)."""
        return None


@pytest.fixture
def no_backoff(monkeypatch):
    monkeypatch.setattr(handshake, "HANDSHAKE_BACKOFF_S", 0.0)
    monkeypatch.setattr(handshake, "HANDSHAKE_JITTER_S", 0.0)


def test_login_retries_a_dropped_handshake_then_reports_it(no_backoff):
    conn = SSHConnection("gpu-a", _route())
    ep = conn.route.target
    flaky = _FakeFabric(lambda n: _raised_like_paramiko(EOFError()) if n < 4 else None)
    conn._login(ep, flaky, None, ("test-login", 1))
    assert (flaky.opens, flaky.closes) == (4, 3)  # each failed attempt's transport closed

    dropped = _FakeFabric(lambda n: _raised_like_paramiko(EOFError()))
    with pytest.raises(HostUnreachable) as ei:
        conn._login(ep, dropped, None, ("test-login", 1))
    assert dropped.opens == HANDSHAKE_ATTEMPTS
    assert str(ei.value) == ("gpu-a: 10.9.0.5:22: the SSH server closed the connection before login 5 times (Error "
                             "reading SSH protocol banner): too many connections at once for its sshd MaxStartups? "
                             "lower orch_ssh_max_handshakes (now 8) or --forks")


def test_login_never_retries_a_refused_login_or_host_key(no_backoff):
    conn = SSHConnection("gpu-a", _route())
    ep = conn.route.target
    refused = _FakeFabric(lambda n: paramiko.AuthenticationException("Authentication failed."))
    with pytest.raises(HostUnreachable, match="authentication failed as root"):
        conn._login(ep, refused, None, ("test-login", 2))
    assert refused.opens == 1
    changed = _FakeFabric(lambda n: HostKeyRefused("gpu-a: host key for 10.9.0.5:22 CHANGED"))
    with pytest.raises(HostUnreachable, match="CHANGED"):
        conn._login(ep, changed, None, ("test-login", 2))
    assert changed.opens == 1


def test_hosts_behind_one_jump_host_share_its_login():
    jump = {"orch_jump_host": "root@10.9.0.1"}
    a = SSHConnection("gpu-a", _route("10.9.0.5", **jump))
    b = SSHConnection("gpu-b", _route("10.9.0.6", **jump))
    assert a._via is b._via and a._via.endpoint.host == "10.9.0.1"
    # trusted by other files, or allowed to add keys: not the same verified login
    c = SSHConnection("gpu-c", _route("10.9.0.7", orch_known_hosts="/tmp/other_known_hosts", **jump))
    d = SSHConnection("gpu-d", _route("10.9.0.8", **jump), accept_new_host_keys=True)
    assert len({id(a._via), id(c._via), id(d._via)}) == 3
    two = SSHConnection("gpu-e", _route("10.9.0.9", orch_jump_host="root@10.9.0.1,root@10.9.0.2"))
    assert two._via.via is a._via  # a chain's first hop is the same shared login
    assert a._gate_key == (("10.9.0.1", 22), ("10.9.0.5", 22))


def test_session_wait_past_the_command_timeout_is_a_timeout():
    conn = SSHConnection("gpu-a", _route(), max_sessions=3)
    for _ in range(3):
        conn.sessions.take(0)
    with pytest.raises(CommandTimeout, match="no free SSH session within 0.05 s for id -un "
                                             r"\(orch_ssh_max_sessions 3 in use\)"):
        with conn._session(0.05, "id -un"):
            pass


def test_inventory_bounds_of_handshakes_and_sessions(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("all:\n  hosts:\n    gpu-a: {orch_ssh_max_sessions: 2}\n")
    with pytest.raises(InventoryError) as ei:
        load_inventory(inv)
    assert str(ei.value) == (f"{inv}:3: host 'gpu-a': orch_ssh_max_sessions must be an integer 3-1000 (orch may "
                             "hold 3 sessions on one connection at once: SFTP, a long command and the lock "
                             "heartbeat beside it), got 2")
    inv.write_text("all:\n  hosts:\n    gpu-a: {orch_ssh_max_handshakes: 0}\n")
    with pytest.raises(InventoryError, match="host 'gpu-a': orch_ssh_max_handshakes must be an integer 1-1000, got 0"):
        load_inventory(inv)
    inv.write_text("all:\n  hosts:\n    gpu-a: {orch_ssh_max_sessions: 3, orch_ssh_max_handshakes: 1}\n")
    hv = load_inventory(inv).host_vars("gpu-a")
    assert (hv["orch_ssh_max_sessions"], hv["orch_ssh_max_handshakes"]) == (3, 1)


class _NoBannerYet:
    """Paramiko's transport before the server's banner came: ``remote_version`` still empty."""

    remote_version = ""


def test_a_banner_read_that_fails_at_once_says_the_link_ended_not_a_timeout(no_backoff):
    conn = SSHConnection("gpu-a", _route(orch_connect_timeout=30), connect_timeout=30)
    ep = conn.route.target
    # a link that went down under the banner read: the kernel answers "no route" long before the timeout
    gone = _FakeFabric(lambda n: _raised_like_paramiko(OSError(113, "No route to host")))
    gone.get_transport = lambda: _NoBannerYet()
    with pytest.raises(HostUnreachable) as ei:
        conn._login(ep, gone, None, ("test-login", 1))
    assert ei.value.transient and gone.opens == 1
    msg = str(ei.value)
    assert msg.startswith("gpu-a: 10.9.0.5:22: the connection ended after 0.") and "before the server sent its SSH " \
        "banner (the link went down, or the peer closed it)" in msg, msg
    assert "within 30 s" not in msg
