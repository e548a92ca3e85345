"""List the run records on the host, or record the controller's progress (``runs``).

``python -m remote runs [--state-dir D] [--run-id ID] [--limit N]`` lists
``<state_dir>/runs/*`` newest first. Result ``data``::

    {"state_dir", "runs": [{"run_id", "created", "action", "status", "dest_dir",
                            "restores": run id a rollback run undid | null,
                            "restored_at": when this run was itself restored | null,
                            "unit_file": bool (a runner change of the unit's own EnvironmentFile=
                                          or --config file, not orch's drop-in),
                            "changed": [{"path", "action"}], "unchanged": int,
                            "autotune_cache": the FlashInfer autotune folder the run backed up | null,
                            "state": {...state.json...} | null}]}

``created`` comes from the manifest, else state.json, else the folder's mtime (ISO-8601 UTC).
``action``/``status`` are ``null`` for a run that has a state.json but no manifest yet.

``python -m remote runs --set-state RUN_ID STATE [--data JSON] [--state-dir D]`` updates
``<state_dir>/runs/RUN_ID/state.json`` atomically (creating the run folder, mode 0700):
``state`` becomes STATE and is appended to ``history`` with its time; ``--data`` (a JSON
object, e.g. bench numbers) is merged into ``data``. STATE is one of
``started stopped reaped installed restarted verified benchmarked completed restored failed
rolled_back`` (docs/protocol.md names the first six plus ``failed``). Result ``data``: the new
state.json content.
"""

from __future__ import annotations

import datetime as _dt
import json
import os

from ..protocol import is_run_id
from .fs import (AUTOTUNE_BACKUP, DEFAULT_STATE_DIR, check_run_id, read_json, runs_root,
                     update_state)
from ..protocol import PayloadError

#: States the controller may record.
STATES = ("started", "stopped", "reaped", "installed", "restarted", "verified", "benchmarked",
          "completed", "restored", "failed", "rolled_back")


def add_arguments(parser) -> None:
    """Flags of ``runs``."""
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--run-id", default=None, help="list only this run")
    parser.add_argument("--limit", type=int, default=0, help="at most N runs (0 = all)")
    parser.add_argument("--set-state", nargs=2, metavar=("RUN_ID", "STATE"), default=None,
                        help="record STATE for RUN_ID in its state.json")
    parser.add_argument("--data", default=None, help="JSON object merged into state.json data")


def run(args) -> dict:
    """``runs`` command: see the module docstring."""
    if args.set_state:
        data = None
        if args.data is not None:
            try:
                data = json.loads(args.data)
            except json.JSONDecodeError as exc:
                raise PayloadError("bad_input", f"--data is not JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise PayloadError("bad_input", "--data must be a JSON object")
        return set_state(args.state_dir, args.set_state[0], args.set_state[1], data)
    if args.data is not None:
        raise PayloadError("bad_input", "--data needs --set-state")
    if args.limit < 0:
        raise PayloadError("bad_input", f"--limit must be 0 (all runs) or more, got {args.limit}")
    return list_runs(args.state_dir, run_id=args.run_id, limit=args.limit)


def set_state(state_dir: str, run_id: str, state: str, data: dict | None = None) -> dict:
    """Record ``state`` (one of :data:`STATES`) for ``run_id``; return the new state.json content.

    Raises ``PayloadError('bad_input')`` for an unknown state or a bad run id.
    """
    check_run_id(run_id)
    if state not in STATES:
        raise PayloadError("bad_input", f"unknown state {state!r}; one of {', '.join(STATES)}")
    return update_state(state_dir, run_id, state=state, data=data)


def _mtime_iso(path: str) -> str:
    t = os.stat(path).st_mtime
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def describe_run(state_dir: str, run_id: str) -> dict:
    """Summary of one run folder (see module docstring); raises ``PayloadError('not_found')``."""
    rdir = os.path.join(runs_root(state_dir), check_run_id(run_id))
    if not os.path.isdir(rdir):
        raise PayloadError("not_found", f"no run {run_id} under {runs_root(state_dir)}")
    try:
        manifest = read_json(os.path.join(rdir, "manifest.json"), default=None)
    except PayloadError as exc:
        manifest = {"status": "corrupt", "error": exc.msg}
    try:
        state = read_json(os.path.join(rdir, "state.json"), default=None)
    except PayloadError as exc:
        state = {"error": exc.msg}
    manifest = manifest if isinstance(manifest, dict) else {}
    files = [f for f in manifest.get("files") or [] if isinstance(f, dict)]
    created = manifest.get("created") or (state or {}).get("created") or _mtime_iso(rdir)
    return {
        "run_id": run_id,
        "created": created,
        "action": manifest.get("action"),
        "status": manifest.get("status"),
        "dest_dir": manifest.get("dest_dir"),
        "unit_file": bool(manifest.get("unit_file")),
        "restores": manifest.get("restores"),
        "restored_at": (state or {}).get("restored_at") if isinstance(state, dict) else None,
        "changed": [{"path": f.get("path"), "action": f.get("action")} for f in files
                    if f.get("action") not in ("unchanged", "absent")],
        "unchanged": sum(1 for f in files if f.get("action") in ("unchanged", "absent")),
        "state": state,
        "autotune_cache": _autotune_backup(rdir),
    }


def _autotune_backup(rdir: str) -> str | None:
    """The folder whose FlashInfer autotune cache the run backed up (``runner_change --op
    cache-backup``'s index), None when it backed up none or the index is unreadable."""
    try:
        index = read_json(os.path.join(rdir, AUTOTUNE_BACKUP + ".json"), default=None)
    except PayloadError:
        return None
    return index.get("dir") if isinstance(index, dict) and isinstance(index.get("dir"), str) else None


def list_runs(state_dir: str, run_id: str | None = None, limit: int = 0) -> dict:
    """All run summaries under ``<state_dir>/runs``, newest ``created`` first (``limit`` > 0 caps them)."""
    root = runs_root(state_dir)
    if run_id is not None:
        return {"state_dir": state_dir, "runs": [describe_run(state_dir, run_id)]}
    try:
        names = sorted(n for n in os.listdir(root)
                       if is_run_id(n) and os.path.isdir(os.path.join(root, n)))
    except FileNotFoundError:
        names = []
    except NotADirectoryError:  # the host's state, not the command's input: as fs.ensure_private_dir says
        raise PayloadError("runtime", f"{root} is not a folder (--state-dir {state_dir})") from None
    out = [describe_run(state_dir, n) for n in names]
    out.sort(key=lambda r: (r["created"], r["run_id"]), reverse=True)
    if limit and limit > 0:
        out = out[:limit]
    return {"state_dir": state_dir, "runs": out}
