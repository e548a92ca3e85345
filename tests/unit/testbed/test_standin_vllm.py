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
