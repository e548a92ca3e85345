"""A per-thread deadline that every command on a connection honours (a task's ``timeout:``).

The engine runs each host's play in its own thread and sets the deadline of the running task
around it (:func:`task_deadline`); :meth:`orchestrator.connection.base.Connection.run` cuts each
command's timeout to what is left (:func:`time_left`), and polling loops in tasks stop there. A
thread of its own (the lock heartbeat) has no deadline.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

_local = threading.local()


@contextmanager
def task_deadline(seconds: float | None) -> Iterator[None]:
    """Within the block, this thread's commands must end ``seconds`` from now (None: no limit).
    An outer, earlier deadline still applies."""
    before = getattr(_local, "at", None)
    if seconds is not None:
        at = time.monotonic() + float(seconds)
        _local.at = at if before is None else min(at, before)
    try:
        yield
    finally:
        _local.at = before


def time_left() -> float | None:
    """Seconds left before this thread's deadline (<= 0 when passed), None when there is none."""
    at = getattr(_local, "at", None)
    return None if at is None else at - time.monotonic()


def clamp(timeout: float | None) -> float | None:
    """``timeout`` (s, None: none) cut to :func:`time_left`; at least a few milliseconds so a
    command past the deadline times out at once rather than running unbounded."""
    left = time_left()
    if left is None:
        return timeout
    left = max(left, 0.001)
    return left if timeout is None else min(float(timeout), left)
