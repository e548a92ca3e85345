"""``find_servers`` (orchestrator.cli.run): a unit record the discovery pass cannot read back is
orch's own fault and stops the run with one clear error, instead of a host quietly left out of
its multi-node server (which would then be retuned one rank at a time)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from orchestrator.cli import run as run_mod
from orchestrator.engine.context import RunOptions
from orchestrator.engine.results import TaskResult
from orchestrator.engine.task import READ_ONLY, task


@dataclass
class H:
    name: str
    groups: list = field(default_factory=list)


def _tasks(server: dict):
    mods: dict = {}

    @task("connect", check_mode=READ_ONLY, registry=mods)
    def connect(ctx):
        return TaskResult.ok("connected")

    @task("unit_facts", check_mode=READ_ONLY, registry=mods)
    def unit_facts(ctx, name: str):
        return TaskResult.ok("read", unit=name, server=server)

    return mods


def _find(tmp_path, monkeypatch, server):
    monkeypatch.setattr(run_mod, "TASKS", _tasks(server))
    events = []
    opts = RunOptions(run_id="r1", run_dir=tmp_path / "run", check=True)
    hosts = [H("a"), H("b")]
    return run_mod.find_servers(hosts, lambda h: {"service": "u"}, opts,
                                lambda ev, **f: events.append((ev, f))), events


def test_a_unit_record_that_does_not_read_back_is_one_clear_error(tmp_path, monkeypatch):
    def broken(data):
        raise KeyError("engine")

    monkeypatch.setattr(run_mod.UnitFacts, "from_dict", staticmethod(broken))
    with pytest.raises(RuntimeError, match=r"internal error: a's unit record does not read back \(KeyError"):
        _find(tmp_path, monkeypatch, {"engine": "nonesuch"})


def test_single_node_units_form_no_server_group(tmp_path, monkeypatch):
    class Facts:
        server = None

    monkeypatch.setattr(run_mod.UnitFacts, "from_dict", staticmethod(lambda data: Facts))
    monkeypatch.setattr(run_mod, "group_servers", lambda units: {})
    (found, recaps), events = _find(tmp_path, monkeypatch, {"engine": "sglang"})
    assert found == {} and not any(ev == "multi_node_servers" for ev, _ in events)
    assert set(recaps) == {"a", "b"}
