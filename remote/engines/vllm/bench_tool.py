"""``bench --tool vllm``: vLLM's own benchmark client, ``vllm bench serve``, once per level.

For each concurrency level C this runs, with the host's Python (the unit's interpreter, which
runs the payload), in its own process group::

    <python> -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url URL
        --endpoint /v1/completions --dataset-name random --random-input-len I
        --random-output-len O --random-range-ratio 0.0 --num-prompts P --max-concurrency C
        --seed S --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el
        --metric-percentiles 99 --disable-tqdm --save-result --result-dir D
        --result-filename level-N.json [--model M]

``vllm.entrypoints.cli.main:main`` is what vLLM's ``vllm`` console script runs (vLLM's
``pyproject.toml`` ``[project.scripts]``), so this is ``vllm bench serve`` of the unit's own
vLLM. The flags are vLLM 0.32.0-0.34.0's (``vllm/benchmarks/serve.py`` ``add_cli_args``,
``vllm/benchmarks/datasets/datasets.py`` ``add_dataset_parser`` and its random-dataset group,
wired by ``vllm/entrypoints/cli/benchmark/serve.py`` ``BenchmarkServingSubcommand``):

- ``--backend vllm`` is vLLM's OpenAI completions request (``benchmarks/lib/endpoint_request_func.py``
  ``ASYNC_REQUEST_FUNCS``: streamed ``/v1/completions`` with ``stream_options.include_usage``);
- ``--dataset-name random`` with ``--random-range-ratio 0.0``: exactly I prompt tokens (the
  dataset's ``RandomDataset.sample``; it needs the model's tokenizer, which vLLM finds from the
  ``root`` of the server's ``/v1/models`` when ``--model`` is not given: ``main_async``);
- ``--ignore-eos`` and ``--temperature 0``: exactly O output tokens, greedy (the release no longer
  sends ``temperature`` by default: ``main_async``'s warning);
- ``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 99``: mean, median, std and
  P99 of each (``benchmark``'s ``process_one_metric``; its default leaves out ``e2el``);
- ``--save-result --result-dir D --result-filename F``: the result JSON, one object, at ``D/F``
  (``compute_result_filename``; ``main_async`` writes it with ``json.dump``).

The result is read from that JSON (:func:`parse_result`, the keys of ``benchmark``'s result dict
and ``process_one_metric``: :data:`RESULT_KEYS`); when the client wrote none, from its printed
summary (:func:`parse_summary`, the labels ``benchmark`` prints: :data:`SUMMARY_LABELS`). Names
are orch's (:data:`remote.bench.common.METRIC_NAMES`); ``input_throughput``, which vLLM does not
report, is ``total_input_tokens / duration``. The level dict gains ``max_concurrency``,
``num_prompts``, ``failed`` (vLLM's own count, else ``P - completed``), ``timed_out`` (the
requests not completed when the client ran past its time limit), ``failure_rate``, ``valid``
(the rule of :data:`remote.bench.common.MAX_FAILURE_FRACTION`) and ``errors``.

A container unit's benchmark runs on the host, as SGLang's tool does: the host's Python must
import ``vllm``. Errors: ``PayloadError("not_found")`` when ``vllm`` is not importable by this
Python. A level whose client fails or reports nothing is returned with ``valid: false`` and the
tail of its output in ``errors``; the run goes on with the next level.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import tempfile
from typing import Any

from ...bench.common import default_num_prompts, judge_tool_level, parse_url, run_client
from ...protocol import PayloadError, log, progress
from .http import COMPLETIONS_PATH

#: the module vLLM's ``vllm`` console script runs (``vllm.entrypoints.cli.main:main``)
CLIENT_MODULE = "vllm.entrypoints.cli.main"
#: ``vllm bench serve`` (``entrypoints/cli/benchmark/main.py`` ``bench``; ``serve.py`` ``name``)
SUBCOMMAND = ("bench", "serve")
#: ``--backend``: vLLM's completions request (``ASYNC_REQUEST_FUNCS["vllm"]``)
BACKEND = "vllm"
#: ``--dataset-name``: random token prompts of a fixed length
DATASET = "random"
#: ``--percentile-metrics`` (``process_one_metric``'s names)
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
#: ``--metric-percentiles``: the release's default, 99 (keys ``p99_<metric>_ms``)
METRIC_PERCENTILES = ("99",)
#: every option orch passes (held against each oracle release's parser by the oracle tests)
FLAGS = ("--backend", "--base-url", "--endpoint", "--dataset-name", "--random-input-len", "--random-output-len",
         "--random-range-ratio", "--num-prompts", "--max-concurrency", "--seed", "--ignore-eos", "--temperature",
         "--percentile-metrics", "--metric-percentiles", "--disable-tqdm", "--save-result", "--result-dir",
         "--result-filename", "--model")

#: orch's name (remote.bench.common.METRIC_NAMES, and ``p99_e2e_latency_ms``) <- the key of vLLM's
#: result JSON (``benchmark``'s result dict; ``mean_/median_/p99_<metric>_ms`` from ``process_one_metric``)
RESULT_KEYS: dict[str, str] = {
    "duration": "duration",
    "completed": "completed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "total_throughput": "total_token_throughput",
    "mean_ttft_ms": "mean_ttft_ms",
    "median_ttft_ms": "median_ttft_ms",
    "p99_ttft_ms": "p99_ttft_ms",
    "mean_itl_ms": "mean_itl_ms",
    "median_itl_ms": "median_itl_ms",
    "p99_itl_ms": "p99_itl_ms",
    "mean_e2e_latency_ms": "mean_e2el_ms",
    "median_e2e_latency_ms": "median_e2el_ms",
    "p99_e2e_latency_ms": "p99_e2el_ms",
}
#: vLLM's count of unsuccessful requests (``benchmark``'s result ``failed``)
FAILED_KEY = "failed"
#: vLLM's key -> the label ``benchmark`` prints before it in the summary (``"{:<40} {:<10}"`` lines)
SUMMARY_LABELS: dict[str, str] = {
    "completed": "Successful requests:",
    "failed": "Failed requests:",
    "duration": "Benchmark duration (s):",
    "total_input_tokens": "Total input tokens:",
    "total_output_tokens": "Total generated tokens:",
    "request_throughput": "Request throughput (req/s):",
    "output_throughput": "Output token throughput (tok/s):",
    "total_token_throughput": "Total token throughput (tok/s):",
    **{f"{stat}_{m}_ms": f"{word} {label} (ms):"
       for m, label in (("ttft", "TTFT"), ("itl", "ITL"), ("e2el", "E2EL"))
       for stat, word in (("mean", "Mean"), ("median", "Median"), ("p99", "P99"))},
}
#: the summary's first line (``benchmark``: ``" Serving Benchmark Result "`` centred in ``=``)
SUMMARY_TITLE = " Serving Benchmark Result "
#: keys whose value is a count (ints in orch's level)
_COUNTS = ("completed", "total_input_tokens", "total_output_tokens")

#: Seconds allowed on top of --level-timeout for the client's own start-up (imports, the tokenizer)
STARTUP_ALLOWANCE_S = 60.0


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


def _to_level(rec: dict[str, Any]) -> dict[str, Any]:
    """orch's metric names from a mapping of vLLM's keys (numbers only; absent: None)."""
    out: dict[str, Any] = {name: _num(rec.get(key)) for name, key in RESULT_KEYS.items()}
    for k in _COUNTS:
        if out[k] is not None:
            out[k] = int(round(out[k]))
    dur, tin = out["duration"], out["total_input_tokens"]
    out["input_throughput"] = tin / dur if dur and tin is not None else None
    failed = _num(rec.get(FAILED_KEY))
    out["failed_reported"] = int(failed) if failed is not None else None
    return out


def parse_result(rec: object) -> dict[str, Any]:
    """Map one ``vllm bench serve`` result JSON object (``--save-result``) to orch's metric names.

    ``rec``: the object ``main_async`` writes (vLLM 0.32.0-0.34.0 ``vllm/benchmarks/serve.py``):
    ``duration`` (s), ``completed``, ``failed``, token totals, ``request_throughput`` (req/s),
    ``output_throughput`` and ``total_token_throughput`` (tokens/s), ``mean_/median_/p99_*_ms``.
    Returns :data:`RESULT_KEYS`' names plus ``input_throughput`` (tokens/s, derived) and
    ``failed_reported`` (vLLM's ``failed``, None when absent); a name vLLM did not write is None.
    Raises ValueError when ``rec`` is not an object or has neither ``duration`` nor ``completed``.
    """
    if not isinstance(rec, dict):
        raise ValueError("the vllm bench serve result is not a JSON object")
    if _num(rec.get("duration")) is None and _num(rec.get("completed")) is None:
        raise ValueError("the vllm bench serve result has neither duration nor completed")
    return _to_level(rec)


def parse_summary(text: str) -> dict[str, Any]:
    """Map the summary ``vllm bench serve`` prints (``benchmark``: the lines after
    :data:`SUMMARY_TITLE`, ``f"{label:<40} {value:<10}"``) to orch's metric names, as
    :func:`parse_result`. The last summary in ``text`` counts. Raises ValueError when ``text``
    holds no summary or it has no ``Successful requests:`` line."""
    at = text.rfind(SUMMARY_TITLE)
    if at < 0:
        raise ValueError("no 'Serving Benchmark Result' summary in the client's output")
    by_label = {label: key for key, label in SUMMARY_LABELS.items()}
    rec: dict[str, Any] = {}
    for line in text[at:].splitlines()[1:]:
        if line.startswith("=" * 10):
            break
        m = re.match(r"^(.*?:)\s+(\S+)\s*$", line)
        if m and m.group(1) in by_label:
            try:
                rec[by_label[m.group(1)]] = float(m.group(2))
            except ValueError:
                continue
    if "completed" not in rec:
        raise ValueError("the client's summary has no 'Successful requests:' line")
    return _to_level(rec)


def vllm_available() -> bool:
    """True when ``import vllm`` can find the package with this interpreter."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def build_command(url: str, conc: int, input_len: int, output_len: int, num_prompts: int, seed: int,
                  result_dir: str, result_filename: str, model: str | None = None,
                  python: str | None = None) -> list[str]:
    """argv of one ``vllm bench serve`` run (module docstring); ``url`` the server's base URL."""
    cmd = [
        python or sys.executable, "-m", CLIENT_MODULE, *SUBCOMMAND,
        "--backend", BACKEND,
        "--base-url", url.rstrip("/"),
        "--endpoint", COMPLETIONS_PATH,
        "--dataset-name", DATASET,
        "--random-input-len", str(int(input_len)),
        "--random-output-len", str(int(output_len)),
        "--random-range-ratio", "0.0",
        "--num-prompts", str(int(num_prompts)),
        "--max-concurrency", str(int(conc)),
        "--seed", str(int(seed)),
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", ",".join(PERCENTILE_METRICS),
        "--metric-percentiles", ",".join(METRIC_PERCENTILES),
        "--disable-tqdm",
        "--save-result", "--result-dir", result_dir, "--result-filename", result_filename,
    ]
    if model:
        cmd += ["--model", model]
    return cmd


def _read_level(path: str, output: str) -> tuple[dict[str, Any], list[str]]:
    """The level's metrics from the result JSON at ``path``, else from the summary in ``output``;
    with the reasons a source was not used."""
    errors: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            return parse_result(json.load(f)), errors
    except (OSError, ValueError) as exc:
        errors.append(f"no result JSON: {exc}")
    try:
        metrics = parse_summary(output)
        errors.clear()  # the printed summary is the client's own result
        return metrics, errors
    except ValueError as exc:
        errors.append(str(exc))
    return _to_level({}), errors


def run_vllm(
    url: str,
    levels: list[int],
    input_len: int,
    output_len: int,
    num_prompts: int | None = None,
    level_timeout: float = 600.0,
    seed: int = 1,
    model: str | None = None,
    api: str = "openai",
    python: str | None = None,
) -> dict[str, Any]:
    """Benchmark ``url`` with ``vllm bench serve`` at each concurrency in ``levels``.

    ``input_len``/``output_len``: tokens per request; ``num_prompts`` per level (None:
    :func:`remote.bench.common.default_num_prompts`); ``level_timeout`` (s): each client may run
    ``level_timeout + STARTUP_ALLOWANCE_S``; ``seed`` + the level's index seeds its prompts;
    ``model``: the name the client sends (None: vLLM asks ``/v1/models``); ``api`` is recorded
    only (vLLM's native API is its OpenAI ``/v1/completions``, which the client always uses).
    Returns the ``data`` shape of :func:`remote.bench.builtin.run_builtin` with ``"tool": "vllm"``.
    Raises PayloadError("not_found") if ``vllm`` is not importable (unless ``python``, another
    interpreter, is given: then a failing import shows up per level), ``"bad_input"`` for a bad URL.
    """
    parse_url(url)
    if python is None and not vllm_available():
        raise PayloadError("not_found", "--tool vllm: `import vllm` fails with " + sys.executable
                           + " (vllm bench serve runs with the unit's own Python)")
    results = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        for li, conc in enumerate(levels):
            n = num_prompts if num_prompts is not None else default_num_prompts(conc)
            name = f"level-{li}.json"
            cmd = build_command(url, conc, input_len, output_len, n, seed + li, tmp, name, model, python)
            rc, output = run_client(cmd, level_timeout + STARTUP_ALLOWANCE_S, 65536)
            metrics, errors = _read_level(os.path.join(tmp, name), output)
            if rc is None:
                errors.append(f"vllm bench serve ran past {level_timeout + STARTUP_ALLOWANCE_S:.0f} s")
            elif rc != 0:
                errors.append(f"vllm bench serve exit status {rc}")
            if errors:
                errors.append(output[-800:])
            reported = metrics.pop("failed_reported")
            level: dict[str, Any] = {"max_concurrency": conc, "num_prompts": n, **metrics}
            done = level["completed"] or 0
            if rc is None:
                level["failed"], level["timed_out"] = 0, max(0, n - done)
            else:
                level["failed"] = max(n - done, reported or 0, 0)
                level["timed_out"] = 0
            judge_tool_level(level, n, rc)
            level["errors"] = errors
            results.append(level)
            progress(li + 1, len(levels), "bench", max_concurrency=conc, completed=done,
                     output_throughput=level["output_throughput"])
            if not level["valid"]:
                log(f"vllm bench serve C={conc}: invalid level: {errors[:1]}", "warning")
    return {
        "tool": "vllm",
        "url": url,
        "levels": results,
        "settings": {"api": api, "concurrency": levels, "input_len": input_len, "output_len": output_len,
                     "num_prompts": num_prompts, "level_timeout": level_timeout, "seed": seed, "model": model},
    }
