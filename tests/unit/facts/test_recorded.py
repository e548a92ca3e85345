"""Facts parsed from recorded command output (pyinfra-style data-driven cases, ``cases/<fact>.json``):
each case is the text a host printed and the fact orch must read from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.facts.files import parse_changed_since_start
from orchestrator.facts.journal import last_start, start_failure, text_since
from orchestrator.facts.processes import descendants, parse_ps_tree
from orchestrator.facts.gpus import UnresolvedDevices, gpu_table, resolve_visible_devices
from orchestrator.facts.systemd_env import expand_exec_argv, parse_env_file
from orchestrator.facts.unit import parse_server_args, parse_show, parse_show_exec_start

CASES = Path(__file__).parent / "cases"


def cases(fact: str):
    data = json.loads((CASES / f"{fact}.json").read_text())
    return [pytest.param(c, id=c["name"]) for c in data]


@pytest.mark.parametrize("case", cases("journal.text_since"))
def test_text_since(case):
    assert text_since(case["before"], case["now"]) == case["expected"]


@pytest.mark.parametrize("case", cases("journal.last_start"))
def test_last_start(case):
    assert last_start(case["text"]) == case["expected"]


@pytest.mark.parametrize("case", cases("journal.start_failure"))
def test_start_failure(case):
    assert start_failure(case["text"]) == case["expected"]


@pytest.mark.parametrize("case", cases("processes.unit_tree"))
def test_unit_tree(case):
    assert sorted(descendants(parse_ps_tree(case["ps"]), case["main_pid"])) == case["expected"]


@pytest.mark.parametrize("case", cases("files.changed_since_start"))
def test_changed_since_start(case):
    assert parse_changed_since_start(case["stdout"], case["paths"]) == case["expected"]


@pytest.mark.parametrize("case", cases("unit.show"))
def test_systemctl_show(case):
    props = parse_show(case["show"])
    assert {k: props.get(k) for k in case["expected"]} == case["expected"]
    sa = parse_server_args(parse_show_exec_start(props["ExecStart"]))
    assert {k: getattr(sa, k) for k in case["server"]} == case["server"]


@pytest.mark.parametrize("case", cases("unit.env_file"))
def test_environment_file(case):
    assert parse_env_file(case["text"]) == case["expected"]


@pytest.mark.parametrize("case", cases("unit.exec_expand"))
def test_exec_start_expansion(case):
    assert expand_exec_argv(case["argv"], case["env"]) == case["expected"]


@pytest.mark.parametrize("case", cases("gpus.visible_devices"))
def test_visible_devices(case):
    gpus = gpu_table(case["query"], case["list"], case["driver"])
    assert gpus and [g.index for g in gpus] == list(range(len(gpus)))
    if case["expected"] is None:
        with pytest.raises(UnresolvedDevices, match="CUDA_VISIBLE_DEVICES"):
            resolve_visible_devices(case["cvd"], gpus)
    else:
        assert resolve_visible_devices(case["cvd"], gpus) == case["expected"]


def test_every_case_file_is_used():
    used = {"journal.text_since", "journal.last_start", "journal.start_failure", "processes.unit_tree",
            "files.changed_since_start", "unit.show", "unit.env_file", "unit.exec_expand", "gpus.visible_devices"}
    assert {p.stem for p in CASES.glob("*.json")} == used
