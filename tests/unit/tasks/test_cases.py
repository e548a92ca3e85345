"""Tasks run against a scripted host (pyinfra-style data-driven cases, ``cases/<task>.json``).

Each case gives the host's variables and what the host answers (commands: regex -> output;
payload commands -> data), the task's arguments, and what must come out: the status, the
message, the facts, the commands run (in order, as regexes), the payload calls, and what the
run recorded about itself (``ctx.run``). Commands or payload calls not scripted fail the case.

Facts are given and expected as JSON: the harness turns given facts into the typed objects their
tasks set (:func:`tests.fakes.typed_facts`), checks each fact a task returns is of its declared
type, and compares typed values by their dict form, the expectation read as its type reads it
(fields it leaves out at the type's defaults).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from orchestrator.engine.results import FAILED, TaskFailed
from orchestrator.facts.catalog import HostFacts
from orchestrator.facts.schema import from_dict, to_dict
from orchestrator.facts.summary import RunSummary
from orchestrator.payload.client import PayloadFailed
from orchestrator.tasks import TASKS
from tests.fakes import FakePayload, ScriptedConnection, make_ctx

CASES = Path(__file__).parent / "cases"


def _controller_gone() -> str:
    """A controller id (records.host.controller_id form) of this machine whose process is gone."""
    import getpass
    import socket
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return f"{getpass.getuser()}@{socket.gethostname()} pid {proc.pid}"


def _all_cases():
    out = []
    for f in sorted(CASES.glob("*.json")):
        text = f.read_text()
        if "{controller_gone}" in text:
            text = text.replace("{controller_gone}", _controller_gone())
        for c in json.loads(text):
            out.append(pytest.param(f.stem, c, id=f"{f.stem}: {c['name']}"))
    return out


def _payload(spec: dict) -> FakePayload:
    def answer(command):
        def fn(args, request):
            key = f"{command} {args[0]}" if args and f"{command} {args[0]}" in spec else command
            value = spec[key]
            if isinstance(value, dict) and "raise" in value:
                kind, msg, *detail = value["raise"]
                raise PayloadFailed(command, kind, msg, detail=detail[0] if detail else None)
            return value
        return fn
    return FakePayload({cmd.split()[0]: answer(cmd.split()[0]) for cmd in spec})


def _as_typed(name: str, expected):
    """An expected fact in the dict form of the type its task sets (as given when not a record)."""
    decl = HostFacts.declaration(name)
    if decl is None or not dataclasses.is_dataclass(decl.type):
        return expected
    return to_dict(from_dict(decl.type, expected))


@pytest.mark.parametrize("task_name, case", _all_cases())
def test_task_case(tmp_path, task_name, case):
    spec = TASKS[task_name]
    conn = ScriptedConnection([(p, a if isinstance(a, (str, dict)) else tuple(a)) for p, a in case.get("commands", [])])
    payload = _payload(case.get("payload", {}))
    ctx = make_ctx(tmp_path, case.get("vars", {}), check=case.get("check", False), connection=conn,
                   payload=payload, **case.get("options", {}))
    for k, v in case.get("run", {}).items():
        setattr(ctx.run, k, v)
    args = spec.coerce(spec.bind(case.get("args", {})))
    try:
        result = spec.fn(ctx, **args)
        status, msg, facts = result.status, result.msg, result.facts
    except TaskFailed as exc:
        status, msg, facts = FAILED, exc.msg, {}
    want = case["expect"]
    assert status == want["status"], msg
    assert want.get("msg", "") in msg, msg
    HostFacts.check(facts)
    for k, v in want.get("facts", {}).items():
        assert to_dict(facts.get(k)) == _as_typed(k, v), k
    if "no_facts" in want:
        assert not facts
    ran = conn.commands()
    pos = 0
    for pattern in want.get("commands", []):
        while pos < len(ran) and not re.search(pattern, ran[pos]):
            pos += 1
        assert pos < len(ran), f"no command matching {pattern!r} (in order) among {ran}"
        pos += 1
    for pattern in want.get("no_commands", []):
        assert not any(re.search(pattern, c) for c in ran), f"{pattern!r} must not run: {ran}"
    assert all(isinstance(a, list) for a, _ in conn.calls), "every command is an argument list"
    for call in want.get("payload_calls", []):
        assert any(c[0] == call[0] and c[1][:len(call[1])] == call[1] for c in payload.calls), (call, payload.calls)
    for k, v in want.get("run", {}).items():
        assert getattr(ctx.run, k) == v, k
    summary, wanted = ctx.run.summary.to_dict(), RunSummary.from_dict(want.get("summary", {})).to_dict()
    for k in want.get("summary", {}):
        assert summary.get(k) == wanted[k], k


def test_every_case_file_names_a_task():
    assert {f.stem for f in CASES.glob("*.json")} <= set(TASKS)
