"""What both benchmark clients share: metric names, the validity rule, ``--url``, prompt counts, and
how an engine's own client process is run (:func:`run_client`).

:mod:`remote.bench.builtin` (orch's client), :mod:`remote.engines.sglang.bench_tool` (SGLang's
``bench_serving``) and :mod:`remote.engines.vllm.bench_tool` (``vllm bench serve``) report levels
under these names and judge them by one rule (:data:`MAX_FAILURE_FRACTION`); each imports this
module and none imports another.
Standard library only.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import signal
import subprocess
import threading
import urllib.parse
from dataclasses import dataclass

from ..protocol import PayloadError

# Metric names shared with sglang.bench_serving's --output-file JSON (SGLang 0.5.x `benchmark`).
METRIC_NAMES = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
)
#: Extra per-level fields orch adds.
LEVEL_EXTRA_NAMES = ("max_concurrency", "failed", "timed_out", "valid")

#: A level with more unsuccessful requests than this fraction of num_prompts is invalid.
MAX_FAILURE_FRACTION = 0.01


def judge_tool_level(level: dict, num_prompts: int, rc: int | None) -> dict:
    """Set ``failure_rate`` and ``valid`` of one level an engine's own client measured (``level`` has
    ``completed``, ``failed`` and ``timed_out``; ``rc``: the client's exit status, None when it ran out
    of time): valid when the client exited 0, completed a request and left at most
    :data:`MAX_FAILURE_FRACTION` of ``num_prompts`` failed or timed out. Returns ``level``."""
    bad = level["failed"] + level["timed_out"]
    level["failure_rate"] = bad / num_prompts
    level["valid"] = rc == 0 and (level["completed"] or 0) > 0 and bad <= MAX_FAILURE_FRACTION * num_prompts
    return level


@dataclass
class Target:
    """Where requests go: parsed from ``--url`` (``http://host:port[/prefix]``)."""

    scheme: str
    host: str
    port: int
    prefix: str  # path prefix without trailing slash, usually ""

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        """A new (unconnected) HTTP(S) connection with socket timeout ``timeout`` s."""
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)


def parse_url(url: str) -> Target:
    """Parse ``--url``; raise ``PayloadError("bad_input")`` unless it is http(s)://host[:port]."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise PayloadError("bad_input", f"bad --url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PayloadError("bad_input", f"bad --url {url!r}: want http://host:port")
    if parts.query or parts.fragment:
        raise PayloadError("bad_input", f"bad --url {url!r}: no query or fragment allowed")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return Target(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def get_json(target: Target, path: str, timeout: float) -> tuple[int, object]:
    """``GET <prefix><path>`` and its body as JSON (at most 1 MiB): ``(status, parsed body)``.
    Raises OSError, ``http.client.HTTPException`` or ValueError as the request or parse fails."""
    conn = target.connection(timeout=timeout)
    try:
        conn.request("GET", target.prefix + path)
        resp = conn.getresponse()
        body = resp.read(1 << 20)
        return resp.status, (json.loads(body) if resp.status == 200 else None)
    finally:
        conn.close()


def server_version(target: Target, timeout: float = 10.0) -> str | None:
    """The ``version`` the server reports at ``GET /get_server_info`` (SGLang's server info), or
    None when it does not answer with one (best effort: a benchmark does not depend on it)."""
    try:
        status, info = get_json(target, "/get_server_info", timeout)
        version = info.get("version") if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return None
    return str(version) if version else None


def default_num_prompts(concurrency: int) -> int:
    """Prompts per level when --num-prompts is not given: max(5 * C, 10) (steady state)."""
    return max(5 * concurrency, 10)


#: Linux prctl(2) option: the signal a process gets when its parent dies (``PR_SET_PDEATHSIG``)
_PR_SET_PDEATHSIG = 1
#: the payload's ending signals that also end a running client (SIGKILL is the kernel's, below)
_END_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _die_with_parent(parent: int):
    """The child side of :func:`run_client` (``preexec_fn``): SIGKILL when the payload dies. ``prctl`` is
    looked up here, in the parent: the child, between fork and exec, only calls it (loading a library
    there could wait forever on a lock another thread of the parent held at the fork)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the signal handlers below still end it
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the payload died between fork and prctl
            os._exit(1)
    return arm


def run_client(cmd: list[str], timeout: float, keep: int) -> tuple[int | None, str]:
    """Run an engine's own benchmark client (``sglang.bench_serving``, ``vllm bench serve``) for one
    concurrency level and wait for it: ``(exit status, None when killed at ``timeout`` s; the last
    ``keep`` characters of its stdout and stderr)``.

    The client runs in a session of its own, so the timeout kills all it started (its process group).
    It also ends with the payload, so that a cancelled run or a lost link stops the load on the
    server instead of leaving it running until the level's timeout:

    - SIGTERM, SIGHUP or SIGINT to the payload while the client runs (what ``orch`` sends on Ctrl-C
      through the ``timeout`` wrapper, :mod:`orchestrator.payload.client`) kills the client's process
      group with SIGKILL, then the signal takes its earlier course in the payload (a signal the payload
      ignores stays ignored and leaves the client running);
    - the payload's death by any signal, SIGKILL included, kills the client (Linux ``prctl(2)``
      ``PR_SET_PDEATHSIG``, set in the client before it runs its program);
    - an exception while waiting (an output pipe gone with the SSH link) kills the group too.

    Signal handlers are only set from the main thread (Python's rule); elsewhere the other two hold.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    old: dict[int, object] = {}

    def on_signal(sig, frame) -> None:
        kill_group()
        # the payload's own handling of the signal, as if the client had not been running
        signal.signal(sig, old[sig])
        os.kill(os.getpid(), sig)

    if threading.current_thread() is threading.main_thread():
        for sig in _END_SIGNALS:
            before = signal.getsignal(sig)
            # an ignored signal stays ignored (nohup, a background job's SIGINT); a handler set outside
            # Python (None) cannot be put back, so it is left alone as well
            if before is signal.SIG_IGN or before is None:
                continue
            old[sig] = before
            signal.signal(sig, on_signal)
    rc: int | None
    try:
        try:
            out, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group()
            out, _ = proc.communicate(timeout=30)
            rc = None
    except BaseException:
        kill_group()
        raise
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return rc, (out or b"").decode("utf-8", "replace")[-keep:]
