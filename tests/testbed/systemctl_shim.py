"""The bed hosts' ``systemctl``: docker-systemctl-replacement, plus what it lacks for the transient
units of the ``systemd-run`` stand-in (``tests/testbed/systemd_run.py``). Standard library only.

For a unit with a spec in ``/run/systemd/transient`` (or one that was collected), it answers as
systemd 252 does for a transient unit:

- ``show UNIT [-p A,B | --property=A ...]``: the replacement's properties, with ``ActiveState``,
  ``SubState``, ``Result``, ``ExecMainCode``, ``ExecMainStatus`` from the unit's result file once
  it has ended (``failed``/``failed``, ``oom-kill``...); ``Result=success`` while it runs. A unit
  that is not loaded (never started, or unloaded after it ended) shows ``LoadState=not-found``,
  ``ActiveState=inactive``, ``SubState=dead``, ``MainPID=0``, ``Result=success``.
- ``is-active UNIT``: ``failed`` (exit 3) once ended with a result file, ``inactive`` (exit 3)
  when not loaded.
- ``reset-failed UNIT``: unloads an ended transient unit (its unit, spec and result files).

Invocation IDs (docker-systemctl-replacement has none), for every unit: each ``start`` of a unit
that is not active and each ``restart`` gets a new random 128-bit ID (32 hex digits), passed to the
unit's processes as ``$INVOCATION_ID`` (systemd.exec(5); the replacement gives its services its own
environment) and recorded in ``/run/orchtb/invocations/UNIT.json`` with the number of lines the
unit's log had then, so the journalctl stand-in stamps the lines written from there on with
``_SYSTEMD_INVOCATION_ID`` (systemd.journal-fields(7)); ``show -p InvocationID UNIT`` answers the
last one (empty for a unit never started), as systemd keeps it after the unit stopped.

User units (``systemctl --user``, systemd.unit(5)): the replacement's own ``--user`` mode runs the
caller's units from ``~/.config/systemd/user`` as the caller; their invocation IDs are recorded
per user, in ``~/.config/orchtb/invocations`` (:func:`invocation_dir`), where the journalctl
stand-in reads them for ``--user-unit``.

Every other call, and every other unit, goes to the replacement unchanged (``REAL`` is its command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

REAL = json.loads(os.environ.get("ORCHTB_SYSTEMCTL_REAL") or "[]")
UNIT_DIR = "/run/systemd/system"
TRANSIENT_DIR = "/run/systemd/transient"
INVOCATIONS = "/run/orchtb/invocations"
NOT_LOADED = {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead", "MainPID": "0",
              "Result": "success", "ExecMainCode": "0", "ExecMainStatus": "0"}


def _unit(name: str) -> str:
    return name if "." in name.rsplit("/", 1)[-1] and name.endswith((".service", ".socket", ".target")) \
        else name + ".service"


def _transient(name: str) -> bool:
    return os.path.exists(os.path.join(TRANSIENT_DIR, name + ".json")) or name.startswith("orch-tune-")


def _result(name: str) -> dict | None:
    try:
        with open(os.path.join(TRANSIENT_DIR, name + ".result")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _props(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-p", "--property"):
            out += args[i + 1].split(",")
            i += 1
        elif a.startswith("--property="):
            out += a.split("=", 1)[1].split(",")
        elif a.startswith("-p") and len(a) > 2:
            out += a[2:].split(",")
        i += 1
    return out


def _show(name: str, args: list[str]) -> int:
    want = _props(args)
    loaded = os.path.exists(os.path.join(UNIT_DIR, name))
    if not loaded:
        values = dict(NOT_LOADED, Id=name)
    else:
        real = subprocess.run(REAL + ["show", name], stdout=subprocess.PIPE, text=True)
        values = dict(line.split("=", 1) for line in real.stdout.splitlines() if "=" in line)
        res = _result(name)
        if res is None:
            values.update(Result="success", ExecMainCode="0", ExecMainStatus="0")
        else:
            values.update(ActiveState="failed", SubState="failed", MainPID="0",
                          **{k: str(v) for k, v in res.items()})
    for k in want or sorted(values):
        print(f"{k}={values.get(k, '')}")
    return 0


def invocation_dir(user: bool) -> str:
    """Where the invocation IDs of the caller's units are recorded: :data:`INVOCATIONS` for the
    system manager's, ``~/.config/orchtb/invocations`` for the caller's own user manager's."""
    return os.path.join(os.path.expanduser("~"), ".config", "orchtb", "invocations") if user else INVOCATIONS


def invocations(name: str, user: bool = False) -> list[dict]:
    """The unit's invocations so far: ``[{"id", "from"}]`` (``from``: lines of its log before it)."""
    try:
        with open(os.path.join(invocation_dir(user), name + ".json")) as f:
            got = json.load(f)
        return got if isinstance(got, list) else []
    except (OSError, ValueError):
        return []


def _new_invocation(name: str, user: bool = False) -> str:
    """A new invocation of ``name``: a random ID recorded with the unit's log length now."""
    mode = ["--user"] if user else []
    log = subprocess.run(REAL + mode + ["log", name, "--no-pager"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, errors="replace").stdout
    inv = uuid.uuid4().hex
    folder = invocation_dir(user)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name + ".json")
    tmp = path + f".{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(invocations(name, user) + [{"id": inv, "from": len(log.splitlines())}], f)
    os.replace(tmp, path)
    return inv


def _show_invocation(name: str, argv: list[str], user: bool = False) -> int:
    """``show`` with ``InvocationID`` among the properties: the replacement's answer for the others
    (through this shim for a transient unit), then ``InvocationID=`` the unit's last."""
    want = _props(argv)
    others = [k for k in want if k != "InvocationID"]
    if others:
        cmd = [sys.executable, os.path.abspath(__file__), *(["--user"] if user else []), "show", name,
               "-p", ",".join(others)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(out.stdout)
    got = invocations(name, user)
    print(f"InvocationID={got[-1]['id'] if got else ''}")
    return 0


def main(argv: list[str]) -> int:
    """Answer the transient-unit calls; hand every other to the replacement."""
    verbs, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-p", "--property"):
            skip = True  # its value is no verb
        elif not a.startswith("-"):
            verbs.append(a)
    user = "--user" in argv
    mode = ["--user"] if user else []
    if len(verbs) >= 2 and verbs[0] == "show" and "InvocationID" in _props(argv):
        return _show_invocation(_unit(verbs[1]), argv, user)
    if len(verbs) == 2 and verbs[0] in ("start", "restart"):
        name = _unit(verbs[1])
        active = subprocess.run(REAL + mode + ["is-active", name], stdout=subprocess.PIPE, text=True).stdout.strip()
        if verbs[0] == "restart" or active != "active":
            os.environ["INVOCATION_ID"] = _new_invocation(name, user)
    if not user and len(verbs) >= 2 and verbs[0] in ("show", "is-active", "reset-failed") \
            and _transient(_unit(verbs[1])):
        name = _unit(verbs[1])
        loaded = os.path.exists(os.path.join(UNIT_DIR, name))
        if verbs[0] == "show":
            return _show(name, argv)
        if verbs[0] == "is-active" and (not loaded or _result(name) is not None):
            print("inactive" if not loaded else "failed")
            return 3
        if verbs[0] == "reset-failed":
            if _result(name) is not None:
                for p in (os.path.join(UNIT_DIR, name), os.path.join(TRANSIENT_DIR, name + ".json"),
                          os.path.join(TRANSIENT_DIR, name + ".result"), os.path.join(TRANSIENT_DIR, name + ".started")):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
            return 0
    os.execvp(REAL[0], REAL + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
