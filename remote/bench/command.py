"""Throughput benchmark against the unit's own URL (sglang.bench_serving metric names).

``python -m remote bench --url http://127.0.0.1:30000 --concurrency 1,16,64
--input-len 1024 --output-len 256 [--api generate|openai] [--tool builtin|sglang] [--engine sglang]``

``--tool builtin`` (default) runs orch's own client (:mod:`remote.bench.builtin`: request
bodies, measurement, counting; ``--api generate`` is ``--engine``'s native API); ``--tool NAME``
runs the engine's own client whose ``Engine.bench_tool`` is NAME (``sglang``: SGLang's
``python -m sglang.bench_serving`` once per level, :mod:`remote.engines.sglang.bench_tool`;
``vllm``: ``vllm bench serve`` once per level, :mod:`remote.engines.vllm.bench_tool`), and only
when ``--engine`` is that engine (another engine's client is refused, ``bad_input``). Both
report the metric names of :mod:`remote.bench.common` and judge a level by the same rule.

Result ``data``::

    {"tool": "builtin"|"sglang"|"vllm", "url": str,
     "levels": [{"max_concurrency": int, "num_prompts": int,
                 "duration": s, "completed": int, "failed": int, "timed_out": int,
                 "not_sent": int, "valid": bool, "failure_rate": float,
                 "total_input_tokens": int, "total_output_tokens": int,
                 "request_throughput": req/s, "input_throughput": tok/s,
                 "output_throughput": tok/s, "total_throughput": tok/s,
                 "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                 "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                 "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
                 "warmup_failed": int, "errors": [up to 5 distinct messages]}, ...],
     "settings": {...the effective flags...}}

Errors: ``PayloadError("bad_input")`` for a malformed URL or flags, or an engine's ``--tool`` that
is not ``--engine``'s; ``--tool sglang`` (``vllm``) raises ``PayloadError("not_found")`` when
``import sglang`` (``vllm``) fails on the host;
``--api openai`` without ``--model`` raises ``PayloadError("runtime")`` when
``/v1/models`` cannot be read.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..protocol import BENCH_TOOLS, DEFAULT_ENGINE, ENGINE_NAMES, PayloadError
from ..engines import ENGINES, engine_named
from .builtin import DEFAULT_VOCAB_HI, run_builtin
from .common import parse_url, server_version


def parse_concurrency(text: str) -> list[int]:
    """``"1,16,64"`` -> [1, 16, 64]; PayloadError("bad_input") unless all are integers >= 1."""
    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise PayloadError("bad_input", f"bad --concurrency {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise PayloadError("bad_input", f"bad --concurrency {text!r}: want integers >= 1")
    if len(levels) > 64:
        raise PayloadError("bad_input", "at most 64 concurrency levels")
    return levels

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``python -m remote bench``."""
    p.add_argument("--url", required=True, help="the unit's base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--api", choices=("generate", "openai"), default="generate")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated levels (max in flight)")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=256, help="generated tokens per request")
    p.add_argument("--num-prompts", type=int, default=None, help="per level; default max(5*C, 10)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests per level (not measured)")
    p.add_argument("--level-timeout", type=float, default=600.0, help="seconds per level")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=1, help="seed of the random prompt token ids")
    p.add_argument("--vocab-max", type=int, default=DEFAULT_VOCAB_HI, help="token ids drawn below this")
    p.add_argument("--tool", choices=BENCH_TOOLS, default="builtin",
                   help="orch's own client, or an engine's own benchmark client (Engine.bench_tool)")
    p.add_argument("--engine", choices=ENGINE_NAMES, default=DEFAULT_ENGINE,
                   help="the engine serving --url (its native API is --api generate)")
    p.add_argument("--model", default=None, help="model name for --api openai; else from /v1/models")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Entry point of the ``bench`` command; returns the result ``data`` (with ``server_version``:
    what the server reports at ``/get_server_info``, None when it does not say)."""
    levels = parse_concurrency(args.concurrency)
    tool_owner = next((e for e in ENGINES.values() if e.bench_tool == args.tool), None)
    serving = engine_named(args.engine)
    if tool_owner is not None and tool_owner is not serving:
        # an engine's client speaks to its own server (its request shape, its dataset, its names)
        own = f"--tool {serving.bench_tool} or " if serving.bench_tool else ""
        raise PayloadError("bad_input", f"--tool {args.tool} is {tool_owner.display_name}'s own benchmark client; "
                                        f"--engine {serving.name} serves {args.url}: use {own}--tool builtin")
    if tool_owner is not None:
        data = tool_owner.run_bench_tool(
            url=args.url, levels=levels, input_len=args.input_len, output_len=args.output_len,
            num_prompts=args.num_prompts, level_timeout=args.level_timeout, seed=args.seed,
            model=args.model, api=args.api,
        )
    else:
        data = run_builtin(
            url=args.url, levels=levels, input_len=args.input_len, output_len=args.output_len,
            num_prompts=args.num_prompts, api=args.api, warmup=args.warmup,
            level_timeout=args.level_timeout, request_timeout=args.request_timeout,
            seed=args.seed, model=args.model, vocab_hi=args.vocab_max, engine=engine_named(args.engine).name,
        )
    data["server_version"] = server_version(parse_url(args.url))
    return data
