"""The stand-in ``vllm bench serve``: vLLM's benchmark client as the test bed needs it
(tests/testbed/README.md, "Stand-in vLLM").

Like vLLM 0.32.0-0.34.0's ``vllm/benchmarks/serve.py`` (``main_async``, ``benchmark``,
``calculate_metrics``) it sends real streamed ``POST /v1/completions`` requests (the body of
``benchmarks/lib/endpoint_request_func.py`` ``async_request_openai_completions``: ``model``,
``prompt``, ``max_tokens``, ``stream``, ``stream_options.include_usage``, ``ignore_eos``, the
sampling parameters) to the one server it is given (``--base-url``, else ``--host``/``--port``),
at most ``--max-concurrency`` in flight, and measures TTFT, ITL, TPOT and E2EL per request. It
prints the release's summary lines (``Serving Benchmark Result``, ``{:<40} {:<10}``) and, with
``--save-result``, writes the release's result JSON (same keys) to ``--result-dir``/``--result-filename``
(``compute_result_filename``'s default name otherwise).

Stood in: the parser (the flags below, vLLM's spellings and defaults; an unknown flag is refused,
as vLLM's parser refuses it), the dataset (``random`` only: prompts of ``--random-input-len``
words ``t<id>``, which the stand-in server counts as tokens, from ``--seed``; no tokenizer), the
HTTP client (threads and ``http.client`` instead of aiohttp), no warm-up, profiling, goodput,
ramp-up, ready check (vLLM's default skips it) or plots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.client import HTTPConnection, HTTPSConnection


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm bench serve")
    p.add_argument("--backend", default="openai", choices=["vllm", "openai"])
    p.add_argument("--base-url", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--label", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", default="0.0")
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--percentile-metrics", default=None)
    p.add_argument("--metric-percentiles", default="99")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--append-result", action="store_true")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None)
    return p


class _Output:
    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len
        self.success = False
        self.ttft = 0.0
        self.itl: list[float] = []
        self.latency = 0.0
        self.output_tokens = 0
        self.start_time = 0.0
        self.error = ""


def _first_model(base: urllib.parse.SplitResult) -> tuple[str, str]:
    """``(id, root)`` of the first model of ``/v1/models`` (vLLM's ``get_first_model_from_server``)."""
    conn = _conn(base, 60)
    try:
        conn.request("GET", base.path.rstrip("/") + "/v1/models")
        data = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return data["data"][0]["id"], data["data"][0]["root"]


def _conn(base: urllib.parse.SplitResult, timeout: float):
    cls = HTTPSConnection if base.scheme == "https" else HTTPConnection
    return cls(base.hostname, base.port or (443 if base.scheme == "https" else 80), timeout=timeout)


def _request(base: urllib.parse.SplitResult, path: str, body: dict, prompt_len: int) -> _Output:
    """One streamed completion, timed as ``async_request_openai_completions`` times it."""
    out = _Output(prompt_len)
    st = time.perf_counter()
    out.start_time = recent = st
    first = False
    conn = _conn(base, 600)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = resp.reason or ""
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            chunk = line[len("data: "):]
            if chunk == "[DONE]":
                continue
            data = json.loads(chunk)
            if data.get("error"):
                out.error = json.dumps(data["error"])
            elif data.get("choices"):
                now = time.perf_counter()
                if not first:
                    first, out.ttft = True, now - st
                else:
                    out.itl.append(now - recent)
                recent = now
            elif data.get("usage"):
                out.output_tokens = data["usage"].get("completion_tokens") or 0
                if data["usage"].get("prompt_tokens") is not None:
                    out.prompt_len = data["usage"]["prompt_tokens"]
        out.success = first and not out.error
        if not first and not out.error:
            out.error = "Never received a valid chunk to calculate TTFT.This response will be marked as failed!"
        out.latency = recent - st
    except Exception as exc:  # noqa: BLE001 - vLLM records any exception as the request's error
        out.error = repr(exc)
    finally:
        conn.close()
    return out


def _pct(values: list[float], p: float) -> float:
    """numpy's default (linear) percentile."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def main(argv: list[str]) -> int:
    """``vllm bench serve ARGS`` (``argv``: ARGS)."""
    args = _parser().parse_args(argv)
    print(args)
    if args.max_concurrency is not None and args.max_concurrency <= 0:
        raise ValueError("--max-concurrency must be greater than 0")
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    base = urllib.parse.urlsplit(base_url)
    path = base.path.rstrip("/") + args.endpoint
    if args.model is None:
        print("Model not specified, fetching first model from server...")
        model_name, model_id = _first_model(base)
        print(f"First model name: {model_name}, first model id: {model_id}")
    else:
        model_name, model_id = args.served_model_name, args.model
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.output_len
    args.ignore_eos = True  # vLLM: the random dataset on an OpenAI backend ignores EOS
    rng = random.Random(args.seed)
    prompts = [" ".join(f"t{rng.randrange(32000)}" for _ in range(args.random_input_len))
               for _ in range(args.num_prompts)]
    extra = {} if args.temperature is None else {"temperature": args.temperature}
    if args.temperature is None:
        print("WARNING: vllm bench serve no longer sets temperature==0 (greedy) in requests by default. The "
              "default will be determined on the server side and can be model/API specific. For the old "
              "behavior, include --temperature=0.")

    def body(prompt: str) -> dict:
        b = {"model": model_name or model_id, "prompt": prompt, "repetition_penalty": 1.0,
             "max_tokens": args.random_output_len, "logprobs": None, "stream": True,
             "stream_options": {"include_usage": True}, **extra}
        if args.ignore_eos:
            b["ignore_eos"] = True
        return b

    print("Starting initial single prompt test run...")
    print("Skipping endpoint ready check.")  # --ready-check-timeout-sec 0, vLLM's default
    print(f"Traffic request rate: {args.request_rate}")
    print(f"Maximum request concurrency: {args.max_concurrency}")
    workers = args.max_concurrency or len(prompts) or 1
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outputs = list(pool.map(lambda pr: _request(base, path, body(pr), args.random_input_len), prompts))
    dur = time.perf_counter() - t0
    ok = [o for o in outputs if o.success]
    failed = [o for o in outputs if not o.success]
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, o in enumerate(failed[:10]):
            print(f"Error {i}: {o.error}")
    total_in = sum(o.prompt_len for o in ok)
    out_lens = [(o.output_tokens or 1) if o.success else 0 for o in outputs]
    total_out = sum(out_lens)
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (n - 1) for o, n in zip(outputs, out_lens) if o.success and n > 1]
    itls = [x for o in ok for x in o.itl]
    e2els = [o.latency for o in ok]
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Successful requests:", len(ok)))
    print("{:<40} {:<10}".format("Failed requests:", len(failed)))
    if args.max_concurrency is not None:
        print("{:<40} {:<10}".format("Maximum request concurrency:", args.max_concurrency))
    print("{:<40} {:<10.2f}".format("Benchmark duration (s):", dur))
    print("{:<40} {:<10}".format("Total input tokens:", total_in))
    print("{:<40} {:<10}".format("Total generated tokens:", total_out))
    print("{:<40} {:<10.2f}".format("Request throughput (req/s):", len(ok) / dur))
    print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", total_out / dur))
    print("{:<40} {:<10.2f}".format("Peak output token throughput (tok/s):", 0.0))
    print("{:<40} {:<10.2f}".format("Peak concurrent requests:", float(workers)))
    print("{:<40} {:<10.2f}".format("Total token throughput (tok/s):", (total_in + total_out) / dur))
    result = {"duration": dur, "completed": len(ok), "failed": len(failed), "total_input_tokens": total_in,
              "total_output_tokens": total_out, "request_throughput": len(ok) / dur, "request_goodput": None,
              "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
              "input_lens": [o.prompt_len for o in outputs], "output_lens": out_lens,
              "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
              "latencies": [o.latency for o in outputs], "start_times": [o.start_time for o in outputs],
              "queue_times": [0.0 for _ in outputs], "generated_texts": ["" for _ in outputs],
              "errors": [o.error for o in outputs], "max_output_tokens_per_s": 0.0,
              "max_concurrent_requests": workers, "rtfx": 0.0}
    selected = (args.percentile_metrics or "ttft,tpot,itl").split(",")
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    for attr, name, header, values in (("ttft", "TTFT", "Time to First Token", ttfts),
                                       ("tpot", "TPOT", "Time per Output Token (excl. 1st token)", tpots),
                                       ("itl", "ITL", "Inter-token Latency", itls),
                                       ("e2el", "E2EL", "End-to-end Latency", e2els)):
        if attr not in selected:
            continue
        mean = statistics.fmean(values) * 1000 if values else 0.0
        median = statistics.median(values) * 1000 if values else 0.0
        std = statistics.pstdev(values) * 1000 if values else 0.0
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        print("{:<40} {:<10.2f}".format(f"Mean {name} (ms):", mean))
        print("{:<40} {:<10.2f}".format(f"Median {name} (ms):", median))
        result[f"mean_{attr}_ms"], result[f"median_{attr}_ms"], result[f"std_{attr}_ms"] = mean, median, std
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            value = _pct(values, p) * 1000
            print("{:<40} {:<10.2f}".format(f"P{word} {name} (ms):", value))
            result[f"p{word}_{attr}_ms"] = value
    print("=" * 50, flush=True)
    dt = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = {"date": dt, "endpoint_type": args.backend, "backend": args.backend, "label": args.label,
           "model_id": model_id, "tokenizer_id": model_id, "num_prompts": args.num_prompts,
           "request_rate": args.request_rate if args.request_rate < float("inf") else "inf", "burstiness": 1.0,
           "max_concurrency": args.max_concurrency, **result}
    for field in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
        out.pop(field, None)  # vLLM keeps them only with --save-detailed
    if args.save_result or args.append_result:
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
        name = args.result_filename or (f"{args.label or args.backend}-{args.request_rate}qps{conc}-"
                                        f"{model_id.split('/')[-1]}-{dt}.json")
        if args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
            name = os.path.join(args.result_dir, name)
        with open(name, "a+" if args.append_result else "w", encoding="utf-8") as f:
            if args.append_result and f.tell() != 0:
                f.write("\n")
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
