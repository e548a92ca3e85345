"""The stand-in vLLM server (tests/testbed/standin_vllm): its two entry forms start, answer vLLM's
HTTP API on loopback, and log what the release's own lookup code loads for the files on disk."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
TREE = REPO / "tests" / "testbed" / "standin_vllm"
QWEN = REPO / "tests" / "data" / "models" / "Qwen3-30B-A3B.json"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def run(tmp_path):
    procs = []

    def start(argv: list[str], env: dict | None = None, config=QWEN):
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(config.read_text() if isinstance(config, Path) else json.dumps(config))
        port = _port()
        words = [w.replace("{model}", str(model)) for w in argv] + ["--host", "127.0.0.1", "--port", str(port)]
        e = dict(os.environ, PYTHONPATH=str(TREE), ORCH_STANDIN_WARMUP_S="0", **(env or {}))
        e.pop("VLLM_TUNED_CONFIG_FOLDER", None) if "VLLM_TUNED_CONFIG_FOLDER" not in (env or {}) else None
        log = tmp_path / f"log{len(procs)}.txt"
        p = subprocess.Popen([sys.executable, *words], env=e, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        while True:  # wait on progress: the server's own start-up line, or its exit
            text = log.read_text()
            if "Application startup complete." in text:
                break
            if p.poll() is not None:
                raise AssertionError(f"the stand-in exited {p.returncode}:\n{text}")
            time.sleep(0.05)
        return url, log, model
    yield start
    for p in procs:
        p.terminate()
        p.wait()


def test_api_server_module_answers_and_logs_the_shipped_file(run):
    url, log, model = run(["-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "-tp", "1"])
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == str(model)
    ans = httpx.post(url + "/v1/completions", json={"model": str(model), "prompt": "hi", "max_tokens": 4,
                                                    "temperature": 0, "return_token_ids": True}).json()
    assert ans["usage"]["completion_tokens"] == 4 and len(ans["choices"][0]["token_ids"]) == 4
    assert httpx.post(url + "/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 404
    text = log.read_text()
    assert "Using TRITON Unquantized MoE backend out of potential backends: ['TRITON'" in text
    line = next(ln for ln in text.splitlines() if "Using configuration from" in ln)
    assert line.startswith("(APIServer pid=") and " INFO " in line
    assert line.endswith("/model_executor/layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json "
                         "for MoE layer.")
    assert text.index("Using TRITON") < text.index("Using configuration") < text.index("Starting vLLM server")


def test_vllm_serve_reads_the_tuned_folder_and_logs_the_default_at_warning(run, tmp_path):
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    (tuned / "E=128,N=384,device_name=NVIDIA_H200.json").write_text(json.dumps({"1": entry}))
    serve = ["-c", "import sys; sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; sys.exit(main())",
             "serve", "{model}"]
    url, log, _ = run(serve + ["--tensor_parallel_size", "2", "--served-model-name", "qwen"],
                      env={"VLLM_TUNED_CONFIG_FOLDER": str(tuned)})
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "qwen"
    assert f"Using configuration from {tuned}/E=128,N=384,device_name=NVIDIA_H200.json for MoE layer." in \
        log.read_text()
    # TP 3: no file anywhere for N=256 (vLLM ships none for the H200): the default line at WARNING
    url, log, _ = run(serve + ["-tp", "3"], env={"VLLM_TUNED_CONFIG_FOLDER": str(tuned)})
    line = next(ln for ln in log.read_text().splitlines() if "Using default MoE config" in ln)
    assert " WARNING " in line and f"{tuned}/E=128,N=256,device_name=NVIDIA_H200.json, " in line


def test_a_named_non_triton_backend_reads_no_file_and_warning_level_hides_the_loaded_line(run):
    url, log, _ = run(["-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                       "--moe-backend", "FlashInfer-CUTLASS"])
    text = log.read_text()
    assert ("Using FlashInfer CUTLASS Unquantized MoE backend out of potential backends: "
            "['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS']." in text) \
        and "MoE config" not in text \
        and "Using configuration" not in text
    url, log, _ = run(["-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"],
                      env={"VLLM_LOGGING_LEVEL": "WARNING"})
    assert "Using configuration" not in log.read_text()


def test_streamed_completion_is_server_sent_events_with_the_usage_last(run):
    url, _, model = run(["-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"])
    body = {"model": str(model), "prompt": "a b c", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [len(c["choices"]) for c in chunks] == [1, 1, 1, 0]
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert chunks[2]["choices"][0]["finish_reason"] == "length" and chunks[0]["choices"][0]["finish_reason"] is None


def test_vllm_bench_serve_stand_in_measures_the_server_and_writes_the_releases_keys(run, tmp_path, monkeypatch):
    """``vllm bench serve`` of the stand-in tree sends real requests to the stand-in server and
    prints and writes what the release's client does (the keys and labels of vLLM's own
    ``benchmarks/serve.py``, read by the oracle test's helpers); orch's ``bench --tool vllm``
    reads its numbers."""
    from remote.engines.vllm import bench_tool as bt
    from tests.unit.remote.engines.vllm.test_bench_tool_oracle import _result_keys, _summary_lines
    from tests.vllm_releases import NEWEST

    url, log, model = run(["-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"])
    monkeypatch.setenv("PYTHONPATH", str(TREE))
    out = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--base-url", url,
                          "--random-input-len", "8", "--random-output-len", "5", "--num-prompts", "6",
                          "--max-concurrency", "2", "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result",
                          "--result-dir", str(tmp_path / "r"), "--result-filename", "x.json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "r" / "x.json").read_text())
    detailed = {"input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"}
    release = _result_keys(NEWEST)
    wanted = {k for k in release - detailed if not k.endswith(("client_queue_time_ms", "including_client_queue_ms"))}
    setup = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
             "burstiness", "max_concurrency"}
    assert wanted <= set(rec) <= release | setup, (wanted - set(rec), set(rec) - release - setup)
    assert (rec["completed"], rec["failed"], rec["total_input_tokens"], rec["total_output_tokens"]) == (6, 0, 48, 30)
    assert rec["model_id"] == str(model)  # asked from /v1/models, as vLLM does without --model
    labels = _summary_lines(NEWEST)
    printed = [ln for ln in out.stdout.splitlines() if ln.endswith(" ") and ":" in ln]
    assert printed and all(ln.split(":")[0] + ":" in labels or ln.startswith(("Mean", "Median", "P99"))
                           for ln in printed), printed
    assert {ln[:40].rstrip() for ln in printed} >= set(bt.SUMMARY_LABELS.values())
    assert bt.parse_summary(out.stdout)["completed"] == 6
    # the requests reached the server (its access lines: the model list and the completions)
    assert log.read_text().count('"POST /v1/completions HTTP/1.1" 200') == 6
    # this process's sys.path has no vllm: the client runs with the interpreter and PYTHONPATH above
    data = bt.run_vllm(url, [1, 3], input_len=8, output_len=5, num_prompts=6, level_timeout=120,
                       python=sys.executable)
    assert [(lv["max_concurrency"], lv["completed"], lv["failed"], lv["total_output_tokens"], lv["valid"])
            for lv in data["levels"]] == [(1, 6, 0, 30, True), (3, 6, 0, 30, True)]
    assert all(lv["median_ttft_ms"] > 0 and lv["output_throughput"] > 0 for lv in data["levels"])
