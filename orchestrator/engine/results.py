"""Task results and the per-host recap (Ansible's ok / changed / failed / unreachable / skipped)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK, CHANGED, FAILED, SKIPPED, UNREACHABLE = "ok", "changed", "failed", "skipped", "unreachable"


class TaskFailed(Exception):
    """Raised by a task module to fail the host with a message shown to the operator."""

    def __init__(self, msg: str, data: dict | None = None):
        super().__init__(msg)
        self.msg = msg
        self.data = data or {}


class Cancelled(Exception):
    """The run was interrupted (SIGINT/SIGTERM); rescue tasks still run."""


@dataclass
class TaskResult:
    """What one task did on one host.

    ``status`` is one of ``ok`` (nothing changed), ``changed``, ``failed``,
    ``skipped`` or ``unreachable``; ``data`` is registered under the task's
    ``register`` name for later tasks; ``msg`` is shown to the operator.
    """

    status: str = OK
    msg: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, msg: str = "", **data) -> "TaskResult":
        return cls(OK, msg, data)

    @classmethod
    def changed(cls, msg: str = "", **data) -> "TaskResult":
        return cls(CHANGED, msg, data)

    @classmethod
    def skipped(cls, msg: str = "", **data) -> "TaskResult":
        return cls(SKIPPED, msg, data)


@dataclass
class HostRecap:
    """Counters and outcome of one host over a play (the PLAY RECAP row)."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0
    rescued: int = 0
    outcome: str = "not started"  # completed | failed | unreachable | not started | check
    cause: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    def count(self, status: str) -> None:
        setattr(self, status, getattr(self, status) + 1)

    @property
    def is_failure(self) -> bool:
        return self.outcome in ("failed", "unreachable")
