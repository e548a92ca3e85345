"""The terminal summary says what happened, the same way for every kind of run."""

from __future__ import annotations

from orchestrator.engine.results import HostRecap
from orchestrator.facts.summary import RunSummary
from orchestrator.ui import _summary_fields


def _recap(**summary) -> HostRecap:
    r = HostRecap("gpu-a")
    r.summary = RunSummary.from_dict(summary)  # as a run record holds it
    return r


def test_rollback_names_what_it_put_back_and_removed_and_compares_throughput():
    fields = dict(_summary_fields(_recap(
        rolled_back="r1", installed=["/c/E=8,N=64,device_name=NVIDIA_H200.json"],
        deleted=["/c/E=8,N=64,device_name=NVIDIA_H200_down.json"],
        bench_before={"output_throughput": 520.0, "server_version": "0.5.23"},
        bench_after={"output_throughput": 460.9, "server_version": "0.5.23"}, throughput_change_pct=-11.37)))
    assert fields["files"] == ("restored E=8,N=64,device_name=NVIDIA_H200.json\n"
                               "removed E=8,N=64,device_name=NVIDIA_H200_down.json")
    assert fields["output tok/s before → after"] == "520.0 → 460.9 (-11.4%)\nserver: sglang 0.5.23"


def test_the_server_says_what_it_is_next_to_the_throughput():
    fields = dict(_summary_fields(_recap(
        installed=["/c/a.json"], bench_before={"output_throughput": 100.0},
        bench_after={"output_throughput": 131.6, "server_version": "0.5.23 (orch test-bed stand-in: throughput "
                                                                   "simulated, not a model)"},
        throughput_change_pct=31.6)))
    assert fields["output tok/s before → after"].endswith(
        "(+31.6%)\nserver: sglang 0.5.23 (orch test-bed stand-in: throughput simulated, not a model)")
    # no benchmark, no server line
    assert dict(_summary_fields(_recap(installed=["/c/a.json"])))["output tok/s before → after"] == "-"
