"""Task results and the per-host recap (Ansible's ok / changed / failed / unreachable / skipped)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import OrchError
from ..facts.summary import RunSummary

OK, CHANGED, FAILED, SKIPPED, UNREACHABLE = "ok", "changed", "failed", "skipped", "unreachable"


class TaskFailed(OrchError):
    """Raised by a task module to fail the host with a message shown to the operator;
    ``data`` is registered with the failed result."""

    exit_status = 1

    def __init__(self, msg: str, data: dict | None = None):
        super().__init__(msg)
        self.msg = msg
        self.data = data or {}


class Cancelled(OrchError):
    """The run was interrupted (SIGINT/SIGTERM); rescue tasks still run."""

    exit_status = 130


@dataclass
class TaskResult:
    """What one task did on one host.

    ``status`` is one of ``ok`` (nothing changed), ``changed``, ``failed``,
    ``skipped`` or ``unreachable``; ``data`` is registered under the task's
    ``register`` name for later tasks (with ``status``, ``msg`` and the booleans
    ``changed``/``failed``/``skipped``/``unreachable``, as Ansible registers them); ``msg`` is
    shown to the operator; ``facts`` are host variables the task publishes (declared in its
    ``@task(sets=...)``), merged by the engine into the host's variables.
    """

    status: str = OK
    msg: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, msg: str = "", *, facts: dict[str, Any] | None = None, **data) -> "TaskResult":
        return cls(OK, msg, data, dict(facts or {}))

    @classmethod
    def changed(cls, msg: str = "", *, facts: dict[str, Any] | None = None, **data) -> "TaskResult":
        return cls(CHANGED, msg, data, dict(facts or {}))

    @classmethod
    def skipped(cls, msg: str = "", *, facts: dict[str, Any] | None = None, **data) -> "TaskResult":
        return cls(SKIPPED, msg, data, dict(facts or {}))

    def registered(self) -> dict[str, Any]:
        """What ``register:`` stores: ``data`` plus ``status``, ``msg`` and Ansible's booleans."""
        return dict(self.data, status=self.status, msg=self.msg, changed=self.status == CHANGED,
                    failed=self.status in (FAILED, UNREACHABLE), skipped=self.status == SKIPPED,
                    unreachable=self.status == UNREACHABLE)


@dataclass
class HostRecap:
    """Counters and outcome of one host over a play (the PLAY RECAP row); ``summary``: what the
    run did on the host (the host's :attr:`HostRun.summary <orchestrator.engine.context.HostRun>`)."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0
    rescued: int = 0
    outcome: str = "not started"  # completed | failed | unreachable | not started | check
    cause: str = ""
    summary: RunSummary = field(default_factory=RunSummary)

    def count(self, status: str) -> None:
        setattr(self, status, getattr(self, status) + 1)

    @property
    def is_failure(self) -> bool:
        return self.outcome in ("failed", "unreachable")
