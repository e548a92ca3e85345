"""A process that holds GPU device files open, started by ``hostinit`` under a borrowed argv[0].

Used for a test-bed host's leftover ``sglang::scheduler_TP0`` and its ``nvidia-persistenced``.
``python holder.py [--comm NAME] [--user U] PATH...``: forks (the child is re-parented to the
host's PID 1, like an orphaned worker or a daemon), opens every PATH read-write, sets the
kernel ``comm`` name to NAME (cut at 15 characters, as the kernel does) and sleeps forever.
"""

import ctypes
import os
import sys
import time


def main(argv):
    """Parse ``argv``, fork, hold the files; never returns in the child."""
    comm, paths, i = None, [], 0
    while i < len(argv):
        if argv[i] in ("--comm", "--user"):
            if argv[i] == "--comm":
                comm = argv[i + 1]
            i += 2
            continue
        paths.append(argv[i])
        i += 1
    if os.fork():
        os._exit(0)
    os.setsid()
    fds = [os.open(p, os.O_RDWR) for p in paths]
    if comm:
        try:
            ctypes.CDLL(None).prctl(15, comm.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):
            pass
    while fds:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
