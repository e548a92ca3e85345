"""The doctor's verdict as a pure function of gathered facts (``classify``), one case per verdict,
without the test bed (tests/e2e/test_doctor.py runs the same verdicts on bed hosts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.facts.probe import ProbeFacts
from orchestrator.facts.schema import from_dict
from orchestrator.facts.unit import UnitFacts
from remote.engines.sglang.moe_log import parse_moe_log
from orchestrator.host.hazards import RootHazards
from orchestrator.tasks.diagnose import DoctorFacts, classify

CASES = json.loads((Path(__file__).parent / "doctor_cases.json").read_text())


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in CASES])
def test_verdict(case):
    facts = DoctorFacts(unit=from_dict(UnitFacts, case["unit"]), probe=ProbeFacts.from_dict(case["probe"]),
                        log=parse_moe_log(case["log"]) if case["log"] is not None else None,
                        file_errors=case.get("file_errors", {}), changed_since_start=case.get("changed_since_start", []),
                        orphans=case.get("orphans", []), installed_by_run=case.get("installed_by_run"),
                        start_failure=case.get("start_failure"), unfinished=case.get("unfinished", []),
                        lock=case.get("lock"),
                        hazards=RootHazards(**case["hazards"]) if "hazards" in case else None,
                        pair_mismatch=case.get("pair_mismatch"))
    row = classify(facts)
    want = case["expect"]
    assert row["verdict"] == want["verdict"], row["why"]
    assert want["why"] in row["why"]
    for note in want.get("notes", []):
        assert note in row["notes"], row["notes"]
    if "installed_by_run" in want:
        assert row["installed_by_run"] == want["installed_by_run"]


def test_every_verdict_has_a_case():
    assert {c["expect"]["verdict"] for c in CASES} == {"tuned", "fallback", "default", "not-triton", "restart-needed",
                                                       "broken", "unfinished-run", "not-applicable"}


def test_an_unfinished_runs_fix_is_orch_recover_and_doctor_fails():
    from orchestrator.cli.doctor import GOOD, fix_command

    fix = fix_command("gpu-a", {"verdict": "unfinished-run"}, "hosts.yaml", "sglang-qwen")
    assert fix.startswith("orch recover hosts.yaml --service sglang-qwen --limit gpu-a")
    assert "unfinished-run" not in GOOD  # exit status 1
