"""Run a command under a deadline that never waits past it: GPU queries (``nvidia-smi``) and the
kernel log.

Why: after an Xid error ``nvidia-smi`` can hang in the kernel (D state) forever (leptonai/gpud
#117, dcgm-exporter #84). ``subprocess.run(timeout=...)`` kills the child and then waits for it;
a process in D state does not die on SIGKILL, so that wait never ends either. :func:`run_bounded`
starts the command in its own process group, SIGKILLs the group at the deadline, waits at most
``grace_s`` more for it to go and then gives up on it: the result says ``hung`` and the process
is left where it is (nothing can end it; a reboot or a GPU reset does). Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass

#: seconds a GPU query may take before it counts as not answering (a healthy ``nvidia-smi
#: --query-gpu`` answers in well under a second; the first call on a host without the persistence
#: daemon initialises the driver, a few seconds)
GPU_QUERY_TIMEOUT_S = 20.0


@dataclass
class Bounded:
    """The outcome of :func:`run_bounded`.

    ``state``: ``ok`` (exit 0), ``failed`` (another exit status), ``timeout`` (killed at the
    deadline, and it went), ``hung`` (killed at the deadline and still there, or its output still
    held open, after ``grace_s``: in D state), ``missing`` (could not be started: not found, not
    executable). ``returncode`` (None unless it exited), ``stdout``/``stderr`` (text, what came
    before the deadline; empty for ``hung``), ``elapsed_s`` (seconds), ``reason`` (a sentence for
    any state but ``ok``, else "")."""

    state: str
    returncode: int | None
    stdout: str
    stderr: str
    elapsed_s: float
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 before its deadline."""
        return self.state == "ok"

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def run_bounded(argv: list[str], timeout_s: float = GPU_QUERY_TIMEOUT_S, grace_s: float = 2.0,
                env: dict | None = None) -> Bounded:
    """Run ``argv`` (no shell), stdin from /dev/null, output captured as text, for at most
    ``timeout_s`` seconds, plus at most ``grace_s`` seconds to see it go after SIGKILL to its
    process group. Never raises for the command's own failures (see :class:`Bounded`); never
    blocks longer than ``timeout_s + grace_s`` (plus the time to start it)."""
    start = time.monotonic()
    name = os.path.basename(argv[0]) if argv else "?"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True, env=env)
    except OSError as exc:
        return Bounded("missing", None, "", "", time.monotonic() - start, f"cannot run {name}: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    else:
        took = time.monotonic() - start
        if proc.returncode == 0:
            return Bounded("ok", 0, out, err, took)
        return Bounded("failed", proc.returncode, out, err, took,
                       f"{name} exited {proc.returncode}: {(err or out).strip()[:200]}")
    try:  # its own session: the group id is its pid
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        out, err = proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        # still alive after SIGKILL (D state) or something it started holds its output open: give
        # up on it; closing our ends makes a late writer get EPIPE, never us wait
        for pipe in (proc.stdout, proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
        return Bounded("hung", None, "", "", time.monotonic() - start,
                       f"{name} did not answer within {timeout_s:g} s and could not be ended "
                       f"(SIGKILL; still there after {grace_s:g} s: a process stuck in the kernel, as a "
                       "GPU query is after a GPU error the driver reported, leptonai/gpud #117)")
    return Bounded("timeout", proc.returncode, out or "", err or "", time.monotonic() - start,
                   f"{name} did not answer within {timeout_s:g} s (killed)")
