"""A long payload command run as a transient systemd unit (``systemd-run --unit orch-tune-RUN``),
outside the SSH login session, and polled by the controller.

Why: on hardened hosts logind ends a user's processes at logout (``KillUserProcesses=yes``,
konstruktoid/ansible-role-hardening #719), so a command started from the SSH session dies with
it; and a cloud firewall drops an SSH channel left idle for the whole tune (issue 21 row 2). A
transient unit belongs to the service manager, not to the session: it survives both, and the
controller reads its state (``systemctl show``) and its output file (``StandardOutput=file:``)
in short commands. Its memory is capped (``MemoryMax=``, systemd.resource-control(5)) so a tuner
whose host memory grows (vllm PR #31604, vllm PR #53490) is the one process the kernel's OOM
killer ends (``Result=oom-kill``), never the server or sshd.

Names: :func:`unit_name` (``orch-tune-<run id>``): `orch recover` finds the unit of a dead
controller's run by that name (:func:`stop_unit`), its output file (``<state_dir>/units/<unit>.out``)
and its ticket (``<unit>.ticket.json``, :func:`unit_files` ``ticket``: what the tune was for, written before
the unit starts), so it can collect a finished tune's files (:func:`last_result`).
"""

from __future__ import annotations

import json
import posixpath
import re

from remote.protocol import PROTO, is_run_id

from ..errors import internal_error
from ..facts.systemd_unit import Unit

#: what `MemoryMax=` is, by default, as a share of the host's MemAvailable at the tune's launch
MEMORY_SHARE = 0.8
#: the unit's state properties the controller reads (systemd.exec(5), org.freedesktop.systemd1(5))
STATE_PROPS = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus")
#: ActiveState values of a unit that has not ended (systemctl(1))
RUNNING_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")
#: the first systemd whose ``systemd-run`` has ``--collect`` (CollectMode=, systemd NEWS "CHANGES WITH 236")
COLLECT_SINCE = 236
#: the first systemd that gives ExecStopPost= ``$SERVICE_RESULT``, ``$EXIT_CODE``, ``$EXIT_STATUS``
#: (systemd NEWS "CHANGES WITH 232"; systemd.exec(5))
STOP_POST_RESULT_SINCE = 232
#: characters of a path that may go into the unit's ExecStopPost= shell line unquoted
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./@:+-]*")


@internal_error("orchestrator.tasks.tune catches it and runs the tune in the SSH session, saying why")
class UnitUnavailable(Exception):
    """``systemd-run`` is absent or could not start the unit (no systemd as PID 1, a container,
    no D-Bus): the caller falls back to running the command in the SSH session. ``str()`` says why."""


def unit_name(run_id: str, command: str = "tune") -> str:
    """``orch-<command>-<run_id>.service``. Raises ValueError for a run id that is not a plain name
    (recover reads run ids from a host's records: nothing else may reach a unit name)."""
    if not is_run_id(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return f"orch-{command}-{run_id}.service"


def memory_max(meminfo: str, share: float = MEMORY_SHARE) -> int | None:
    """``share`` of ``MemAvailable`` (bytes) of a ``/proc/meminfo`` text (proc(5): ``kB`` are KiB);
    None when the line is missing (a kernel before 3.14): then no limit is set."""
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemAvailable" and rest.split() and rest.split()[0].isdigit():
            return int(int(rest.split()[0]) * 1024 * share)
    return None


def parse_show(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of ``systemctl show -p ...`` as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def unit_state(t, unit: str) -> dict[str, str]:
    """The :data:`STATE_PROPS` of ``unit`` on the host of connection ``t`` (a unit that is not
    loaded, e.g. one that ended with success and was unloaded, shows ``LoadState=not-found``)."""
    res = transient(unit).systemctl(t, "show", "-p", ",".join(STATE_PROPS), check=False)
    return parse_show(res.stdout)


def stop_unit(t, unit: str) -> dict[str, str] | None:
    """Stop ``unit`` if it still runs (``systemctl stop``: SIGTERM to its processes, SIGKILL after its
    stop timeout), then unload it (``reset-failed``). Returns its state before the stop, or None when
    it was not loaded."""
    st = unit_state(t, unit)
    if st.get("LoadState") in (None, "", "not-found"):
        return None
    # best effort: a unit that ended meanwhile makes stop or reset-failed fail, and either way
    # the caller reads what is left from its state
    if st.get("ActiveState") in RUNNING_STATES:
        transient(unit).systemctl(t, "stop", timeout=120, check=False)
    transient(unit).systemctl(t, "reset-failed", check=False)
    return st


def transient(unit: str) -> Unit:
    """The handle of orch's transient unit ``unit`` (made through sudo by ``systemd-run``: the
    system manager's, every call through sudo)."""
    return Unit(unit, "system", root_reads=True)


def unit_files(state_dir: str, unit: str) -> dict[str, str]:
    """Where the unit's files are on the host: ``out`` (its stdout, the payload's JSON lines),
    ``err`` (stderr), ``ticket`` (what the command was for), ``env`` (the environment it runs
    with, :func:`env_file_text`) and ``result`` (how it ended, :func:`stop_post_result`), under
    ``<state_dir>/units``."""
    d = posixpath.join(state_dir, "units")
    return {"out": posixpath.join(d, unit + ".out"), "err": posixpath.join(d, unit + ".err"),
            "ticket": posixpath.join(d, unit + ".ticket.json"), "env": posixpath.join(d, unit + ".env"),
            "result": posixpath.join(d, unit + ".result")}


def systemd_version(text: str) -> int | None:
    """systemd's version from ``systemd-run --version`` (first line ``systemd 252 (252.38-1~deb12u1)``);
    None when the text has none."""
    m = re.match(r"\s*systemd (\d+)", text or "")
    return int(m.group(1)) if m else None


def env_file_text(env: dict[str, str]) -> str:
    """``env`` as an ``EnvironmentFile=`` text (systemd.exec(5)): one ``KEY="VALUE"`` a line, the
    value double-quoted with ``\\``, ``"``, `` ` `` and ``$`` escaped by a backslash, the only
    escapes systemd reads there (a newline stays as it is inside the quotes). Keys that are not
    variable names are left out (systemd ignores them too). Pure;
    :func:`orchestrator.facts.systemd_env.parse_env_file` reads it back to ``env``."""
    lines = []
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        quoted = re.sub(r'([\\"`$])', r"\\\1", str(value))
        lines.append(f'{key}="{quoted}"')
    return "".join(line + "\n" for line in lines)


def stop_post_result(path: str) -> str | None:
    """The ``ExecStopPost=`` value that writes how the unit's main process ended to ``path``:
    ``$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS`` (systemd.exec(5); ``$$`` is a literal ``$`` in
    a command line, systemd.service(5)), so a unit unloaded at once (``--collect``) still says
    whether the kernel ended it at its ``MemoryMax=`` (``oom-kill``) or its time ran out. None for a
    path that cannot go into the shell line as it is."""
    if not _PLAIN_PATH.fullmatch(path):
        return None
    return f"/bin/sh -c 'echo \"$$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS\" > {path}'"


def parse_stop_post_result(text: str) -> dict[str, str]:
    """:func:`stop_post_result`'s file as the :data:`STATE_PROPS` it stands for (``Result``,
    ``ExecMainCode``, ``ExecMainStatus``; ``{}`` when empty)."""
    parts = (text or "").split()
    return dict(zip(("Result", "ExecMainCode", "ExecMainStatus"), parts)) if parts else {}


def last_result(out: str) -> dict | None:
    """The last ``result`` or ``error`` message (``{"proto": 1, "type": ...}``) among the JSON lines
    of a payload command's output ``out``; None when it has none (the command was stopped, or
    died, before its end)."""
    final = None
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("proto") == PROTO and msg.get("type") in ("result", "error"):
            final = msg
    return final
