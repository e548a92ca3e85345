"""The controller's record of a run.

One folder per run, ``<state_dir>/runs/<run_id>/``, laid out as :mod:`orchestrator.records.layout`
says (every file name of it comes from there). The default state dir follows the XDG base-directory spec: ``$XDG_STATE_HOME/orch``
or ``~/.local/state/orch``. Secrets (keys containing ``password``) are never written.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from ..atomic import write_text
from .layout import DEBUG_LOG, EVENTS, RUNS


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/orch``, else ``~/.local/state/orch``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "orch"


def new_run_id(action: str = "tune") -> str:
    """A sortable, unique run id: ``YYYYmmddTHHMMSSZ-<action>-<6 hex>`` (UTC)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{action}-{secrets.token_hex(3)}"


def _scrub(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if "password" not in str(k).lower()}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


class RunRecord:
    """Creates ``<state_dir>/runs/<run_id>/`` and appends events to ``events.jsonl`` (:data:`~.layout.EVENTS`).

    While it is open, what the libraries log at WARNING and above (Paramiko's tracebacks of a
    failed handshake, from its transport thread) goes to ``debug.log`` (:data:`~.layout.DEBUG_LOG`,
    made on the first such line) instead of the operator's terminal: the task's own message says
    what happened in one line (:func:`quiet_library_logs`)."""

    def __init__(self, state_dir: Path, run_id: str):
        self.run_id = run_id
        self.dir = Path(state_dir) / RUNS / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._lock = threading.Lock()
        self._events = open(self.dir / EVENTS, "a", encoding="utf-8")
        self._log = logging.FileHandler(self.dir / DEBUG_LOG, encoding="utf-8", delay=True)
        self._log.setLevel(logging.WARNING)
        self._log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
        quiet_library_logs()
        logging.getLogger().addHandler(self._log)

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event (``time`` in Unix seconds, ``event`` name, fields)."""
        line = json.dumps(_scrub({"time": round(time.time(), 3), "event": event, **fields}),
                          sort_keys=True, default=str)
        with self._lock:
            self._events.write(line + "\n")
            self._events.flush()

    def write_json(self, relpath: str, data: Any) -> Path:
        """Write ``data`` as JSON to ``relpath`` inside the run folder; return the path."""
        path = self.dir / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_text(path, json.dumps(_scrub(data), indent=2, sort_keys=True, default=str) + "\n")

    def close(self) -> None:
        with self._lock:
            self._events.close()
        logging.getLogger().removeHandler(self._log)
        self._log.close()


def quiet_library_logs() -> None:
    """Keep what libraries log off the terminal: give the root logger a handler that drops it, so
    Python's last-resort handler (which prints WARNING and above, tracebacks included, to stderr)
    is never used. A run's record adds the handler that keeps it (:class:`RunRecord`)."""
    root = logging.getLogger()
    if not any(isinstance(h, logging.NullHandler) for h in root.handlers):
        root.addHandler(logging.NullHandler())


def read_events(run_dir: Path) -> list[dict]:
    """All events of a run folder, in order."""
    path = Path(run_dir) / EVENTS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
