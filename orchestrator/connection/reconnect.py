"""Reconnecting to a host whose link was lost in the middle of a run (issue 32 row 1).

A link that goes down for a while (a switch reboot, a flapping NIC, a firewall that drops the
session: paramiko #2463, pyinfra #1336) ends the command in flight with
:class:`~orchestrator.connection.base.LinkLost` once the keep-alives or TCP give up on the peer
(:mod:`orchestrator.connection.ssh`). The engine then logs in again with a bounded backoff
(:func:`reconnect`, tenacity): :data:`BACKOFF_S` doubling up to :data:`BACKOFF_MAX_S` plus up to
:data:`JITTER_S` of jitter, each attempt bounded by the connection's own connect timeout, for at
most ``orch_reconnect_timeout`` seconds, and runs the step again (a task declared ``rerun``:
idempotent, or one that reattaches to what it started, as the tune in its transient unit does).
Only a transient failure is retried (:attr:`HostUnreachable.transient`): a refused host key or
login is an answer, and asking again changes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import tenacity

from .base import HostUnreachable

#: seconds of the first wait between two login attempts (doubled each time) ...
BACKOFF_S = 1.0
#: ... at most this long ...
BACKOFF_MAX_S = 15.0
#: ... plus a random 0..JITTER_S, so hosts lost together do not knock together
JITTER_S = 1.0


def is_transient(exc: BaseException) -> bool:
    """True for a :class:`HostUnreachable` that a later attempt may not meet (a lost link, a
    timeout, no route); False for anything else (a refused key or login, a command's failure)."""
    return isinstance(exc, HostUnreachable) and exc.transient


def reconnecting(within: float, *, cancel: threading.Event | None = None,
                 on_retry: Callable[[int, BaseException, float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> tenacity.Retrying:
    """A tenacity ``Retrying`` that retries :func:`is_transient` failures for at most ``within``
    seconds (from its first attempt), waiting :data:`BACKOFF_S` doubling to :data:`BACKOFF_MAX_S`
    plus a random 0-:data:`JITTER_S` s between attempts, and never past ``within``; the last
    failure is re-raised as it is. ``cancel`` (an operator interrupt) ends the waits at once and
    stops the retries. ``on_retry(attempt, exc, wait_s)`` is told before each wait."""
    start = clock()

    def sleep(seconds: float) -> None:
        if cancel is not None:
            cancel.wait(seconds)
        else:
            time.sleep(seconds)

    def stop(state: tenacity.RetryCallState) -> bool:
        return (cancel is not None and cancel.is_set()) or clock() - start >= within

    def wait(state: tenacity.RetryCallState) -> float:
        step = (tenacity.wait_exponential(multiplier=BACKOFF_S, max=BACKOFF_MAX_S)
                + tenacity.wait_random(0, JITTER_S))(state)
        return max(0.0, min(step, within - (clock() - start)))

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None:
            on_retry(state.attempt_number, state.outcome.exception(), state.next_action.sleep)

    return tenacity.Retrying(retry=tenacity.retry_if_exception(is_transient), stop=stop, wait=wait,
                             sleep=sleep, before_sleep=before_sleep, reraise=True)


def reconnect(open_: Callable[[], None], within: float, *, cancel: threading.Event | None = None,
              on_retry: Callable[[int, BaseException, float], None] | None = None) -> int:
    """Call ``open_`` (a connection's login) until it succeeds, as :func:`reconnecting` allows;
    returns the number of attempts. Raises the last :class:`HostUnreachable` when the time is up,
    an operator interrupt came, or a failure is not transient."""
    retrying = reconnecting(within, cancel=cancel, on_retry=on_retry)
    for attempt in retrying:
        with attempt:
            open_()
    return int(retrying.statistics.get("attempt_number", 1))
