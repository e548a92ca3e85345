"""``journalctl`` of a test-bed host: a front for docker-systemctl-replacement's ``systemctl3 log``.

Bound (through a small shell wrapper) over ``/usr/bin/journalctl`` inside each host.
journalctl3 itself cannot be bound elsewhere (it looks for ``systemctl3.py`` beside its own
path) and knows only ``-u -n -f --no-pager``; this shim accepts the options an operator tool
uses (``-u UNIT`` (once), ``-n N``, ``-f``, ``--no-pager``, ``-q``, ``-b``, ``-x``, ``-o cat|short``,
``--since``/``--until`` as ``YYYY-MM-DD HH:MM:SS``, ``@EPOCH``, ``now``) and runs
``systemctl3 log UNIT``. ``--since``/``--until`` filter on the ``[YYYY-MM-DD HH:MM:SS...]`` prefix
that SGLang (and the stand-in) puts on each line; lines without one (tracebacks) belong to the
line before. The unit's log file accumulates across restarts (docker-systemctl-replacement).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import datetime

SYSTEMCTL3 = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "systemctl3")
STAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")


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


def main(argv: list[str] | None = None) -> int:
    """Run ``systemctl3 log`` for the unit and print (filtered) lines; returns its exit status."""
    p = argparse.ArgumentParser(prog="journalctl", add_help=True)
    p.add_argument("-u", "--unit", required=True)
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
    args = p.parse_args(argv)
    unit = args.unit if "." in args.unit else args.unit + ".service"
    if args.follow:
        cmd = [SYSTEMCTL3, "log", unit, "--no-pager", "-f"]
        if args.lines is not None:
            cmd += ["-n", str(args.lines)]
        return subprocess.call(cmd)
    out = subprocess.run([SYSTEMCTL3, "log", unit, "--no-pager"], stdout=subprocess.PIPE, text=True,
                         errors="replace")
    # -n is applied here: systemctl3's own -n pipes through tail and logs noise on stderr
    since = _parse_time(args.since) if args.since else None
    until = _parse_time(args.until) if args.until else None
    # second resolution of the stamps: compare against the whole second of the bound
    if since is not None:
        since = float(int(since))
    kept: list[str] = []
    current: float | None = None
    for line in out.stdout.splitlines():
        m = STAMP.match(line)
        if m:
            current = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
        if current is None and (since is not None or until is not None):
            continue
        if since is not None and current is not None and current < since:
            continue
        if until is not None and current is not None and current > until:
            continue
        kept.append(line)
    if args.lines is not None:
        kept = kept[-args.lines:] if args.lines else []
    sys.stdout.write("".join(line + "\n" for line in kept))
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
