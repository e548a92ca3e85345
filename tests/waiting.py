"""Waits that derive from progress, never from the machine's speed (issue 32 row 17).

A test waits on a condition (a process ended, a file appeared, an event was recorded). What ends
a wait that never comes true is not a wall time but a **stall**: nothing the wait watches (an
``orch`` process's output and its run records, a unit's log, a host's files) has changed for
:data:`STALL_S` seconds. While the watched thing makes progress the wait goes on, so a machine
busy with other work makes a test slower, never failing; a hang still ends it, after
:data:`STALL_S` seconds of silence. :data:`CEILING_S` bounds a single command whose end is the
condition itself (a shell command inside a bed host): a hang guard, generous on purpose.

``ORCH_TEST_STALL_S`` overrides :data:`STALL_S` (e.g. lower it to find a hang faster by hand).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

#: seconds without any progress after which a wait counts as hung
STALL_S = float(os.environ.get("ORCH_TEST_STALL_S") or 600)
#: seconds a single command may take before it counts as hung (a hang guard only)
CEILING_S = max(STALL_S, 900.0)


class Stalled(AssertionError):
    """A wait saw no progress for :data:`STALL_S` seconds (a hang); the message says what it waited for."""


def files_state(*roots: str | Path, pattern: str = "*") -> tuple:
    """A fingerprint of the files under ``roots`` matching ``pattern`` (name, size, mtime): it changes
    when one is written, added or removed. A root that is a file counts as itself."""
    out = []
    for root in roots:
        p = Path(root)
        try:
            if p.is_file():
                st = p.stat()
                out.append((str(p), st.st_size, st.st_mtime_ns))
                continue
            for f in sorted(p.rglob(pattern)):
                try:
                    st = f.stat()
                except OSError:
                    continue
                out.append((str(f), st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return tuple(out)


class Watch:
    """Progress of the things a wait watches: each probe is a callable whose value changes as the
    thing moves on (a file fingerprint, a log's length, a count). :meth:`check` raises
    :class:`Stalled` when no probe changed for ``stall`` seconds."""

    def __init__(self, probes: Iterable[Callable[[], Any]] = (), stall: float | None = None, what: str = ""):
        self.probes = list(probes)
        self.stall = STALL_S if stall is None else float(stall)
        self.what = what
        self.last = self._values()
        self.moved_at = time.monotonic()

    def _values(self) -> list:
        vals = []
        for p in self.probes:
            try:
                vals.append(p())
            except Exception as exc:  # a probe that fails now may answer later: that is a change too
                vals.append(repr(exc))
        return vals

    def check(self) -> None:
        """Note progress; raise :class:`Stalled` after ``stall`` s without any."""
        now = self._values()
        if now != self.last:
            self.last, self.moved_at = now, time.monotonic()
        elif time.monotonic() - self.moved_at > self.stall:
            raise Stalled(f"no progress for {self.stall:g} s while waiting for {self.what}")


def wait_until(cond: Callable[[], Any], what: str, *, progress: Iterable[Callable[[], Any]] = (),
               alive: Callable[[], str | None] | None = None, stall: float | None = None,
               poll: float = 0.2) -> Any:
    """Poll ``cond()`` until it returns something true, and return that. ``alive()`` returns why the
    wait is hopeless (e.g. "orch exited (1)"), or None: it fails at once then. ``progress``: probes
    of the things whose movement keeps the wait going (:class:`Watch`); without any, the wait fails
    after ``stall`` s as a hang."""
    watch = Watch(progress, stall, what)
    while True:
        got = cond()
        if got:
            return got
        if alive is not None:
            why = alive()
            if why:
                raise AssertionError(f"{why} before {what}")
        watch.check()
        time.sleep(poll)


def process_ended(proc: subprocess.Popen) -> Callable[[], str | None]:
    """An ``alive`` check for :func:`wait_until`: the process ``proc`` ended (with its status)."""
    return lambda: f"the process exited ({proc.returncode})" if proc.poll() is not None else None


def wait_process(proc: subprocess.Popen, what: str, *, progress: Iterable[Callable[[], Any]] = (),
                 stall: float | None = None) -> int:
    """Wait for ``proc`` to end while ``progress`` moves (:func:`wait_until`); returns its status.
    On a stall the process is killed before :class:`Stalled` is raised."""
    try:
        wait_until(lambda: proc.poll() is not None, what, progress=progress, stall=stall)
    except Stalled:
        proc.kill()
        raise
    return proc.returncode


def run_watched(cmd: list[str], *, progress: Iterable[Callable[[], Any]] = (), stall: float | None = None,
                what: str | None = None, input: str | None = None, **popen: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, input=input)`` without a wall-time
    limit: it waits while the command's own output or ``progress`` moves, and kills it after
    ``stall`` s of silence (:class:`Stalled`)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True,
                                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, **popen)
        if input is not None:
            proc.stdin.write(input)
            proc.stdin.close()
        sizes = [lambda: os.fstat(out.fileno()).st_size, lambda: os.fstat(err.fileno()).st_size]
        wait_process(proc, what or f"`{' '.join(map(str, cmd))[:200]}`", progress=[*sizes, *progress], stall=stall)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
