"""Stand-in for ``systemd-run`` on test-bed hosts (their ``/usr/bin/systemd-run``), standard library only.

The bed's service manager is docker-systemctl-replacement, which has no transient units. This
script gives orch's use of ``systemd-run`` (systemd-run(1), systemd 252) the same contract:

- ``systemd-run [--unit=NAME] [-p|--property=KEY=VALUE]... [--setenv=VAR=VALUE]...
  [--working-directory=DIR] [--description=TEXT] [--collect] [-q|--quiet] [--] COMMAND [ARG...]``
  writes the unit ``NAME.service`` (``run-u<N>`` without ``--unit``) and starts it with the
  host's ``systemctl start``, then returns (no ``--wait``: systemd-run returns once the unit has
  started; the replacement's "not active" of a supervisor that has not yet run its first line, on
  a busy machine, is waited out until that line writes ``NAME.launched``). It prints ``Running as unit: NAME.service`` on stderr (unless ``--quiet``), as
  systemd-run does. A unit of that name that is still loaded is refused (exit 1, ``Unit NAME.service
  was already loaded or has a fragment file.``), like systemd's.
  ``--version`` prints ``systemd 252 (orch test-bed stand-in)``.
- The unit's ``ExecStart=`` is this script's ``--supervise NAME``: it runs COMMAND in a fresh
  environment (``PATH`` and the ``--setenv`` variables only, as a transient unit gets the manager's
  environment, never the caller's shell's), in ``--working-directory`` (default ``/``), in its own
  process group, with ``StandardOutput=``/``StandardError=`` ``file:PATH``/``append:PATH``/``null``
  honoured, and passes SIGTERM/SIGINT on to that group (``systemctl stop``).
- ``MemoryMax=BYTES`` (also ``K``/``M``/``G``/``T`` suffixes, ``infinity``): **stand-in for the
  cgroup limit**. The bed's hosts have no memory cgroup of their own, so the supervisor sums the
  resident memory (``VmRSS`` of ``/proc/PID/status``) of COMMAND and every descendant every 50 ms
  and, above the limit, SIGKILLs them all, as the kernel's cgroup OOM killer does, with the
  unit's ``Result=oom-kill``. A burst shorter than a poll can pass; the real limit has no such gap.
- ``RuntimeMaxSec=S``: after S seconds SIGTERM, then SIGKILL after 10 s; ``Result=timeout``.
- ``Environment=`` (assignments separated by spaces, quotes as in a unit file) and
  ``EnvironmentFile=[-]PATH`` (read when the command starts; systemd.exec(5)'s syntax:
  ``KEY=VALUE`` lines, ``#``/``;`` comments, a double-quoted value unescapes ``\\"``, ``\\\\``,
  `` \\` `` and ``\\$`` and may span lines, a single-quoted one is verbatim, an unquoted one keeps
  the character after a backslash; a missing file fails the start unless ``-``). Files override
  ``Environment=``, as in systemd (a **stand-in** parser, written from systemd.exec(5), not orch's).
- ``ExecStopPost=COMMAND``: run after the command ended, with ``$SERVICE_RESULT``, ``$EXIT_CODE``
  (``exited``/``killed``) and ``$EXIT_STATUS`` (the status, or the signal's name) in its
  environment (systemd.exec(5)); the line is split into words with shell quoting and ``$$`` becomes
  ``$`` (systemd.service(5)); other ``$VAR`` substitution of systemd is not stood in for.
- ``Nice=N``: COMMAND starts at niceness N (systemd.exec(5) ``Nice=``), as systemd sets it before
  the exec.
- What docker-systemctl-replacement cannot keep (``Result``, ``ExecMainCode``, ``ExecMainStatus``)
  the supervisor writes to ``/run/systemd/transient/NAME.service.result`` (JSON), and the bed's
  ``systemctl`` shim (``tests/testbed/systemctl_shim.py``) answers ``show``/``is-active``/
  ``reset-failed`` with it. As in systemd, a unit that ended with ``Result=success`` is unloaded
  at once (``LoadState=not-found``), a failed one stays ``failed`` until ``reset-failed``, and
  with ``--collect`` (``CollectMode=inactive-or-failed``) it is unloaded whatever its result.

Files: the unit ``/run/systemd/system/NAME.service`` (where the replacement looks; systemd keeps
transient units in ``/run/systemd/transient``) and its spec ``/run/systemd/transient/NAME.service.json``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

UNIT_DIR = "/run/systemd/system"
TRANSIENT_DIR = "/run/systemd/transient"
SYSTEMCTL = "/usr/bin/systemctl"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: seconds without a sign of a forked supervisor after which its start counts as failed (a hang guard)
STALL_S = float(os.environ.get("ORCH_TEST_STALL_S") or 600)
_SUFFIX = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def parse_bytes(value: str) -> int | None:
    """``MemoryMax=`` value in bytes (``1536M``, ``2G``, ``123456``); None for ``infinity``.
    Raises ValueError for anything else (systemd.resource-control(5) also takes ``N%`` of RAM;
    orch never passes it, so it is refused here)."""
    if value.strip() == "infinity":
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)\s*", value)
    if not m:
        raise ValueError(f"bad MemoryMax value {value!r}")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def paths(name: str) -> tuple[str, str, str]:
    """(unit file, spec, result) of the transient unit ``name`` (with ``.service``)."""
    return (os.path.join(UNIT_DIR, name), os.path.join(TRANSIENT_DIR, name + ".json"),
            os.path.join(TRANSIENT_DIR, name + ".result"))


def _parse(argv: list[str]) -> dict:
    spec = {"unit": None, "properties": [], "setenv": {}, "cwd": "/", "collect": False, "quiet": False,
            "description": None, "command": []}
    i = 0
    with_value = {"--unit", "-p", "--property", "--setenv", "-E", "--working-directory", "--description"}
    while i < len(argv):
        a = argv[i]
        if a == "--":
            spec["command"] = argv[i + 1:]
            break
        if not a.startswith("-"):
            spec["command"] = argv[i:]
            break
        key, eq, val = a.partition("=")
        if key in with_value and not eq:
            i += 1
            val = argv[i]
        if key == "--unit":
            spec["unit"] = val
        elif key in ("-p", "--property"):
            spec["properties"].append(val)
        elif key in ("--setenv", "-E"):
            var, _, v = val.partition("=")
            spec["setenv"][var] = v
        elif key == "--working-directory":
            spec["cwd"] = val
        elif key == "--description":
            spec["description"] = val
        elif key == "--collect":
            spec["collect"] = True
        elif key in ("-q", "--quiet"):
            spec["quiet"] = True
        elif key == "--no-block":
            pass
        else:
            raise SystemExit(f"systemd-run (test-bed stand-in): unsupported option {a}")
        i += 1
    if not spec["command"]:
        raise SystemExit("systemd-run (test-bed stand-in): no command given")
    return spec


def launch(argv: list[str]) -> int:
    """``systemd-run ARGS``: write the unit and start it; the exit status of ``systemctl start``."""
    spec = _parse(argv)
    name = spec["unit"] or f"run-u{os.getpid()}"
    if not name.endswith(".service"):
        name += ".service"
    unit_file, spec_file, result_file = paths(name)
    if os.path.exists(unit_file):
        print(f"Failed to start transient service unit: Unit {name} was already loaded or has a fragment file.",
              file=sys.stderr)
        return 1
    props = {}
    for p in spec["properties"]:
        k, _, v = p.partition("=")
        props.setdefault(k, []).append(v)
    for v in props.get("MemoryMax", []):
        parse_bytes(v)  # a bad value is refused before anything starts, as systemd does
    spec["props"] = props
    os.makedirs(TRANSIENT_DIR, exist_ok=True)
    os.makedirs(UNIT_DIR, exist_ok=True)
    with open(spec_file, "w") as f:
        json.dump(spec, f)
    with open(unit_file, "w") as f:
        f.write("[Unit]\nDescription=%s\n\n[Service]\nType=simple\nTimeoutStopSec=30\nExecStart=%s %s --supervise %s\n"
                % (" ".join((spec["description"] or " ".join(spec["command"])).split()), sys.executable, os.path.abspath(__file__), name))
    for p in (result_file, result_file[:-len(".result")] + ".started", result_file[:-len(".result")] + ".launched"):
        if os.path.exists(p):
            os.unlink(p)
    res = subprocess.run([SYSTEMCTL, "start", name], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rc = res.returncode
    launched = result_file[:-len(".result")] + ".launched"  # the supervisor's first line; this removes it
    if rc != 0 and "not active" in res.stderr:
        # the replacement forked the supervisor, then judged it at once: "not active" of a unit whose
        # command already ended, or of one whose supervisor has not yet run its first line (a busy
        # machine). systemd-run returns 0 once the unit's process started, whatever it then does:
        # wait for the supervisor's first sign (a hang guard of STALL_S, as tests/waiting.py's).
        end = time.monotonic() + STALL_S
        while not os.path.exists(launched) and time.monotonic() < end:
            time.sleep(0.05)
        if os.path.exists(launched):
            rc = 0
    if os.path.exists(launched):
        os.unlink(launched)
    if rc != 0:
        sys.stderr.write(res.stderr)
    if rc == 0 and not spec["quiet"]:
        print(f"Running as unit: {name}", file=sys.stderr)
    return rc


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _rss(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            pass
    return total


def _kill_all(root: int, sig: int) -> None:
    for p in _descendants(root):
        try:
            os.kill(p, sig)
        except OSError:
            pass


def _open_output(value: str | None):
    if not value or value in ("inherit", "journal"):
        return None
    if value == "null":
        return subprocess.DEVNULL
    kind, _, path = value.partition(":")
    if kind in ("file", "append", "truncate"):
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if kind == "append" else 0)
                     | (os.O_TRUNC if kind == "truncate" else 0), 0o600)
        return fd
    raise SystemExit(f"systemd-run (test-bed stand-in): unsupported output {value!r}")


def _env_file(path: str) -> dict[str, str]:
    """An ``EnvironmentFile=`` as systemd.exec(5) describes it (see the module docstring)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out, i, n = {}, 0, len(text)
    while i < n:
        # a line: skip blank space, comments
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 1
            continue
        eq = text.find("=", i)
        nl = text.find("\n", i)
        if eq < 0 or (0 <= nl < eq):
            i = n if nl < 0 else nl + 1
            continue
        key = text[i:eq].strip()
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        value = []
        if i < n and text[i] == "'":
            end = text.index("'", i + 1)
            value.append(text[i + 1:end])
            i = end + 1
        elif i < n and text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    if text[i + 1] in '"\\`$':
                        value.append(text[i + 1])
                    elif text[i + 1] != "\n":
                        value.append(text[i:i + 2])
                    i += 2
                    continue
                value.append(text[i])
                i += 1
            i += 1
        else:
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n:
                    if text[i + 1] != "\n":
                        value.append(text[i + 1])
                    i += 2
                    continue
                value.append(text[i])
                i += 1
            value = ["".join(value).rstrip(" \t\r")]
        while i < n and text[i] != "\n":
            i += 1
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            out[key] = "".join(value)
    return out


def _unit_environment(props: dict) -> dict[str, str]:
    """``Environment=`` then ``EnvironmentFile=`` (which override it), as systemd builds them."""
    env: dict[str, str] = {}
    for value in props.get("Environment", []):
        for word in shlex.split(value):
            k, eq, v = word.partition("=")
            if eq:
                env[k] = v
    for ref in props.get("EnvironmentFile", []):
        optional = ref.startswith("-")
        path = ref[1:] if optional else ref
        try:
            env.update(_env_file(path))
        except FileNotFoundError:
            if not optional:
                raise
    return env


def _stop_post(props: dict, env: dict[str, str], result: str, code: str, status: str) -> None:
    """Run the unit's ``ExecStopPost=`` commands (see the module docstring)."""
    for line in props.get("ExecStopPost", []):
        argv = [w.replace("$$", "$") for w in shlex.split(line)]
        subprocess.run(argv, env={**env, "SERVICE_RESULT": result, "EXIT_CODE": code, "EXIT_STATUS": status},
                       stdin=subprocess.DEVNULL, check=False)


def supervise(name: str) -> int:
    """The unit's main process: run the command under the unit's limits; write its result."""
    unit_file, spec_file, result_file = paths(name)
    started_file = result_file[:-len(".result")] + ".started"
    open(started_file, "w").close()
    open(result_file[:-len(".result")] + ".launched", "w").close()  # for the launch waiting on it
    with open(spec_file) as f:
        spec = json.load(f)
    props = spec["props"]
    last = {k: v[-1] for k, v in props.items() if v}
    limit = parse_bytes(last["MemoryMax"]) if "MemoryMax" in last else None
    runtime_max = float(last["RuntimeMaxSec"]) if "RuntimeMaxSec" in last else None
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **spec["setenv"], **_unit_environment(props)}
    out = _open_output(last.get("StandardOutput"))
    err = _open_output(last.get("StandardError"))
    nice = int(last["Nice"]) if "Nice" in last else 0
    child = subprocess.Popen(spec["command"], env=env, cwd=spec["cwd"], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, process_group=0,
                             preexec_fn=(lambda: os.nice(nice)) if nice > 0 else None)
    stopping = {"sig": None}

    def forward(sig, _frame):
        stopping["sig"] = sig
        _kill_all(child.pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    started = time.monotonic()
    result, term_at = "success", None
    while child.poll() is None:
        if limit is not None and _rss(_descendants(child.pid)) > limit:
            result = "oom-kill"
            _kill_all(child.pid, signal.SIGKILL)
        elif runtime_max is not None and time.monotonic() - started > runtime_max and term_at is None:
            result, term_at = "timeout", time.monotonic()
            _kill_all(child.pid, signal.SIGTERM)
        elif term_at is not None and time.monotonic() - term_at > 10:
            _kill_all(child.pid, signal.SIGKILL)
        time.sleep(0.05)
    rc = child.returncode
    if result == "success" and stopping["sig"] is None and rc != 0:
        result = "signal" if rc < 0 else "exit-code"
    code, status = ("killed", -rc) if rc < 0 else ("exited", rc)
    _stop_post(props, env, result, code, signal.Signals(-rc).name[3:] if rc < 0 else str(rc))
    if result == "success" or spec["collect"]:
        # systemd unloads an inactive unit at once, a failed one too with --collect
        for p in (unit_file, spec_file, result_file, started_file):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    else:
        tmp = result_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"Result": result, "ExecMainCode": code, "ExecMainStatus": status}, f)
        os.replace(tmp, result_file)
    return 0 if result == "success" else 1


def main(argv: list[str]) -> int:
    """Entry point: ``--version``, ``--supervise NAME`` (the unit's ExecStart) or a launch."""
    if argv[:1] == ["--version"]:
        print("systemd 252 (orch test-bed stand-in)")
        return 0
    if argv[:1] == ["--supervise"]:
        return supervise(argv[1])
    return launch(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
