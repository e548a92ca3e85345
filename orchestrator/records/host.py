"""The host's own run records and lock, seen from the controller.

On the host, the payload keeps one folder per run (``<state_dir>/runs/<run_id>/``: the state the
run reached, its backups and manifest) and the host lock (``<state_dir>/lock.json``); its ``runs``
and ``lock`` commands read and change them (remote/host/runs.py, lock.py). :class:`HostRecords`
is the one typed way the controller calls them; :class:`LockHeartbeat` renews the lock while a
run holds it; :func:`controller_id` and :func:`holder_gone` say who holds a lock and whether it
is gone.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
from typing import Any, Callable

from ..payload.client import PayloadFailed

#: host run-record states of a run that ended (anything else was cut short)
FINISHED_STATES = ("completed", "restored", "failed", "rolled_back")
#: seconds after which a lock whose heartbeat stopped counts as stale (a hint, never a licence to break it)
STALE_AFTER_S = 600.0
#: default seconds between two heartbeats of a held lock (``orch_lock_heartbeat_interval``)
DEFAULT_HEARTBEAT_S = 60.0


def controller_id() -> str:
    """``user@machine pid N``: who holds a host lock (shown to anyone refused by it)."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


def holder_gone(controller: str | None) -> bool:
    """True when ``controller`` (a :func:`controller_id` text) names a process of THIS machine
    that no longer exists. A holder on another machine, or an older text, is never judged gone."""
    if not isinstance(controller, str) or " pid " not in controller:
        return False
    who, _, pid = controller.rpartition(" pid ")
    if who.rpartition("@")[2] != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def record_state(run: dict) -> str | None:
    """The state a host run record says its run reached (``started``, ``stopped``, ...), or None."""
    st = run.get("state")
    return st.get("state") if isinstance(st, dict) else None


def deadman_report(run: dict) -> dict | None:
    """What the host's dead-man did for a run (``state.json`` ``deadman``, remote/host/deadman.py),
    None when it never fired. Pure: ``run`` as :meth:`HostRecords.runs` gives it."""
    st = run.get("state")
    dm = st.get("deadman") if isinstance(st, dict) else None
    return dm if isinstance(dm, dict) else None


def deadman_text(dm: dict) -> str:
    """One line on what the host's dead-man did (:func:`deadman_report`). Pure."""
    files = [f for f in dm.get("files") or [] if f.get("action") != "unchanged"]
    return (f"the host's dead-man fired at {dm.get('fired_at')} (no controller for {dm.get('heartbeat_age_s')} s, "
            f"deadline {dm.get('deadline_s')} s): {dm.get('tune')}; put back {len(files)} file(s)"
            + (f" (restore failed: {dm['restore_error']})" if dm.get("restore_error") else "")
            + f"; the unit {dm.get('unit')}, then {dm.get('unit_state')}")


def unfinished(runs: list[dict], this_run: str, holder: str | None) -> list[dict]:
    """Records of runs other than ``this_run`` that did not finish.

    A run counts when its state is not in :data:`FINISHED_STATES` and it went past ``started``
    (it stopped the unit) or still holds the lock (``holder``): a run that failed before the stop
    and released its lock changed nothing (since the release records such a run ``failed``, only
    records of older controllers stay ``started``). Each keeps the folder its files went to
    (``dest_dir``) and the FlashInfer autotune folder it backed up (``autotune_cache``, or None),
    which ``orch recover`` puts back, and what the host's dead-man did for it (``deadman``, only
    when it fired: :func:`deadman_report`). Pure: ``runs`` as :meth:`HostRecords.runs`.
    """
    out = []
    for r in runs:
        st = record_state(r)
        if (r.get("run_id") != this_run and st and st not in FINISHED_STATES
                and (st != "started" or r.get("run_id") == holder)):
            out.append({"run_id": r["run_id"], "state": st, "action": r.get("action"), "created": r.get("created"),
                        "dest_dir": r.get("dest_dir"), "autotune_cache": r.get("autotune_cache")})
            if deadman_report(r):
                out[-1]["deadman"] = deadman_report(r)
    return out


class HostRecords:
    """The payload's ``runs`` and ``lock`` commands as methods (``client``: a
    :class:`orchestrator.payload.client.PayloadClient`). Each raises ``PayloadFailed`` as the
    payload reports it (``kind`` ``locked``, ``not_found``, ...)."""

    def __init__(self, client):
        self.client = client

    def _call(self, command: str, args: list[str]) -> dict[str, Any]:
        return self.client.call(command, [*args, "--state-dir", self.client.state_dir], timeout=60)

    # run records
    def runs(self, limit: int = 0) -> list[dict]:
        """The host's run records, newest first (``limit`` 0: all)."""
        return self._call("runs", ["--limit", str(int(limit))] if limit else []).get("runs") or []

    def set_state(self, run_id: str, state: str, data: dict[str, Any]) -> None:
        """Record that run ``run_id`` reached ``state`` (with ``data``: action, summary, note)."""
        self._call("runs", ["--set-state", run_id, state, "--data", json.dumps(data, default=str)])

    # the lock
    def lock_status(self, stale_after: float | None = None) -> dict[str, Any]:
        """``{held, lock: {run_id, controller, ...}, stale, heartbeat_age_s}``."""
        return self._call("lock", ["status"] + (["--stale-after", str(stale_after)] if stale_after else []))

    def holder(self) -> str | None:
        """Run id holding the host lock (None when free or corrupt)."""
        st = self.lock_status()
        return (st.get("lock") or {}).get("run_id") if st.get("held") else None

    def acquire(self, run_id: str, stale_after: float = STALE_AFTER_S) -> dict[str, Any]:
        """Take the lock for ``run_id`` as this controller (:func:`controller_id`)."""
        return self._call("lock", ["acquire", "--run-id", run_id, "--controller", controller_id(),
                                   "--stale-after", str(stale_after)])

    def heartbeat(self, run_id: str) -> dict[str, Any]:
        """Renew ``run_id``'s lock."""
        return self._call("lock", ["heartbeat", "--run-id", run_id])

    def release(self, run_id: str) -> dict[str, Any]:
        """Release ``run_id``'s lock."""
        return self._call("lock", ["release", "--run-id", run_id])

    def break_lock(self, run_id: str, holder: str | None, stale_after: float = STALE_AFTER_S) -> dict[str, Any]:
        """Break the lock held by ``holder`` (recorded in ``lock.broken.json`` with ``run_id``)."""
        args = ["break", "--run-id", run_id, "--stale-after", str(stale_after), "--force"]
        return self._call("lock", args + (["--holder", holder] if holder else []))

    def unfinished(self, this_run: str, holder: str | None) -> list[dict]:
        """:func:`unfinished` over :meth:`runs`."""
        return unfinished(self.runs(), this_run, holder)


class LockHeartbeat:
    """Renews run ``run_id``'s host lock every ``interval`` seconds from a daemon thread, until
    :meth:`stop`.

    ``records``: :class:`HostRecords`. A renewal that fails (link down, timeout) is reported to
    ``on_error(text)`` and retried at the next tick. A lock found gone or held by another run
    (``not_found``/``locked``: someone broke it) ends the heartbeats after ``on_lost(text)``.
    ``beats`` counts the renewals.
    """

    def __init__(self, records: HostRecords, run_id: str, interval: float = DEFAULT_HEARTBEAT_S, *,
                 name: str = "", on_lost: Callable[[str], None] | None = None,
                 on_error: Callable[[str], None] | None = None):
        if not interval > 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval!r}")
        self.records = records
        self.run_id = run_id
        self.interval = float(interval)
        self.beats = 0
        self._on_lost = on_lost or (lambda text: None)
        self._on_error = on_error or (lambda text: None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"orch-lock-heartbeat-{name}", daemon=True)

    def start(self) -> "LockHeartbeat":
        """Start the thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self, wait: float = 10.0) -> None:
        """Stop renewing; wait up to ``wait`` seconds for a renewal in flight to end."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.records.heartbeat(self.run_id)
                self.beats += 1
            except PayloadFailed as exc:
                if self._stop.is_set():
                    return
                if exc.kind in ("not_found", "locked"):
                    self._on_lost(exc.msg.splitlines()[0])
                    return
                self._on_error(exc.msg.splitlines()[0][:300])
            except Exception as exc:  # a lost link: the next tick tries again
                if self._stop.is_set():
                    return
                self._on_error(f"{type(exc).__name__}: {str(exc)[:300]}")
