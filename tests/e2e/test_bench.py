"""`orch bench` on the test bed: runs on the host, reports bench_serving's metric names."""

import json

import pytest

from tests.e2e.helpers import inventory, orch

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
