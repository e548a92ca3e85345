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


def test_rollback_summary_at_80_columns_keeps_each_action_next_to_its_file():
    """At 80 columns the summary is one block per host; each file is a row of its own whose label
    is what the run did to it, so "removed" never wraps onto a line apart from its file name."""
    from rich.console import Console

    from orchestrator.ui import print_summary

    d = "/opt/sglang/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_9_0/"
    up, down = "E=8,N=64,device_name=NVIDIA_H200.json", "E=8,N=64,device_name=NVIDIA_H200_down.json"
    r = _recap(rolled_back="r1", installed=[d + up], deleted=[d + down],
               bench_before={"output_throughput": 520.0, "server_version": "0.5.23 (a stand-in, simulated)"},
               bench_after={"output_throughput": 460.9}, throughput_change_pct=-11.37)
    console = Console(width=80, force_terminal=False, record=True)
    print_summary(console, {"gpu-a": r})
    lines = console.export_text().splitlines()
    assert all(len(ln.rstrip()) <= 80 for ln in lines)
    assert any(ln.split() == ["restored", up] for ln in lines), lines
    assert any(ln.split() == ["removed", down] for ln in lines), lines
    assert not any(ln.split() == ["removed"] for ln in lines)
