"""``bench --tool sglang``: run SGLang's own ``python -m sglang.bench_serving`` per level.

For each concurrency level C this runs (host Python, subprocess, own process group):

    <python> -m sglang.bench_serving --backend sglang|sglang-oai --base-url URL
        --dataset-name random-ids --random-input-len I --random-output-len O
        --random-range-ratio 1.0 --num-prompts P --max-concurrency C --seed S
        --output-file F [--model M]

(``sglang.bench_serving``'s own flags; ``random-ids`` because the ``random`` dataset downloads
ShareGPT when ``--dataset-path`` is not a JSON file: SGLang 0.5.23
``sglang/benchmark/datasets/random.py``). bench_serving appends one JSON object per run to F; the last line
is parsed with :func:`parse_bench_serving_record`, which accepts the field names of old
and new sglang.bench_serving builds and of vLLM's ``benchmark_serving``/``vllm bench
serve`` and returns the names of :data:`remote.bench.common.METRIC_NAMES`. The level dict gains
``max_concurrency``, ``num_prompts``, ``failed`` (= P - completed), ``timed_out``
(1 when the subprocess ran past its time limit, else 0: bench_serving does not report
request timeouts separately), ``valid`` and ``errors``.

Errors: ``PayloadError("not_found")`` when ``sglang`` is not importable by this Python.
A level whose subprocess fails or writes no JSON is returned with ``valid: false`` and
the tail of its output in ``errors``; the run goes on with the next level.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import tempfile
from typing import Any

from ...protocol import PayloadError, log, progress
from ...bench.common import default_num_prompts, judge_tool_level, parse_url, run_client

#: Names orch reports (remote.bench.common.METRIC_NAMES) <- alternative names seen in
#: bench_serving outputs (older SGLang builds, vLLM). The first present wins.
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "duration": ("duration", "benchmark_duration"),
    "completed": ("completed", "successful_requests"),
    "total_input_tokens": ("total_input_tokens", "total_input"),
    "total_output_tokens": ("total_output_tokens", "total_output"),
    "request_throughput": ("request_throughput",),
    "input_throughput": ("input_throughput",),
    "output_throughput": ("output_throughput",),
    "total_throughput": ("total_throughput", "total_token_throughput"),
    "mean_ttft_ms": ("mean_ttft_ms",),
    "median_ttft_ms": ("median_ttft_ms",),
    "p99_ttft_ms": ("p99_ttft_ms",),
    "mean_itl_ms": ("mean_itl_ms",),
    "median_itl_ms": ("median_itl_ms",),
    "p99_itl_ms": ("p99_itl_ms",),
    "mean_e2e_latency_ms": ("mean_e2e_latency_ms", "mean_e2el_ms"),
    "median_e2e_latency_ms": ("median_e2e_latency_ms", "median_e2el_ms"),
    "p99_e2e_latency_ms": ("p99_e2e_latency_ms", "p99_e2el_ms"),
}

#: Seconds allowed on top of --level-timeout for bench_serving's own start-up
#: (imports, tokenizer load) and its 1 s pause after warm-up.
STARTUP_ALLOWANCE_S = 60.0


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


def parse_bench_serving_record(rec: dict[str, Any]) -> dict[str, Any]:
    """Map one bench_serving JSON object to orch's metric names (remote.bench.common.METRIC_NAMES).

    Missing throughputs are derived from totals and ``duration`` (s):
    ``total_throughput = (total_input_tokens + total_output_tokens) / duration`` (absent in
    older SGLang builds), ``input_throughput = total_input_tokens / duration`` (absent in
    vLLM), ``request_throughput = completed / duration``. Names absent and not derivable
    come back as ``None``. ``completed`` and token totals are ints. Raises ValueError if
    ``rec`` is not a dict or has neither ``duration`` nor ``completed``.
    """
    if not isinstance(rec, dict):
        raise ValueError("bench_serving record is not a JSON object")
    out: dict[str, Any] = {}
    for name, aliases in FIELD_ALIASES.items():
        out[name] = None
        for a in aliases:
            if a in rec and _num(rec[a]) is not None:
                out[name] = _num(rec[a])
                break
    if out["duration"] is None and out["completed"] is None:
        raise ValueError("bench_serving record has neither duration nor completed")
    for k in ("completed", "total_input_tokens", "total_output_tokens"):
        if out[k] is not None:
            out[k] = int(round(out[k]))
    dur = out["duration"]
    if dur and dur > 0:
        tin, tout, done = out["total_input_tokens"], out["total_output_tokens"], out["completed"]
        if out["total_throughput"] is None and tin is not None and tout is not None:
            out["total_throughput"] = (tin + tout) / dur
        if out["input_throughput"] is None and tin is not None:
            out["input_throughput"] = tin / dur
        if out["output_throughput"] is None and tout is not None:
            out["output_throughput"] = tout / dur
        if out["request_throughput"] is None and done is not None:
            out["request_throughput"] = done / dur
    return out


def read_last_record(path: str) -> dict[str, Any]:
    """Last JSON object line of bench_serving's ``--output-file`` (JSON lines, appended).

    Raises ValueError when the file holds no JSON object line.
    """
    last = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                last = obj
    if last is None:
        raise ValueError(f"no JSON record in {path}")
    return last


def sglang_available() -> bool:
    """True when ``import sglang`` can find the package with this interpreter."""
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def build_command(
    url: str, conc: int, input_len: int, output_len: int, num_prompts: int, seed: int,
    output_file: str, model: str | None = None, api: str = "generate",
    python: str | None = None,
) -> list[str]:
    """argv of one bench_serving run (see module docstring)."""
    cmd = [
        python or sys.executable, "-m", "sglang.bench_serving",
        "--backend", "sglang" if api == "generate" else "sglang-oai",
        "--base-url", url,
        "--dataset-name", "random-ids",
        "--random-input-len", str(input_len),
        "--random-output-len", str(output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(num_prompts),
        "--max-concurrency", str(conc),
        "--seed", str(seed),
        "--output-file", output_file,
    ]
    if model:
        cmd += ["--model", model]
    return cmd


def run_sglang(
    url: str,
    levels: list[int],
    input_len: int,
    output_len: int,
    num_prompts: int | None = None,
    level_timeout: float = 600.0,
    seed: int = 1,
    model: str | None = None,
    api: str = "generate",
    python: str | None = None,
) -> dict[str, Any]:
    """Benchmark ``url`` with sglang.bench_serving at each concurrency in ``levels``.

    Returns the same ``data`` shape as remote.bench.builtin.run_builtin with ``"tool": "sglang"``.
    Each subprocess may run ``level_timeout + STARTUP_ALLOWANCE_S`` seconds.
    Raises PayloadError("not_found") if sglang is not importable (unless ``python``,
    another interpreter, is given: then a failing import shows up per level).
    """
    parse_url(url)
    if python is None and not sglang_available():
        raise PayloadError("not_found", "--tool sglang: `import sglang` fails with " + sys.executable)
    results = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        for li, conc in enumerate(levels):
            n = num_prompts if num_prompts is not None else default_num_prompts(conc)
            out_file = os.path.join(tmp, f"level-{li}.jsonl")
            cmd = build_command(url, conc, input_len, output_len, n, seed + li, out_file, model, api, python)
            rc, tail = run_client(cmd, level_timeout + STARTUP_ALLOWANCE_S, 2000)
            level: dict[str, Any] = {"max_concurrency": conc, "num_prompts": n}
            errors: list[str] = []
            try:
                metrics = parse_bench_serving_record(read_last_record(out_file))
            except (OSError, ValueError) as exc:
                metrics = parse_bench_serving_record({"completed": 0})
                errors.append(f"no result: {exc}")
            if rc is None:
                errors.append(f"bench_serving ran past {level_timeout + STARTUP_ALLOWANCE_S:.0f} s")
            elif rc != 0:
                errors.append(f"bench_serving exit status {rc}")
            if errors:
                errors.append(tail[-800:])
            level.update(metrics)
            done = level["completed"] or 0
            level["failed"] = max(0, n - done) if rc is not None else 0
            level["timed_out"] = max(0, n - done) if rc is None else 0
            judge_tool_level(level, n, rc)
            level["errors"] = errors
            results.append(level)
            progress(li + 1, len(levels), "bench", max_concurrency=conc, completed=done,
                     output_throughput=level["output_throughput"])
            if not level["valid"]:
                log(f"bench_serving C={conc}: invalid level: {errors[:1]}", "warning")
    return {
        "tool": "sglang",
        "url": url,
        "levels": results,
        "settings": {"api": api, "concurrency": levels, "input_len": input_len, "output_len": output_len,
                     "num_prompts": num_prompts, "level_timeout": level_timeout, "seed": seed, "model": model},
    }
