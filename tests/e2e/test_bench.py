"""`orch bench` on the test bed: runs on the host, reports bench_serving's metric names."""

import json

import pytest

from tests.e2e.helpers import flat, inventory, orch
from tests.testbed.bed import mixed_fleet_options

pytestmark = pytest.mark.testbed

NAMES = {"duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
         "input_throughput", "output_throughput", "total_throughput", "median_ttft_ms", "p99_ttft_ms",
         "median_itl_ms", "median_e2e_latency_ms", "max_concurrency", "failed", "valid"}


def test_orch_bench_levels(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    proc = orch("bench", str(inventory(bed, tmp_path / "hosts.yaml")), "--service", "sglang-qwen",
                "--concurrency", "1,4", "--input-len", "16", "--output-len", "8", "--json", state_dir=tmp_path / "s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    levels = json.loads(proc.stdout)["hosts"][h.name]["levels"]
    assert [lv["max_concurrency"] for lv in levels] == [1, 4]
    for lv in levels:
        assert NAMES <= set(lv)
        assert lv["valid"] and lv["failed"] == 0 and lv["completed"] >= 5
        assert lv["total_output_tokens"] == lv["completed"] * 8
    # throughput rises with concurrency on the stand-in (simulated batching)
    assert levels[1]["output_throughput"] > levels[0]["output_throughput"]


def test_orch_bench_counts_failures(testbed_factory, tmp_path):
    bed = testbed_factory(1, host_options={0: {"env": {"ORCH_STANDIN_HANG_GENERATE": "1"}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    proc = orch("bench", str(inventory(bed, tmp_path / "hosts.yaml")), "--service", "sglang-qwen",
                "--concurrency", "2", "--input-len", "8", "--output-len", "4", "--level-timeout", "6", "--json",
                state_dir=tmp_path / "s")
    assert proc.returncode == 1
    levels = json.loads(proc.stdout)["hosts"][h.name]["levels"]
    assert levels and not levels[0]["valid"] and levels[0]["completed"] == 0
    assert levels[0]["failed"] + levels[0]["timed_out"] >= 10


def _posts(h) -> int:
    """Completions the host's vLLM stand-in answered (its uvicorn access lines)."""
    return h.unit_log().count('"POST /v1/completions HTTP/1.1" 200')


def _main_pid(h) -> str:
    return h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip()


def test_bench_tool_vllm_runs_vllm_bench_serve_and_another_engines_client_is_refused(testbed_factory, tmp_path):
    """``orch bench --tool vllm`` on a vLLM unit runs ``vllm bench serve`` on the host (the unit's
    own Python and tree: the stand-in client, tests/testbed/README.md) against the unit; the
    numbers are the client's (its request count, its token totals; the server answered exactly
    those requests). On the SGLang host of the same inventory the vLLM client is refused, and so
    is SGLang's client on the vLLM host: one error naming the host and the unit, nothing run."""
    bed = testbed_factory(2, mixed_fleet_options())
    sg, vl = bed.host("gpu-a"), bed.host("gpu-b")
    for h in bed.hosts:
        h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    pids = {h.name: _main_pid(h) for h in bed.hosts}
    before = _posts(vl)
    proc = orch("bench", str(inv), "--tool", "vllm", "--concurrency", "1,4", "--input-len", "16",
                "--output-len", "8", state_dir=tmp_path / "s", env={"COLUMNS": "400"})
    assert proc.returncode == 1, proc.stderr[-4000:]  # gpu-a refused
    out = flat(proc.stdout)
    assert "gpu-a: unit sglang-qwen" in out and "runs SGLang; the benchmark client 'vllm' is another engine's own" \
        in out, proc.stdout[-3000:]
    results = json.loads(next((tmp_path / "s").rglob("bench.json")).read_text())  # the run's record
    assert results["gpu-a"] == {}
    data = results["gpu-b"]
    assert data, proc.stdout[-4000:]
    assert data["tool"] == "vllm" and [lv["max_concurrency"] for lv in data["levels"]] == [1, 4]
    for lv in data["levels"]:
        assert NAMES <= set(lv) and lv["valid"] and lv["failed"] == 0 and lv["errors"] == []
        # the default prompt count per level (max(5 C, 10)), each with exactly 16 in and 8 out
        assert lv["completed"] == lv["num_prompts"] == max(5 * lv["max_concurrency"], 10)
        assert (lv["total_input_tokens"], lv["total_output_tokens"]) == (16 * lv["completed"], 8 * lv["completed"])
        assert lv["median_ttft_ms"] > 0 and lv["output_throughput"] > 0
    # vllm bench serve sends no warm-up: the server answered exactly the requests the client counted
    assert _posts(vl) - before == sum(lv["completed"] for lv in data["levels"])
    # SGLang's own client on the vLLM host: refused, no request sent
    sent = _posts(vl)
    proc = orch("bench", str(inv), "--bench-tool", "sglang", "--limit", "gpu-b", state_dir=tmp_path / "s2",
                env={"COLUMNS": "400"})
    assert proc.returncode == 1
    assert "gpu-b: unit vllm-qwen" in flat(proc.stdout) and "runs vLLM; the benchmark client 'sglang' is another " \
        "engine's own: use --bench-tool vllm or --bench-tool builtin" in flat(proc.stdout), proc.stdout[-3000:]
    assert _posts(vl) == sent
    # nothing restarted, both still serve
    assert {h.name: _main_pid(h) for h in bed.hosts} == pids
    for h in bed.hosts:
        h.wait_http("/health")
