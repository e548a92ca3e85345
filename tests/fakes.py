"""Scripted stand-ins for a host, for fast in-process tests of tasks and facts (no test bed).

Like Invoke's ``MockContext(run={command: Result})``: every command a task runs must be scripted,
and an unscripted one fails the test loudly, so a test says exactly what a task does on a host.

- :class:`ScriptedConnection`: ``run(argv)`` answers from a script of (pattern -> result);
  records every call (argv, become).
- :class:`FakePayload`: ``call(command, args)`` answers from a dict of command -> data (or an
  exception, or a function of the args); records every call.
- :func:`make_ctx`: a real :class:`orchestrator.engine.context.HostContext` around them; facts
  given as (partial) JSON become the typed objects their tasks set (:func:`typed_facts`).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Callable

from orchestrator.connection.base import CommandFailed, CommandResult
from orchestrator.engine.context import HostContext, RunOptions
from orchestrator.facts.catalog import HostFacts
from orchestrator.facts.schema import from_dict

RUN_ID = "20260101T000000Z-tune-abcdef"


class ScriptedConnection:
    """A connection whose commands are answered by a script.

    ``script``: list of ``(pattern, answer)``; ``pattern`` is a regular expression matched
    (``re.search``) against the command line joined by spaces, ``answer`` a
    :class:`CommandResult`-like tuple or list ``(exited, stdout, stderr)``, a string (stdout,
    exit 0), a function ``fn(argv) -> answer``, or ``{"seq": [answer, ...]}``: one answer per
    call, the last repeating. The first matching pattern answers. ``calls`` lists
    ``(argv, become)`` of every command run.
    """

    def __init__(self, script: list[tuple[str, Any]] | None = None, host: str = "h1", become: bool = False):
        self.host = host
        self.become = become
        self.script: list[tuple[str, Any]] = list(script or [])
        self.calls: list[tuple[list[str], bool]] = []
        self.files: dict[str, bytes] = {}
        self.put_files: dict[str, bytes] = {}
        self.closed = False

    def on(self, pattern: str, answer: Any = "") -> "ScriptedConnection":
        """Add ``pattern -> answer`` to the script (before the existing entries)."""
        self.script.insert(0, (pattern, answer))
        return self

    def run(self, argv, *, check: bool = True, timeout: float | None = None, become: bool = False,
            on_stdout_line: Callable[[str], None] | None = None, **_kw) -> CommandResult:
        argv = [str(a) for a in argv] if not isinstance(argv, str) else [argv]
        self.calls.append((argv, become))
        line = " ".join(argv)
        for pattern, answer in self.script:
            if re.search(pattern, line):
                if isinstance(answer, dict) and "seq" in answer:
                    seq = answer["seq"]
                    answer = seq.pop(0) if len(seq) > 1 else seq[0]
                if callable(answer):
                    answer = answer(argv)
                if isinstance(answer, str):
                    answer = (0, answer, "")
                exited, stdout, stderr = answer
                res = CommandResult(line, exited, stdout, stderr)
                if on_stdout_line:
                    for out_line in stdout.splitlines():
                        on_stdout_line(out_line)
                if check and exited != 0:
                    raise CommandFailed(res, self.host)
                return res
        raise AssertionError(f"unscripted command on {self.host}: {line}")

    def commands(self) -> list[str]:
        """Every command run, joined by spaces, in order."""
        return [" ".join(a) for a, _ in self.calls]

    def put(self, local_path: str, remote_path: str, *, become: bool = False) -> None:
        self.put_files[remote_path] = Path(local_path).read_bytes()

    def get(self, remote_path: str, local_path: str, *, become: bool = False) -> None:
        if remote_path not in self.files:
            raise AssertionError(f"unscripted download of {remote_path}")
        Path(local_path).write_bytes(self.files[remote_path])

    def close(self) -> None:
        self.closed = True


class FakePayload:
    """A payload client answering from ``responses``: command -> data dict, an exception instance
    (raised), or a function ``fn(args, request) -> data``. ``calls`` lists ``(command, args,
    request)``. An unscripted command fails the test."""

    def __init__(self, responses: dict[str, Any] | None = None, state_dir: str = "/var/lib/orch"):
        self.responses = dict(responses or {})
        self.state_dir = state_dir
        self.calls: list[tuple[str, list[str], dict | None]] = []
        self.env: dict[str, str] = {}

    def call(self, command: str, args: list[str] | None = None, *, request: dict | None = None,
             timeout: float | None = None, **_kw) -> dict:
        args = list(args or [])
        self.calls.append((command, args, request))
        if command not in self.responses:
            raise AssertionError(f"unscripted payload call: {command} {args}")
        answer = self.responses[command]
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(args, request)
        return answer


def typed_facts(variables: dict[str, Any]) -> dict[str, Any]:
    """``variables`` with each fact given as JSON (a dict for a record) turned into the typed object
    its task sets (:class:`orchestrator.facts.catalog.HostFacts`), leniently: fields the test leaves
    out take the record's defaults (:func:`orchestrator.facts.schema.from_dict`)."""
    out = dict(variables)
    for name, value in variables.items():
        decl = HostFacts.declaration(name)
        if decl is not None and isinstance(value, dict) and decl.type is not dict:
            out[name] = from_dict(decl.type, value)
    return out


def make_ctx(tmp_path: Path, variables: dict[str, Any] | None = None, *, check: bool = False,
             connection: Any = None, payload: Any = None, run_id: str = RUN_ID, name: str = "h1",
             **options: Any) -> HostContext:
    """A real :class:`HostContext` for host ``name`` whose run record lives under ``tmp_path``.
    ``emit``-ted events are in ``ctx.events`` and ``say``-lines in ``ctx.lines``."""
    opts = RunOptions(run_id=run_id, run_dir=tmp_path / "run", check=check, cancel=threading.Event(), **options)
    events: list[tuple[str, dict]] = []
    lines: list[str] = []
    ctx = HostContext(name, typed_facts(variables or {}), opts, lambda ev, **f: events.append((ev, f)),
                      echo=lines.append)
    ctx.connection = connection
    ctx.payload = payload
    ctx.events = events
    ctx.lines = lines
    return ctx
