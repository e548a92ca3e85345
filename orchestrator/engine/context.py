"""Per-host state while a play runs: variables, transport, payload client, flags."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class RunOptions:
    """Options of one ``orch`` invocation shared by all hosts.

    ``check``: check mode (change nothing); ``run_id``: the run's id (also the host
    run-record name); ``run_dir``: controller-side record folder; ``accept_new_host_keys``:
    accept-new semantics for unknown host keys; ``leave_stopped``: do not restart a unit
    after a failure; ``extra``: CLI values exposed to templates (``service``, ...).
    """

    run_id: str
    run_dir: Path
    check: bool = False
    accept_new_host_keys: bool = False
    leave_stopped: bool = False
    echo_output: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    #: controller state dir (the config store lives under it)
    state_dir: Path | None = None
    #: ignore stored results and tune again
    retune: bool = False
    #: meeting point of hosts sharing a tuning key (orchestrator.engine.groups.GroupCoordinator)
    groups: Any = None


class HostContext:
    """Everything a task module sees for one host.

    ``vars``: merged inventory/play/extra variables plus registered task data;
    ``state``: what earlier tasks did (``stopped_by_orch``, ``install_manifest``, ...) that
    rescue tasks need; ``transport``: the connection (opened by the ``connect`` task);
    ``payload``: the payload client (set by ``payload``); ``emit(event, **fields)``
    appends to the run's ``events.jsonl``; ``progress(**fields)`` feeds the UI.
    """

    def __init__(self, name: str, variables: dict[str, Any], options: RunOptions,
                 emit: Callable[..., None], progress: Callable[..., None] | None = None,
                 echo: Callable[[str], None] | None = None):
        self.name = name
        self.vars = variables
        self.options = options
        self.state: dict[str, Any] = {}
        self.transport = None
        self.payload = None
        self._emit = emit
        self._progress = progress
        self._echo = echo
        self.host_dir = options.run_dir / "hosts" / name
        self.host_dir.mkdir(parents=True, exist_ok=True)
        self.current_task = ""
        #: True while rescue/always steps run: they finish even after an interrupt
        self.protected = False

    @property
    def check(self) -> bool:
        return self.options.check

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
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:  # closing a dead link must not mask the real error
                pass
