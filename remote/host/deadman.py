"""The host's dead-man: restore the host when no controller checks in (``deadman``).

``python -m remote deadman --run-id ID --unit UNIT --deadline S [--state-dir D] [--tune-unit U] [--poll S]``

Armed by the controller as the transient unit ``orch-deadman-<run id>.service`` before it stops
the unit (orchestrator/tasks/deadman.py), so it runs under the service manager, outside any SSH
session, whatever happens to the link or the controller (issue 32 rows 1 and 2). It watches the
run's host lock (``lock.json``, remote/host/lock.py), whose heartbeat the controller renews while
it holds the lock, and ends:

- **disarmed** when the run is done with the host: its lock is released or held by another run,
  or its record (``runs/<ID>/state.json``) says ``completed``/``restored``/``failed``/``rolled_back``;
- **fired** when the lock's heartbeat is older than ``--deadline`` seconds. Under the lock's mutex
  it marks the lock (``"deadman": {...}``): from then on the run's heartbeat and its installs and
  restores are refused (remote/host/lock.py, remote/host/changes.py), so a controller that comes
  back late changes nothing. Then, in this order: it stops the run's tune (its transient unit
  ``--tune-unit``, then the processes tagged ``ORCH_TAG=<ID>.`` of a tune run in the SSH session:
  SIGTERM, SIGKILL after 30 s), puts the files the run changed back from its manifest and backups
  (:func:`remote.host.undo.restore`, its run record left unfinished), and starts the unit:
  ``systemctl start`` when it is down, ``systemctl restart`` when it runs and the restore changed a
  file (a process the dead run started on its new files), nothing when it runs on unchanged files.
  What it did goes into the run record (``state.json`` ``deadman``) and is the result's ``data``.

The run stays unfinished, holding the (marked) lock: ``orch tune`` refuses the host and
``orch doctor`` says so until ``orch recover`` takes the lock over, proves the restored files
from a start's log and records the run ``restored``, saying what the dead-man did.
Result ``data``: ``{"fired": false, "why"}`` or the report (``fired``, ``fired_at``,
``heartbeat_age_s``, ``deadline_s``, ``tune``, ``files``, ``unit``, ``unit_state``,
``invocation_id``). Not armed for a unit of a user's own manager, and not where ``systemd-run``
cannot start a unit (the controller says so).
"""

from __future__ import annotations

import os
import re
import subprocess
import time

from ..protocol import PayloadError, log
from .undo import restore
from .fs import DEFAULT_STATE_DIR, atomic_write_json, check_run_id, now_iso, read_json, run_dir, update_state
from .lockfile import lock_path, mutex, read_lock

#: run record states of a run that is done with the host (orchestrator/records/host.py FINISHED_STATES)
FINISHED = ("completed", "restored", "failed", "rolled_back")
#: seconds between SIGTERM and SIGKILL of the run's tagged payload processes
TERM_WAIT_S = 30.0
#: seconds to wait for the unit to be active (or failed) after the start
START_WAIT_S = 120.0


def add_arguments(parser) -> None:
    """Flags of ``deadman``."""
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--unit", required=True, help="the server's unit, started again when it fires")
    parser.add_argument("--deadline", type=float, required=True,
                        help="seconds without a heartbeat of the run's lock after which it fires")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--tune-unit", default=None, help="the run's tune unit (default orch-tune-<run id>.service)")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between two looks at the lock")


def run(args) -> dict:
    """``deadman`` command: see the module docstring."""
    check_run_id(args.run_id)
    if not re.fullmatch(r"[A-Za-z0-9:_.@\\-]+", args.unit) or args.unit.startswith("-"):
        raise PayloadError("bad_input", f"invalid unit name {args.unit!r}")
    if not args.deadline > 0 or not args.poll > 0:
        raise PayloadError("bad_input", "--deadline and --poll must be positive")
    tune_unit = args.tune_unit or f"orch-tune-{args.run_id}.service"
    return watch(args.state_dir, args.run_id, args.unit, args.deadline, tune_unit, args.poll)


def _done(state_dir: str, run_id: str) -> str | None:
    """Why the run is done with the host (None: it is not)."""
    lk = read_lock(state_dir)
    if lk is None:
        return "the run released its lock"
    if lk.get("run_id") != run_id:
        return f"the lock is held by {lk.get('run_id')}"
    st = read_json(os.path.join(run_dir(state_dir, run_id), "state.json"), default=None)
    if isinstance(st, dict) and st.get("state") in FINISHED:
        return f"the run is {st.get('state')}"
    return None


def _age(lock: dict) -> float:
    """Seconds since the lock's last heartbeat (its creation when it has none)."""
    ts = lock.get("heartbeat_ts", lock.get("created_ts"))
    return time.time() - float(ts) if isinstance(ts, (int, float)) else float("inf")


def watch(state_dir: str, run_id: str, unit: str, deadline: float, tune_unit: str, poll: float = 5.0) -> dict:
    """Watch run ``run_id``'s lock until the run is done with the host (returns ``fired`` false)
    or its heartbeat is ``deadline`` s old (:func:`fire`)."""
    log(f"watching run {run_id}: fires when its lock's heartbeat is {deadline:g} s old")
    while True:
        why = _done(state_dir, run_id)
        if why:
            log(f"disarmed: {why}")
            return {"fired": False, "why": why}
        lk = read_lock(state_dir) or {}
        age = _age(lk)
        if age > deadline:
            with mutex(state_dir):  # no heartbeat can land between the look and the mark
                lk = read_lock(state_dir)
                if lk is None or lk.get("run_id") != run_id or _age(lk) <= deadline:
                    continue
                age = _age(lk)
                lk["deadman"] = {"fired_at": now_iso(), "heartbeat_age_s": round(age, 1), "deadline_s": deadline,
                                 "by": f"orch-deadman-{run_id}.service"}
                atomic_write_json(lock_path(state_dir), lk)
            return fire(state_dir, run_id, unit, tune_unit, age, deadline)
        time.sleep(max(0.2, min(poll, deadline - age)))


def _systemctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["systemctl", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(["systemctl", *args], 1, "", str(exc))


def _active(unit: str) -> str:
    return _systemctl("is-active", unit, timeout=60).stdout.strip() or "unknown"


def _stop_tune(run_id: str, tune_unit: str) -> str:
    """Stop the run's tune: its transient unit, then its tagged payload processes. What was done."""
    done = []
    if _active(tune_unit) in ("active", "activating", "deactivating", "reloading"):
        _systemctl("stop", tune_unit)
        done.append(f"stopped {tune_unit}")
    pattern = "ORCH_TAG=" + run_id.replace(".", "[.]") + "[.]"
    if subprocess.run(["pkill", "-TERM", "-f", pattern], check=False).returncode == 0:
        end = time.monotonic() + TERM_WAIT_S
        while time.monotonic() < end and subprocess.run(["pgrep", "-f", pattern], check=False,
                                                        capture_output=True).returncode == 0:
            time.sleep(0.5)
        subprocess.run(["pkill", "-KILL", "-f", pattern], check=False)
        done.append("ended its tagged payload processes")
    return "; ".join(done) or "no tune of the run was running"


def fire(state_dir: str, run_id: str, unit: str, tune_unit: str, age: float, deadline: float) -> dict:
    """Stop the run's tune, put its files back, start the unit; record and return what was done
    (see the module docstring)."""
    report: dict = {"fired": True, "fired_at": now_iso(), "heartbeat_age_s": round(age, 1), "deadline_s": deadline}
    log(f"no controller checked in for {age:.0f} s (deadline {deadline:g} s): restoring the host", "warning")
    report["tune"] = _stop_tune(run_id, tune_unit)
    files: list = []
    if os.path.exists(os.path.join(run_dir(state_dir, run_id), "manifest.json")):
        try:
            files = restore(state_dir, run_id, ignore_lock=True, record_state=False)["files"]
        except PayloadError as exc:  # the unit is started all the same: on what is there
            report["restore_error"] = exc.msg
            log(f"restore failed: {exc.msg}", "warning")
    report["files"] = files
    changed = [f for f in files if f.get("action") != "unchanged"]
    state = _active(unit)
    if state == "active" and changed:
        res = _systemctl("restart", unit)
        report["unit"] = "restarted on the restored files (its process was started on the run's files)"
    elif state == "active":
        res = None
        report["unit"] = "left running (the run had changed none of its files)"
    else:
        res = _systemctl("start", unit)
        report["unit"] = f"started (it was {state})"
    if res is not None and res.returncode != 0:
        report["unit_error"] = (res.stderr or res.stdout).strip()[-300:]
    end = time.monotonic() + START_WAIT_S
    state = _active(unit)
    while state in ("activating", "inactive", "deactivating", "reloading") and time.monotonic() < end:
        time.sleep(0.5)
        state = _active(unit)
    report["unit_state"] = state
    show = _systemctl("show", "-p", "InvocationID", unit, timeout=60).stdout.strip()
    report["invocation_id"] = show.partition("=")[2] or None
    update_state(state_dir, run_id, deadman=report)
    log(f"done: {report['tune']}; {len(changed)} file(s) put back; {unit} {report['unit']}, now {state}")
    return report
