"""``journalctl`` of a test-bed host: a front for docker-systemctl-replacement's ``systemctl3 log``.

Bound (through a small shell wrapper) over ``/usr/bin/journalctl`` inside each host.
journalctl3 itself cannot be bound elsewhere (it looks for ``systemctl3.py`` beside its own
path) and knows only ``-u -n -f --no-pager``; this shim accepts the options an operator tool
uses (``-u UNIT`` (once), ``-n N``, ``-f``, ``--no-pager``, ``-q``, ``-b``, ``-x``, ``-o cat|short``,
``--since``/``--until`` as ``YYYY-MM-DD HH:MM:SS``, ``@EPOCH``, ``now``) and runs
``systemctl3 log UNIT``. ``--since``/``--until`` filter on the ``[YYYY-MM-DD HH:MM:SS...]`` prefix
that SGLang (and the stand-in) puts on each line; lines without one (tracebacks) belong to the
line before. The unit's log file accumulates across restarts (docker-systemctl-replacement).

Cursors (journalctl(1) ``--show-cursor``, ``--after-cursor``, ``--cursor``; ``-o json`` gives
``__CURSOR``, ``__REALTIME_TIMESTAMP``, ``MESSAGE``, ``_SYSTEMD_UNIT``): each line of the unit's
log is an entry, its sequence number its place in the log; the cursor has journald's form
(``s=SEQNUM_ID;i=SEQNUM;b=BOOT;m=MONO;t=REALTIME;x=HASH``, hex) with ``i`` that place.

Invocation IDs (systemd.journal-fields(7)): ``-o json`` (``--all`` accepted) gives each entry
``_SYSTEMD_UNIT`` and ``_SYSTEMD_INVOCATION_ID``, the ID of the unit's invocation current when the
line was written (the bed's ``systemctl`` records each start's ID with the log's length then,
``/run/orchtb/invocations/UNIT.json``), as journald reads it for the unit of the writing process.
A process may say it writes through an earlier invocation's stdout stream, whose metadata journald
cached for that stream's (dead) process: ``/run/orchtb/journal-streams/UNIT.jsonl``, one
``{"after": N, "lines": [TEXT...], "_SYSTEMD_INVOCATION_ID": ID}`` a line; the first entry after
place N with each TEXT then carries that ID (the stand-in server's straggler,
``ORCH_STANDIN_STRAGGLER``). journald's own "Suppressed" line carries journald's fields
(``_SYSTEMD_UNIT=systemd-journald.service``, its own invocation ID) and the unit's as
``OBJECT_SYSTEMD_UNIT``/``OBJECT_SYSTEMD_INVOCATION_ID``.

User units (``--user-unit UNIT``): the entries of a unit of the caller's own user manager, as
systemd 252's journalctl matches them: ``_SYSTEMD_USER_UNIT=UNIT`` together with ``_UID=`` of the
caller (``src/journal/journalctl.c``: ``add_matches_for_user_unit(j, u, getuid())``). The stand-in
reads the caller's own ``systemctl3 --user log UNIT`` and its invocation IDs
(``~/.config/orchtb/invocations``, written by the bed's ``systemctl --user``); root's
``--user-unit`` reads root's own user units, so a user's unit read through sudo shows nothing, as
on such a systemd.
Version (host option ``journalctl_version``, passed as ``ORCHTB_JOURNALCTL_VERSION``; 252 by default,
Debian 12's, as the bed's ``systemd-run`` stand-in): ``--version`` prints it; ``--invocation=ID``
(journalctl(1): the entries of one invocation, by its 32-hex-digit ID) exists from 257 on (systemd
#33794): before that it is refused as journalctl's option parser refuses an unknown option,
``journalctl: unrecognized option '--invocation=...'`` on stderr, exit status 1. Every call's
arguments are appended to ``/run/orchtb/journalctl.calls`` (one JSON list a line), so a test can
say which options were asked for.

Faults of journald (``/run/orchtb/journald.json``, written by a test): ``{"suppress": {"from":
K, "match": REGEX}}`` drops the lines at place >= K that match (journald's rate limiting,
systemd #2913) and puts ``systemd-journald[N]: Suppressed C messages from UNIT`` where the first
was; ``{"clock_step": {"from": K, "seconds": S}}`` writes the stamps of the lines at place >= K
S seconds earlier (a clock stepped back, systemd #43805: ``--since`` then hides them);
``{"no_invocation": {"from": K, "match": REGEX}}``: the lines at place >= K that match keep their
unit but carry no ``_SYSTEMD_INVOCATION_ID`` (journald could not read the invocation of a process
that had exited, systemd #2913, #7506).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime

SYSTEMCTL3 = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "systemctl3")
STAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
FAULTS = "/run/orchtb/journald.json"
INVOCATIONS = "/run/orchtb/invocations"
STREAMS = "/run/orchtb/journal-streams"
BOOT = "0" * 31 + "1"
#: journald's own invocation ID on the bed (the "Suppressed" lines it logs itself)
JOURNALD_INVOCATION = "5" * 32


def _faults() -> dict:
    try:
        with open(FAULTS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _read_json(path: str, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _invocations(user: bool) -> str:
    """Where the bed's ``systemctl`` records invocation IDs: the system's, or the caller's user manager's
    (``~/.config/orchtb/invocations``, tests/testbed/systemctl_shim.py ``invocation_dir``)."""
    return os.path.join(os.path.expanduser("~"), ".config", "orchtb", "invocations") if user else INVOCATIONS


def _entries(lines: list[str], unit: str, user: bool = False) -> list[dict]:
    """The unit's log lines as journal entries with their unit and invocation fields."""
    starts = [i for i in _read_json(os.path.join(_invocations(user), unit + ".json"), []) if isinstance(i, dict)]
    out = []
    for place, line in enumerate(lines, 1):
        e = {"MESSAGE": line, "_SYSTEMD_UNIT": unit}
        current = [i["id"] for i in starts if int(i.get("from", 0)) < place]
        if current:
            e["_SYSTEMD_INVOCATION_ID"] = current[-1]
        out.append(e)
    try:
        with open(os.path.join(STREAMS, unit + ".jsonl")) as f:
            streams = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        streams = []
    for st in streams:
        for text in st.get("lines") or []:
            for e in out[int(st.get("after", 0)):]:
                if e["MESSAGE"] == text and not e.get("_stream"):
                    e["_SYSTEMD_INVOCATION_ID"], e["_stream"] = st["_SYSTEMD_INVOCATION_ID"], True
                    break
    for e in out:
        e.pop("_stream", None)
    return out


def _view(entries: list[dict], unit: str) -> list[dict]:
    """The unit's entries as journald would have kept them under the faults of :data:`FAULTS`."""
    faults = _faults()
    step = faults.get("clock_step")
    if step:
        shift = float(step["seconds"])
        for e in entries[int(step["from"]):]:
            m = STAMP.match(e["MESSAGE"])
            if m:
                t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + shift
                e["MESSAGE"] = "[" + datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") + e["MESSAGE"][len(m.group(0)):]
    lost = faults.get("no_invocation")
    if lost:
        pat = re.compile(lost["match"])
        for e in entries[int(lost["from"]):]:
            if pat.search(e["MESSAGE"]):
                e.pop("_SYSTEMD_INVOCATION_ID", None)
    sup = faults.get("suppress")
    if sup:
        pat = re.compile(sup["match"])
        start = int(sup["from"])
        dropped = [i for i in range(start, len(entries)) if pat.search(entries[i]["MESSAGE"])]
        if dropped:
            first = entries[dropped[0]]
            note = {"MESSAGE": f"systemd-journald[52]: Suppressed {len(dropped)} messages from {unit}",
                    "_SYSTEMD_UNIT": "systemd-journald.service", "_SYSTEMD_INVOCATION_ID": JOURNALD_INVOCATION,
                    "OBJECT_SYSTEMD_UNIT": unit}
            if first.get("_SYSTEMD_INVOCATION_ID"):
                note["OBJECT_SYSTEMD_INVOCATION_ID"] = first["_SYSTEMD_INVOCATION_ID"]
            keep = set(dropped)
            entries = [note if i == dropped[0] else e for i, e in enumerate(entries) if i not in keep or i == dropped[0]]
    return entries


def _seqnum_id(unit: str) -> str:
    return hashlib.md5(unit.encode()).hexdigest()


def _cursor(unit: str, place: int) -> str:
    """journald's cursor form for the entry at ``place`` (1-based) of the unit's log."""
    x = int(hashlib.md5(f"{unit}:{place}".encode()).hexdigest()[:16], 16)
    return f"s={_seqnum_id(unit)};i={place:x};b={BOOT};m={place:x};t={place:x};x={x:x}"


def _place(unit: str, cursor: str) -> int:
    """The entry place a cursor names; exits like journalctl on a cursor it cannot seek to."""
    parts = dict(p.split("=", 1) for p in cursor.split(";") if "=" in p)
    try:
        if parts["s"] != _seqnum_id(unit):
            raise KeyError
        return int(parts["i"], 16)
    except (KeyError, ValueError):
        sys.stderr.write("Failed to seek to cursor: Invalid argument\n")
        raise SystemExit(1)


def _parse_time(text: str) -> float:
    """Epoch seconds for a journalctl time spec (``@EPOCH``, ``now``, ``YYYY-MM-DD[ HH:MM[:SS]]``)."""
    text = text.strip()
    if text.startswith("@"):
        return float(text[1:])
    if text == "now":
        return time.time()
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    raise SystemExit(f"Failed to parse timestamp: {text}")


#: the journalctl this shim stands for (host option ``journalctl_version``)
VERSION = int(os.environ.get("ORCHTB_JOURNALCTL_VERSION") or 252)
#: the first journalctl with ``--invocation`` (systemd #33794)
INVOCATION_SINCE = 257
CALLS = "/run/orchtb/journalctl.calls"


def _log_call(argv: list[str]) -> None:
    try:
        with open(CALLS, "a") as f:
            f.write(json.dumps(argv) + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Run ``systemctl3 log`` for the unit and print (filtered) lines; returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    _log_call(argv)
    if argv[:1] == ["--version"]:
        print(f"systemd {VERSION} (orch test-bed stand-in)")
        return 0
    if VERSION < INVOCATION_SINCE:
        for a in argv:
            if a == "--invocation" or a.startswith("--invocation="):
                sys.stderr.write(f"journalctl: unrecognized option '{a}'\n")
                return 1
    p = argparse.ArgumentParser(prog="journalctl", add_help=True)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("-u", "--unit")
    which.add_argument("--user-unit")
    p.add_argument("-n", "--lines", type=int)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--no-pager", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-b", "--boot", nargs="?", const="0")
    p.add_argument("-x", "--catalog", action="store_true")
    p.add_argument("-o", "--output", default="short")
    p.add_argument("-S", "--since")
    p.add_argument("-U", "--until")
    p.add_argument("--system", action="store_true")
    p.add_argument("--show-cursor", action="store_true")
    p.add_argument("--after-cursor")
    p.add_argument("-c", "--cursor")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("--invocation", default=None)
    args = p.parse_args(argv)
    user = args.user_unit is not None
    name = args.user_unit if user else args.unit
    unit = name if "." in name else name + ".service"
    mode = ["--user"] if user else []
    if args.follow:
        cmd = [SYSTEMCTL3, *mode, "log", unit, "--no-pager", "-f"]
        if args.lines is not None:
            cmd += ["-n", str(args.lines)]
        return subprocess.call(cmd)
    out = subprocess.run([SYSTEMCTL3, *mode, "log", unit, "--no-pager"], stdout=subprocess.PIPE, text=True,
                         errors="replace", stderr=subprocess.DEVNULL if user else None)
    if user and out.returncode != 0:  # no such unit of the caller's manager: no entries, as journalctl
        out = subprocess.CompletedProcess(out.args, 0, "", None)
    # -n is applied here: systemctl3's own -n pipes through tail and logs noise on stderr
    since = _parse_time(args.since) if args.since else None
    until = _parse_time(args.until) if args.until else None
    # second resolution of the stamps: compare against the whole second of the bound
    if since is not None:
        since = float(int(since))
    kept: list[tuple[int, dict, float | None]] = []
    current: float | None = None
    entries = _view(_entries(out.stdout.splitlines(), unit, user), unit)
    first = 1
    if args.after_cursor:
        first = _place(unit, args.after_cursor) + 1
    elif args.cursor:
        first = _place(unit, args.cursor)
    for place, entry in enumerate(entries, 1):
        if args.invocation is not None and entry.get("_SYSTEMD_INVOCATION_ID") != args.invocation:
            continue  # journalctl 257+: only that invocation's entries (an ID; offsets are not stood in for)
        m = STAMP.match(entry["MESSAGE"])
        if m:
            current = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
        if current is None and (since is not None or until is not None):
            continue
        if since is not None and current is not None and current < since:
            continue
        if until is not None and current is not None and current > until:
            continue
        if place < first:
            continue
        kept.append((place, entry, current))
    last = kept[-1][0] if kept else None
    if args.lines is not None:
        kept = kept[-args.lines:] if args.lines else []
    if args.output == "json":
        sys.stdout.write("".join(json.dumps({"__CURSOR": _cursor(unit, n), "__REALTIME_TIMESTAMP": str(int((t or 0) * 1e6)),
                                             **e}) + "\n" for n, e, t in kept))
    else:
        sys.stdout.write("".join(e["MESSAGE"] + "\n" for _, e, _ in kept))
    if args.show_cursor and last is not None:  # journalctl: the cursor of the last entry read, after two dashes
        sys.stdout.write(f"-- cursor: {_cursor(unit, last)}\n")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
