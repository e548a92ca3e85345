"""Who listens on the unit's TCP port, and free it of the unit's own leftovers (``port``).

``python -m remote port --port N [--unit NAME.service] [--owner-args JSON] [--main-pid PID] [--free]
[--term-timeout S] [--kill-timeout S]``

Why: after ``systemctl stop`` a leftover child of the server (not holding a GPU, so ``reap``
does not see it) can keep the listening socket; the next start then dies with "address already
in use", and a rescue restart dies the same way.

How:

1. Listening sockets on the port: ``/proc/net/tcp`` and ``/proc/net/tcp6`` rows in state
   ``0A`` (LISTEN) whose local port is N, by socket inode; their holders by scanning
   ``/proc/*/fd`` for ``socket:[INODE]``.
2. A holder belongs to the unit when its cgroup (``/proc/PID/cgroup``) is the unit's (a path
   whose last component is ``--unit``), or when its command line runs
   ``-m sglang.launch_server`` (or ``sglang serve``) with exactly the unit's launch arguments
   (``--owner-args``, a JSON list: a fork of the server keeps its command line). Anything else is foreign.
3. With ``--free``: when a foreign process holds the port, nothing is signalled and
   ``PayloadError('runtime')`` names every holder (PID and command line); otherwise the unit's
   holders get SIGTERM, then SIGKILL after ``--term-timeout`` (only while each PID is still the
   process first seen: :func:`remote.host.procs.signal_if_same`), and the port is checked again.
   A holder left -> ``PayloadError('runtime')``. PID 1 and the payload's own ancestors are never
   signalled (reported as foreign).

``--main-pid PID`` (the unit's ``MainPID``): each holder also says whether it is that process or
one of its descendants (``main``), and whether every listening socket it holds is one the main
server (or a descendant) also holds (``main_socket``: an inherited copy of the server's own socket,
e.g. a fork that outlived its parent; it cannot be a second server, which would need a socket of
its own). Readiness and the benchmark check that the process answering on the port is the unit's
main server, not a leaked one (``free`` is not needed for that).

Result ``data``::

    {"port": N, "holders": [{"pid", "cmdline", "owner": bool, "why", "inodes": [socket inode],
                             "main": bool | null, "main_socket": bool | null}],
     "killed": [{"pid", "cmdline", "signal", "exited"}], "free": bool}
"""

from __future__ import annotations

import json
import os
import signal

from ..protocol import PayloadError, log
from ..engines import ENGINES
from .procs import _wait_gone, ancestors, cmdline, proc_stat, signal_if_same

LISTEN = "0A"


def add_arguments(parser) -> None:
    """Flags of ``port``."""
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unit", default=None, help="the unit's name (NAME.service): its cgroup")
    parser.add_argument("--owner-args", default=None,
                        help="JSON list: the unit's arguments after its entry point (Launch.entry_args)")
    parser.add_argument("--main-pid", type=int, default=None, help="the unit's MainPID: mark its holders")
    parser.add_argument("--free", action="store_true", help="end the unit's own holders")
    parser.add_argument("--term-timeout", type=float, default=10.0)
    parser.add_argument("--kill-timeout", type=float, default=10.0)


def listening_inodes(table: str, port: int) -> set[int]:
    """Socket inodes LISTENing on ``port`` in a ``/proc/net/tcp``/``tcp6`` ``table`` text. Pure."""
    out = set()
    for line in table.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] != LISTEN:
            continue
        try:
            local_port = int(parts[1].rsplit(":", 1)[1], 16)
            inode = int(parts[9])
        except (IndexError, ValueError):
            continue
        if local_port == port and inode:
            out.add(inode)
    return out


def is_unit_process(argv: list[str], cgroup_text: str, unit: str | None, owner_args: list[str] | None) -> str | None:
    """Why a process belongs to the unit (``"cgroup"``, ``"command line"``), or None. Pure.

    ``cgroup_text``: its ``/proc/PID/cgroup``; ``unit``: ``NAME.service``; ``owner_args``: the
    unit's arguments after its entry point (``Launch.entry_args``; whose process it is, the
    engines say: ``Engine.is_server_process``, e.g. ``-m sglang.launch_server ARGS``)."""
    if unit:
        for line in cgroup_text.splitlines():
            path = line.split(":", 2)[-1].strip()
            if path.rstrip("/").rsplit("/", 1)[-1] == unit:
                return "cgroup"
    if owner_args is not None and any(e.is_server_process(argv, owner_args) for e in ENGINES.values()):
        return "command line"
    return None


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def holders(port: int) -> dict[int, set[int]]:
    """``{pid: socket inodes}`` of the processes holding a listening socket on ``port``."""
    inodes = listening_inodes(_read("/proc/net/tcp"), port) | listening_inodes(_read("/proc/net/tcp6"), port)
    found: dict[int, set[int]] = {}
    if not inodes:
        return found
    wanted = {f"socket:[{i}]": i for i in inodes}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if target in wanted:
                found.setdefault(int(name), set()).add(wanted[target])
    return found


def run(args) -> dict:
    """``port`` command: see the module docstring."""
    if not 0 < args.port < 65536:
        raise PayloadError("bad_input", f"--port must be 1..65535, got {args.port}")
    owner_args = None
    if args.owner_args is not None:
        try:
            owner_args = json.loads(args.owner_args)
        except ValueError as exc:
            raise PayloadError("bad_input", f"--owner-args is not JSON: {exc}") from None
        if not isinstance(owner_args, list) or not all(isinstance(a, str) for a in owner_args):
            raise PayloadError("bad_input", "--owner-args must be a JSON list of strings")
    result = free_port(args.port, args.unit, owner_args, args.free, args.term_timeout, args.kill_timeout)
    if args.main_pid is not None:
        mark_main(result["holders"], args.main_pid, ancestors)
    return result


def mark_main(found: list[dict], main_pid: int, ancestors_of) -> None:
    """Set ``main`` and ``main_socket`` on each holder (see the module docstring). Pure but for
    ``ancestors_of(pid) -> list[int]`` (the PID and its parents)."""
    main_inodes: set[int] = set()
    for h in found:
        h["main"] = main_pid > 1 and main_pid in ancestors_of(int(h["pid"]))
        if h["main"]:
            main_inodes.update(h.get("inodes") or [])
    for h in found:
        inodes = set(h.get("inodes") or [])
        h["main_socket"] = bool(h["main"] or (inodes and inodes <= main_inodes))


def _describe(port: int, unit: str | None, owner_args: list[str] | None) -> list[dict]:
    never = ancestors(os.getpid())
    out = []
    held = holders(port)
    for pid in sorted(held):
        st = proc_stat(pid)
        if st is None:
            continue
        argv = cmdline(pid)
        why = None if pid in never else is_unit_process(argv, _read(f"/proc/{pid}/cgroup"), unit, owner_args)
        out.append({"pid": pid, "cmdline": " ".join(argv), "owner": why is not None,
                    "why": why or ("PID 1 or the payload" if pid in never else "not the unit's"),
                    "inodes": sorted(held[pid]), "starttime": st[2]})
    return out


def free_port(port: int, unit: str | None, owner_args: list[str] | None, free: bool = False,
              term_timeout: float = 10.0, kill_timeout: float = 10.0) -> dict:
    """Find (and with ``free`` end) the holders of ``port``; see the module docstring."""
    found = _describe(port, unit, owner_args)
    result = {"port": port, "holders": [{k: v for k, v in h.items() if k != "starttime"} for h in found],
              "killed": [], "free": not found}
    if not free or not found:
        return result
    foreign = [h for h in found if not h["owner"]]
    if foreign:
        raise PayloadError("runtime", f"port {port} is held by process(es) that are not the unit's: " +
                           "; ".join(f"{h['pid']} ({h['cmdline'][:160]})" for h in foreign) +
                           "; the server cannot start while they listen there", detail=result)
    targets = [dict(h, signal=None, exited=False) for h in found]
    for sig, wait in ((signal.SIGTERM, term_timeout), (signal.SIGKILL, kill_timeout)):
        left = [t for t in targets if not t["exited"]]
        if not left:
            break
        for t in left:
            if signal_if_same(t["pid"], t["starttime"], sig):
                t["signal"] = sig.name
                log(f"sent {sig.name} to {t['pid']} ({t['cmdline'][:200]}), which held port {port}")
            else:
                t["exited"] = True
        _wait_gone(left, wait)
    result["killed"] = [{"pid": t["pid"], "cmdline": t["cmdline"], "signal": t["signal"], "exited": t["exited"],
                         "why": t["why"]} for t in targets]
    after = _describe(port, unit, owner_args)
    result["free"] = not after
    if after:
        raise PayloadError("runtime", f"port {port} is still held after SIGKILL: " +
                           "; ".join(f"{h['pid']} ({h['cmdline'][:160]})" for h in after), detail=result)
    return result
