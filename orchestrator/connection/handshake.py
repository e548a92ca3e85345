"""Bounds on what one SSH server is asked at once: handshakes in flight, sessions per connection.

OpenSSH's sshd drops new connections while too many are still unauthenticated (``MaxStartups``,
default ``10:30:100``: from 10 on, 30 % are dropped, all at 100; sshd_config(5)); the client then
reads EOF instead of the server's banner, and Paramiko raises ``SSHException("Error reading SSH
protocol banner")`` (paramiko #664, #528; fabric #1992: many hosts behind one bastion). And sshd
refuses a session channel past ``MaxSessions`` (default 10) per connection ("administratively
prohibited"). So orch:

* keeps at most ``orch_ssh_max_handshakes`` handshakes (TCP connect to the end of the login) in
  flight to one SSH server (a jump host, or a host by its address behind its jump hosts):
  :class:`HandshakeGate`;
* retries a handshake that the server dropped before the login (:func:`is_handshake_drop`),
  :data:`HANDSHAKE_ATTEMPTS` attempts in all with exponential backoff and jitter
  (:func:`handshake_retrying`, tenacity). Never a refused login, a refused or changed host key,
  a refused TCP connect or a timeout: those are answers, and asking again changes nothing;
* opens at most ``orch_ssh_max_sessions`` sessions at once on one connection
  (:class:`SessionSlots`), and opens again a session that sshd refused while the link stays up
  (:func:`is_session_refused`, :func:`session_retrying`): sshd frees a closed session only after
  it has read the close, so a new one asked for right behind it can still find the count full.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Hashable, Iterator

import paramiko
import tenacity

#: attempts of one handshake in all (the first and 4 retries) when the server drops it before login
HANDSHAKE_ATTEMPTS = 5
#: seconds of the first backoff (doubled each retry, at most HANDSHAKE_BACKOFF_MAX_S) ...
HANDSHAKE_BACKOFF_S = 0.5
HANDSHAKE_BACKOFF_MAX_S = 8.0
#: ... plus a random 0..HANDSHAKE_JITTER_S, so hosts dropped together do not come back together
HANDSHAKE_JITTER_S = 1.0

#: what a connection that sshd closed before or during the key exchange raises from Paramiko
#: (EOF on the socket, or a reset; Paramiko's transport thread re-raises them from connect)
_DROPPED = (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
#: the prefix of Paramiko's message when the banner could not be read (paramiko/transport.py)
BANNER_ERROR = "Error reading SSH protocol banner"


def is_handshake_drop(exc: BaseException) -> bool:
    """True when ``exc`` (raised by Paramiko's ``SSHClient.connect``) says the server closed the
    connection before the login: EOF or a reset while reading the banner (Paramiko's
    ``SSHException("Error reading SSH protocol banner...")`` whose context is ``EOFError`` or a
    reset), or during the key exchange (the ``EOFError``/``ConnectionResetError`` itself), as
    sshd does past ``MaxStartups``. False for everything else, in particular a failed
    authentication, a host key refused, an unanswered banner (a timeout: the server is there but
    hung), a refused TCP connect, and a jump host's refusal to open a channel."""
    if isinstance(exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException,
                        paramiko.ChannelException)):
        return False
    if isinstance(exc, _DROPPED):
        return True
    if isinstance(exc, paramiko.SSHException) and str(exc).startswith(BANNER_ERROR):
        cause = exc.__cause__ or exc.__context__
        if cause is None:  # raised without its cause: read the message (Paramiko appends str(cause))
            return "timed out" not in str(exc)
        return isinstance(cause, _DROPPED)
    return False


def handshake_retrying(sleep: Callable[[float], None] = time.sleep,
                       on_retry: Callable[[int, BaseException, float], None] | None = None) -> tenacity.Retrying:
    """A tenacity ``Retrying`` for one handshake: retries only :func:`is_handshake_drop`
    exceptions, :data:`HANDSHAKE_ATTEMPTS` attempts in all, waiting ``HANDSHAKE_BACKOFF_S * 2**n``
    s (at most ``HANDSHAKE_BACKOFF_MAX_S``) plus a random 0-``HANDSHAKE_JITTER_S`` s between them;
    the last exception is re-raised as it is. ``on_retry(attempt, exc, wait_s)`` is told before
    each wait. Use as ``for attempt in handshake_retrying(): with attempt: ...``."""
    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None:
            on_retry(state.attempt_number, state.outcome.exception(), state.next_action.sleep)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_handshake_drop),
        stop=tenacity.stop_after_attempt(HANDSHAKE_ATTEMPTS),
        wait=tenacity.wait_exponential(multiplier=HANDSHAKE_BACKOFF_S, max=HANDSHAKE_BACKOFF_MAX_S)
        + tenacity.wait_random(0, HANDSHAKE_JITTER_S),
        sleep=sleep, reraise=True, before_sleep=before_sleep)


#: attempts to open one session channel that sshd refused, and the first backoff (s), doubled each time
SESSION_ATTEMPTS = 5
SESSION_BACKOFF_S = 0.1
#: what Paramiko's Transport.open_channel raises when the server refused the channel (it never opened:
#: the command did not start)
_UNABLE = "Unable to open channel."


def is_session_refused(exc: BaseException) -> bool:
    """True when ``exc`` says the server refused to open a channel: Paramiko's
    ``ChannelException`` (sshd's "administratively prohibited" or "open failed" past
    ``MaxSessions``) or ``SSHException("Unable to open channel.")``. Nothing ran on the host then,
    so opening it again is safe. The caller checks that the link is still up."""
    return isinstance(exc, paramiko.ChannelException) or (
        type(exc) is paramiko.SSHException and str(exc) == _UNABLE)


def session_retrying(sleep: Callable[[float], None] = time.sleep,
                     alive: Callable[[], bool] = lambda: True) -> tenacity.Retrying:
    """A tenacity ``Retrying`` for opening one session: retries :func:`is_session_refused`
    while ``alive()``, :data:`SESSION_ATTEMPTS` attempts in all, ``SESSION_BACKOFF_S * 2**n`` s
    apart plus a random 0-``SESSION_BACKOFF_S`` s; the last exception is re-raised."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda e: is_session_refused(e) and alive()),
        stop=tenacity.stop_after_attempt(SESSION_ATTEMPTS),
        wait=tenacity.wait_exponential(multiplier=SESSION_BACKOFF_S, max=2.0) + tenacity.wait_random(0, SESSION_BACKOFF_S),
        sleep=sleep, reraise=True)


class HandshakeGate:
    """The handshakes in flight to one SSH server from this process, at most a bound at once.

    One gate per server key (:meth:`of`: shared by every connection of the process that goes to
    that server). :meth:`slot` waits while ``limit`` handshakes are in flight (each caller gives its
    own host's ``orch_ssh_max_handshakes``), then counts this one until the block ends. The wait has
    no timeout of its own: each handshake in flight ends within its connect timeout. ``peak`` is
    the most seen in flight at once (for tests and messages)."""

    _gates: dict[Hashable, "HandshakeGate"] = {}
    _gates_lock = threading.Lock()

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.in_flight = 0
        self.peak = 0

    @classmethod
    def of(cls, key: Hashable) -> "HandshakeGate":
        """The process's gate for server ``key`` (made on first use)."""
        with cls._gates_lock:
            gate = cls._gates.get(key)
            if gate is None:
                gate = cls._gates[key] = cls()
            return gate

    @contextmanager
    def slot(self, limit: int) -> Iterator[None]:
        """Hold one of at most ``limit`` (at least 1) handshake slots for the block."""
        limit = max(1, int(limit))
        with self._cond:
            while self.in_flight >= limit:
                self._cond.wait()
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()


class SessionSlots:
    """At most ``limit`` sessions (exec channels, the SFTP channel) open at once on one SSH
    connection, so orch never asks past sshd's ``MaxSessions``. :meth:`hold` waits up to
    ``timeout`` s (None: as long as it takes) and raises :class:`TimeoutError` past it; a slot held
    for the connection's life (the SFTP channel, which Fabric keeps open) is :meth:`take`-n and
    :meth:`give`-n back by hand. ``peak`` is the most held at once."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self._sem = threading.BoundedSemaphore(self.limit)
        self._lock = threading.Lock()
        self.held = 0
        self.peak = 0

    def take(self, timeout: float | None = None) -> None:
        """Take one slot; raises :class:`TimeoutError` after ``timeout`` s without one."""
        got = self._sem.acquire() if timeout is None else self._sem.acquire(timeout=max(0.0, timeout))
        if not got:
            raise TimeoutError(f"no free SSH session within {timeout} s ({self.limit} open on this connection)")
        with self._lock:
            self.held += 1
            self.peak = max(self.peak, self.held)

    def give(self) -> None:
        """Give one slot back."""
        with self._lock:
            self.held -= 1
        self._sem.release()

    @contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[None]:
        """Hold one slot for the block (see :meth:`take`)."""
        self.take(timeout)
        try:
            yield
        finally:
            self.give()


__all__ = ["HANDSHAKE_ATTEMPTS", "SESSION_ATTEMPTS", "BANNER_ERROR", "is_handshake_drop", "handshake_retrying",
           "is_session_refused", "session_retrying", "HandshakeGate", "SessionSlots"]
