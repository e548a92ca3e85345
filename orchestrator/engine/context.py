"""Per-host state while a play runs: variables, connection, payload client, what the run did."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..connection.deadline import time_left
from ..facts.catalog import HostFacts
from ..facts.downtime import Phase, downtime
from ..facts.summary import RunSummary
from ..records.layout import host_dir


@dataclass
class RunOptions:
    """Options of one ``orch`` invocation shared by all hosts.

    ``check``: check mode (change nothing); ``run_id``: the run's id (also the host
    run-record name); ``run_dir``: controller-side record folder; ``accept_new_host_keys``:
    accept-new semantics for unknown host keys; ``leave_stopped``: do not restart a unit
    after a failure; ``extra``: CLI values exposed to templates (``service``, ...);
    ``cancel``: set on SIGINT/SIGTERM. ``hooks``: objects told about the play's progress
    (``start_batch(names)``, ``host_started(name)``, ``host_failed(name, cause)`` when a task's
    failure sends a block to its rescue, ``host_done(name)``, each optional), e.g. the fleet's
    tune-once-per-group coordinator or :class:`orchestrator.fleet.ServerBarrier`. ``state_dir``, ``retune``, ``fleet``, ``servers`` and ``barrier`` are
    read by tasks only (the config store's folder, ``--retune``, the coordinator), never by the
    engine.
    """

    run_id: str
    run_dir: Path
    check: bool = False
    accept_new_host_keys: bool = False
    #: write the keys ``accept_new_host_keys`` accepts into known_hosts; False in check mode
    #: (``--check`` changes nothing, the controller's files included: a key is trusted for the run)
    remember_host_keys: bool = True
    leave_stopped: bool = False
    echo_output: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    hooks: list[Any] = field(default_factory=list)
    #: controller state dir (the config store lives under it)
    state_dir: Path | None = None
    #: ignore stored results and tune again
    retune: bool = False
    #: tune-once-per-group coordinator (orchestrator.fleet.GroupCoordinator), also in ``hooks``
    fleet: Any = None
    #: host name -> its multi-node server (orchestrator.facts.server_group.ServerGroup), found
    #: before the play (orchestrator.cli.run.find_servers); read by unit_facts only
    servers: dict[str, Any] = field(default_factory=dict)
    #: meeting points of the ranks of those servers (orchestrator.fleet.ServerBarrier), also in ``hooks``
    barrier: Any = None
    #: host name -> its open connection, handed over by an earlier pass of this invocation (the
    #: discovery pass, orchestrator.cli.run.find_servers): the ``connect`` task takes the host's
    #: instead of logging in again, so a run logs in once per host; the caller closes what is left
    connections: dict[str, Any] = field(default_factory=dict)
    #: at the end of a host's play, leave its connection open in ``connections`` (for the next
    #: pass) instead of closing it
    keep_connections: bool = False


@dataclass
class HostRun:
    """What this run did on one host: the one place rescue and ``always`` steps read it from.

    Safety state (so a rescue undoes exactly what this run did): ``unit`` (the unit read),
    ``was_active``; ``stopped_by_orch`` / ``started_by_orch`` (a rescue starts only a unit this
    run stopped); ``install_attempted`` and ``install_manifest`` (restore only when this run
    wrote); ``tuned_files`` (role -> local path of the files to install); ``log_mark`` (the unit
    log before the last start, so only that start's lines are read) and ``start_mark`` (its
    journal cursor and log files' sizes then, :class:`orchestrator.facts.journal.LogMark`); ``payload`` (version,
    sha256, root of the pushed payload) and ``payload_tmp`` (check mode's temp folder);
    ``locked`` / ``heartbeat`` (the host lock and the thread renewing it); ``record_state`` /
    ``record_action`` (what the host's run record says). ``summary``: what the run did on the
    host (:class:`orchestrator.facts.summary.RunSummary`), written to the run records and shown by
    the UI and the report. ``on_done``: callables
    ``fn(ctx)`` run when the host's play ends, whatever happened (stop the heartbeat, remove the
    check-mode temp folder).
    """

    unit: str | None = None
    was_active: bool = False
    stopped_by_orch: bool = False
    started_by_orch: bool = False
    install_attempted: bool = False
    #: a runner trial wrote orch's drop-in (its rescue reloads systemd only then: a change of the
    #: unit's own EnvironmentFile= or --config file needs no reload)
    dropin_written: bool = False
    install_manifest: dict[str, Any] | None = None
    tuned_files: dict[str, str] = field(default_factory=dict)
    #: sub-runs of this run on the host (``<run id>.triton``: the Triton files a runner trial
    #: installed, a manifest of their own); their host record follows this run's, the rescue restores them
    sub_runs: list[str] = field(default_factory=list)
    log_mark: str = ""
    start_mark: Any = None
    #: the start mark of a start made again after a port race (orchestrator.host.port_race): no second retry
    port_race_retried_for: Any = None
    payload: dict[str, Any] | None = None
    payload_tmp: str | None = None
    locked: bool = False
    heartbeat: Any = None
    record_state: str | None = None
    record_action: str = "tune"
    #: the host-side dead-man of this run (:mod:`orchestrator.tasks.deadman`): its unit and
    #: deadline, None when it was not armed
    deadman: Any = None
    #: ``time.monotonic()`` when the link was lost and not yet back (None: it is up), and whether
    #: the controller gave up on the host (``orch_reconnect_timeout`` passed): later steps then
    #: try it once each, without waiting for it again
    link_lost_at: float | None = None
    link_given_up: bool = False
    summary: RunSummary = field(default_factory=RunSummary)
    on_done: list[Callable[[Any], None]] = field(default_factory=list)
    #: the steps that bound the unit's downtime, as they ran (:meth:`HostContext.mark_phase`)
    phases: list[Phase] = field(default_factory=list)

    def when_done(self, fn: Callable[[Any], None]) -> None:
        """Run ``fn(ctx)`` when the host's play ends (once, however often it is asked)."""
        if fn not in self.on_done:
            self.on_done.append(fn)


class HostContext:
    """Everything a task module sees for one host.

    ``vars``: merged inventory/play/extra variables plus facts and registered results;
    ``facts``: the facts earlier tasks set, typed (:class:`orchestrator.facts.catalog.HostFacts`:
    ``ctx.facts.unit``, ``ctx.facts.probe``, ...); ``run``: what this run did on the host (:class:`HostRun`); ``connection``: the host's
    connection (opened by the ``connect`` task); ``payload``: the payload client (set by
    ``payload``); ``check``: whether the running task is in check mode (``--check``, or the
    task's ``check_mode:`` keyword); ``emit(event, **fields)`` appends to the run's
    ``events.jsonl``; ``progress(**fields)`` feeds the UI.
    """

    def __init__(self, name: str, variables: dict[str, Any], options: RunOptions,
                 emit: Callable[..., None], progress: Callable[..., None] | None = None,
                 echo: Callable[[str], None] | None = None):
        self.name = name
        self.vars = variables
        self.facts = HostFacts(variables)
        self.options = options
        self.run = HostRun()
        self.connection = None
        self.payload = None
        self._emit = emit
        self._progress = progress
        self._echo = echo
        self.host_dir = host_dir(options.run_dir, name)
        self.host_dir.mkdir(parents=True, exist_ok=True)
        self.current_task = ""
        #: True while rescue/always steps run: they finish even after an interrupt
        self.protected = False
        #: the running task's check mode when its ``check_mode:`` keyword sets one (else --check)
        self.task_check: bool | None = None
        #: which run of the running task this is: 2 and more after a lost link (a ``rerun`` task)
        self.attempt = 1
        #: when the running task began (wall clock, seconds since the epoch; set by the engine)
        self.step_started: float | None = None

    @property
    def check(self) -> bool:
        """Check mode for the running task: its ``check_mode:`` keyword, else ``--check``."""
        return self.options.check if self.task_check is None else self.task_check

    def remaining(self, timeout: float) -> float:
        """``timeout`` (s) cut to what is left of the running task's ``timeout:`` (never below 0)."""
        left = time_left()
        return float(timeout) if left is None else max(0.0, min(float(timeout), left))

    def deadline(self, timeout: float) -> float:
        """``time.monotonic()`` value at which a wait of ``timeout`` s (cut as :meth:`remaining`) ends."""
        return time.monotonic() + self.remaining(timeout)

    def mark_phase(self, name: str) -> None:
        """Record that the running step, one of the downtime's parts (``stop``, ``tune``,
        ``install``, ``start``, ``readiness``: :data:`orchestrator.facts.downtime.PARTS`), ran from
        its start until now, and update the run summary's ``downtime``."""
        now = time.time()
        self.run.phases.append(Phase(name, self.step_started if self.step_started is not None else now, now))
        s = self.run.summary
        used = bool(s.prepared_used and s.prepared_used.get("used"))
        s.downtime = downtime(self.run.phases, prepared=used)

    def emit(self, event: str, **fields: Any) -> None:
        """Record an event for this host in the run's ``events.jsonl``."""
        self._emit(event, host=self.name, task=self.current_task, **fields)

    def progress(self, **fields: Any) -> None:
        """Report progress (``done``, ``total``, ``stage``, ``eta_s`` ...) to the UI."""
        if self._progress:
            self._progress(self.name, **fields)

    def say(self, line: str) -> None:
        """Print one line prefixed with the host name."""
        if self._echo:
            self._echo(f"[{self.name}] {line}")

    def cancelled(self) -> bool:
        """True when the operator interrupted the run and this step may be cut short."""
        return self.options.cancel.is_set() and not self.protected

    def close(self) -> None:
        """Close the host's connection, or hand it to the next pass (``options.keep_connections``)."""
        if self.connection is not None and self.options.keep_connections:
            self.options.connections[self.name] = self.connection
            self.connection = None
            return
        if self.connection is not None:
            try:
                self.connection.close()
            except Exception:  # closing a dead link must not mask the real error
                pass
