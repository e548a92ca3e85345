"""``bench --tool vllm`` (remote/engines/vllm/bench_tool.py) held against vLLM 0.32.0, 0.33.0, 0.34.0.

``vllm/benchmarks/serve.py`` does not import without vLLM's server (aiohttp, its tokenizers,
numpy, the platform), so its source is read with ``ast``: the options of ``add_cli_args`` and of
``datasets.py`` ``add_dataset_parser``, the ``--backend`` names (``ASYNC_REQUEST_FUNCS``), the
subcommand names, the keys of ``benchmark``'s result dict and of ``process_one_metric``, the lines
the summary prints (label and format string), and ``compute_result_filename``. The parser tests
read a result JSON and a printed summary built from those keys and format strings.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from remote.engines.vllm import bench_tool as bt
from remote.protocol import PayloadError
from tests.vllm_releases import ORACLE_RELEASES, source_tree

SERVE = "vllm/benchmarks/serve.py"


def _tree(version: str, rel: str) -> ast.Module:
    return ast.parse((source_tree(version) / rel).read_text())


def _func(mod: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(n for n in ast.walk(mod) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _options(version: str) -> dict[str, ast.Call]:
    """option string -> its ``add_argument`` call, in the bench serve parser's two files."""
    out = {}
    for rel in (SERVE, "vllm/benchmarks/datasets/datasets.py"):
        for n in ast.walk(_tree(version, rel)):
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument":
                for a in n.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str):
                        out[a.value] = n
    return out


def _keyword(call: ast.Call, name: str):
    """The keyword's value: a literal as its value, else its node (``type=int``: an ``ast.Name``)."""
    kw = next((k.value for k in call.keywords if k.arg == name), None)
    try:
        return ast.literal_eval(kw) if kw is not None else None
    except ValueError:
        return kw


def _metric_calls(version: str) -> list[tuple[str, str]]:
    """``(attribute, printed name)`` of each ``process_one_metric(...)`` call in ``benchmark``."""
    out = []
    for n in ast.walk(_func(_tree(version, SERVE), "benchmark")):
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "process_one_metric":
            out.append((n.args[0].value, n.args[1].value))
    return out


def _result_keys(version: str) -> set[str]:
    """The keys ``benchmark`` writes into its result (the generation branch's dict literal, and
    ``process_one_metric``'s ``mean_/median_/std_/p<N>_<attr>_ms`` for each metric with P99)."""
    fn = _func(_tree(version, SERVE), "benchmark")
    keys: set[str] = set()
    for n in ast.walk(fn):
        if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "result" for t in n.targets)):
            found = {k.value for k in n.value.keys if isinstance(k, ast.Constant)}
            if "output_throughput" in found:  # the generation branch (not the pooling one)
                keys |= found
    text = ast.unparse(fn)
    for stat in ("mean", "median", "std"):
        assert f'result[f"{stat}_{{metric_attribute_name}}_ms"]' in text.replace("'", '"'), (version, stat)
    assert 'result[f"p{p_word}_{metric_attribute_name}_ms"]' in text.replace("'", '"'), version
    for attr, _ in _metric_calls(version):
        keys |= {f"{s}_{attr}_ms" for s in ("mean", "median", "std", "p99")}
    return keys


def _summary_lines(version: str) -> dict[str, str]:
    """label -> the format string ``benchmark`` prints it with (``"{:<40} {:<10}"``,
    ``"{:<40} {:<10.2f}"``), for the fixed labels and ``process_one_metric``'s
    ``Mean/Median/P<N> <name> (ms):`` lines (N = 99)."""
    fn = _func(_tree(version, SERVE), "benchmark")
    out = {}
    for n in ast.walk(fn):
        if (isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "format" and isinstance(n.func.value, ast.Constant)
                and n.func.value.value.startswith("{:<40}") and n.args and isinstance(n.args[0], ast.Constant)):
            out[n.args[0].value] = n.func.value.value
        if (isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "format" and isinstance(n.func.value, ast.Constant)
                and n.func.value.value.startswith("{:<40}") and n.args and isinstance(n.args[0], ast.JoinedStr)):
            template = ast.unparse(n.args[0])  # f'Mean {metric_name} (ms):'
            for _, name in _metric_calls(version):
                label = template[2:-1].replace("{metric_name}", name).replace("{p_word}", "99")
                out[label] = n.func.value.value
    return out


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_every_flag_orch_passes_is_the_releases(version):
    opts = _options(version)
    assert set(bt.FLAGS) <= set(opts), (version, set(bt.FLAGS) - set(opts))
    cmd = bt.build_command("http://10.0.0.1:8000", 4, 64, 16, 20, 3, "/d", "f.json", model="m", python="py")
    assert {w for w in cmd if w.startswith("--")} == set(bt.FLAGS)
    for flag in ("--ignore-eos", "--disable-tqdm", "--save-result"):
        assert _keyword(opts[flag], "action") == "store_true", (version, flag)
    for flag in ("--random-input-len", "--random-output-len", "--num-prompts", "--max-concurrency", "--seed"):
        assert getattr(_keyword(opts[flag], "type"), "id", None) == "int", (version, flag)
    assert getattr(_keyword(opts["--temperature"], "type"), "id", None) == "float", version
    assert bt.DATASET in _keyword(opts["--dataset-name"], "choices"), version
    # the percentile flags take comma-separated words, which process_one_metric knows
    assert set(bt.PERCENTILE_METRICS) <= {a for a, _ in _metric_calls(version)}, version
    assert _keyword(opts["--metric-percentiles"], "default") == ",".join(bt.METRIC_PERCENTILES), version
    # a range ratio of 0.0 is a parsable value in every release (a float; 0.34.0 also takes JSON)
    assert float(cmd[cmd.index("--random-range-ratio") + 1]) == 0.0


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_subcommand_backend_and_entry_point_are_the_releases(version):
    root = source_tree(version)
    mod = _tree(version, "vllm/benchmarks/lib/endpoint_request_func.py")
    funcs = next(n.value for n in ast.walk(mod) if isinstance(n, ast.AnnAssign)
                 and getattr(n.target, "id", "") == "ASYNC_REQUEST_FUNCS")
    table = {k.value: v.id for k, v in zip(funcs.keys, funcs.values)}
    assert table[bt.BACKEND] == "async_request_openai_completions", version
    request = ast.unparse(_func(mod, "async_request_openai_completions"))
    assert '"stream": True' in request.replace("'", '"') and "completions" in request
    names = {}
    for rel in ("vllm/entrypoints/cli/benchmark/main.py", "vllm/entrypoints/cli/benchmark/serve.py"):
        cls = next(n for n in ast.walk(_tree(version, rel)) if isinstance(n, ast.ClassDef) and n.name.startswith("Bench"))
        names[rel] = next(st.value.value for st in cls.body if isinstance(st, ast.Assign)
                          and getattr(st.targets[0], "id", "") == "name")
    assert tuple(names.values()) == bt.SUBCOMMAND, version
    main = root / (bt.CLIENT_MODULE.replace(".", "/") + ".py")
    text = main.read_text()
    assert "def main()" in text and 'if __name__ == "__main__":' in text, version  # `python -m` runs it
    assert "vllm.entrypoints.cli.benchmark.main" in text, version
    # the endpoint: vLLM's default for the completions backend
    assert _keyword(_options(version)["--endpoint"], "default") == bt.COMPLETIONS_PATH


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_result_keys_and_where_the_file_goes_are_the_releases(version):
    keys = _result_keys(version)
    assert set(bt.RESULT_KEYS.values()) | {bt.FAILED_KEY} <= keys, (version, set(bt.RESULT_KEYS.values()) - keys)
    fn = ast.unparse(_func(_tree(version, SERVE), "compute_result_filename"))
    assert "file_name = args.result_filename" in fn and "os.path.join(args.result_dir, file_name)" in fn, version
    main = ast.unparse(_func(_tree(version, SERVE), "main_async"))
    assert "json.dump(result_json, outfile)" in main and "args.save_result" in main, version


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_summary_labels_are_the_releases(version):
    lines = _summary_lines(version)
    assert set(bt.SUMMARY_LABELS.values()) <= set(lines), (version, set(bt.SUMMARY_LABELS.values()) - set(lines))
    assert f'"{bt.SUMMARY_TITLE}"' in (source_tree(version) / SERVE).read_text().replace("'", '"')


def _values(keys) -> dict:
    """A value per key, distinct enough that a swapped mapping shows."""
    return {k: (100 + i if k in ("completed", "failed", "total_input_tokens", "total_output_tokens") else 1.5 + i)
            for i, k in enumerate(sorted(keys))}


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_parse_result_reads_the_releases_json(version, tmp_path):
    rec = _values(_result_keys(version))
    rec.update(date="20261204-080000", backend="vllm", model_id="/m", num_prompts=300, request_rate="inf",
               max_concurrency=4, request_goodput=None)
    (tmp_path / "r.json").write_text(json.dumps(rec))  # main_async's json.dump: one object
    got = bt.parse_result(json.loads((tmp_path / "r.json").read_text()))
    for orch_name, key in bt.RESULT_KEYS.items():
        assert got[orch_name] == pytest.approx(rec[key]), (orch_name, key)
    assert got["failed_reported"] == rec["failed"]
    assert got["input_throughput"] == pytest.approx(rec["total_input_tokens"] / rec["duration"])
    assert isinstance(got["completed"], int)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_parse_summary_reads_the_releases_printed_lines(version):
    lines = _summary_lines(version)
    rec = _values(set(bt.SUMMARY_LABELS))
    text = ["Starting initial single prompt test run...",
            "{s:{c}^{n}}".format(s=bt.SUMMARY_TITLE, n=50, c="=")]
    for key, label in bt.SUMMARY_LABELS.items():
        text.append(lines[label].format(label, rec[key]))
    text.append("{:<40} {:<10.2f}".format("Peak concurrent requests:", 4.0))
    text.append("=" * 50)
    got = bt.parse_summary("\n".join(text) + "\n")
    for orch_name, key in bt.RESULT_KEYS.items():
        # the summary rounds to 2 decimals (``{:<10.2f}``), counts are printed whole
        assert got[orch_name] == pytest.approx(rec[key], abs=0.006), (orch_name, key)
    assert got["failed_reported"] == rec["failed"]


def test_parse_errors_are_clear():
    with pytest.raises(ValueError, match="not a JSON object"):
        bt.parse_result([1])
    with pytest.raises(ValueError, match="neither duration nor completed"):
        bt.parse_result({"backend": "vllm"})
    with pytest.raises(ValueError, match="no 'Serving Benchmark Result'"):
        bt.parse_summary("Traceback (most recent call last):\n")
    # a summary line that is not a number is skipped, not a crash
    text = "=" * 12 + bt.SUMMARY_TITLE + "=" * 12 + "\nSuccessful requests:   x\n"
    with pytest.raises(ValueError, match="no 'Successful requests:'"):
        bt.parse_summary(text)


def test_build_command_runs_the_units_python_as_the_console_script():
    cmd = bt.build_command("http://127.0.0.1:8000/", 16, 1024, 256, 80, 3, "/tmp/d", "level-0.json", python="/v/bin/python")
    assert cmd[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    assert cmd[cmd.index("--base-url") + 1] == "http://127.0.0.1:8000"
    assert cmd[cmd.index("--max-concurrency") + 1] == "16" and cmd[cmd.index("--num-prompts") + 1] == "80"
    assert cmd[cmd.index("--random-input-len") + 1] == "1024" and cmd[cmd.index("--random-output-len") + 1] == "256"
    assert cmd[cmd.index("--result-dir") + 1] == "/tmp/d" and cmd[cmd.index("--result-filename") + 1] == "level-0.json"
    assert "--model" not in cmd  # vLLM asks /v1/models (the served name and the tokenizer's root)


def test_run_vllm_refuses_without_vllm(monkeypatch):
    monkeypatch.setattr(bt, "vllm_available", lambda: False)
    with pytest.raises(PayloadError, match="import vllm"):
        bt.run_vllm("http://127.0.0.1:9", [1], input_len=4, output_len=4)
    with pytest.raises(PayloadError, match="bad --url"):
        bt.run_vllm("ftp://x", [1], input_len=4, output_len=4)


def _fake_client(tmp_path: Path, body: str) -> str:
    """A stand-in interpreter: ``python -m vllm.entrypoints.cli.main bench serve ARGS`` runs ``body``
    with the parsed ``--result-dir``/``--result-filename``/``--num-prompts`` as ``d``, ``f``, ``n``."""
    script = tmp_path / "python"
    script.write_text("#!/usr/bin/env python3\nimport json, os, sys, time\nargs = sys.argv[5:]\n"
                      "def opt(k):\n    return args[args.index(k) + 1]\n"
                      "d, f, n = opt('--result-dir'), opt('--result-filename'), int(opt('--num-prompts'))\n" + body)
    script.chmod(0o755)
    return str(script)


def test_run_vllm_levels_from_json_summary_failures_and_timeouts(tmp_path, monkeypatch):
    ok = ("json.dump({'duration': 2.0, 'completed': n, 'failed': 0, 'total_input_tokens': 8 * n,"
          " 'total_output_tokens': 4 * n, 'request_throughput': n / 2.0, 'output_throughput': 2.0 * n,"
          " 'total_token_throughput': 6.0 * n, 'median_ttft_ms': 5.0, 'median_itl_ms': 1.0,"
          " 'median_e2el_ms': 9.0}, open(os.path.join(d, f), 'w'))\n")
    data = bt.run_vllm("http://127.0.0.1:9", [1, 4], input_len=8, output_len=4, python=_fake_client(tmp_path, ok))
    assert data["tool"] == "vllm" and [lv["max_concurrency"] for lv in data["levels"]] == [1, 4]
    lv = data["levels"][1]
    assert lv["num_prompts"] == 20 and lv["completed"] == 20 and lv["total_output_tokens"] == 80
    assert lv["output_throughput"] == 40.0 and lv["median_e2e_latency_ms"] == 9.0 and lv["valid"]
    # no JSON, a printed summary: read from it; 3 failed requests of 10 make the level invalid
    summary = ("print('=' * 12 + ' Serving Benchmark Result ' + '=' * 12)\n"
               "print('{:<40} {:<10}'.format('Successful requests:', n - 3))\n"
               "print('{:<40} {:<10}'.format('Failed requests:', 3))\n"
               "print('{:<40} {:<10.2f}'.format('Benchmark duration (s):', 1.0))\nprint('=' * 50)\n")
    data = bt.run_vllm("http://127.0.0.1:9", [1], input_len=8, output_len=4, python=_fake_client(tmp_path, summary))
    lv = data["levels"][0]
    assert (lv["completed"], lv["failed"], lv["valid"]) == (7, 3, False) and lv["errors"] == []
    # a client that writes nothing and fails: invalid, its output kept
    data = bt.run_vllm("http://127.0.0.1:9", [2], input_len=8, output_len=4,
                       python=_fake_client(tmp_path, "print('boom: tokenizer not found'); sys.exit(1)\n"))
    lv = data["levels"][0]
    assert not lv["valid"] and lv["completed"] is None and lv["failed"] == 10
    assert any("exit status 1" in e for e in lv["errors"]) and any("tokenizer not found" in e for e in lv["errors"])
    # past its time limit: killed, its requests counted as timed out
    monkeypatch.setattr(bt, "STARTUP_ALLOWANCE_S", 0.0)
    data = bt.run_vllm("http://127.0.0.1:9", [1], input_len=8, output_len=4, level_timeout=0.5,
                       python=_fake_client(tmp_path, "import signal\nsignal.pause()\n"))
    lv = data["levels"][0]
    assert lv["timed_out"] == 10 and not lv["valid"] and any("ran past" in e for e in lv["errors"])
