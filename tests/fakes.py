"""Scripted stand-ins for a host, for fast in-process tests of tasks and facts (no test bed).

Like Invoke's ``MockContext(run={command: Result})``: every command a task runs must be scripted,
and an unscripted one fails the test loudly, so a test says exactly what a task does on a host.

- :class:`ScriptedConnection`: ``run(argv)`` answers from a script of (pattern -> result);
  records every call (argv, become); :func:`unit_host` scripts one with a systemd unit and files.
- :class:`FakeSSHTransport`: a Paramiko transport whose peer answers keepalive requests, or never does.
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
        #: each command as it was passed (a task must pass an argument list, never a shell string)
        self.raw_calls: list[Any] = []
        self.files: dict[str, bytes] = {}
        self.put_files: dict[str, bytes] = {}
        self.closed = False

    def on(self, pattern: str, answer: Any = "") -> "ScriptedConnection":
        """Add ``pattern -> answer`` to the script (before the existing entries)."""
        self.script.insert(0, (pattern, answer))
        return self

    def run(self, argv, *, check: bool = True, timeout: float | None = None, become: bool = False,
            on_stdout_line: Callable[[str], None] | None = None, **_kw) -> CommandResult:
        self.raw_calls.append(argv)
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


def unit_host(show: str, cat: str, files: dict[str, str] | None = None, cat_ok: bool = True) -> ScriptedConnection:
    """A host with one systemd unit, for reading it (``gather_unit``): ``systemctl show`` answers
    ``show``, ``systemctl cat`` answers ``cat`` (``cat_ok`` False: the manager has no file for it,
    "No files found"); ``head -c N -- PATH`` reads ``files`` (another path: "No such file") and
    ``test -x PATH`` finds them; the main process's environment (``/proc/PID/environ``) is gone."""
    files = dict(files or {})

    def head(argv):
        path = argv[-1]
        if path in files:
            return 0, files[path], ""
        return 1, "", f"head: cannot open '{path}': No such file or directory"

    return ScriptedConnection([
        (r"^systemctl (--user )?show", show),
        (r"^systemctl (--user )?cat", cat if cat_ok else (1, "", "No files found")),
        (r"^head -c", head),
        (r"^test -x", lambda argv: (0 if argv[-1] in files else 1, "", "")),
        (r"^cat /proc/\d+/environ$", (1, "", "No such file or directory")),
    ])


class FakeSSHTransport:
    """A Paramiko transport whose peer answers global requests (``answers``) or never does (a frozen
    sshd: no reply until the transport closes). ``requests`` lists ``(kind, wait)`` of each."""

    def __init__(self, answers: bool):
        self.answers = answers
        self.active = True
        self.closed = threading.Event()
        self.requests: list[tuple[str, bool]] = []
        self.released = threading.Event()

    def is_active(self) -> bool:
        return self.active

    def global_request(self, kind, data=None, wait=True):
        self.requests.append((kind, wait))
        if not self.answers:  # a frozen sshd: no reply until the transport closes
            self.released.wait()
            return None
        return None  # OpenSSH answers keepalive@openssh.com with a failure: a reply all the same

    def close(self) -> None:
        self.active = False
        self.released.set()
        self.closed.set()


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

    def started(self, unit: str) -> bool:
        """Whether this client started the transient unit ``unit`` (the real client's reattach
        question): a fake starts none."""
        return False


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
