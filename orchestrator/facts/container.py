"""A unit whose ``ExecStart=`` runs ``docker run ...`` or ``podman run ...``: the run command line
parsed as the runtime parses it, into typed facts (:class:`ContainerRun`).

The option table follows the runtimes' documented option lists: Docker's ``docker container run``
reference (https://docs.docker.com/reference/cli/docker/container/run/) and Podman's
``podman-run(1)`` (https://docs.podman.io/en/latest/markdown/podman-run.1.html). Both parse with
Go's pflag rules: long options as ``--name VALUE`` or ``--name=VALUE``; a boolean option never
takes the next word (``--rm``, ``--rm=false``); short options combine (``-it``, ``-itd``), and the
last one of a group may take its value attached or as the next word (``-p30000:30000``,
``-e K=V``, ``-e=K=V``); the first word that is not an option is the image and everything after
it is the container's command (``run`` stops parsing options there, so ``--port`` after the image
is SGLang's). Whether an option takes a value decides where the image is, so an option this table
does not know is refused (:class:`ContainerError`) rather than guessed.

What orch reads from the command line: the runtime, the image, the container's ``--name``, its
mounts (``-v``/``--volume``, ``--mount``, ``--tmpfs``), its environment (``-e``/``--env``,
``--env-file`` read on the host, ``-e K`` passing the unit's own value), its GPU selection
(``--gpus``, CDI ``--device nvidia.com/gpu=...``, ``--device /dev/nvidiaN``,
``NVIDIA_VISIBLE_DEVICES``), its network (``--network``/``--net``) and published ports
(``-p``/``--publish``, ``-P``), detach (``-d``), ``--rm``, ``--entrypoint`` and the inner command.
Pure (no host access) except where a function says it reads files through a connection.
"""

from __future__ import annotations

import csv
import posixpath
from dataclasses import asdict, dataclass, field

from remote.gpus import VENDORS as GPU_VENDORS

from ..errors import OrchError

#: runtime executables orch recognises (basename of ExecStart's first word)
RUNTIMES = ("docker", "podman")

#: options taking a value, both runtimes (docker container run, podman run); short spellings map
#: to the long name. Docker: https://docs.docker.com/reference/cli/docker/container/run/ ;
#: Podman: https://docs.podman.io/en/latest/markdown/podman-run.1.html
VALUE_OPTIONS = frozenset({
    # docker container run (and podman run, which accepts the same spelling)
    "add-host", "annotation", "attach", "blkio-weight", "blkio-weight-device", "cap-add", "cap-drop",
    "cgroup-parent", "cgroupns", "cidfile", "cpu-count", "cpu-percent", "cpu-period", "cpu-quota",
    "cpu-rt-period", "cpu-rt-runtime", "cpu-shares", "cpus", "cpuset-cpus", "cpuset-mems", "detach-keys",
    "device", "device-cgroup-rule", "device-read-bps", "device-read-iops", "device-write-bps",
    "device-write-iops", "dns", "dns-opt", "dns-option", "dns-search", "domainname", "entrypoint", "env",
    "env-file", "expose", "gpus", "group-add", "health-cmd", "health-interval", "health-retries",
    "health-start-interval", "health-start-period", "health-timeout", "hostname", "io-maxbandwidth",
    "io-maxiops", "ip", "ip6", "ipc", "isolation", "kernel-memory", "label", "label-file", "link",
    "link-local-ip", "log-driver", "log-opt", "mac-address", "memory", "memory-reservation", "memory-swap",
    "memory-swappiness", "mount", "name", "network", "net", "network-alias", "net-alias", "oom-score-adj",
    "pid", "pids-limit", "platform", "publish", "pull", "restart", "runtime", "security-opt", "shm-size",
    "stop-signal", "stop-timeout", "storage-opt", "sysctl", "tmpfs", "ulimit", "user", "userns", "uts",
    "volume", "volume-driver", "volumes-from", "workdir",
    # podman run only
    "arch", "authfile", "cert-dir", "cgroup-conf", "cgroups", "chrootdirs", "conmon-pidfile", "creds",
    "decryption-key", "env-merge", "gidmap", "gpu", "group-entry", "health-log-destination",
    "health-max-log-count", "health-max-log-size", "health-on-failure", "health-startup-cmd",
    "health-startup-interval", "health-startup-retries", "health-startup-success", "health-startup-timeout",
    "hostuser", "image-volume", "init-path", "log-level", "os", "passwd-entry", "personality", "pidfile",
    "pod", "pod-id-file", "preserve-fd", "preserve-fds", "rdt-class", "requires", "retry", "retry-delay",
    "sdnotify", "seccomp-policy", "secret", "shm-size-systemd", "subgidname", "subuidname", "systemd",
    "timeout", "uidmap", "umask", "unsetenv", "variant",
})
#: boolean options (never take the next word; ``--opt=false`` is accepted)
BOOL_OPTIONS = frozenset({
    "detach", "disable-content-trust", "help", "init", "interactive", "no-healthcheck", "oom-kill-disable",
    "privileged", "publish-all", "quiet", "read-only", "rm", "sig-proxy", "tty", "use-api-socket",
    # podman run only
    "env-host", "http-proxy", "no-hosts", "passwd", "read-only-tmpfs", "replace", "rmi", "tls-verify",
    "unsetenv-all",
})
#: short spellings (both runtimes)
SHORT = {"a": "attach", "c": "cpu-shares", "d": "detach", "e": "env", "h": "hostname", "i": "interactive",
         "l": "label", "m": "memory", "p": "publish", "P": "publish-all", "q": "quiet", "t": "tty", "u": "user",
         "v": "volume", "w": "workdir"}
#: global options of the runtime itself that take a value (``docker --host H run``,
#: ``podman --root R run``); the rest of the global options are booleans
GLOBAL_VALUE_OPTIONS = frozenset({
    "config", "context", "host", "log-level", "tlscacert", "tlscert", "tlskey",  # docker
    "cgroup-manager", "conmon", "connection", "events-backend", "hooks-dir", "identity", "imagestore",
    "module", "network-cmd-path", "network-config-dir", "out", "root", "runroot", "runtime", "runtime-flag",
    "ssh", "storage-driver", "storage-opt", "tmpdir", "volumepath", "url",  # podman
})
#: ``-v`` options (podman-run(1) "--volume", docker's bind propagation and SELinux labels)
VOLUME_OPTIONS = frozenset({"ro", "rw", "z", "Z", "O", "U", "copy", "nocopy", "suid", "nosuid", "exec", "noexec",
                            "dev", "nodev", "shared", "rshared", "slave", "rslave", "private", "rprivate",
                            "unbindable", "runbindable", "bind", "rbind", "noatime", "consistent", "cached",
                            "delegated"})
GLOBAL_SHORT_VALUE = {"H": "host", "c": "context", "l": "log-level"}


class ContainerError(OrchError):
    """A container run command orch cannot read or must refuse; the message names the option."""

    exit_status = 1


@dataclass
class Mount:
    """One mount of the container: ``kind`` ``bind`` (a host folder or file), ``volume`` (a named
    volume), ``anonymous`` (a new volume), ``tmpfs``; ``source`` (host path for ``bind``, volume
    name for ``volume``, "" otherwise), ``target`` (the path inside the container), ``read_only``,
    ``spec`` (the option as written, e.g. ``-v /models:/models:ro``)."""

    kind: str
    source: str
    target: str
    read_only: bool = False
    spec: str = ""


@dataclass
class Port:
    """One published port (``-p [IP:][HOST_PORT:]CONTAINER_PORT[/PROTO]``): ``host_port`` None
    when the runtime picks one."""

    container_port: int
    host_port: int | None
    host_ip: str = ""
    protocol: str = "tcp"


@dataclass
class GpuSelection:
    """The GPUs the container sees: ``how`` ``all``, ``devices`` (``devices``: indexes or UUIDs),
    ``count`` (the first ``count`` GPUs), ``none`` (no GPU option: the image may still see none);
    ``options``: the GPU options as written (to give the probe container the same)."""

    how: str = "none"
    devices: list[str] = field(default_factory=list)
    count: int | None = None
    options: list[str] = field(default_factory=list)


@dataclass
class ContainerRun:
    """A parsed ``docker run`` / ``podman run`` command line (pure data).

    ``runtime``: ``docker`` or ``podman``; ``runtime_path``: ExecStart's first word;
    ``global_options``: words between the runtime and ``run`` (``--root R``); ``options``:
    ``[(long name, value or None), ...]`` in order; ``image``; ``name`` (``--name``, None when
    the runtime picks one); ``mounts``; ``env`` (``-e K=V`` values, later wins); ``env_pass``
    (``-e K``: the runtime's own value passes in); ``env_files`` (``--env-file`` host paths, in
    order); ``gpus``; ``network`` (``--network``, None: the runtime's default bridge);
    ``ports``; ``publish_all`` (``-P``); ``detach``; ``remove`` (``--rm``); ``entrypoint``;
    ``command``: the words after the image.
    """

    runtime: str
    runtime_path: str
    image: str
    command: list[str] = field(default_factory=list)
    global_options: list[str] = field(default_factory=list)
    options: list[tuple[str, str | None]] = field(default_factory=list)
    name: str | None = None
    mounts: list[Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_pass: list[str] = field(default_factory=list)
    env_files: list[str] = field(default_factory=list)
    gpus: GpuSelection = field(default_factory=GpuSelection)
    network: str | None = None
    ports: list[Port] = field(default_factory=list)
    publish_all: bool = False
    detach: bool = False
    remove: bool = False
    entrypoint: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def host_network(self) -> bool:
        """The container shares the host's network (``--network host``)."""
        return self.network == "host"

    def host_path(self, path: str) -> tuple[str, Mount] | None:
        """``(host path, mount)`` of the container path ``path`` through the bind mount whose
        target holds it (the deepest one, as the runtime stacks them), or None when no bind
        mount holds it (a file there lives in the container's layer or a volume)."""
        path = posixpath.normpath(path)
        best = None
        for m in self.mounts:
            target = posixpath.normpath(m.target)
            if path == target or path.startswith(target.rstrip("/") + "/"):
                if best is None or len(target) > len(posixpath.normpath(best.target)):
                    best = m
        if best is None or best.kind != "bind":
            return None
        rest = posixpath.relpath(path, posixpath.normpath(best.target))
        return (best.source if rest == "." else posixpath.join(best.source, rest)), best

    def container_path(self, host_path: str) -> str | None:
        """The path inside the container of the host path ``host_path`` through the bind mount
        whose source holds it (the deepest one), or None when no bind mount holds it: the
        inverse of :meth:`host_path`, for paths orch wrote on the host (a rollback's)."""
        path = posixpath.normpath(host_path)
        best = None
        for m in self.mounts:
            if m.kind != "bind":
                continue
            src = posixpath.normpath(m.source)
            if path == src or path.startswith(src.rstrip("/") + "/"):
                if best is None or len(src) > len(posixpath.normpath(best.source)):
                    best = m
        if best is None:
            return None
        rest = posixpath.relpath(path, posixpath.normpath(best.source))
        return best.target if rest == "." else posixpath.join(best.target, rest)

    def published_port(self, container_port: int) -> Port | None:
        """The ``-p`` entry publishing ``container_port`` over TCP, or None."""
        for p in self.ports:
            if p.container_port == container_port and p.protocol == "tcp":
                return p
        return None


def _long(name: str, word: str) -> str:
    if name in VALUE_OPTIONS or name in BOOL_OPTIONS:
        return name
    raise ContainerError(f"unknown option {word!r} in the container run command: orch reads only the options "
                         "docker and podman document for 'run' (it must know which take a value to find the image)")


def _bool_value(name: str, value: str | None, word: str) -> bool:
    if value is None:
        return True
    low = value.lower()
    if low in ("1", "t", "true"):
        return True
    if low in ("0", "f", "false"):
        return False
    raise ContainerError(f"option {word!r}: {value!r} is not a boolean")


def split_run_options(words: list[str]) -> tuple[list[tuple[str, str | None]], int]:
    """Parse the options after ``run`` (pflag rules, see the module docstring) up to the image.

    Returns ``([(long name, value), ...], index of the image in words)``; a boolean option's
    value is ``"true"``/``"false"``. Raises :class:`ContainerError` for an unknown option, a value
    option with no value, or a command line with no image."""
    opts: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            i += 1
            break
        if w.startswith("--"):
            name, eq, value = w[2:].partition("=")
            name = _long(name, w)
            if name in BOOL_OPTIONS:
                opts.append((name, "true" if _bool_value(name, value if eq else None, w) else "false"))
                i += 1
                continue
            if not eq:
                if i + 1 >= len(words):
                    raise ContainerError(f"option {w} has no value in the container run command")
                value = words[i + 1]
                i += 1
            opts.append((name, value))
            i += 1
            continue
        if w.startswith("-") and len(w) > 1:
            j = 1
            while j < len(w):
                ch = w[j]
                if ch not in SHORT:
                    raise ContainerError(f"unknown option -{ch} (in {w!r}) in the container run command")
                name = SHORT[ch]
                if name in BOOL_OPTIONS:
                    opts.append((name, "true"))
                    j += 1
                    continue
                value = w[j + 1:]
                if value.startswith("="):
                    value = value[1:]
                if not value:
                    if i + 1 >= len(words):
                        raise ContainerError(f"option -{ch} has no value in the container run command")
                    value = words[i + 1]
                    i += 1
                opts.append((name, value))
                break
            i += 1
            continue
        break
    if i >= len(words):
        raise ContainerError("the container run command names no image")
    return opts, i


def parse_volume(spec: str) -> Mount:
    """``-v``/``--volume``: ``[SOURCE:]TARGET[:OPTIONS]``; a SOURCE starting with ``/`` (or ``.``,
    ``~``) is a host path (bind), else a named volume; no SOURCE: an anonymous volume. ``ro``
    (podman also ``readonly``) among the comma-separated OPTIONS makes it read-only. Raises
    :class:`ContainerError` for an empty or relative target."""
    parts = spec.split(":")
    if len(parts) == 1:
        src, target, options = "", parts[0], ""
    elif len(parts) == 2:
        if parts[1].startswith("/") or not all(o in VOLUME_OPTIONS or o.startswith("idmap")
                                               for o in parts[1].split(",")):
            src, target, options = parts[0], parts[1], ""
        else:  # podman: CONTAINER-DIR:OPTIONS is an anonymous volume with options
            src, target, options = "", parts[0], parts[1]
    else:
        src, target, options = parts[0], parts[1], ":".join(parts[2:])
    if not target.startswith("/"):
        raise ContainerError(f"volume {spec!r}: the container path {target!r} is not absolute")
    ro = any(o in ("ro", "readonly") for o in options.split(","))
    if not src:
        return Mount("anonymous", "", target, ro, f"-v {spec}")
    kind = "bind" if src.startswith(("/", ".", "~")) else "volume"
    return Mount(kind, src, target, ro, f"-v {spec}")


def _csv_fields(value: str) -> list[str]:
    """Comma-separated fields, with CSV quoting as both runtimes read ``--mount``/``--gpus``."""
    try:
        return next(csv.reader([value]))
    except (csv.Error, StopIteration):
        raise ContainerError(f"cannot read {value!r} (comma-separated fields)") from None


def parse_mount(spec: str) -> Mount:
    """``--mount type=bind,source=/a,target=/b[,readonly]``: keys ``type`` (``bind``,
    ``volume`` (docker's default), ``tmpfs``, others kept as written), ``source``/``src``,
    ``target``/``destination``/``dst``, ``readonly``/``ro`` (alone or ``=true|false|1|0``).
    Raises :class:`ContainerError` without a target."""
    kv: dict[str, str | None] = {}
    for f in _csv_fields(spec):
        k, eq, v = f.partition("=")
        kv[k.strip().lower()] = v if eq else None
    kind = (kv.get("type") or "volume").lower()
    src = kv.get("source") or kv.get("src") or ""
    target = kv.get("target") or kv.get("destination") or kv.get("dst") or ""
    if not target:
        raise ContainerError(f"--mount {spec!r} names no target")
    ro = False
    for key in ("readonly", "ro"):
        if key in kv:
            v = kv[key]
            ro = v is None or v.lower() in ("1", "true")
    if kind == "volume" and not src:
        kind = "anonymous"
    return Mount(kind, src, target, ro, f"--mount {spec}")


def parse_publish(spec: str) -> list[Port]:
    """``-p``: ``[IP:][HOST_PORT:]CONTAINER_PORT[/PROTO]``, ports or ``A-B`` ranges of the same
    length (``IP`` may be ``[v6]``). Raises :class:`ContainerError` for what is not a port."""
    proto = "tcp"
    body = spec
    if "/" in body:
        body, proto = body.rsplit("/", 1)
    ip = ""
    if body.startswith("["):
        close = body.find("]")
        ip, body = body[1:close], body[close + 2:]
    parts = body.rsplit(":", 2) if not ip else body.split(":")
    if len(parts) == 3:
        ip, host, cont = parts
    elif len(parts) == 2:
        host, cont = parts
    else:
        host, cont = "", parts[0]

    def rng(text: str) -> list[int]:
        a, _, b = text.partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError:
            raise ContainerError(f"-p {spec!r}: {text!r} is not a port") from None
        return list(range(lo, hi + 1))

    cports = rng(cont)
    hports: list[int | None] = rng(host) if host else [None] * len(cports)
    if len(hports) == 1 and len(cports) > 1:
        hports = [None] * len(cports)  # one host port for a range: the runtime picks within it
    if len(hports) != len(cports):
        raise ContainerError(f"-p {spec!r}: the host and container port ranges differ in length")
    return [Port(c, h, ip, proto.lower()) for h, c in zip(hports, cports)]


def parse_gpu_request(value: str) -> GpuSelection:
    """docker ``--gpus`` as the docker CLI reads it (``opts/gpus.go`` of docker/cli): CSV fields;
    a field without ``=`` is a count (``all`` or a number); keys ``count``, ``device`` (the rest
    of that field, split at commas: quote it, ``'"device=0,1"'``, or the ``,1`` becomes a field
    of its own), ``driver``, ``capabilities``, ``options``; with neither a count nor devices the
    count is 1. Raises :class:`ContainerError` where docker refuses the value (an unknown key, a
    key given twice, both a count and devices)."""
    sel = GpuSelection(options=["--gpus", value])
    seen: set[str] = set()
    count: int | None = None
    devices: list[str] | None = None

    def parse_count(text: str) -> int:
        if text == "all":
            return -1
        try:
            return int(text)
        except ValueError:
            raise ContainerError(f"--gpus {value!r}: {text!r} is not a GPU count (a number or 'all')") from None

    for f in _csv_fields(value):
        key, eq, val = f.partition("=")
        if key in seen:
            raise ContainerError(f"--gpus {value!r}: '{key}' is given twice (docker refuses it)")
        seen.add(key)
        if not eq:
            seen.add("count")
            count = parse_count(key)
        elif key == "count":
            count = parse_count(val)
        elif key == "device":
            devices = val.split(",")
        elif key not in ("driver", "capabilities", "options"):
            raise ContainerError(f"--gpus {value!r}: unexpected key '{key}' (docker refuses it)")
    if count is None and devices is None:
        count = 1
    if count and devices is not None:
        raise ContainerError(f"--gpus {value!r}: both a count and devices (docker refuses it: quote the "
                             "device list, --gpus '\"device=0,1\"')")
    if devices is not None:
        sel.how, sel.devices = "devices", devices
    elif count == -1:
        sel.how = "all"
    else:
        sel.how, sel.count = "count", count
    return sel


def _add_device(sel: GpuSelection, value: str) -> None:
    """One ``--device`` of the run command: a GPU vendor's CDI device (``KIND=ID``, podman and
    docker 25+) or device file (:mod:`remote.gpus`: every known vendor's, the unit being read before
    any host is asked which it has), or an AMD GPU's ``/dev/dri``/``/dev/kfd``."""
    host = value.split(":", 1)[0]
    kind, _, which = host.partition("=")
    file_vendor = next((v for v in GPU_VENDORS if v.is_device_file(host)), None)
    index = file_vendor.device_index(host) if file_vendor is not None else None
    if which and any(kind == v.cdi_kind for v in GPU_VENDORS):  # CDI
        sel.options += ["--device", value]
        if which == "all":
            sel.how, sel.devices = "all", []
        elif sel.how != "all":
            sel.how = "devices"
            sel.devices.append(which)
    elif index is not None:
        sel.options += ["--device", value]
        if sel.how != "all":
            sel.how = "devices"
            sel.devices.append(str(index))
    elif file_vendor is not None or host.startswith("/dev/dri") or host == "/dev/kfd":
        sel.options += ["--device", value]


def parse_container_run(argv: list[str]) -> ContainerRun | None:
    """Parse ``exec_start`` words as ``docker|podman [GLOBAL OPTIONS] [container] run OPTIONS
    IMAGE [COMMAND...]`` (see the module docstring).

    Returns None when the first word is not docker or podman (not a container unit), or when the
    subcommand is not ``run``: for ``start -a`` and other subcommands, :class:`ContainerError`
    (orch must see the run command line to know the image, mounts and GPUs). Raises
    :class:`ContainerError` for an option it does not know, a bad value, or no image.
    """
    if not argv:
        return None
    runtime = posixpath.basename(argv[0])
    if runtime not in RUNTIMES:
        return None
    i, glob = 1, []
    while i < len(argv) and argv[i].startswith("-"):
        w = argv[i]
        glob.append(w)
        name = w[2:].split("=", 1)[0] if w.startswith("--") else GLOBAL_SHORT_VALUE.get(w[1:2], "")
        if "=" not in w and (name in GLOBAL_VALUE_OPTIONS or (not w.startswith("--") and w[1:2] in GLOBAL_SHORT_VALUE)
                             and len(w) == 2):
            if i + 1 < len(argv):
                glob.append(argv[i + 1])
            i += 1
        i += 1
    if i < len(argv) and argv[i] == "container":
        i += 1
    sub = argv[i] if i < len(argv) else ""
    if sub != "run":
        raise ContainerError(f"the unit runs '{runtime} {sub}', not '{runtime} run': orch reads a container's "
                             f"image, mounts and GPUs from its run command line (ExecStart={runtime} run ...)")
    words = argv[i + 1:]
    opts, at = split_run_options(words)
    run = ContainerRun(runtime=runtime, runtime_path=argv[0], image=words[at], command=list(words[at + 1:]),
                       global_options=glob, options=opts)
    for name, value in opts:
        v = value or ""
        if name == "name":
            run.name = v
        elif name == "volume":
            run.mounts.append(parse_volume(v))
        elif name == "mount":
            run.mounts.append(parse_mount(v))
        elif name == "tmpfs":
            run.mounts.append(Mount("tmpfs", "", v.split(":", 1)[0], False, f"--tmpfs {v}"))
        elif name == "env":
            k, eq, val = v.partition("=")
            if not k:
                raise ContainerError(f"-e {v!r}: no variable name")
            if eq:
                run.env[k] = val
                if k in run.env_pass:
                    run.env_pass.remove(k)
            else:
                run.env.pop(k, None)
                run.env_pass.append(k)
        elif name == "env-file":
            run.env_files.append(v)
        elif name == "gpus":
            sel = parse_gpu_request(v)
            run.gpus = GpuSelection(sel.how, sel.devices, sel.count, run.gpus.options + sel.options)
        elif name == "device":
            _add_device(run.gpus, v)
        elif name in ("network", "net"):
            run.network = v.split(":", 1)[0]
        elif name == "publish":
            run.ports += parse_publish(v)
        elif name == "publish-all":
            run.publish_all = v == "true"
        elif name == "detach":
            run.detach = v == "true"
        elif name == "rm":
            run.remove = v == "true"
        elif name == "entrypoint":
            run.entrypoint = v
        elif name == "runtime":
            run.gpus.options += ["--runtime", v]
    return run


def parse_container_env_file(text: str) -> tuple[dict[str, str], list[str]]:
    """An ``--env-file`` as both runtimes read it: one ``KEY=VALUE`` a line taken literally (no
    quotes removed, no ``$`` expanded), ``KEY`` alone passes the runtime's own value, lines
    starting with ``#`` and blank lines skipped, leading whitespace of the key dropped. Returns
    ``(assignments, passed-through keys)``. Pure."""
    env: dict[str, str] = {}
    passed: list[str] = []
    for line in text.splitlines():
        s = line.lstrip()
        if not s or s.startswith("#"):
            continue
        k, eq, v = s.partition("=")
        if eq:
            env[k] = v
        else:
            passed.append(k.strip())
    return env, passed


def container_environment(run: ContainerRun, runtime_env: dict[str, str],
                          env_files: list[str]) -> dict[str, str]:
    """The environment the container's command gets from the run command line (the image's own
    ``ENV`` comes under it and is not known here): the ``--env-file`` texts ``env_files`` (in
    order) under the ``-e`` options; ``KEY`` without a value takes ``runtime_env``'s (the unit's
    environment, which the runtime client runs with) and is left out when that has none, as both
    runtimes do. Pure."""
    out: dict[str, str] = {}
    for text in env_files:
        assigned, passed = parse_container_env_file(text)
        out.update(assigned)
        for k in passed:
            if k in runtime_env:
                out[k] = runtime_env[k]
    for name, value in run.options:
        if name != "env" or not value:
            continue
        k, eq, v = value.partition("=")
        if eq:
            out[k] = v
        elif k in runtime_env:
            out[k] = runtime_env[k]
    return out


def detach_reason(run: ContainerRun) -> str | None:
    """Why orch refuses a unit whose run command detaches (``-d``), or None. Pure.

    With ``-d`` the runtime client prints the container id and exits: systemd sees the unit's
    main process end while the container runs on outside the unit (a plain ``Type=simple`` unit
    then counts as stopped or restarts it), and the container's output is not the unit's journal
    (podman issue #8841), so orch could not prove from the log which config file was read."""
    if not run.detach:
        return None
    return (f"the unit's '{run.runtime} run' has -d/--detach: the {run.runtime} client exits as soon as the "
            "container starts, so systemd sees the unit's main process end while the container runs outside it, "
            "and the server's log does not reach the unit's journal (containers/podman#8841). Remove -d from "
            "ExecStart (run the container attached, with --rm)")
