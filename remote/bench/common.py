"""What both benchmark clients share: metric names, the validity rule, ``--url`` and prompt counts.

:mod:`remote.bench.builtin` (orch's client), :mod:`remote.engines.sglang.bench_tool` (SGLang's
``bench_serving``) and :mod:`remote.engines.vllm.bench_tool` (``vllm bench serve``) report levels
under these names and judge them by one rule (:data:`MAX_FAILURE_FRACTION`); each imports this
module and none imports another.
Standard library only.
"""

from __future__ import annotations

import http.client
import json
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
