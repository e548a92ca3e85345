"""The unit's downtime per host (orchestrator/facts/downtime.py) from the steps' own clocks, and
how the terminal summary, the HTML report and the run record carry it."""

from __future__ import annotations

import json
import shutil

import pytest

from orchestrator import report as rep
from orchestrator.engine.context import HostContext, RunOptions
from orchestrator.engine.results import HostRecap
from orchestrator.facts.downtime import PARTS, Downtime, Phase, PreparedTune, downtime
from orchestrator.facts.summary import RunSummary
from orchestrator.ui import _summary_fields, downtime_text
from tests.paths import DATA

RUN_ID = "20261129T092040Z-tune-6c2b53"


def _phases(*spans):
    return [Phase(name, float(a), float(b)) for name, a, b in spans]


def test_parts_follow_each_other_and_add_up_to_the_total():
    d = downtime(_phases(("stop", 100, 103), ("tune", 104, 160), ("install", 161, 162), ("start", 163, 165),
                         ("readiness", 165.5, 190)), prepared=True)
    assert d.parts() == {"stop": 3.0, "tune": 57.0, "install": 2.0, "start": 3.0, "readiness": 25.0}
    assert d.total == 90.0 == pytest.approx(sum(d.parts().values()))
    assert d.stopped_at == 100 and d.back_at == 190 and d.ended and d.prepared
    assert d.line() == "90.0 s: stop 3.0, tune 57.0, install 2.0, start 3.0, readiness 25.0"


def test_a_step_that_did_not_run_gives_its_time_to_the_next():
    # files from the store: no tune step; the reap and the records fall into the install part
    d = downtime(_phases(("stop", 0, 2), ("install", 5, 6), ("start", 6, 8), ("readiness", 8, 12)))
    assert d.parts() == {"stop": 2.0, "tune": 0.0, "install": 4.0, "start": 2.0, "readiness": 4.0}
    assert d.total == 12.0 and "(compiled after the stop)" in d.line()
    # no readiness wait: the downtime ends with the start
    d = downtime(_phases(("stop", 0, 2), ("tune", 2, 30), ("install", 30, 31), ("start", 31, 33)))
    assert d.total == 33.0 and d.readiness == 0.0 and d.ended


def test_a_unit_not_started_again_has_no_total_and_the_last_stop_counts():
    d = downtime(_phases(("stop", 0, 2), ("tune", 2, 30)))
    assert d.total is None and not d.ended and d.tune == 28.0 and d.line().startswith("not back")
    d = downtime(_phases(("stop", 0, 1), ("start", 1, 2), ("readiness", 2, 5), ("stop", 50, 52), ("tune", 52, 60),
                         ("start", 61, 62), ("readiness", 62, 70)))
    assert d.stopped_at == 50 and d.total == 20.0 and d.install == 0.0 and d.start == 2.0
    assert downtime(_phases(("tune", 0, 5))) is None


def test_mark_phase_uses_the_steps_start_and_updates_the_summary(tmp_path):
    ctx = HostContext("gpu-a", {}, RunOptions(run_id="r1", run_dir=tmp_path), lambda *a, **k: None)
    ctx.step_started = 1000.0
    ctx.mark_phase("stop")
    assert ctx.run.phases[0].start == 1000.0 and ctx.run.phases[0].end >= 1000.0
    d = ctx.run.summary.downtime
    assert isinstance(d, Downtime) and d.stopped_at == 1000.0 and d.total is None


def _summary(**over) -> RunSummary:
    s = RunSummary(downtime=downtime(_phases(("stop", 0, 2.5), ("tune", 3, 48), ("install", 48, 49),
                                             ("start", 49, 51), ("readiness", 51, 63)), prepared=True),
                   prepared=PreparedTune(ok=True, dir="/var/lib/orch/work/x/prepared", kernels=1803, seconds=140.2,
                                         workers=8, nice=10, target="cuda sm_90 (NVIDIA H200)"),
                   prepared_used={"used": True, "kernels": 1803})
    for k, v in over.items():
        setattr(s, k, v)
    return s


def test_terminal_summary_shows_the_split_and_where_the_kernels_were_compiled():
    text = downtime_text(_summary())
    assert text.splitlines() == ["63.0 s", "stop 2.5, tune 45.5, install 1.0", "start 2.0, readiness 12.0",
                                 "1803 kernels prepared before the stop"]
    failed = _summary(prepared=PreparedTune(ok=False, reason="payload prepare failed (crash)"),
                      prepared_used={"used": False, "reason": "the prepare step failed: payload prepare failed"})
    assert downtime_text(failed).endswith("compiled after the stop")
    assert dict(_summary_fields(HostRecap("gpu-a", summary=_summary())))["unit downtime"].startswith("63.0 s")
    assert downtime_text(RunSummary()) == "-"


def test_run_record_and_html_report_carry_the_downtime(tmp_path):
    s = _summary()
    back = RunSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.downtime.parts() == s.downtime.parts() and back.downtime.total == 63.0
    assert back.prepared.kernels == 1803 and back.prepared_used["used"] is True
    run_dir = tmp_path / "runs" / RUN_ID
    shutil.copytree(DATA / "report_run", run_dir)
    recap = json.loads((run_dir / "recap.json").read_text())
    recap["gpu-a"]["summary"].update(s.to_dict())
    (run_dir / "recap.json").write_text(json.dumps(recap))
    html = rep.build_report(run_dir, plots=False).read_text()
    assert "<h3>Unit downtime</h3>" in html and "The unit was down for <b>63.0 s</b>" in html
    for part in PARTS:
        assert f"<th class=\"n\">{part} s</th>" in html
    assert "1803 kernels compiled before the stop for cuda sm_90 (NVIDIA H200) in 140.2 s" in html
    assert '<td class="n">63.0</td>' in html  # the recap row
