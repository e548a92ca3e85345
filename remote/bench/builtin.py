"""orch's own benchmark client (``bench --tool builtin``, the default): standard library only.

It uses only the standard library (the host's Python has no httpx):
one thread per in-flight request, ``http.client`` streaming, Server-Sent-Events lines
``data: {json}`` ending with ``data: [DONE]``. It talks to ``--url`` and nothing else,
never retries, and bounds every loop by a count and a deadline.

Request bodies:

- ``--api generate``: the engine's native streamed request (``--engine``; ``Engine.bench_request``
  and ``Engine.bench_chunk``): for SGLang what ``python -m sglang.bench_serving --backend sglang``
  sends, ``POST /generate`` with ``{"input_ids": [...], "sampling_params": {"temperature": 0.0,
  "max_new_tokens": O, "ignore_eos": true}, "stream": true}``, each chunk carrying ``text``
  (cumulative) and ``meta_info.completion_tokens`` (cumulative count of generated tokens) and
  ``meta_info.prompt_tokens`` (:mod:`remote.engines.sglang.http`).
- ``--api openai``: ``POST /v1/completions`` with ``{"model", "prompt": [ids...],
  "max_tokens": O, "temperature": 0.0, "ignore_eos": true, "stream": true,
  "stream_options": {"include_usage": true}}``; chunks carry ``choices[0].text`` and the
  last one ``usage.completion_tokens``/``usage.prompt_tokens``.

Measurement (same definitions as sglang.bench_serving ``calculate_metrics``):

- TTFT: from just before the connection is opened to the first content chunk: on
  ``/generate`` with counts, a chunk whose ``completion_tokens`` grew (a repeated count
  is skipped); otherwise a chunk with non-empty text (one token each).
- ITL: gaps between later content chunks; a chunk that reports k > 1 new tokens
  contributes k gaps of (gap / k), as bench_serving does for ``/generate``.
- E2E latency: from the start to the last line read (``[DONE]``).
- ``duration``: wall time of the level, first dispatch to the last request's end.
- Output tokens of a request: the server's ``completion_tokens`` when reported, else
  the number of content chunks. Input tokens: the server's ``prompt_tokens`` when
  reported, else the number of ids sent.
- Percentiles interpolate linearly between order statistics (numpy's default).
Counting: every measured request ends in exactly one of ``completed``, ``failed``
(HTTP status other than 200, a connection error, an ``error`` object in the stream,
a malformed stream, or no content at all), ``timed_out`` (``--request-timeout``
exceeded, or cut by the ``--level-timeout`` deadline while in flight) or ``not_sent``
(the level deadline passed before it started; these also count in ``timed_out``).
``--level-timeout`` bounds a level's warm-up and measured requests together; warm-up
requests (``--warmup``, at most 32 output tokens each) are not part of the metrics,
their failures are counted in ``warmup_failed``. A level is ``valid`` only if ``completed > 0`` and (failed + timed_out) <= 1% of
``num_prompts``. Latency metrics are over completed requests only; throughputs divide
completed requests' tokens by ``duration``. Times with no samples are ``null``.

A level's ``data`` entry and the command's result are described in :mod:`remote.bench.command`.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..engines import engine_named
from ..protocol import PayloadError, internal_error, log, progress
from .common import MAX_FAILURE_FRACTION, Target, default_num_prompts, get_json, parse_url

# Random prompt token ids are drawn from [VOCAB_LO, vocab_hi): low ids are special
# tokens in most vocabularies; 32000 is below the vocabulary size of every model
# family orch targets (Llama-2/Mixtral 32000, Qwen 151936, DeepSeek 129280).
VOCAB_LO = 100
DEFAULT_VOCAB_HI = 32000


def make_prompts(count: int, input_len: int, seed: int, vocab_hi: int = DEFAULT_VOCAB_HI) -> list[list[int]]:
    """``count`` prompts of exactly ``input_len`` random token ids in [VOCAB_LO, vocab_hi).

    Deterministic for a given ``seed`` (``random.Random``); no dataset, no tokenizer.
    """
    if vocab_hi <= VOCAB_LO:
        raise PayloadError("bad_input", f"--vocab-max must be > {VOCAB_LO}")
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB_LO, vocab_hi) for _ in range(input_len)] for _ in range(count)]


def request_body(api: str, ids: list[int], output_len: int, model: str | None,
                 engine: str | None = None) -> tuple[str, dict]:
    """(path, JSON body) of one streaming request; see the module docstring for the shapes
    (``generate``: the native request of ``engine``, ``Engine.bench_request``; None: the default engine)."""
    if api == "generate":
        req = engine_named(engine).bench_request(ids, output_len)
        return req.path, dict(req.body or {})
    if api == "openai":
        return "/v1/completions", {
            "model": model,
            "prompt": ids,
            "max_tokens": output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    raise PayloadError("bad_input", f"unknown --api {api!r}")


@dataclass
class ChunkInfo:
    """What one parsed SSE ``data:`` object says."""

    has_text: bool = False
    completion_tokens: int | None = None  # cumulative count, when the server reports it
    prompt_tokens: int | None = None
    error: str | None = None


def parse_chunk(api: str, data: Any, engine: str | None = None) -> ChunkInfo:
    """Interpret one decoded JSON chunk of a native (``generate``: ``Engine.bench_chunk`` of
    ``engine``) or ``/v1/completions`` stream."""
    info = ChunkInfo()
    if not isinstance(data, dict):
        info.error = f"unexpected chunk {str(data)[:100]!r}"
        return info
    if data.get("error") is not None:
        err = data["error"]
        info.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
        return info
    if api == "generate":
        info.has_text, usage = engine_named(engine).bench_chunk(data)
    else:
        choices = data.get("choices") or []
        info.has_text = bool(choices and isinstance(choices[0], dict) and choices[0].get("text"))
        usage = data.get("usage") or {}
    if isinstance(usage, Mapping):
        ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
        info.completion_tokens = ct if isinstance(ct, int) and not isinstance(ct, bool) else None
        info.prompt_tokens = pt if isinstance(pt, int) and not isinstance(pt, bool) else None
    return info


@dataclass
class RequestRecord:
    """Outcome of one request. Times are ``time.perf_counter()`` seconds."""

    status: str = "failed"  # "completed" | "failed" | "timed_out"
    error: str | None = None
    start: float = 0.0
    end: float = 0.0
    ttft: float | None = None  # s
    itl: list[float] = field(default_factory=list)  # s, one entry per generated token after the first
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunks: int = 0  # content chunks seen

    @property
    def latency(self) -> float:
        """E2E latency in seconds."""
        return self.end - self.start


@internal_error("a request ran past its deadline; the request's loop in this module records it as "
                "timed_out")
class _Timeout(Exception):
    """A request ran past its deadline (caught by the request loop)."""


def stream_request(
    target: Target,
    api: str,
    ids: list[int],
    output_len: int,
    model: str | None,
    request_timeout: float,
    deadline: float,
    engine: str | None = None,
) -> RequestRecord:
    """Send one streaming request and time it; never raises for server or network faults.

    ``deadline`` is an absolute ``time.perf_counter()`` bound (the level deadline); the
    request gives up at min(start + request_timeout, deadline) and is then ``timed_out``.
    The number of lines read is bounded by 8 * output_len + 64.
    """
    rec = RequestRecord(prompt_tokens=len(ids))
    path, body = request_body(api, ids, output_len, model, engine)
    payload = json.dumps(body).encode()
    rec.start = time.perf_counter()
    stop_at = min(rec.start + request_timeout, deadline)
    conn = None
    last_ct = 0  # last cumulative completion_tokens reported
    counted_chunks = 0
    reported_ct: int | None = None
    last_ts = rec.start
    max_lines = 8 * output_len + 64
    try:
        remaining = stop_at - time.perf_counter()
        if remaining <= 0:
            raise _Timeout()
        conn = target.connection(timeout=remaining)
        conn.request(
            "POST",
            target.prefix + path,
            body=payload,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(2000).decode("utf-8", "replace")
            rec.error = f"HTTP {resp.status} {resp.reason}: {text[:200]}"
            rec.end = time.perf_counter()
            return rec
        done = False
        for _ in range(max_lines):
            remaining = stop_at - time.perf_counter()
            if remaining <= 0:
                raise _Timeout()
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            raw = resp.readline(1 << 24)
            if not raw:
                break  # server closed the stream
            line = raw.strip()
            if not line or line.startswith(b":"):
                continue
            if line.startswith(b"data:"):
                line = line[5:].strip()
            if line == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            try:
                data = json.loads(line)
            except ValueError:
                rec.error = f"malformed stream line {line[:100]!r}"
                rec.end = now
                return rec
            info = parse_chunk(api, data, engine)
            if info.error is not None:
                rec.error = f"server error in stream: {info.error}"
                rec.end = now
                return rec
            if info.prompt_tokens is not None:
                rec.prompt_tokens = info.prompt_tokens
            # /generate reports a running count in every chunk: a chunk is new content when
            # the count grew (a repeat with the same count is skipped, as bench_serving does).
            # OpenAI's usage is a final total on a chunk without choices: there, and on
            # servers that send no counts, a chunk with text is one new token.
            ct = info.completion_tokens
            if ct is not None:
                reported_ct = max(reported_ct or 0, ct)
            if api == "generate" and ct is not None:
                if ct <= last_ct:
                    continue
                new_tokens = ct - last_ct
                last_ct = ct
            elif info.has_text:
                new_tokens = 1
            else:
                continue
            counted_chunks += 1
            if rec.ttft is None:
                rec.ttft = now - rec.start
            else:
                gap = now - last_ts
                rec.itl.extend([gap / new_tokens] * new_tokens)
            last_ts = now
        else:
            rec.error = f"stream longer than {max_lines} lines"
            rec.end = time.perf_counter()
            return rec
        rec.end = time.perf_counter()
        rec.chunks = counted_chunks
        rec.output_tokens = reported_ct if reported_ct is not None else counted_chunks
        if rec.ttft is None:
            rec.error = "stream ended without any generated token" + ("" if done else " (no [DONE])")
            return rec
        rec.status = "completed"
        return rec
    except (_Timeout, socket.timeout, TimeoutError):
        rec.status = "timed_out"
        rec.error = f"no complete answer within {min(request_timeout, stop_at - rec.start):.1f} s"
        rec.end = time.perf_counter()
        return rec
    except (OSError, http.client.HTTPException, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        rec.end = time.perf_counter()
        return rec
    finally:
        if conn is not None:
            conn.close()


def percentile(values: list[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation, as numpy.percentile's default.

    Raises ValueError on an empty list.
    """
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms_stats(prefix: str, values_s: list[float], with_p99: bool = True) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    if values_s:
        out[f"mean_{prefix}_ms"] = sum(values_s) / len(values_s) * 1000.0
        out[f"median_{prefix}_ms"] = percentile(values_s, 50) * 1000.0
        if with_p99:
            out[f"p99_{prefix}_ms"] = percentile(values_s, 99) * 1000.0
    else:
        out[f"mean_{prefix}_ms"] = out[f"median_{prefix}_ms"] = None
        if with_p99:
            out[f"p99_{prefix}_ms"] = None
    return out


def compute_level_metrics(
    records: list[RequestRecord | None],
    duration: float,
    max_concurrency: int,
    num_prompts: int,
) -> dict[str, Any]:
    """Per-level metrics dict (names in METRIC_NAMES + LEVEL_EXTRA_NAMES and a few more).

    ``records`` has one entry per measured request; ``None`` means never sent (level
    deadline). ``duration`` is the level's wall time in seconds (> 0).
    """
    done = [r for r in records if r is not None and r.status == "completed"]
    failed = [r for r in records if r is not None and r.status == "failed"]
    timed = [r for r in records if r is not None and r.status == "timed_out"]
    not_sent = sum(1 for r in records if r is None) + max(0, num_prompts - len(records))
    dur = duration if duration > 0 else float("nan")
    tin = sum(r.prompt_tokens for r in done)
    tout = sum(r.output_tokens for r in done)
    m: dict[str, Any] = {
        "max_concurrency": max_concurrency,
        "num_prompts": num_prompts,
        "duration": duration,
        "completed": len(done),
        "failed": len(failed),
        "timed_out": len(timed) + not_sent,
        "not_sent": not_sent,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": len(done) / dur,
        "input_throughput": tin / dur,
        "output_throughput": tout / dur,
        "total_throughput": (tin + tout) / dur,
    }
    m.update(_ms_stats("ttft", [r.ttft for r in done if r.ttft is not None]))
    m.update(_ms_stats("itl", [g for r in done for g in r.itl]))
    m.update(_ms_stats("e2e_latency", [r.latency for r in done]))
    bad = m["failed"] + m["timed_out"]
    m["failure_rate"] = bad / num_prompts if num_prompts else 1.0
    m["valid"] = bool(done) and bad <= MAX_FAILURE_FRACTION * num_prompts
    errors: list[str] = []
    for r in failed + timed:
        if r.error and r.error not in errors and len(errors) < 5:
            errors.append(r.error)
    if not_sent and len(errors) < 5:
        errors.append(f"{not_sent} request(s) not sent: level deadline reached")
    m["errors"] = errors
    for k, v in list(m.items()):
        if isinstance(v, float) and not math.isfinite(v):
            m[k] = None
    return m


def run_requests(
    target: Target,
    api: str,
    prompts: list[list[int]],
    output_len: int,
    model: str | None,
    concurrency: int,
    request_timeout: float,
    deadline: float,
    engine: str | None = None,
) -> tuple[list[RequestRecord | None], float]:
    """Run ``len(prompts)`` requests with at most ``concurrency`` in flight.

    Returns (records in prompt order, None for never sent; wall time in s). No request
    starts after ``deadline`` (perf_counter seconds); threads are joined by deadline + 10 s
    and a request still running then is recorded as timed out.
    """
    n = len(prompts)
    records: list[RequestRecord | None] = [None] * n
    started = [False] * n
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        for _ in range(n):  # bounded: each iteration takes one new index
            with lock:
                i = next_index[0]
                if i >= n or time.perf_counter() >= deadline:
                    return
                next_index[0] = i + 1
                started[i] = True
            records[i] = stream_request(target, api, prompts[i], output_len, model, request_timeout, deadline,
                                        engine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{k}") for k in range(min(concurrency, n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + 10.0 - time.perf_counter()))
    wall = time.perf_counter() - t0
    with lock:
        for i in range(n):
            if started[i] and records[i] is None:  # stuck past the deadline (e.g. in DNS)
                records[i] = RequestRecord(status="timed_out", error="still running after the level deadline",
                                           start=t0, end=time.perf_counter())
    ends = [r.end for r in records if r is not None]
    if ends:
        wall = max(ends) - t0
    return records, wall


def discover_model(target: Target, timeout: float) -> str:
    """First model id from ``GET /v1/models`` (OpenAI list format); PayloadError("runtime") if none."""
    try:
        status, listing = get_json(target, "/v1/models", timeout)
        if status != 200:
            raise PayloadError("runtime", f"GET /v1/models: HTTP {status}; pass --model")
        data = listing.get("data") or []
        if not data or not data[0].get("id"):
            raise PayloadError("runtime", "GET /v1/models listed no model; pass --model")
        return str(data[0]["id"])
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        raise PayloadError("runtime", f"GET /v1/models failed: {exc}; pass --model") from None


def run_builtin(
    url: str,
    levels: list[int],
    input_len: int,
    output_len: int,
    num_prompts: int | None = None,
    api: str = "generate",
    warmup: int = 1,
    level_timeout: float = 600.0,
    request_timeout: float = 300.0,
    seed: int = 1,
    model: str | None = None,
    vocab_hi: int = DEFAULT_VOCAB_HI,
    engine: str | None = None,
) -> dict[str, Any]:
    """Run the built-in benchmark over ``levels`` (concurrency values); returns result data.
    ``engine``: whose native API ``api`` ``generate`` is (None: the default engine).

    Token lengths are counts of tokens; timeouts are seconds. Emits one ``progress``
    line per finished level. Raises PayloadError for bad input (see module docstring).
    """
    target = parse_url(url)
    if api not in ("generate", "openai"):
        raise PayloadError("bad_input", f"unknown --api {api!r}")
    for name, v in (("--input-len", input_len), ("--output-len", output_len)):
        if v < 1:
            raise PayloadError("bad_input", f"{name} must be >= 1")
    if num_prompts is not None and num_prompts < 1:
        raise PayloadError("bad_input", "--num-prompts must be >= 1")
    if not warmup >= 0:
        raise PayloadError("bad_input", f"--warmup must be 0 or more, got {warmup}")
    for name, v in (("--level-timeout", level_timeout), ("--request-timeout", request_timeout)):
        if not 0 < v < float("inf"):
            raise PayloadError("bad_input", f"{name} must be a positive number of seconds, got {v}")
    if api == "openai" and not model:
        model = discover_model(target, min(request_timeout, 30.0))
    results = []
    for li, conc in enumerate(levels):
        n = num_prompts if num_prompts is not None else default_num_prompts(conc)
        prompts = make_prompts(n + warmup, input_len, seed + li, vocab_hi)
        level_start = time.perf_counter()
        deadline = level_start + level_timeout
        warmup_failed = 0
        if warmup:
            wrecs, _ = run_requests(target, api, prompts[n:], min(output_len, 32), model,
                                    min(conc, warmup), request_timeout, deadline, engine)
            warmup_failed = sum(1 for r in wrecs if r is None or r.status != "completed")
            if warmup_failed:
                log(f"bench C={conc}: {warmup_failed}/{warmup} warm-up request(s) failed", "warning")
        recs, wall = run_requests(target, api, prompts[:n], output_len, model, conc, request_timeout, deadline,
                                  engine)
        m = compute_level_metrics(recs, wall, conc, n)
        m["warmup_failed"] = warmup_failed
        results.append(m)
        progress(li + 1, len(levels), "bench", max_concurrency=conc, completed=m["completed"],
                 failed=m["failed"], timed_out=m["timed_out"], output_throughput=m["output_throughput"])
        if not m["valid"]:
            log(f"bench C={conc}: invalid level ({m['failed']} failed, {m['timed_out']} timed out "
                f"of {n}): {m['errors'][:2]}", "warning")
    return {
        "tool": "builtin",
        "url": url,
        "levels": results,
        "settings": {
            "api": api, "concurrency": levels, "input_len": input_len, "output_len": output_len,
            "num_prompts": num_prompts, "warmup": warmup, "level_timeout": level_timeout,
            "request_timeout": request_timeout, "seed": seed, "model": model, "vocab_max": vocab_hi,
        },
    }
