"""The host lock's file, shared by the commands that read or change it: ``lock`` (remote/host/lock.py)
and the host's dead-man (remote/host/deadman.py). Standard library only."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Iterator

from .fs import PRIVATE_FILE_MODE, ensure_private_dir


def lock_path(state_dir: str) -> str:
    """``<state_dir>/lock.json``."""
    return os.path.join(state_dir, "lock.json")


@contextlib.contextmanager
def mutex(state_dir: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<state_dir>/lock.mutex`` (created 0600) for a block."""
    ensure_private_dir(state_dir)
    fd = os.open(os.path.join(state_dir, "lock.mutex"), os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Corrupt(dict):
    """Marker for a lock.json that exists but does not parse."""


def read_lock(state_dir: str) -> dict | None:
    """The lock as a dict, ``None`` when absent, a :class:`Corrupt` dict when unreadable."""
    try:
        with open(lock_path(state_dir), "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(raw.decode("utf-8"))
        if not isinstance(obj, dict):
            raise ValueError("not an object")
        return obj
    except ValueError as exc:
        return Corrupt(error=f"corrupt lock.json: {exc}")
