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


def _plain_reporter(interval=None):
    import io

    from rich.console import Console

    from orchestrator.ui import Reporter

    buf = io.StringIO()
    return Reporter(Console(file=buf, force_terminal=False, width=80), progress_interval=interval), buf


def test_without_a_terminal_a_long_step_prints_plain_progress_lines():
    """Into a log (no terminal) each tick prints, per host with a tune in progress, the batch
    sizes done, the time elapsed and the time left; once the tune task ends, nothing more."""
    from orchestrator.engine.results import TaskResult
    from orchestrator.ui import plain_progress_line

    rep, buf = _plain_reporter(interval=0)  # no ticker thread: ticks by hand
    with rep:
        rep.progress("gpu-a", stage="tune", done=0, total=18)
        started = rep._plain["gpu-a"]["started"]
        rep.progress("gpu-a", stage="tune", done=3, total=18)
        (line,) = rep.tick(now=started + 72)
        assert line.split("progress ", 1)[1].startswith("gpu-a tune: 3/18 batch sizes done, 1m12s elapsed")
        assert "about 6m00s left" in line  # 72 s for 3 of 18: 15 more at that pace
        rep.task_result("gpu-a", "Tune the fused-MoE kernel", TaskResult.changed("tuned 18 batch sizes"))
        assert rep.tick() == []
    assert "3/18 batch sizes done" in buf.getvalue() and "tuned 18 batch sizes" in buf.getvalue()
    # the payload's own estimate wins over the pace
    st = {"stage": "tune", "done": 2, "total": 4, "eta_s": 100.0, "at": 50.0, "started": 0.0}
    assert plain_progress_line("h", st, 60.0).endswith("1m00s elapsed, about 1m30s left")
    assert "left" not in plain_progress_line("h", dict(st, done=4, eta_s=None), 60.0)


def test_the_ticker_prints_at_its_interval_until_the_reporter_closes():
    import threading

    rep, buf = _plain_reporter(interval=0.01)
    seen = threading.Event()
    with rep:
        rep.progress("gpu-b", stage="tune", done=1, total=2)
        for _ in range(1000):  # wait for the ticker (a readiness poll, no timed assertion)
            if "gpu-b tune: 1/2 batch sizes done" in buf.getvalue():
                seen.set()
                break
            threading.Event().wait(0.01)
    assert seen.is_set()
    assert rep._ticker is None
    # on a terminal the bar does the job: no ticker
    from rich.console import Console

    from orchestrator.ui import Reporter
    import io
    term = Reporter(Console(file=io.StringIO(), force_terminal=True), progress_interval=0.01)
    with term:
        assert term._ticker is None
