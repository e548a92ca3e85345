"""Processes as the payload sees them in ``/proc``, and signalling them safely (standard library).

Shared by the commands that end processes (``reap``: GPU holders; ``port``: holders of the
unit's port): reading ``/proc/PID/stat``/``cmdline``/``exe``, a process's ancestors, whether a
PID still names the process first seen (its start time), and :func:`signal_if_same`, which
signals only that process (through a pidfd where the kernel has them).
"""

from __future__ import annotations

import os
import signal
import time

#: Poll interval while waiting for processes to exit, seconds.
POLL_S = 0.05


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, starttime)`` from ``/proc/PID/stat`` (fields 3, 4, 22); ``None`` if gone."""
    raw = _read(f"/proc/{pid}/stat")
    if not raw:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return rest[0].decode(), int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    """argv of ``pid`` from ``/proc/PID/cmdline`` (empty for kernel threads / gone processes)."""
    raw = _read(f"/proc/{pid}/cmdline") or b""
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")] if raw else []


def exe_name(pid: int) -> str | None:
    """Basename of ``/proc/PID/exe`` (without `` (deleted)``); ``None`` if unreadable."""
    try:
        target = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    if target.endswith(" (deleted)"):
        target = target[: -len(" (deleted)")]
    return os.path.basename(target)


def ancestors(pid: int) -> set[int]:
    """``pid`` and all its ancestors (by PPid), up to and including PID 1."""
    out = {pid}
    cur = pid
    while cur > 1:
        st = proc_stat(cur)
        if st is None:
            break
        cur = st[1]
        if cur in out or cur <= 0:
            break
        out.add(cur)
    out.add(1)
    return out


def alive(pid: int, starttime: int | None) -> bool:
    """True while ``pid`` exists, is not a zombie, and (when given) still has ``starttime``."""
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X", "x"):
        return False
    return starttime is None or st[2] == starttime


def _pids() -> list[int]:
    return sorted(int(n) for n in os.listdir("/proc") if n.isdigit())


def _wait_gone(procs: list[dict], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            if not p["exited"] and not alive(p["pid"], p["starttime"]):
                p["exited"] = True
        if all(p["exited"] for p in procs) or time.monotonic() >= deadline:
            return
        time.sleep(POLL_S)


def signal_if_same(pid: int, starttime: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` only while it is still the process first seen with ``starttime``
    (``/proc/PID/stat`` field 22); returns False, sending nothing, when it is gone, a zombie, or
    the PID now names another process.

    Where the kernel has pidfds (Linux 5.3+, Python 3.9+), the process is pinned with
    ``pidfd_open`` first, its start time is checked, and the signal goes through the pidfd: a
    PID reused between the check and the signal cannot be hit. Elsewhere the check comes right
    before ``kill`` (a window of microseconds).
    """
    fd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:  # ENOSYS (older kernel), EPERM: fall back to kill()
            fd = None
    try:
        if not alive(pid, starttime):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


