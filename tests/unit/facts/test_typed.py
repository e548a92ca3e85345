"""Typed facts between tasks (issue 17): the probe's answer parsed once and strictly, the facts
read by attribute in templates as in code, the run summary's JSON keys as earlier releases wrote
them."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from orchestrator import templating
from orchestrator.engine.results import TaskFailed
from orchestrator.facts.bench import BenchResult
from orchestrator.facts.catalog import HostFacts, TuningKey
from orchestrator.facts.plan import Endpoint, Plan
from orchestrator.facts.probe import ProbeFacts
from orchestrator.facts.schema import FactError, from_dict, to_dict
from orchestrator.facts.summary import BenchSummary, RunSummary
from orchestrator.facts.unit import UnitFacts
from remote.engines.sglang.server_args import ServerArgs
from orchestrator.tasks import TASKS
from tests.fakes import FakePayload, make_ctx

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "tests" / "data" / "models" / "Qwen3-30B-A3B.json"
OLD_RUN = REPO / "tests" / "data" / "report_run"


@pytest.fixture(scope="module")
def probe_answer() -> dict:
    """What this repository's payload answers to ``probe`` for a model on an H200 (no GPU here)."""
    from remote import probe as payload_probe

    parser = argparse.ArgumentParser()
    payload_probe.add_arguments(parser)
    return payload_probe.run(parser.parse_args(["--model-config", str(MODEL), "--device-name", "NVIDIA H200"]))


def test_the_payloads_probe_answer_parses_and_round_trips(probe_answer):
    """Every key the payload sends is a field of ProbeFacts and back: adding one on either side
    without the other fails here."""
    facts = ProbeFacts.parse(probe_answer, "probe")
    assert facts.to_dict() == json.loads(json.dumps(probe_answer))
    assert facts.model.E == 128 and facts.file_names["up"] == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert facts.tuner_provider.auto in ("sglang", "builtin")


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("install_dir"), "probe: missing field 'install_dir'"),
    (lambda d: d["engine"].pop("configs_root"), "probe: missing field 'engine.configs_root'"),
    (lambda d: d["model"].pop("tuner_unsupported"), "probe: missing field 'model.tuner_unsupported'"),
    (lambda d: d.update(loader_fallback=True), "probe: unknown field 'loader_fallback'"),
    (lambda d: d["model"].update(E="128"), "probe: 'model.E' must be int, got str '128'"),
    (lambda d: d.update(gpus=[{"index": 0}]), "probe: missing field 'gpus[0].name'"),
])
def test_a_probe_answer_that_does_not_fit_is_refused_naming_the_field(probe_answer, change, message):
    answer = copy.deepcopy(probe_answer)
    change(answer)
    with pytest.raises(FactError) as exc:
        ProbeFacts.parse(answer, "probe")
    assert str(exc.value).startswith(message), exc.value


def test_the_probe_task_fails_naming_the_missing_field_not_a_default(tmp_path, probe_answer):
    """A probe from an older payload (a field missing) fails at the probe task, before a plan."""
    old = {k: v for k, v in probe_answer.items() if k != "existing"}
    unit = from_dict(UnitFacts, {"server": {"model_path": "/models/qwen"}})
    ctx = make_ctx(tmp_path, {"orch_unit": unit}, payload=FakePayload({"probe": old}))
    with pytest.raises(TaskFailed, match="probe: missing field 'existing': the payload's probe answer"):
        TASKS["probe"].fn(ctx)
    ok = make_ctx(tmp_path, {"orch_unit": unit}, payload=FakePayload({"probe": probe_answer}))
    result = TASKS["probe"].fn(ok)
    assert isinstance(result.facts["orch_probe"], ProbeFacts) and result.data == probe_answer


def test_templates_read_typed_facts_by_attribute_and_by_key():
    plan = Plan(action="tune", reason="", backend="triton", install_dir="/c/triton_3_6_0",
                paths={"up": "/c/triton_3_6_0/a.json"})
    unit = from_dict(UnitFacts, {"active_state": "active", "server": {"port": 30001}})
    variables = {"orch_plan": plan, "orch_unit": unit, "orch_bench_before": BenchResult(levels=[])}
    assert templating.evaluate("orch_plan.action == 'tune' and orch_unit.active_state == 'active'", variables)
    assert templating.render("{{ orch_plan.paths }}", variables) == {"up": "/c/triton_3_6_0/a.json"}
    assert templating.render("{{ orch_plan['install_dir'] }}", variables) == "/c/triton_3_6_0"
    assert templating.render("{{ orch_unit.server.port }}", variables) == 30001
    assert templating.render("{{ 'before' if orch_bench_before is defined else none }}", variables) == "before"


def test_ctx_facts_reads_typed_and_refuses_a_variable_that_hides_a_fact(tmp_path):
    ctx = make_ctx(tmp_path, {"orch_unit": {"unit": "sglang-qwen", "server": {"tp": 2}},
                              "orch_bench_before": {"levels": [{"max_concurrency": 1}]}})
    assert isinstance(ctx.facts.unit, UnitFacts) and ctx.facts.server.tp == 2 and ctx.facts.server.port == 30000
    assert ctx.facts.bench("before").levels == [{"max_concurrency": 1}] and ctx.facts.bench("after") is None
    assert ctx.facts.plan is None
    assert make_ctx(tmp_path).facts.server == ServerArgs(interpreter="", argv=[])  # no unit read: SGLang's defaults
    ctx.vars["orch_plan"] = {"action": "tune"}  # e.g. a play variable of that name
    with pytest.raises(FactError, match="host variable orch_plan is a dict, not the Plan its task sets"):
        ctx.facts.plan


def test_a_task_fact_of_another_type_than_declared_is_refused():
    HostFacts.check({"orch_plan": Plan("skip", "r", "flashinfer_cutlass", "/c"), "orch_installed": ["/c/a.json"],
                     "orch_x": {"undeclared": "not checked here"}})
    with pytest.raises(FactError, match="fact orch_endpoint must be Endpoint, got dict"):
        HostFacts.check({"orch_endpoint": {"url": "http://127.0.0.1:30000"}})
    with pytest.raises(FactError, match="fact orch_bench_after must be BenchResult, got dict"):
        HostFacts.check({"orch_bench_after": {"levels": []}})


def test_the_summary_writes_the_keys_tasks_assigned_none_included():
    s = RunSummary()
    assert s.to_dict() == {}
    s.reap_devices = None  # the unit's GPUs were not known: said, not left out
    s.plan = Plan("tune", "", "auto", "/c", {"up": "/c/u.json"}, {"up": False})
    s.benches["before"] = BenchSummary(output_throughput=100.0, max_concurrency=4)
    s.port_freed = (s.port_freed or []) + [{"pid": 7}]
    out = s.to_dict()
    assert set(out) == {"reap_devices", "plan", "bench_before", "port_freed"} and out["reap_devices"] is None
    assert out["plan"]["paths"] == {"up": "/c/u.json"} and out["bench_before"]["output_throughput"] == 100.0
    with pytest.raises(AttributeError, match="RunSummary has no field 'plann'"):
        s.plann = None


def test_an_old_run_records_summary_reads_and_keeps_its_keys():
    old = json.loads((OLD_RUN / "recap.json").read_text())["gpu-a"]["summary"]
    s = RunSummary.from_dict(dict(old, retired_key={"kept": True}))
    assert s.bench_before.output_throughput == old["bench_before"]["output_throughput"]
    assert s.plan.paths == old["plan"]["paths"] and s.speedups() == [1.4956, 1.6996]
    back = s.to_dict()
    assert set(back) == set(old) | {"retired_key"} and back["retired_key"] == {"kept": True}
    assert {k: back[k] for k in ("installed", "reaped", "speedup_vs_default", "throughput_change_pct")} == \
        {k: old[k] for k in ("installed", "reaped", "speedup_vs_default", "throughput_change_pct")}


def test_lenient_reading_fills_defaults_and_strict_parsing_does_not():
    assert from_dict(Endpoint, {"url": "http://h:1"}) == Endpoint(url="http://h:1", via="")
    with pytest.raises(FactError, match="missing field 'via'"):
        Endpoint.parse({"url": "http://h:1"}, "endpoint")
    assert BenchResult.parse({"levels": []}, "bench").to_dict() == {"levels": []}  # optional fields stay absent
    key = TuningKey("abc", {"E": 8})
    assert to_dict(key) == {"hash": "abc", "E": 8} and TuningKey.from_dict({"hash": "abc", "E": 8}) == key
