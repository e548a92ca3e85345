"""Independent second benchmark client, used only as a test oracle for remote/bench/builtin.py.

Shares no code with remote/bench/builtin.py: asyncio + httpx instead of threads + http.client,
its own prompt generator and its own stream parser. It measures one thing the
agreement test compares: output tokens per second of a fixed-concurrency run against
SGLang's streaming ``POST /generate``.

    measure(url, concurrency=4, input_len=32, output_len=24, num_prompts=16) ->
        {"completed": int, "failed": int, "output_tokens": int,
         "duration_s": float, "output_tokens_per_s": float}

``output_tokens`` sums, over successful requests, the last ``meta_info.completion_tokens``
seen in the stream (or the count of ``data:`` objects when the server sends none);
``duration_s`` is the wall time from the first request's start to the last one's end.
Only ``url`` (loopback in the tests) is contacted.

Run by hand: ``python -m tests.unit.remote.bench.oracle http://127.0.0.1:30000 4 32 24 16``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx


async def _one(client: httpx.AsyncClient, url: str, ids: list[int], output_len: int, timeout_s: float):
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}}
    t0 = time.perf_counter()
    tokens = None
    objects = 0
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url + "/generate", json=body) as r:
                if r.status_code != 200:
                    return None
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        break
                    obj = json.loads(payload)
                    if "error" in obj:
                        return None
                    objects += 1
                    ct = (obj.get("meta_info") or {}).get("completion_tokens")
                    if ct is not None:
                        tokens = ct
    except (httpx.HTTPError, TimeoutError, ValueError):
        return None
    return (t0, time.perf_counter(), tokens if tokens is not None else objects)


async def _measure(url, concurrency, input_len, output_len, num_prompts, timeout_s, seed):
    # an LCG of its own, so that prompts do not come from remote.bench
    state = seed * 2654435761 % (1 << 32) or 1
    prompts = []
    for _ in range(num_prompts):
        p = []
        for _ in range(input_len):
            state = (1103515245 * state + 12345) % (1 << 31)
            p.append(200 + state % 20000)
        prompts.append(p)
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        await _one(client, url, prompts[0], min(output_len, 16), timeout_s)  # warm-up, not counted

        async def guarded(p):
            async with sem:
                return await _one(client, url, p, output_len, timeout_s)

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(p) for p in prompts))
        end = max([r[1] for r in results if r] or [time.perf_counter()])
    ok = [r for r in results if r]
    toks = sum(r[2] for r in ok)
    dur = end - start
    return {"completed": len(ok), "failed": len(results) - len(ok), "output_tokens": toks,
            "duration_s": dur, "output_tokens_per_s": toks / dur if dur > 0 else 0.0}


def measure(url: str, concurrency: int, input_len: int, output_len: int, num_prompts: int,
            timeout_s: float = 60.0, seed: int = 3) -> dict:
    """Run ``num_prompts`` streaming /generate requests, ``concurrency`` at a time; see module doc."""
    return asyncio.run(_measure(url.rstrip("/"), concurrency, input_len, output_len, num_prompts, timeout_s, seed))


if __name__ == "__main__":
    u, c, i, o, n = sys.argv[1], *map(int, sys.argv[2:6])
    print(json.dumps(measure(u, c, i, o, n)))
