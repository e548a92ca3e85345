"""The names ``tune --space`` and ``tune --provider`` take are spelled once (remote/protocol.py) and
every place that checks them (the inventory variable, the task arguments, the payload's parser,
the store key) checks against those tuples: a value added to one and not the others fails here."""

from __future__ import annotations

import argparse
import typing

import pytest

import remote.tuning.command
from orchestrator.facts.probe import ProbeFacts
from orchestrator.inventory.variables import KNOWN_VARS, BadValue
from orchestrator.store import StoreError, tuning_key
from orchestrator.tasks import TASKS
from remote.protocol import (DEFAULT_PROVIDER, DEFAULT_SEARCH_SPACE, PROVIDER_NAMES, RESOLVED_PROVIDERS,
                             SEARCH_SPACES, PayloadError)
from remote.tuning.support import resolve_provider_name

ENUMS = [("orch_tune_space", "space", "--space", SEARCH_SPACES, DEFAULT_SEARCH_SPACE),
         ("orch_tune_provider", "provider", "--provider", PROVIDER_NAMES, DEFAULT_PROVIDER)]


def _tune_parser() -> dict[str, argparse.Action]:
    p = argparse.ArgumentParser()
    remote.tuning.command.add_arguments(p)
    return {a.option_strings[0]: a for a in p._actions if a.option_strings}


@pytest.mark.parametrize("var,arg,flag,names,default", ENUMS)
def test_every_check_uses_the_one_tuple(var, arg, flag, names, default):
    spec = KNOWN_VARS[var]
    assert spec.default == default and spec.type == "|".join(names)
    assert [spec.check(n) for n in names] == list(names)
    with pytest.raises(BadValue, match=var):
        spec.check("fastest")
    for task in ("tune", "config_source"):
        assert typing.get_args(TASKS[task].params[arg].type) == names, task
    action = _tune_parser()[flag]
    assert tuple(action.choices) == names and action.default == default


def test_provider_names_resolve_to_the_resolved_names(monkeypatch):
    from remote.engines.sglang import kernel_roles
    monkeypatch.setattr(kernel_roles, "sglang_entry_missing", lambda: "sglang is not installed for this interpreter")
    assert resolve_provider_name("auto") == ("builtin", "sglang is not installed for this interpreter")
    assert resolve_provider_name("builtin")[0] in RESOLVED_PROVIDERS
    assert set(RESOLVED_PROVIDERS) == set(PROVIDER_NAMES) - {"auto"}
    with pytest.raises(PayloadError, match=r"auto\|sglang\|vllm\|builtin"):
        resolve_provider_name("trtllm")


def test_store_key_needs_a_resolved_provider():
    probe = {"tuner_provider": {"auto": "trtllm"}, "model": {}, "sglang": {}}
    with pytest.raises(StoreError, match="tuner_provider.auto"):
        tuning_key(ProbeFacts.from_dict(probe), "fast", None, "auto")
    for name in RESOLVED_PROVIDERS:
        typed = ProbeFacts.from_dict(dict(probe, tuner_provider={"auto": name}))
        assert tuning_key(typed, "fast", None, "auto")["provider"] == name
