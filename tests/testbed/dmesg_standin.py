"""The test bed's ``dmesg`` (a bed host shares the machine's kernel, whose log holds no GPU
lines): prints the kernel log lines a test wrote, in util-linux dmesg's default format.

Installed per host as ``/usr/local/sbin/dmesg`` (before ``/bin/dmesg`` on PATH) when the host
option ``dmesg`` is set. Reads ``/run/orchtb/dmesg.json``::

    {"lines": ["[  812.345678] NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus."],
     "later": [...], "later_from_call": 2, "refuse": false}

``lines`` are printed on every call; ``later`` too from the ``later_from_call``-th call on (the
calls are counted in ``/run/orchtb/dmesg.calls``), so a test makes an Xid appear between two
reads of the log, as one logged during a tune does. ``refuse``: exit 1 with util-linux's message
for ``kernel.dmesg_restrict=1`` (``dmesg: read kernel buffer failed: Operation not permitted``).
No file: no line. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys

LOG_FILE = "/run/orchtb/dmesg.json"
CALLS_FILE = "/run/orchtb/dmesg.calls"


def main(argv: list) -> int:
    """Entry point (arguments are ignored: the default output is the only one orch reads)."""
    try:
        with open(LOG_FILE) as f:
            spec = json.load(f)
    except OSError:
        return 0
    if spec.get("refuse"):
        sys.stderr.write("dmesg: read kernel buffer failed: Operation not permitted\n")
        return 1
    calls = 0
    if os.path.exists(CALLS_FILE):
        with open(CALLS_FILE) as f:
            calls = int(f.read().strip() or 0)
    calls += 1
    with open(CALLS_FILE, "w") as f:
        f.write(str(calls))
    lines = list(spec.get("lines") or [])
    if calls >= int(spec.get("later_from_call") or 1 << 30):
        lines += list(spec.get("later") or [])
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
