"""The controller's side of the payload protocol (v1, docs/protocol.md): run ``python -m remote
<command>`` on a host and read its JSON lines; stop a run's tagged payload commands.

:class:`PayloadClient` is built by the ``payload`` task once the payload is on the host
(:mod:`orchestrator.payload.deploy`); later tasks call ``ctx.payload.call(...)``, and the host's run
records and lock go through :class:`orchestrator.records.host.HostRecords` on top of it.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import tempfile
import threading
import time
from typing import Any, Callable

import tenacity

from remote.protocol import is_run_id

from ..connection.base import ConnectError, HostUnreachable
from ..connection.deadline import clamp
from ..host.container import payload_container
from ..engine.results import Cancelled, TaskFailed
from .transient import (COLLECT_SINCE, RUNNING_STATES, STOP_POST_RESULT_SINCE, UnitUnavailable, env_file_text,
                        parse_stop_post_result, stop_post_result, stop_unit, systemd_version, transient, unit_files,
                        unit_state)

PROTO = 1
#: seconds between two polls of a payload command run in a transient unit
POLL_S = 2.0
#: polls in a row that may fail without losing the link (no state read, a command's timeout) before
#: the failure is raised; a lost link is raised at once (the engine logs in again and reattaches)
POLL_RETRIES = 10


def _poll_retrying(poll_s: float) -> tenacity.Retrying:
    """Tries of one poll of a transient unit: a :class:`ConnectError` that is not a lost link is
    tried again ``poll_s`` s later, :data:`POLL_RETRIES` tries in all; the last one is re-raised."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, ConnectError)
                                          and not isinstance(e, HostUnreachable)),
        stop=tenacity.stop_after_attempt(POLL_RETRIES), wait=tenacity.wait_fixed(poll_s), reraise=True)


class ContainerPayload:
    """Where the container commands of :meth:`PayloadClient.in_container` run: ``run`` (the
    unit's parsed run command), ``interpreter`` (the image's Python), ``commands``."""

    def __init__(self, run, interpreter: str, commands: frozenset[str]):
        self.run, self.interpreter, self.commands = run, interpreter, commands


class PayloadFailed(TaskFailed):
    """The payload ended with an ``error`` line or crashed.

    ``kind`` is the protocol error kind (``bad_input``, ``not_found``, ``locked``,
    ``runtime``, or ``crash`` when no final line came); ``stderr_tail`` the last lines
    of its stderr (kept for the report).
    """

    def __init__(self, command: str, kind: str, msg: str, stderr_tail: str = "", detail: Any = None):
        text = f"payload {command} failed ({kind}): {msg}"
        if stderr_tail and kind in ("crash", "runtime", "out of host memory"):
            text += "\n" + stderr_tail
        super().__init__(text, {"kind": kind, "stderr_tail": stderr_tail, "detail": detail})
        self.kind = kind


class PayloadClient:
    """Runs ``python -m remote <command>`` on a host with the unit's interpreter.

    ``root`` is the unpacked payload folder (``<state_dir>/payload/<sha12>``);
    ``env`` extra environment (``TRITON_INTERPRET=1`` on test beds); ``wrapper``: the unit's
    launch wrappers (``numactl ...``, ``conda run ...``: ``Launch.wrapper`` of
    :mod:`remote.engines.sglang.launcher`), put before the interpreter so the payload runs as the server
    runs (after ``timeout``, whose command line keeps the run's tag).
    ``call``'s timeout is cut to what is left of the running task's ``timeout:``.
    """

    def __init__(self, connection, interpreter: str, root: str, state_dir: str, env: dict[str, str] | None = None,
                 cancel: threading.Event | None = None, wrapper: list[str] | None = None):
        self.connection = connection
        self.wrapper = list(wrapper or [])
        self.cancel = cancel
        #: prefix of the ORCH_TAG of this run's long commands (see :func:`stop_payload`)
        self.run_tag = "orch"
        self.interpreter = interpreter
        self.root = root
        self.state_dir = state_dir
        self.env = dict(env or {})
        #: a container unit's image runs these commands (:meth:`in_container`); None: all on the host
        self.container: ContainerPayload | None = None
        #: transient units this client started and has not seen end: unit -> ``time.monotonic()``
        #: of the start (:meth:`call_in_unit` reattaches to one of them; :meth:`started` asks)
        self._units: dict[str, float] = {}

    def in_container(self, run, interpreter: str, commands=("probe", "prepare", "tune")) -> None:
        """Run ``commands`` inside a fresh ``--rm`` container of the container unit ``run``
        (:class:`orchestrator.facts.container.ContainerRun`) with the image's ``interpreter``,
        the unit's GPU, mount and environment options and this payload mounted read-only
        (:func:`orchestrator.host.container.payload_container`); the other commands (install,
        restore, reap, port, lock, ...) act on the host and run with the host's Python."""
        self.container = ContainerPayload(run, interpreter, frozenset(commands))

    def argv(self, command: str, args: list[str], timeout: float | None = None, tag: str | None = None) -> list[str]:
        """The full argument list run on the host (quoted by the connection).

        ``tag`` (``ORCH_TAG=<random>``) marks the command line so an interrupted run can
        signal exactly this process (``pkill -f``), never another.
        """
        extra = dict(self.env)
        # the unit's own PYTHONPATH (where its sglang may live) follows the payload's root
        pythonpath = ":".join(p for p in (self.root, extra.pop("PYTHONPATH", "")) if p)
        # no __pycache__ in the verified payload tree (an added file counts as tampering)
        env = [f"PYTHONPATH={pythonpath}", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"]
        env += [f"{k}={v}" for k, v in sorted(extra.items())]
        if tag:
            env.append(f"ORCH_TAG={tag}")
        argv = [*self.wrapper, "env", *env, self.interpreter, "-m", "remote", command, *[str(a) for a in args]]
        c = self.container
        if c is not None and command in c.commands:
            # the tag marks the runtime client's command line (SIGTERM reaches the payload through
            # the client's signal proxy); the container gets the run tag in its name, so a rescue
            # can end it through the runtime (orchestrator.host.container), never by host PID
            inner = [e for e in env if not e.startswith("ORCH_TAG=")]
            name = f"orch-{(tag or self.run_tag).replace('.', '-')}-{secrets.token_hex(3)}"
            argv = [*payload_container(c.run, self.root, self.state_dir, name,
                                       ["-e", f"ORCH_TAG={tag}"] if tag else []),
                    "env", *inner, c.interpreter, "-m", "remote", command, *[str(a) for a in args]]
        if timeout:
            # a dropped SSH channel does not stop a remote command: bound it on the host too
            argv = ["timeout", "--kill-after=30", str(int(timeout)), *argv]
        return argv

    def push_request(self, name: str, data: dict) -> str:
        """Upload ``data`` as JSON into the payload's request folder (root-only: through sudo
        when the host uses ``ansible_become``); return its path."""
        req_dir = posixpath.join(self.state_dir, "payload", "requests")
        self.connection.run(["mkdir", "-p", req_dir], become=True)
        self.connection.run(["chmod", "700", req_dir], become=True)
        remote = posixpath.join(req_dir, f"{name}-{secrets.token_hex(4)}.json")
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(data, fh)
            local = fh.name
        try:
            self.connection.put(local, remote, become=True)
        finally:
            os.unlink(local)
        return remote

    def call(self, command: str, args: list[str] | None = None, *, request: dict | None = None,
             timeout: float | None = None, on_progress: Callable[[dict], None] | None = None,
             on_log: Callable[[dict], None] | None = None, become: bool = True,
             interruptible: bool = False) -> dict:
        """Run one payload command and return the ``data`` of its ``result`` line.

        ``timeout`` (s) bounds it on the host (``timeout``) and on the controller.
        ``interruptible`` (long commands: tune, bench): an operator interrupt sends SIGTERM
        to it on the host, so the rescue steps can run at once.
        Raises :class:`PayloadFailed` on an ``error`` line, a crash or a missing result;
        connection errors (:class:`HostUnreachable`, :class:`CommandTimeout`) pass through;
        :class:`Cancelled` when an operator interrupt stopped an ``interruptible`` command.
        """
        args = list(args or [])
        timeout = clamp(timeout)
        if request is not None:
            args += ["--request", self.push_request(command, request)]
        final: dict = {}

        def on_line(line: str) -> None:
            line = line.strip()
            if not line.startswith("{"):
                return
            try:
                msg = json.loads(line)
            except ValueError:
                return
            if msg.get("proto") != PROTO:
                return
            kind = msg.get("type")
            if kind == "progress" and on_progress:
                on_progress(msg)
            elif kind == "log" and on_log:
                on_log(msg)
            elif kind in ("result", "error"):
                final.update(msg)

        tag = None
        if interruptible and timeout:
            tag = f"{self.run_tag}.{secrets.token_hex(4)}"
        done = threading.Event()
        watcher = None
        if tag and self.cancel is not None and not self.cancel.is_set():
            watcher = threading.Thread(target=self._stop_on_cancel, args=(tag, done), daemon=True)
            watcher.start()
        try:
            res = self.connection.run(self.argv(command, args, timeout, tag), check=False, become=become,
                                     timeout=(timeout + 60) if timeout else None, on_stdout_line=on_line)
        finally:
            done.set()
            if watcher is not None:
                watcher.join(timeout=30)
        tail = "\n".join(res.stderr.strip().splitlines()[-20:])
        if final.get("type") == "result":
            return final.get("data") or {}
        if tag and self.cancel.is_set():  # we stopped it ourselves: say so, not "crash"
            raise Cancelled(f"payload {command} stopped: interrupted by the operator")
        if final.get("type") == "error":
            raise PayloadFailed(command, final.get("kind", "runtime"), final.get("msg", ""), tail, final.get("detail"))
        why = "killed by timeout" if res.exited in (124, 137) else f"exit {res.exited}"
        raise PayloadFailed(command, "crash", f"no result line ({why})", tail)


    def started(self, unit: str) -> bool:
        """True when this client started the transient unit ``unit`` and has not seen it end (a
        :meth:`call_in_unit` for it reattaches)."""
        return unit in self._units

    def systemd_version(self) -> int | None:
        """The host's systemd version (``systemd-run --version``, asked once per client); None
        when ``systemd-run`` does not answer with one."""
        if not hasattr(self, "_systemd_version"):
            res = self.connection.run(["systemd-run", "--version"], check=False, become=True, timeout=60)
            self._systemd_version = systemd_version(res.stdout) if res.ok else None
        return self._systemd_version

    def start_unit(self, command: str, args: list[str], unit: str, *, props: list[str] | None = None,
                   tag: str | None = None, environment: dict[str, str] | None = None,
                   ticket: dict | None = None) -> dict:
        """Start ``python -m remote COMMAND ARGS`` as the transient unit ``unit`` (``systemd-run``,
        :mod:`orchestrator.payload.transient`), returning at once; returns how (``unit``,
        ``systemd``: the host's version, ``collect``).

        The unit writes its JSON lines to ``<state_dir>/units/<unit>.out`` (stderr to ``.err``).
        ``props``: more ``--property=`` values. ``environment``: the unit's effective environment
        (the server's, :attr:`orchestrator.facts.unit.UnitFacts.environment`), written to a
        root-only ``.env`` file the unit reads with ``EnvironmentFile=``: systemd gives a
        transient unit only its manager's environment, never the caller's shell's, and the
        server's (``TRITON_PTXAS_PATH``, ``CUDA_HOME``, ``LD_LIBRARY_PATH``: triton #10331)
        would be missing; the command line's own ``env`` assignments still come last. ``ticket``:
        what the command is for (JSON), written beside its output first. ``--collect`` where
        systemd has it (>= 236): a unit of the name that ended failed would otherwise stay loaded
        and refuse the name until ``reset-failed`` (systemd PR #31990); how it ended then comes
        from the ``.result`` file its ``ExecStopPost=`` writes (:func:`stop_post_result`). A unit
        of the name that is loaded but not running (an earlier one that failed) is unloaded first.
        Raises :class:`UnitUnavailable` when the unit could not be started (nothing of it runs)."""
        t = self.connection
        paths = unit_files(self.state_dir, unit)
        version = self.systemd_version()
        collect = version is not None and version >= COLLECT_SINCE
        out_dir = posixpath.dirname(paths["out"])
        t.run(["mkdir", "-p", out_dir], become=True)
        t.run(["chmod", "700", out_dir], become=True)
        t.run(["rm", "-f", paths["out"], paths["err"], paths["ticket"], paths["env"], paths["result"]], become=True)
        if ticket is not None:
            self._put_text(json.dumps(ticket), paths["ticket"])
        all_props = [f"StandardOutput=file:{paths['out']}", f"StandardError=file:{paths['err']}", *(props or [])]
        if environment:
            self._put_text(env_file_text(environment), paths["env"])
            all_props.append(f"EnvironmentFile={paths['env']}")
        post = stop_post_result(paths["result"])
        if post and (version is None or version >= STOP_POST_RESULT_SINCE):
            all_props.append(f"ExecStopPost={post}")
        launch = ["systemd-run", f"--unit={unit}", f"--description=orch payload {command}", "--quiet",
                  *(["--collect"] if collect else []), *[f"--property={p}" for p in all_props], "--",
                  *self.argv(command, args, tag=tag)]
        res = t.run(launch, check=False, become=True, timeout=120)
        st = unit_state(t, unit) if not res.ok else {}
        if not res.ok and "already" in res.stderr and st.get("LoadState") not in (None, "", "not-found") \
                and st.get("ActiveState") not in RUNNING_STATES:
            # an earlier unit of this name that ended failed (no --collect then, or before this
            # systemd): systemd-run refuses the name ("Unit NAME was already loaded or has a fragment
            # file", "already exists") until it is unloaded (systemd PR #31990)
            transient(unit).systemctl(t, "reset-failed", check=False)
            res = t.run(launch, check=False, become=True, timeout=120)
            st = unit_state(t, unit) if not res.ok else {}
        if not res.ok and st.get("ActiveState") not in RUNNING_STATES:
            # nothing of it runs (a unit that does is polled as started: never a second tuner)
            why = (res.stderr.strip().splitlines() or [f"exit {res.exited}"])[-1]
            t.run(["rm", "-f", paths["env"]], check=False, become=True, timeout=60)
            raise UnitUnavailable(f"systemd-run could not start {unit}: {why}")
        return {"unit": unit, "systemd": version, "collect": collect}

    def _put_text(self, text: str, remote: str) -> None:
        """Upload ``text`` to the root-only path ``remote`` (through a private local temp file)."""
        with tempfile.NamedTemporaryFile("w", suffix=".tmp", delete=False) as fh:
            fh.write(text)
            local = fh.name
        try:
            self.connection.put(local, remote, become=True)
        finally:
            os.unlink(local)

    def call_in_unit(self, command: str, args: list[str], unit: str, *, memory_max: int | None = None,
                     timeout: float | None = None, on_progress: Callable[[dict], None] | None = None,
                     poll_s: float = POLL_S, ticket: dict | None = None,
                     environment: dict[str, str] | None = None, properties: list[str] | None = None) -> dict:
        """Run one payload command as the transient systemd unit ``unit`` (:meth:`start_unit`) and
        return the ``data`` of its ``result`` line.

        Every ``poll_s`` s the controller reads the unit's state and the new output (two short
        commands: no channel stays open for the whole command). ``memory_max`` (bytes) becomes
        ``MemoryMax=``, ``timeout`` (s) ``RuntimeMaxSec=`` and the controller's own bound. An
        operator interrupt stops the unit (``systemctl stop``). A poll that fails without losing
        the link (no state read, a command timeout) is tried again, up to :data:`POLL_RETRIES` in
        a row (tenacity); a lost link (:class:`LinkLost`) is raised, and the engine runs the step
        again once it has logged in again: called again for a unit this client started, it
        **reattaches** (reads its output from the start, polls it to its end) instead of starting
        a second one. Raises :class:`UnitUnavailable` when the unit could not be started (nothing
        ran: the caller may fall back to :meth:`call`); :class:`PayloadFailed` on an ``error``
        line, on ``Result=oom-kill`` (kind ``out of host memory``), or an end without a result
        line (``crash``); :class:`Cancelled` after an interrupt; connection errors past the retries.
        ``ticket`` and ``environment``: as :meth:`start_unit`. ``properties``: more unit properties
        (systemd.exec(5), ``Nice=10`` for the prepare step, which runs beside the serving server).
        """
        timeout = clamp(timeout)
        t = self.connection
        paths = unit_files(self.state_dir, unit)
        out, err = paths["out"], paths["err"]
        started = self._units.get(unit)
        if started is not None and unit_state(t, unit).get("ActiveState") not in RUNNING_STATES \
                and not t.run(["test", "-e", out], check=False, become=True, timeout=60).ok:
            started = None  # the link was lost before its launch reached the host: nothing of it ran
        if started is None:
            props = []
            if memory_max:
                props.append(f"MemoryMax={int(memory_max)}")
            if timeout:
                props.append(f"RuntimeMaxSec={int(timeout)}")
            props += list(properties or [])
            # noted before the launch: a link lost while it is under way must lead to a reattach,
            # never to a second launch that would remove the running unit's output
            started = self._units[unit] = time.monotonic()
            try:
                self.start_unit(command, args, unit, props=props, tag=f"{self.run_tag}.{secrets.token_hex(4)}",
                                environment=environment, ticket=ticket)
            except UnitUnavailable:
                self._units.pop(unit, None)
                raise
        # else: reattach to the unit this client started (the step runs again after a lost link)
        final: dict = {}
        offset, partial = 0, ""

        def feed(chunk: str) -> None:
            nonlocal partial
            *lines, partial = (partial + chunk).split("\n")
            for line in lines:
                msg = _proto_line(line)
                if msg is None:
                    continue
                if msg.get("type") == "progress" and on_progress:
                    on_progress(msg)
                elif msg.get("type") in ("result", "error"):
                    final.update(msg)

        def poll() -> tuple[dict, str]:
            st = unit_state(t, unit)  # first the state, then the output: an ended unit's is whole
            if not st.get("LoadState"):
                # no answer at all (a command cut by a dropped session, sudo refused): a failed
                # poll, not an ended unit, which still shows its LoadState and Result
                raise ConnectError(f"{getattr(t, 'host', 'host')}: no state of unit {unit}")
            return st, t.run(["tail", "-c", f"+{offset + 1}", out], check=False, become=True, timeout=60).stdout

        while True:
            if self.cancel is not None and self.cancel.is_set():
                stop_unit(t, unit)
                raise Cancelled(f"payload {command} stopped: interrupted by the operator")
            if timeout and time.monotonic() - started > timeout + 60:
                stop_unit(t, unit)
                raise PayloadFailed(command, "crash", f"no result line (killed by timeout, unit {unit})")
            for attempt in _poll_retrying(poll_s):
                with attempt:
                    st, chunk = poll()
            offset += len(chunk.encode())
            feed(chunk)
            if st.get("ActiveState") not in RUNNING_STATES:
                break
            if self.cancel is not None:
                self.cancel.wait(poll_s)
            else:
                time.sleep(poll_s)
        feed("\n")
        tail = "\n".join(t.run(["tail", "-n", "20", err], check=False, become=True, timeout=60).stdout
                         .strip().splitlines()[-20:])
        if st.get("LoadState") == "not-found" or not st.get("Result"):
            # unloaded at once (--collect, or a success): how it ended is in its ExecStopPost= file
            st = {**st, **parse_stop_post_result(t.run(["cat", "--", paths["result"]], check=False, become=True,
                                                       timeout=60).stdout)}
        transient(unit).systemctl(t, "reset-failed", check=False)  # unloads it; one already unloaded is fine
        t.run(["rm", "-f", paths["env"]], check=False, become=True, timeout=60)  # the server's secrets, if any
        self._units.pop(unit, None)
        if final.get("type") == "result":
            return final.get("data") or {}
        if final.get("type") == "error":
            raise PayloadFailed(command, final.get("kind", "runtime"), final.get("msg", ""), tail, final.get("detail"))
        result = st.get("Result", "")
        if result == "oom-kill":
            raise PayloadFailed(command, "out of host memory",
                                f"the kernel ended unit {unit} at its MemoryMax={memory_max} bytes; "
                                "the batch sizes it finished are kept in its checkpoint", tail)
        why = "killed by timeout" if result == "timeout" else \
            f"unit {unit} ended: Result={result or '?'}, {st.get('ExecMainCode', '?')} {st.get('ExecMainStatus', '?')}"
        raise PayloadFailed(command, "crash", f"no result line in {offset} bytes of output ({why})", tail)

    def _stop_on_cancel(self, tag: str, done: threading.Event) -> None:
        """On operator interrupt, SIGTERM the tagged payload (``timeout`` forwards it to Python)."""
        while not done.wait(0.5):
            if self.cancel.is_set():
                # the `timeout` wrapper keeps the tag on its command line and forwards the signal
                self.connection.run(["pkill", "-TERM", "-f", f"ORCH_TAG={tag}"], check=False, become=True, timeout=30)
                return


def _proto_line(line: str) -> dict | None:
    """A payload protocol message (``{"proto": 1, "type": ...}``) of one output line, else None."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and msg.get("proto") == PROTO else None


def tag_pattern(run_id: str) -> str:
    """``pgrep -f`` pattern (POSIX ERE) matching the command lines tagged ``ORCH_TAG=<run_id>.``
    by :meth:`PayloadClient.call` (the ``timeout`` wrapper of a long payload command). Raises
    ValueError for a run id that is not a plain name (recover reads run ids from a host's
    records: no pattern syntax may slip in)."""
    if not is_run_id(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return "ORCH_TAG=" + run_id.replace(".", "[.]") + "[.]"


def stop_tagged(t, run_id: str, wait: float = 30) -> str | None:
    """Stop run ``run_id``'s tagged payload commands (tune, bench) still running on the host.

    SIGTERM to the tagged ``timeout`` wrappers (they forward it to the payload's Python, whose
    own command line carries no tag); after ``wait`` s, SIGKILL to their process groups (the
    payload, its wrappers' processes) and then to them (SIGKILL is not forwarded). Returns ``None`` when none ran, else ``"SIGTERM"`` or
    ``"SIGKILL"`` (what ended them). Raises ValueError as :func:`tag_pattern`.
    """
    pattern = tag_pattern(run_id)
    if not t.run(["pkill", "-TERM", "-f", pattern], check=False, become=True, timeout=30).ok:
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not t.run(["pgrep", "-f", pattern], check=False, become=True, timeout=30).ok:
            return "SIGTERM"
        time.sleep(1)
    pids = [p for p in t.run(["pgrep", "-f", pattern], check=False, become=True, timeout=30).stdout.split()
            if p.isdigit()]
    if pids:
        # the whole process group of each `timeout` (it makes its own, coreutils timeout(1)): its
        # child and that one's children (a `conda run` wrapper runs the payload as its child)
        t.run(["pkill", "-KILL", "-g", ",".join(pids)], check=False, become=True, timeout=30)
    t.run(["pkill", "-KILL", "-f", pattern], check=False, become=True, timeout=30)
    return "SIGKILL"
