"""The host lock: one controller run at a time per host (``lock``).

``python -m remote lock OP [--state-dir D] [--run-id ID] [--controller TEXT] [--stale-after S] [--force]``

The lock is the file ``<state_dir>/lock.json``::

    {"run_id", "controller", "pid", "created", "heartbeat", "created_ts", "heartbeat_ts"}

(``*_ts``: seconds since the epoch on the host's clock; ``created``/``heartbeat``: the same as
ISO-8601 UTC; ``pid``: the payload process that acquired it, for information only; ``host`` and
``machine_id``: the host that holds it, :func:`host_identity`.)

The state folder belongs to ONE host. Its owner is recorded in ``<state_dir>/host.json``
(``{"hostname", "machine_id", "since"}``) by the first lock taken in it; every later
``acquire``/``heartbeat``/``release``/``break`` from another host (another host name or
``/etc/machine-id``) is refused (``PayloadError('locked')``) naming the owner: two hosts sharing
one folder (an ``orch_state_dir`` on NFS, hosts cloned with their data disk; clones share the
machine id, so the host name tells them apart) would mix their runs, backups and locks. A renamed
or re-imaged host: remove ``host.json`` (the message says so). It must
outlive the payload process: the controller holds it across many payload calls. So liveness is
judged by the heartbeat the controller renews (``lock heartbeat``) between steps, not by a PID:
a lock whose heartbeat is older than ``--stale-after`` seconds (default 600) is *stale*.

Operations (each runs under ``flock`` of ``<state_dir>/lock.mutex``, so two payloads never
interleave their read-modify-write of the lock):

- ``acquire --run-id ID --controller TEXT``: atomic create (temp file + ``link()``, which fails
  with EEXIST like ``O_EXCL`` and never shows a half-written file). Held by ID already: heartbeat
  renewed, ``"reentrant": true``. Held by another run (stale or not):
  ``PayloadError('locked')`` naming its run id, controller, age and heartbeat age.
- ``heartbeat --run-id ID``: renew our heartbeat; ``not_found`` when there is no lock,
  ``locked`` when another run holds it or the host's dead-man marked it (``"deadman"``:
  remote/host/deadman.py took the run over).
- ``release --run-id ID``: remove our own lock; ``locked`` when another run holds it;
  ``"released": false`` when there was none.
- ``status``: report (never fails for a missing lock).
- ``break [--run-id BREAKER] [--holder RUN_ID] [--force]``: remove a stale (or corrupt) lock;
  any lock with ``--force``. ``--run-id`` names the run that breaks it (recorded in
  ``<state_dir>/lock.broken.json`` with the removed lock). With ``--holder`` the holder must be
  that run (guards against breaking a lock that changed hands since it was looked at).
  Refused (``locked``) for a fresh lock without --force.

Result ``data`` of every operation: :func:`describe` of the lock after the operation, plus
``"op"`` and, depending on the operation, ``acquired``/``reentrant``/``released``/``broken``
(with ``previous``: the removed lock).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

from .fs import (DEFAULT_STATE_DIR, PRIVATE_FILE_MODE, atomic_write_json, check_run_id,
                     fsync_dir, write_all)
from .lockfile import Corrupt as _Corrupt, lock_path, mutex as _mutex, read_lock as _read
from ..protocol import PayloadError

#: Default seconds after the last heartbeat when a lock counts as stale.
DEFAULT_STALE_AFTER = 600.0

OPS = ("acquire", "heartbeat", "release", "status", "break")


def add_arguments(parser) -> None:
    """Flags of ``lock``."""
    parser.add_argument("op", choices=OPS)
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--controller", default=None,
                        help="who holds it (user@machine, pid), shown to anyone refused")
    parser.add_argument("--stale-after", type=float, default=DEFAULT_STALE_AFTER,
                        help="seconds without heartbeat after which the lock is stale")
    parser.add_argument("--force", action="store_true", help="break even a fresh lock")
    parser.add_argument("--holder", default=None, help="break: only if this run holds the lock")


def run(args) -> dict:
    """``lock`` command: see the module docstring."""
    sd, sa = args.state_dir, args.stale_after
    if sa <= 0:
        raise PayloadError("bad_input", "--stale-after must be positive")
    if args.op == "acquire":
        if not args.run_id or not args.controller:
            raise PayloadError("bad_input", "lock acquire needs --run-id and --controller")
        return acquire(sd, args.run_id, args.controller, sa)
    if args.op in ("heartbeat", "release") and not args.run_id:
        raise PayloadError("bad_input", f"lock {args.op} needs --run-id")
    if args.op == "heartbeat":
        return heartbeat(sd, args.run_id, sa)
    if args.op == "release":
        return release(sd, args.run_id, sa)
    if args.op == "break":
        return break_lock(sd, args.holder, force=args.force, stale_after=sa, breaker=args.run_id)
    return status(sd, sa)


#: candidates of the machine id, systemd's first (machine-id(5)), then D-Bus's older copy
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def host_identity() -> dict:
    """``{"hostname", "machine_id"}`` of this host (``machine_id``: the first line of the first
    readable :data:`MACHINE_ID_FILES`, "" when none)."""
    mid = ""
    for path in MACHINE_ID_FILES:
        try:
            with open(path) as fh:
                mid = fh.readline().strip()
        except OSError:
            continue
        if mid:
            break
    return {"hostname": socket.gethostname(), "machine_id": mid}


def owner_path(state_dir: str) -> str:
    """``<state_dir>/host.json``: the host the state folder belongs to."""
    return os.path.join(state_dir, "host.json")


def same_host(a: dict, b: dict) -> bool:
    """True when identities ``a`` and ``b`` (:func:`host_identity`) name the same host: same host
    name and same machine id (a missing machine id on either side matches any). Pure."""
    if a.get("hostname") != b.get("hostname"):
        return False
    ma, mb = a.get("machine_id") or "", b.get("machine_id") or ""
    return not ma or not mb or ma == mb


def foreign_owner_error(state_dir: str, owner: dict, me: dict) -> PayloadError:
    """The refusal for host ``me`` in a state folder that belongs to ``owner``."""
    return PayloadError(
        "locked",
        f"the orch state folder {state_dir} belongs to host {owner.get('hostname')!r} (machine-id "
        f"{owner.get('machine_id') or '?'}), not to this host {me.get('hostname')!r} (machine-id "
        f"{me.get('machine_id') or '?'}): hosts must not share one state folder (orch_state_dir on a shared "
        f"mount, or a disk cloned from another host). Give this host its own orch_state_dir; if this host "
        f"was renamed or re-imaged, remove {owner_path(state_dir)}",
        detail={"owner": owner, "host": me, "state_dir": state_dir})


def check_owner(state_dir: str, claim: bool) -> dict:
    """Refuse (``PayloadError('locked')``) when the state folder belongs to another host; with
    ``claim``, record this host as its owner when nobody is. Call under :func:`_mutex`. Returns
    this host's identity."""
    me = host_identity()
    owner = None
    try:
        with open(owner_path(state_dir), "rb") as fh:
            owner = json.loads(fh.read().decode("utf-8"))
    except FileNotFoundError:
        owner = None
    except (OSError, ValueError):
        owner = {"hostname": "?", "machine_id": "", "error": "unreadable host.json"}
    if isinstance(owner, dict) and owner:
        if not same_host(owner, me):
            raise foreign_owner_error(state_dir, owner, me)
    elif claim:
        atomic_write_json(owner_path(state_dir), dict(me, since=_iso(time.time())))
    return me


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1e6):06d}Z"


def describe(lock: dict | None, stale_after: float = DEFAULT_STALE_AFTER, now: float | None = None) -> dict:
    """``{"held", "stale", "lock", "age_s", "heartbeat_age_s", "stale_after_s"}`` for ``lock``.

    Ages are seconds (float) on the host's clock; a corrupt lock counts as held and stale.
    """
    now = time.time() if now is None else now
    if lock is None:
        return {"held": False, "stale": False, "lock": None, "age_s": None,
                "heartbeat_age_s": None, "stale_after_s": stale_after}
    if isinstance(lock, _Corrupt):
        return {"held": True, "stale": True, "lock": dict(lock), "age_s": None,
                "heartbeat_age_s": None, "stale_after_s": stale_after}

    def age(key: str) -> float | None:
        v = lock.get(key)
        return round(now - float(v), 3) if isinstance(v, (int, float)) else None

    hb = age("heartbeat_ts")
    return {"held": True, "stale": hb is None or hb > stale_after, "lock": lock,
            "age_s": age("created_ts"), "heartbeat_age_s": hb, "stale_after_s": stale_after}


def _held_error(d: dict, wanted_by: str | None) -> PayloadError:
    lk = d["lock"] or {}
    where = f", host {lk.get('host')}" if lk.get("host") else ""
    who = f"run {lk.get('run_id')} (controller {lk.get('controller')}{where})" if "run_id" in lk else lk.get("error")
    ages = ""
    if d["age_s"] is not None:
        ages = f", age {d['age_s']:.0f} s, last heartbeat {d['heartbeat_age_s']:.0f} s ago"
    stale = " [STALE: 'lock break' removes it]" if d["stale"] else ""
    for_ = f" (wanted by run {wanted_by})" if wanted_by else ""
    return PayloadError("locked", f"host lock held by {who}{ages}{stale}{for_}", detail=d)


def acquire(state_dir: str, run_id: str, controller: str,
            stale_after: float = DEFAULT_STALE_AFTER) -> dict:
    """Take the host lock for ``run_id``; see module docstring. Raises ``PayloadError('locked')``."""
    check_run_id(run_id)
    with _mutex(state_dir):
        me = check_owner(state_dir, claim=True)
        cur = _read(state_dir)
        if (cur is not None and not isinstance(cur, _Corrupt) and cur.get("run_id") == run_id
                and same_host(_lock_host(cur), me)):
            new = _renew(state_dir, cur)
            return dict(describe(new, stale_after), op="acquire", acquired=True, reentrant=True)
        if cur is not None:
            raise _held_error(describe(cur, stale_after), run_id)
        now = time.time()
        lock = {"run_id": run_id, "controller": controller, "pid": os.getpid(),
                "host": me["hostname"], "machine_id": me["machine_id"], "created": _iso(now),
                "heartbeat": _iso(now), "created_ts": now, "heartbeat_ts": now}
        fd, tmp = tempfile.mkstemp(prefix=".lock.json.orch-tmp-", dir=state_dir)
        try:
            try:
                write_all(fd, (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode())
                os.fchmod(fd, PRIVATE_FILE_MODE)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, lock_path(state_dir))  # atomic create: EEXIST if someone has it
            except FileExistsError:
                raise _held_error(describe(_read(state_dir), stale_after), run_id)
        finally:
            os.unlink(tmp)
        fsync_dir(state_dir)
        return dict(describe(lock, stale_after, now), op="acquire", acquired=True, reentrant=False)


def _renew(state_dir: str, lock: dict) -> dict:
    now = time.time()
    new = dict(lock, heartbeat=_iso(now), heartbeat_ts=now)
    atomic_write_json(lock_path(state_dir), new)
    return new


def _lock_host(lock: dict) -> dict:
    """The identity of the host that took ``lock`` (older locks name only the host name)."""
    return {"hostname": lock.get("host"), "machine_id": lock.get("machine_id") or ""}


def _own(state_dir: str, run_id: str, stale_after: float) -> dict | None:
    """Current lock if ``run_id`` holds it from this host; ``None`` if none; raises ``locked`` if
    another run (or the same run from another host sharing the folder) does."""
    me = check_owner(state_dir, claim=False)
    cur = _read(state_dir)
    if cur is None:
        return None
    if isinstance(cur, _Corrupt) or cur.get("run_id") != run_id or not same_host(_lock_host(cur), me):
        raise _held_error(describe(cur, stale_after), run_id)
    return cur


def heartbeat(state_dir: str, run_id: str, stale_after: float = DEFAULT_STALE_AFTER) -> dict:
    """Renew ``run_id``'s heartbeat. Raises ``not_found`` (no lock) or ``locked`` (another holder)."""
    check_run_id(run_id)
    with _mutex(state_dir):
        cur = _own(state_dir, run_id, stale_after)
        if cur is None:
            raise PayloadError("not_found", f"no host lock to renew for run {run_id} (was it broken?)")
        if cur.get("deadman"):
            raise PayloadError("locked", deadman_text(run_id, cur["deadman"]), detail=describe(cur, stale_after))
        return dict(describe(_renew(state_dir, cur), stale_after), op="heartbeat")


def deadman_text(run_id: str, fired: dict) -> str:
    """Why a lock the host's dead-man marked (remote/host/deadman.py) refuses its run. Pure."""
    return (f"the host's dead-man took run {run_id} over at {fired.get('fired_at')} (no controller had checked "
            f"in for {fired.get('heartbeat_age_s')} s, deadline {fired.get('deadline_s')} s): it stopped the tune, "
            "put the earlier files back and started the unit; `orch recover` records it")


def release(state_dir: str, run_id: str, stale_after: float = DEFAULT_STALE_AFTER) -> dict:
    """Remove ``run_id``'s own lock (``released`` false when none). Raises ``locked`` for another holder."""
    check_run_id(run_id)
    with _mutex(state_dir):
        cur = _own(state_dir, run_id, stale_after)
        if cur is None:
            return dict(describe(None, stale_after), op="release", released=False)
        os.unlink(lock_path(state_dir))
        fsync_dir(state_dir)
        return dict(describe(None, stale_after), op="release", released=True, previous=cur)


def status(state_dir: str, stale_after: float = DEFAULT_STALE_AFTER) -> dict:
    """Describe the lock (held/stale/ages); reads without creating anything."""
    return dict(describe(_read(state_dir), stale_after), op="status")


def break_lock(state_dir: str, holder: str | None = None, force: bool = False,
               stale_after: float = DEFAULT_STALE_AFTER, breaker: str | None = None) -> dict:
    """Remove a stale (or corrupt) lock, or any lock with ``force``; see module docstring.

    ``holder``: refuse unless this run holds it; ``breaker``: the run breaking it (recorded).

    Raises ``PayloadError('locked')`` for a fresh lock without ``force`` or a holder other
    than ``holder``; ``broken`` is false when there was no lock.
    """
    for rid in (holder, breaker):
        if rid is not None:
            check_run_id(rid)
    with _mutex(state_dir):
        check_owner(state_dir, claim=False)
        cur = _read(state_dir)
        if cur is None:
            return dict(describe(None, stale_after), op="break", broken=False)
        d = describe(cur, stale_after)
        if holder is not None and (isinstance(cur, _Corrupt) or cur.get("run_id") != holder):
            raise PayloadError("locked", f"lock is held by {dict(cur).get('run_id')}, not {holder}; "
                                         "not breaking it", detail=d)
        if not d["stale"] and not force:
            e = _held_error(d, None)
            raise PayloadError("locked", e.msg + "; it is not stale (heartbeat within "
                                                 f"{stale_after:.0f} s): --force breaks it anyway", detail=d)
        os.unlink(lock_path(state_dir))
        fsync_dir(state_dir)
        now = time.time()
        atomic_write_json(os.path.join(state_dir, "lock.broken.json"),
                          {"broken_at": _iso(now), "broken_by": breaker, "forced": bool(force),
                           "stale": d["stale"], "previous": dict(cur)})
        return dict(describe(None, stale_after), op="break", broken=True, previous=dict(cur),
                    previous_status=d)
