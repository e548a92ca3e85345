"""A **stand-in** ``docker`` CLI for test-bed hosts (orch test bed), executed with podman underneath.

Standard library only. The bed installs it at ``/usr/bin/docker`` inside container hosts with
``container: {"runtime": "docker"}`` (tests/testbed/README.md): this machine has no Docker daemon,
so the subcommands orch, its units and the tests use follow the Docker CLI's documented contract
(https://docs.docker.com/reference/cli/docker/ : ``container run``, ``stop``, ``kill``, ``rm``,
``ps``, ``inspect``, ``exec``, ``cp``, ``logs``, ``start``, ``wait``) and run as the host's real
podman (4.3). Where docker and podman differ, docker's side is what the caller sees:

- ``run --gpus all|N|'"device=0,1"'`` (podman 4.3 has no ``--gpus``): the NVIDIA runtime's job,
  giving the container the selected ``/dev/nvidiaN`` and ``/dev/nvidiactl``, is done with binds
  of the host's (plain-file) GPU devices;
- ``ps --format``/``inspect --format``: docker's Go-template fields, rendered here from podman's
  JSON (``{{.State}}`` is ``running``/``exited``/``created``, ``{{.Status}}`` ``Up 5 seconds`` /
  ``Exited (0) 3 seconds ago``, ``{{.Names}}`` without ``/``; ``inspect``'s ``.Name`` is
  ``/NAME``, ``.State.Status`` docker's words); the ``name`` filter is a regular expression;
- ``stop -t/--timeout``, ``stop -s``; ``logs -n/--tail`` (podman's ``-n`` is ``--names``);
- errors: ``Error response from daemon: No such container: NAME`` (exit 1; ``rm -f``: on stderr,
  exit 0, as docker/cli's ``rm`` treats a not-found error under ``--force``), ``run`` failures exit 125.

Only the Go-template subset below is understood (field paths, ``json``, ``index``, ``lower``,
``upper``, ``join``, ``table``); anything else exits 1 with a message, as docker does on a bad
template.

Every call is appended to ``/run/orchtb/docker-calls.jsonl`` (``{"argv", "pid"}``), so a test sees
which commands reached the runtime. Fault knob (issue 32 row 8, moby #31459), written by a test to
``/run/orchtb/docker.json``: ``{"client_leaves_container": true}`` makes ``docker run`` a client that
ends at SIGTERM and leaves its container running, as Docker's does wherever the container is the
daemon's and no signal reaches it through the client (a ``-t`` run has no signal proxy, a client
SIGKILLed at ``TimeoutStopSec``, ``--sig-proxy=false``): the container's processes are then outside
the unit's process tree, and only ``docker stop``/``kill``/``rm -f`` end them. The stand-in does
this with podman's own ``--sig-proxy=false`` (conmon keeps the container).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
import time

PODMAN = os.environ.get("ORCH_DOCKER_SHIM_PODMAN", "/usr/bin/podman")
#: where each call is recorded, and the fault knob (module docstring)
CALLS = "/run/orchtb/docker-calls.jsonl"
KNOBS = "/run/orchtb/docker.json"


def _knob(name: str) -> bool:
    try:
        with open(KNOBS) as f:
            return bool(json.load(f).get(name))
    except (OSError, ValueError, AttributeError):
        return False


def _record(argv: list) -> None:
    try:
        with open(CALLS, "a") as f:
            f.write(json.dumps({"argv": argv, "pid": os.getpid()}) + "\n")
    except OSError:
        pass

#: docker run options taking a value (``docker run --help`` of the Docker CLI 28, the reference's list)
RUN_VALUE = frozenset("""add-host annotation attach blkio-weight blkio-weight-device cap-add cap-drop cgroup-parent
cgroupns cidfile cpu-count cpu-percent cpu-period cpu-quota cpu-rt-period cpu-rt-runtime cpu-shares cpus cpuset-cpus
cpuset-mems detach-keys device device-cgroup-rule device-read-bps device-read-iops device-write-bps device-write-iops
dns dns-option dns-opt dns-search domainname entrypoint env env-file expose gpus group-add health-cmd health-interval
health-retries health-start-interval health-start-period health-timeout hostname io-maxbandwidth io-maxiops ip ip6
ipc isolation kernel-memory label label-file link link-local-ip log-driver log-opt mac-address memory
memory-reservation memory-swap memory-swappiness mount name network net network-alias net-alias oom-score-adj pid
pids-limit platform publish pull restart runtime security-opt shm-size stop-signal stop-timeout storage-opt sysctl
tmpfs ulimit user userns uts volume volume-driver volumes-from workdir""".split())
RUN_SHORT_VALUE = frozenset("acehlmpuvw")

#: podman's container states -> docker's (docker: created, running, paused, restarting, removing, exited, dead)
STATES = {"configured": "created", "initialized": "created", "created": "created", "running": "running",
          "paused": "paused", "stopping": "running", "stopped": "exited", "exited": "exited",
          "removing": "removing", "unknown": "dead"}


class DockerError(Exception):
    """A failure shown as the Docker CLI shows it: ``message`` on stderr, exit ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _podman(args: list[str], capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([PODMAN, *args], text=True, stdin=subprocess.DEVNULL if capture else None,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)


def _exec_podman(args: list[str]) -> None:
    """Replace this process with podman (``run``, ``exec``, ``logs``: signals, stdin and the
    exit status are podman's own, like the docker client's)."""
    sys.stdout.flush()
    os.execv(PODMAN, [PODMAN, *args])


# --- Go templates (the subset docker users write) ---------------------------------------------

def go_str(value) -> str:
    """``value`` as Go's fmt prints it in a template (``true``, ``map[k:v]``, ``[a b]``,
    ``<no value>`` for a missing one)."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_str(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    return str(value)


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\(|\)|\||[^\s()|]+')


def _eval_pipeline(expr: str, dot):
    tokens = _TOKEN.findall(expr)
    stages: list[list[str]] = [[]]
    for t in tokens:
        if t == "|":
            stages.append([])
        elif t not in "()":
            stages[-1].append(t)
    value, first = None, True
    for stage in stages:
        if not stage:
            raise DockerError(f"template parsing error: missing command in {expr!r}")
        args = [_operand(t, dot) for t in stage[1:]] + ([] if first else [value])
        head = stage[0]
        if head.startswith(".") or head.startswith('"'):
            if len(stage) > 1 and head.startswith("."):  # a method-like field call: .Label "key"
                value = _label(dot, args[0]) if head == ".Label" else _operand(head, dot)
            else:
                value = _operand(head, dot)
        elif head == "json":
            value = json.dumps(args[0] if args else dot, separators=(",", ":"))
        elif head == "index":
            value = args[0]
            for k in args[1:]:
                if isinstance(value, list):
                    value = value[int(k)]
                else:
                    value = value.get(k) if isinstance(value, dict) else None
        elif head in ("lower", "upper", "title"):
            value = getattr(go_str(args[0]), head)()
        elif head == "join":
            value = str(args[1]).join(go_str(v) for v in args[0]) if len(args) == 2 else ""
        elif head == "println":
            value = " ".join(go_str(a) for a in args) + "\n"
        else:
            raise DockerError(f'template: :1: function "{head}" not defined')
        first = False
    return value


def _label(dot, key):
    labels = dot.get("_labels") if isinstance(dot, dict) else None
    return (labels or {}).get(key, "")


def _operand(token: str, dot):
    if token.startswith('"'):
        return json.loads(token)
    if token == ".":
        return dot
    if token.startswith("."):
        value = dot
        for part in token[1:].split("."):
            if not isinstance(value, dict):
                raise DockerError(f'template: :1: executing "" at <{token}>: can\'t evaluate field {part}')
            if part not in value:
                raise DockerError(f'template: :1:2: executing "" at <{token}>: map has no entry for key "{part}"')
            value = value[part]
        return value
    return token


def render(template: str, dot) -> str:
    """Execute the Go template ``template`` on ``dot`` (the subset in the module docstring)."""
    out, pos = [], 0
    for m in re.finditer(r"\{\{-?\s*(.*?)\s*-?\}\}", template, re.S):
        out.append(template[pos:m.start()])
        value = _eval_pipeline(m.group(1), dot)
        out.append(value if isinstance(value, str) else go_str(value))
        pos = m.end()
    out.append(template[pos:])
    return "".join(out)


def _unescape(fmt: str) -> str:
    return fmt.replace("\\t", "\t").replace("\\n", "\n")


# --- what docker prints ----------------------------------------------------------------------

def human_duration(seconds: float) -> str:
    """Docker's ``units.HumanDuration`` (go-units): ``Less than a second``, ``1 second``,
    ``N seconds``, ``About a minute``, ``N minutes``, ``About an hour``, ``N hours``, ``N days``,
    ``N weeks``, ``N months``, ``N years``."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    m = s // 60
    if m == 1:
        return "About a minute"
    if m < 60:
        return f"{m} minutes"
    h = round(s / 3600)
    if h == 1:
        return "About an hour"
    if h < 48:
        return f"{h} hours"
    if h < 24 * 7 * 2:
        return f"{h // 24} days"
    if h < 24 * 30 * 2:
        return f"{h // 24 // 7} weeks"
    if h < 24 * 365 * 2:
        return f"{h // 24 // 30} months"
    return f"{h // 24 // 365} years"


def docker_status(state: str, started: float, exited_at: float, exit_code: int, now: float) -> str:
    """``{{.Status}}`` of ``docker ps``: ``Up 5 seconds``, ``Exited (0) 3 seconds ago``, ``Created``."""
    if state == "running":
        return "Up " + human_duration(now - started)
    if state == "paused":
        return "Up " + human_duration(now - started) + " (Paused)"
    if state == "exited":
        return f"Exited ({exit_code}) {human_duration(now - exited_at)} ago"
    if state == "removing":
        return "Removal In Progress"
    if state == "dead":
        return "Dead"
    return "Created"


def docker_ports(ports) -> str:
    """``{{.Ports}}``: ``0.0.0.0:30000->30000/tcp`` entries joined by ``, ``."""
    out = []
    for p in ports or []:
        n = max(1, int(p.get("range") or 1))
        for k in range(n):
            hp, cp = int(p.get("host_port") or 0), int(p.get("container_port") or 0)
            proto = p.get("protocol") or "tcp"
            ip = p.get("host_ip") or "0.0.0.0"
            out.append(f"{ip}:{hp + k}->{cp + k}/{proto}" if hp else f"{cp + k}/{proto}")
    return ", ".join(out)


def _ps_row(c: dict, no_trunc: bool, now: float) -> dict:
    state = STATES.get(str(c.get("State", "")).lower(), str(c.get("State", "")).lower())
    cmd = " ".join(c.get("Command") or [])
    command = json.dumps(cmd if no_trunc or len(cmd) <= 20 else cmd[:19] + "…", ensure_ascii=False)
    created = float(c.get("Created") or 0)
    labels = c.get("Labels") or {}
    return {
        "ID": c.get("Id", "") if no_trunc else c.get("Id", "")[:12],
        "Image": c.get("Image", ""), "Command": command,
        "CreatedAt": _dt.datetime.fromtimestamp(created, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000 UTC"),
        "RunningFor": human_duration(now - created) + " ago",
        "Ports": docker_ports(c.get("Ports")), "State": state,
        "Status": docker_status(state, float(c.get("StartedAt") or 0), float(c.get("ExitedAt") or 0),
                                int(c.get("ExitCode") or 0), now),
        "Size": "0B", "Names": ",".join(n.lstrip("/") for n in c.get("Names") or []),
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "Mounts": ",".join(c.get("Mounts") or []), "Networks": ",".join(c.get("Networks") or []),
        "LocalVolumes": "0", "_labels": labels, "_name_list": [n.lstrip("/") for n in c.get("Names") or []],
    }


def _filter_ok(row: dict, c: dict, filters: list[str]) -> bool:
    by: dict[str, list[str]] = {}
    for f in filters:
        key, eq, value = f.partition("=")
        if not eq:
            raise DockerError(f"bad format of filter (expected name=value): {f}")
        by.setdefault(key, []).append(value)
    for key, values in by.items():  # one key: any value matches; several keys: all must
        if key == "name":
            ok = any(re.search(v, n) or re.search(v, "/" + n) for v in values for n in row["_name_list"])
        elif key == "id":
            ok = any(c.get("Id", "").startswith(v) for v in values)
        elif key == "status":
            ok = row["State"] in values
        elif key == "label":
            ok = all(_label_match(row["_labels"], v) for v in values)
        elif key == "ancestor":
            ok = any(row["Image"] == v or row["Image"].startswith(v + ":") for v in values)
        elif key == "exited":
            ok = row["State"] == "exited" and str(int(c.get("ExitCode") or 0)) in values
        else:
            raise DockerError(f"Error response from daemon: invalid filter '{key}'")
        if not ok:
            return False
    return True


def _label_match(labels: dict, spec: str) -> bool:
    k, eq, v = spec.partition("=")
    return k in labels and (not eq or labels[k] == v)


PS_DEFAULT = ("table {{.ID}}\t{{.Image}}\t{{.Command}}\t{{.RunningFor}}\t{{.Status}}\t{{.Ports}}\t{{.Names}}")
HEADERS = {"ID": "CONTAINER ID", "Image": "IMAGE", "Command": "COMMAND", "CreatedAt": "CREATED AT",
           "RunningFor": "CREATED", "Ports": "PORTS", "State": "STATE", "Status": "STATUS", "Size": "SIZE",
           "Names": "NAMES", "Labels": "LABELS", "Mounts": "MOUNTS", "Networks": "NETWORKS"}


def _table(template: str, rows: list[dict]) -> str:
    """docker's ``table`` format: a header of the fields' column names, then the rows, aligned
    like Go's tabwriter (cells padded to the widest, three spaces apart)."""
    head = re.sub(r"\{\{\s*\.(\w+)\s*\}\}", lambda m: HEADERS.get(m.group(1), m.group(1).upper()), template)
    lines = [head] + [render(template, r) for r in rows]
    cells = [ln.split("\t") for ln in lines]
    widths: dict[int, int] = {}
    for row in cells:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths.get(i, 0), len(cell))
    return "\n".join("".join(c.ljust(widths[i] + 3) if i < len(row) - 1 else c for i, c in enumerate(row)).rstrip()
                     for row in cells) + "\n"


def cmd_ps(args: list[str]) -> int:
    """``docker ps [-a] [-q] [--no-trunc] [-n N] [-l] [-s] [-f FILTER]... [--format F]``."""
    show_all = quiet = no_trunc = False
    fmt, filters, last = None, [], -1
    it = iter(args)
    for a in it:
        name, eq, val = a.partition("=")
        if a in ("-a", "--all"):
            show_all = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a == "--no-trunc":
            no_trunc = True
        elif a in ("-s", "--size"):
            pass
        elif a in ("-l", "--latest"):
            last = 1
        elif name in ("-n", "--last"):
            last = int(val if eq else next(it))
        elif name in ("-f", "--filter"):
            filters.append(val if eq else next(it))
        elif name == "--format":
            fmt = val if eq else next(it)
        elif re.fullmatch(r"-[aqsl]+", a):
            show_all |= "a" in a
            quiet |= "q" in a
            last = 1 if "l" in a else last
        else:
            raise DockerError(f"unknown flag: {a}\nSee 'docker ps --help'.", 125)
    res = _podman(["ps", "-a", "--format", "json"])
    if res.returncode != 0:
        raise DockerError(f"Cannot connect to the container runtime: {res.stderr.strip()}")
    now = time.time()
    containers = sorted(json.loads(res.stdout or "[]"), key=lambda c: -float(c.get("Created") or 0))
    rows = []
    for c in containers:
        row = _ps_row(c, no_trunc, now)
        if not show_all and last < 0 and row["State"] not in ("running", "paused", "restarting"):
            continue
        if _filter_ok(row, c, filters):
            rows.append(row)
    if last >= 0:
        rows = rows[:last]
    if quiet:
        sys.stdout.write("".join(r["ID"] + "\n" for r in rows))
        return 0
    fmt = _unescape(fmt) if fmt else PS_DEFAULT
    if fmt == "json":
        sys.stdout.write("".join(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n"
                                 for r in rows))
    elif fmt.startswith("table"):
        sys.stdout.write(_table(fmt[5:].lstrip() or PS_DEFAULT[6:], rows))
    else:
        sys.stdout.write("".join(render(fmt, r) + "\n" for r in rows))
    return 0


def docker_inspect(c: dict) -> dict:
    """A podman ``inspect`` object in the shape ``docker inspect`` prints for a container:
    ``Name`` with its leading ``/``, ``State.Status`` in docker's words (``running``, ``exited``,
    ``created``), ``Image`` the image id, ``Config.Image`` the name given to ``run``."""
    d = dict(c)
    d["Name"] = "/" + str(c.get("Name", "")).lstrip("/")
    st = dict(c.get("State") or {})
    status = STATES.get(str(st.get("Status", "")).lower(), str(st.get("Status", "")).lower())
    st["Status"] = status
    st["Running"] = status == "running"
    st.setdefault("Paused", status == "paused")
    st.setdefault("Restarting", False)
    st.setdefault("OOMKilled", False)
    st["Dead"] = status == "dead"
    for k in ("Healthcheck", "CgroupPath", "ConmonPid", "CheckpointedAt", "RestoredAt", "CheckpointLog",
              "CheckpointPath", "RestoreLog", "Restored", "Checkpointed", "StoppedByUser"):
        st.pop(k, None)
    d["State"] = st
    config = dict(c.get("Config") or {})
    config["Image"] = c.get("ImageName") or config.get("Image", "")
    d["Config"] = config
    d["Image"] = "sha256:" + str(c.get("Image", "")).removeprefix("sha256:")
    for k in ("ImageName", "ImageDigest", "Pod", "OCIRuntime", "ConmonPidFile", "PidFile", "Dependencies",
              "ExitCommand", "Namespace", "IsInfra", "IsService", "OCIConfigPath", "StaticDir", "Rootfs",
              "BoundingCaps", "EffectiveCaps"):
        d.pop(k, None)
    return d


def cmd_inspect(args: list[str]) -> int:
    """``docker inspect [-f FORMAT] [--type container|image] [-s] NAME...``: the docker-shaped
    objects (:func:`docker_inspect`) as a JSON array, or ``FORMAT`` executed on each; a name
    that is no container: ``Error: No such object: NAME`` on stderr, exit 1."""
    fmt, kind, names = None, None, []
    it = iter(args)
    for a in it:
        name, eq, val = a.partition("=")
        if name in ("-f", "--format"):
            fmt = val if eq else next(it)
        elif name == "--type":
            kind = val if eq else next(it)
        elif a in ("-s", "--size"):
            pass
        elif a.startswith("-"):
            raise DockerError(f"unknown flag: {a}\nSee 'docker inspect --help'.", 125)
        else:
            names.append(a)
    if not names:
        raise DockerError('"docker inspect" requires at least 1 argument.', 1)
    objects, missing = [], []
    for n in names:
        if kind in (None, "container"):
            res = _podman(["container", "inspect", n])
            if res.returncode == 0:
                objects.append(docker_inspect(json.loads(res.stdout)[0]))
                continue
        if kind in (None, "image"):
            res = _podman(["image", "inspect", n])
            if res.returncode == 0:
                objects.append(json.loads(res.stdout)[0])
                continue
        missing.append(n)
    if fmt and fmt != "json":
        fmt = _unescape(fmt)
        for o in objects:
            sys.stdout.write(render(fmt, o) + "\n")
    else:
        sys.stdout.write(json.dumps(objects, indent=4) + "\n")
    for n in missing:
        sys.stderr.write(f"Error: No such object: {n}\n")
    return 1 if missing else 0


def _exists(name: str) -> bool:
    return _podman(["container", "exists", name]).returncode == 0


def _no_such(name: str) -> str:
    return f"Error response from daemon: No such container: {name}"


def _state(name: str) -> str:
    res = _podman(["container", "inspect", "--format", "{{.State.Status}}", name])
    return STATES.get(res.stdout.strip().lower(), res.stdout.strip().lower()) if res.returncode == 0 else ""


def _split_opts(args: list[str], value_opts: dict[str, str], bool_opts: dict[str, str]):
    """``(options {long: value}, operands)`` for a simple subcommand; short options map through
    the dicts (``{"-t": "timeout"}``)."""
    opts: dict[str, str] = {}
    rest: list[str] = []
    it = iter(args)
    for a in it:
        name, eq, val = a.partition("=")
        if name in value_opts:
            opts[value_opts[name]] = val if eq else next(it)
        elif a in bool_opts:
            opts[bool_opts[a]] = "true"
        elif a.startswith("-") and a != "-":
            raise DockerError(f"unknown flag: {a}", 125)
        else:
            rest.append(a)
    return opts, rest


def cmd_stop(args: list[str]) -> int:
    """``docker stop [-t|--timeout N] [-s|--signal SIG] NAME...``: the stop signal, SIGKILL after
    N s (10); prints each name as given; a missing one: docker's message, exit 1."""
    opts, names = _split_opts(args, {"-t": "timeout", "--timeout": "timeout", "--time": "timeout",
                                     "-s": "signal", "--signal": "signal"}, {})
    timeout = int(opts.get("timeout", "10"))
    status = 0
    for n in names:
        if not _exists(n):
            print(_no_such(n), file=sys.stderr)
            status = 1
            continue
        if "signal" in opts and _state(n) == "running":
            _podman(["kill", "-s", opts["signal"], n])
            deadline = time.monotonic() + max(0, timeout)
            while time.monotonic() < deadline and _state(n) == "running":
                time.sleep(0.1)
        res = _podman(["stop", "-t", str(timeout), n])
        if res.returncode != 0 and _exists(n):
            print(f"Error response from daemon: cannot stop container: {n}: {res.stderr.strip()}", file=sys.stderr)
            status = 1
            continue
        print(n)
    return status


def cmd_kill(args: list[str]) -> int:
    """``docker kill [-s SIG] NAME...`` (SIGKILL by default); a container that is not running:
    ``cannot kill container: NAME: container ... is not running``, exit 1."""
    opts, names = _split_opts(args, {"-s": "signal", "--signal": "signal"}, {})
    status = 0
    for n in names:
        if not _exists(n):
            print(_no_such(n), file=sys.stderr)
            status = 1
        elif _state(n) != "running":
            print(f"Error response from daemon: cannot kill container: {n}: container {n} is not running",
                  file=sys.stderr)
            status = 1
        else:
            res = _podman(["kill", "-s", opts.get("signal", "KILL"), n])
            if res.returncode != 0:
                print(f"Error response from daemon: cannot kill container: {n}: {res.stderr.strip()}",
                      file=sys.stderr)
                status = 1
            else:
                print(n)
    return status


def cmd_rm(args: list[str]) -> int:
    """``docker rm [-f] [-v] NAME...``: ``-f`` kills a running one (SIGKILL), and a missing one is
    reported on stderr without failing (exit 0); without it a running container is refused.
    Prints each name removed."""
    opts, names = _split_opts(args, {}, {"-f": "force", "--force": "force", "-v": "volumes", "--volumes": "volumes",
                                         "-fv": "fv", "-vf": "fv"})
    force = "force" in opts or "fv" in opts
    status = 0
    for n in names:
        if not _exists(n):  # docker/cli's rm: with --force a missing one is printed, not an error
            print(_no_such(n), file=sys.stderr)
            status = status if force else 1
            continue
        if not force and _state(n) in ("running", "paused"):
            print(f"Error response from daemon: cannot remove container \"/{n}\": container is running: stop the "
                  "container before removing or force remove", file=sys.stderr)
            status = 1
            continue
        res = _podman(["rm", "-f", "-t", "0", n] if force else ["rm", n])
        if res.returncode != 0 and _exists(n):
            print(f"Error response from daemon: {res.stderr.strip()}", file=sys.stderr)
            status = 1
        else:
            print(n)
    return status


def gpu_binds(value: str, devices: list[str]) -> list[str]:
    """``-v`` words giving the container the GPUs ``docker run --gpus VALUE`` selects from the
    host's ``devices`` (``/dev/nvidia0``... in index order): ``all``, a count ``N``,
    ``count=N``, ``device=0,1`` (indexes; quoted as ``'"device=0,1"'`` on a command line);
    ``/dev/nvidiactl`` comes with any GPU. Raises :class:`DockerError` where docker refuses the
    value (an unknown key, both a count and devices)."""
    count, picked = None, None
    # docker/cli reads the value as CSV: a quoted field keeps its commas ('"device=0,1"')
    for f in next(csv.reader([value])):
        key, eq, val = f.partition("=")
        if not eq:
            count = key
        elif key == "count":
            count = val
        elif key == "device":
            picked = val.split(",")
        elif key not in ("driver", "capabilities", "options"):
            raise DockerError(f"invalid argument \"{value}\" for \"--gpus\" flag: unexpected key '{key}' in '{f}'", 125)
    if count is not None and picked is not None:
        raise DockerError(f'invalid argument "{value}" for "--gpus" flag: cannot set both Count and DeviceIDs on '
                          "device request", 125)
    if picked is not None:
        chosen = [f"/dev/nvidia{int(d)}" for d in picked]
    elif count in (None, "all", "-1"):
        chosen = list(devices) if count else devices[:1]
    else:
        chosen = devices[:int(count)]
    missing = [d for d in chosen if d not in devices]
    if missing:
        raise DockerError("docker: Error response from daemon: could not select device driver \"\" with "
                          f"capabilities: [[gpu]] (no such GPU: {', '.join(missing)})", 125)
    words = []
    for d in chosen + (["/dev/nvidiactl"] if chosen and os.path.exists("/dev/nvidiactl") else []):
        words += ["-v", f"{d}:{d}"]
    return words


def _host_gpus() -> list[str]:
    found = [n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)]
    return [f"/dev/{n}" for n in sorted(found, key=lambda n: int(n[6:]))]


def run_argv(args: list[str]) -> list[str]:
    """podman's ``run`` words for ``docker run ARGS``: the options up to the image, ``--gpus``
    replaced by GPU binds (:func:`gpu_binds`), the rest as written (podman takes docker's
    spellings); the image and its command unchanged."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--" or not a.startswith("-") or a == "-":
            break
        name, eq, val = a.partition("=")
        if name == "--gpus":
            if not eq:
                i += 1
                val = args[i]
            out += gpu_binds(val, _host_gpus())
        elif a.startswith("--"):
            out.append(a)
            if not eq and name[2:] in RUN_VALUE:
                i += 1
                out.append(args[i])
        else:
            out.append(a)
            j = 1
            while j < len(a) and a[j] not in RUN_SHORT_VALUE:
                j += 1
            if j == len(a) - 1:  # the group ends with an option whose value is the next word
                i += 1
                out.append(args[i])
        i += 1
    return out + args[i:]


def cmd_run(args: list[str]) -> int:
    """``docker run OPTIONS IMAGE [COMMAND...]`` as podman ``run`` (:func:`run_argv`); a name in
    use is docker's ``Conflict`` (exit 125)."""
    words = run_argv(args)
    for k, w in enumerate(words):
        name = None
        if w == "--name" and k + 1 < len(words):
            name = words[k + 1]
        elif w.startswith("--name="):
            name = w[7:]
        if name and _exists(name):
            cid = _podman(["container", "inspect", "--format", "{{.Id}}", name]).stdout.strip()
            raise DockerError(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already '
                              f'in use by container "{cid}". You have to remove (or rename) that container to be able '
                              "to reuse that name.\n\nRun 'docker run --help' for more information", 125)
    if _knob("client_leaves_container"):  # the client ends at SIGTERM, the container runs on
        words = ["--sig-proxy=false", *words]
    _exec_podman(["run", *words])
    return 125


def cmd_logs(args: list[str]) -> int:
    """``docker logs [-f] [-n|--tail N] [-t] [--since T] [--until T] [--details] NAME``
    (podman's ``-n`` is ``--names``: docker's ``-n`` goes as ``--tail``)."""
    out: list[str] = []
    it = iter(args)
    name = None
    for a in it:
        opt, eq, val = a.partition("=")
        if opt in ("-n", "--tail"):
            v = val if eq else next(it)
            out += ["--tail", "-1" if v == "all" else v]
        elif opt in ("--since", "--until"):
            out += [opt, val if eq else next(it)]
        elif a in ("-f", "--follow", "-t", "--timestamps"):
            out.append(a)
        elif a == "--details":
            pass
        elif a.startswith("-"):
            raise DockerError(f"unknown flag: {a}", 125)
        else:
            name = a
    if name is None:
        raise DockerError('"docker logs" requires exactly 1 argument.', 1)
    if not _exists(name):
        raise DockerError(_no_such(name))
    _exec_podman(["logs", *out, name])
    return 1


def cmd_exec(args: list[str]) -> int:
    """``docker exec [OPTIONS] NAME COMMAND...`` (same options in podman); a container that is
    not running: docker's ``container ... is not running`` (exit 1)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        opt = args[i].partition("=")[0]
        if "=" not in args[i] and opt in ("-e", "--env", "--env-file", "-u", "--user", "-w", "--workdir",
                                            "--detach-keys"):
            i += 1
        i += 1
    if i >= len(args):
        raise DockerError('"docker exec" requires at least 2 arguments.', 1)
    name = args[i]
    if not _exists(name):
        raise DockerError(_no_such(name))
    if _state(name) != "running":
        raise DockerError(f"Error response from daemon: container {name} is not running")
    _exec_podman(["exec", *args])
    return 1


def cmd_cp(args: list[str]) -> int:
    """``docker cp [-a] [-L] [-q] SRC DEST`` (one side ``NAME:PATH``)."""
    out = [a for a in args if a not in ("-q", "--quiet", "-L", "--follow-link")]
    res = _podman(["cp", *out], capture=False)
    return 0 if res.returncode == 0 else 1


def cmd_start(args: list[str]) -> int:
    """``docker start [-a] NAME...``."""
    _exec_podman(["start", *args])
    return 1


def cmd_wait(args: list[str]) -> int:
    """``docker wait NAME...``: each container's exit code once it stops."""
    for n in args:
        if not _exists(n):
            raise DockerError(_no_such(n))
    _exec_podman(["wait", *args])
    return 1


COMMANDS = {"run": cmd_run, "ps": cmd_ps, "ls": cmd_ps, "list": cmd_ps, "inspect": cmd_inspect, "stop": cmd_stop,
            "kill": cmd_kill, "rm": cmd_rm, "remove": cmd_rm, "logs": cmd_logs, "exec": cmd_exec, "cp": cmd_cp,
            "start": cmd_start, "wait": cmd_wait}


def main(argv: list[str]) -> int:
    """``docker [GLOBAL OPTIONS] [container] COMMAND ARGS`` (see the module docstring)."""
    _record(list(argv))
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        opt = argv[i].partition("=")[0]
        if opt in ("-H", "--host", "-c", "--context"):
            print("docker (test-bed stand-in over podman): only the local engine is here; "
                  f"{argv[i]} is not supported", file=sys.stderr)
            return 1
        if "=" not in argv[i] and opt in ("-l", "--log-level", "--config", "--tlscacert", "--tlscert", "--tlskey"):
            i += 1
        i += 1
    rest = argv[i:]
    if rest[:1] == ["container"]:
        rest = rest[1:]
    if not rest or rest[0] not in COMMANDS:
        word = rest[0] if rest else ""
        print(f"docker: unknown command: docker {word}\n\nRun 'docker --help' for more information", file=sys.stderr)
        return 1
    try:
        return COMMANDS[rest[0]](rest[1:])
    except DockerError as exc:
        print(str(exc), file=sys.stderr)
        return exc.status
    except StopIteration:
        print(f"flag needs an argument (docker {rest[0]} {shlex.join(rest[1:])})", file=sys.stderr)
        return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
