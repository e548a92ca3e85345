"""How a unit's ``ExecStart=`` starts a server: the wrappers orch reads, whatever the engine.

Every form resolves (:func:`resolve`) to a :class:`Launch`: the Python that runs the server, the
wrapper prefix the payload (tuner, probe) reuses so that it runs as the server runs (NUMA and CPU
binding, priority, the conda environment), the engine's entry point, the arguments the engine's
own argument parser receives for that entry point, and the environment changes the wrappers make.
The entry points are each engine's (:class:`EntryPoints`, in its own ``launcher`` module): this
module reads the wrappers around them.

Wrappers, outermost first, in any order and nesting:

- systemd's ``ExecStart=`` prefixes ``-``, ``@``, ``:``, ``+``, ``!``, ``!!`` (systemd.service(5),
  "Table 1. Special executable prefixes"): :func:`split_exec_prefix`; ``@`` makes the second word
  argv[0] (dropped here), ``:`` turns off the expansion of ``$VAR`` (the caller's part);
- ``env [-u NAME] [-S STRING] [-C DIR] [NAME=VALUE]... CMD`` (coreutils env(1); ``-S`` splits
  its string into words, the shebang form ``/usr/bin/env -S 'python3 -u'``); ``-i`` is refused;
- ``bash -c 'SCRIPT'`` (also ``sh``, ``dash``, ``-lc``) whose script is one simple command:
  ``NAME=VALUE`` assignments, ``exec``, then the command (no ``;``, ``&&``, pipes, redirections);
- ``numactl`` with binding options (numactl(8): ``--cpunodebind``/``-N``, ``--membind``/``-m``,
  ``--physcpubind``/``-C``, ``--interleave``/``-i``, ``--preferred``/``-p``,
  ``--preferred-many``/``-P``, ``--weighted-interleave``/``-w``, ``--localalloc``/``-l``,
  ``--all``/``-a``, ``--balancing``/``-b``); ``taskset [-a] -c LIST`` or ``taskset MASK``
  (taskset(1), no ``-p``); ``nice [-n N]`` (``-N``, ``--adjustment``); ``stdbuf -i/-o/-e MODE``
  (coreutils stdbuf(1));
- ``uv run [--project DIR] [--directory DIR] [--no-sync] [--frozen] ... CMD`` (uv's ``run``
  reference): the command runs in the project's virtual environment, ``$UV_PROJECT_ENVIRONMENT``
  or ``<project>/.venv`` (the project is ``--project``, else ``--directory``, else the unit's
  working directory; orch does not search parent folders for ``pyproject.toml``); ``python`` and
  an engine's console script name that environment's ``bin/`` files; ``uv run`` sets
  ``VIRTUAL_ENV``. The payload does not run through ``uv run`` (which would sync the environment
  first: installs, lock changes); it runs the environment's Python with ``VIRTUAL_ENV`` set, as
  ``uv run`` would;
- ``conda run (-n ENV | -p PREFIX) [--no-capture-output | --live-stream] [--cwd DIR] CMD``
  (conda's ``run`` command): kept in front of the payload (conda's activation is the
  environment the server sees, :attr:`Launch.activates`), always with ``--no-capture-output``
  (without it conda holds the payload's progress lines until it ends); ``python`` is
  ``PREFIX/bin/python`` with ``-p``, and with ``-n`` the environment's own ``python`` (resolved by
  ``conda run`` itself);
- ``start-stop-daemon --start [--background --make-pidfile --pidfile F] [--output LOG |
  --no-close] [--chdir DIR] (--exec PROG | --startas PROG) -- ARGS`` (Debian's start-stop-daemon(8),
  dpkg 1.21), the daemonizer of ``Type=forking`` units with ``PIDFile=``: the command is PROG with
  ARGS; it is not kept in front of the payload (the tuner must not go into the background);
  ``--output LOG`` is where the server's log goes (:attr:`Launch.log_files`). ``--background``
  without ``--output`` or ``--no-close`` is refused: start-stop-daemon then points the server's
  output at ``/dev/null``, and orch proves from the log which config file the server read.

Containers: a ``docker``/``podman`` command is handed to the optional ``container`` hook of
:func:`resolve` (``(argv) -> (inner argv, container facts) | None``); without one it is refused.

Then the entry point: ``<python> [options] -m MODULE ARGS`` (any program name: ``pypy3``, a venv's
``python3.11``) for a module of :attr:`EntryPoints.modules`, ``<python> .../SCRIPT ARGS`` or
``SCRIPT ARGS`` for a console script of :attr:`EntryPoints.scripts`; the engine reads the rest.

A form not listed here raises :class:`LaunchError` naming the word and the forms orch knows.
Pure and standard library only; the host reads (a console script's shebang, the uv environment's
Python) are the caller's (``orchestrator.facts.unit``).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from ..protocol import internal_error
from .errors import EngineError

#: the wrapper forms every refusal lists (the engines' entry points come first)
WRAPPER_FORMS = ("uv run", "conda run -n ENV / -p PREFIX", "numactl", "taskset", "nice", "stdbuf", "env [-S]",
                 "bash -c", "start-stop-daemon --start (Type=forking)", "systemd's ExecStart prefixes - @ : + ! !!")

#: a ``docker run``-like command: ``(argv) -> (inner argv, container facts)``, or None when
#: ``argv`` is not one the hook reads
ContainerHook = Callable[[list[str]], "tuple[list[str], Any] | None"]


@internal_error("caught by orchestrator.facts.unit, which raises UnitError naming the unit")
class LaunchError(EngineError):
    """An ``ExecStart=`` that is no launch form orch knows, or a wrapper option it does not read;
    the message names the word."""


@dataclass
class Launch:
    """An ``ExecStart=`` resolved (see the module docstring).

    ``forms``: the forms found, outermost first (``["numactl", "conda run", "<engine> serve"]``);
    ``wrapper``: the argv prefix the payload runs under (kept wrappers, normalised: an
    ``env NAME=VALUE`` for assignments of ``bash -c`` and for ``uv run``'s ``VIRTUAL_ENV``);
    ``interpreter``: the Python that runs the server (None until the console script's shebang is
    read: :attr:`script`); ``entry``: the engine's entry point (its module, or its console
    script and subcommand); ``engine``: the engine whose entry point it is (:attr:`EntryPoints.name`);
    ``entry_args``: the words after the entry point as on the command line (they identify the
    server's processes); ``server_argv``: what the engine's argument parser receives;
    ``script``: the console script whose shebang names the interpreter (absolute, or a bare name
    looked up in ``script_dirs`` then ``$PATH``); ``env_set``/``env_unset``: the wrappers'
    changes to the unit's environment; ``venv_python``: the uv environment's Python, which must
    exist; ``cwd``: the folder a wrapper runs the server in (``env -C``, ``conda run --cwd``,
    ``uv run --directory``, ``start-stop-daemon --chdir``; None: the unit's working directory);
    ``container``: what the container hook returned (None: no container); ``log_files``: files a
    wrapper sends the server's output to instead of the unit's (``start-stop-daemon --output``).
    """

    forms: list[str] = field(default_factory=list)
    wrapper: list[str] = field(default_factory=list)
    interpreter: str | None = None
    entry: str = ""
    entry_args: list[str] = field(default_factory=list)
    server_argv: list[str] = field(default_factory=list)
    script: str | None = None
    script_dirs: list[str] = field(default_factory=list)
    env_set: dict[str, str] = field(default_factory=dict)
    env_unset: list[str] = field(default_factory=list)
    venv_python: str | None = None
    cwd: str | None = None
    container: Any = None
    log_files: list[str] = field(default_factory=list)
    engine: str = ""

    def environment(self, unit_env: dict[str, str]) -> dict[str, str]:
        """The environment the server sees: ``unit_env`` (what systemd gives) with the wrappers'
        changes applied (conda's activation scripts are not read)."""
        env = {k: v for k, v in unit_env.items() if k not in self.env_unset}
        env.update(self.env_set)
        return env

    @property
    def needs_shebang(self) -> bool:
        """A console script whose interpreter is read from its shebang on the host (:attr:`script`
        set, :attr:`interpreter` not yet)."""
        return self.script is not None and self.interpreter is None


_SYSTEMD_PREFIXES = "-@:+!"


def split_exec_prefix(value: str) -> tuple[str, str]:
    """``(prefixes, rest)`` of an ``ExecStart=`` value: ``"-@/usr/bin/x ..."`` -> ``("-@",
    "/usr/bin/x ...")`` (systemd.service(5): any of ``-``, ``@``, ``:``, and one of ``+``, ``!``,
    ``!!``, in any order). Pure."""
    value = value.lstrip()
    i = 0
    while i < len(value) and value[i] in _SYSTEMD_PREFIXES:
        i += 1
    return value[:i], value[i:]


def apply_exec_prefix(prefixes: str, argv: list[str]) -> list[str]:
    """The command a prefixed ``ExecStart=`` runs, argv[0] being the program: with ``@`` the
    second word is the argv[0] systemd passes (dropped, the program stays). Raises
    :class:`LaunchError` for ``@`` with one word."""
    if "@" in prefixes:
        if len(argv) < 2:
            raise LaunchError("ExecStart with the '@' prefix needs the program and its argv[0]")
        return [argv[0], *argv[2:]]
    return list(argv)


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _is_python(word: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)*)?[a-z]?", _base(word)) is not None


class EntryPoints(Protocol):
    """One engine's entry points, as :func:`resolve` hands them the command left once the wrappers
    are read. ``name``/``display_name``: the engine's; ``modules``: the ``python -m`` modules that
    start its server; ``scripts``: its console scripts (a bare name in a ``uv run`` or ``conda run
    -p`` environment is that environment's ``bin/`` file); ``forms``: how the refusal names its
    entry points."""

    name: str
    display_name: str
    #: how a refusal names the server (``"an <engine> server"``)
    server_phrase: str
    modules: tuple[str, ...]
    scripts: tuple[str, ...]
    forms: tuple[str, ...]

    def enter_module(self, module: str, args: list[str], launch: Launch) -> None:
        """``<python> -m module ARGS`` (``launch.interpreter`` set): fill ``launch``'s entry point,
        ``entry_args`` and ``server_argv``, or raise :class:`LaunchError`."""

    def enter_script(self, argv: list[str], launch: Launch) -> None:
        """``SCRIPT ARGS`` (``argv[0]`` the console script, ``launch.interpreter`` set when a Python
        runs it by path, else ``launch.script`` is to be set): fill ``launch`` as
        :meth:`enter_module`, or raise :class:`LaunchError`."""

    def image_entrypoint(self, image: str) -> tuple[str, ...] | None:
        """The ``ENTRYPOINT`` of ``image`` when it is one of the engine's own server images (a
        container run that names no command of its own runs it, followed by the run's words);
        None for any other image."""

# ---- wrappers -----------------------------------------------------------------------------------

def _opt_value(argv: list[str], i: int, short: str, long: str) -> tuple[str | None, int] | None:
    """``(value, next index)`` when ``argv[i]`` is ``short``/``long`` with a value (``-N 0``,
    ``-N0``, ``--cpunodebind=0``, ``--cpunodebind 0``); None when it is not that option."""
    w = argv[i]
    if w == short or w == long:
        if i + 1 >= len(argv):
            raise LaunchError(f"option {w} has no value")
        return argv[i + 1], i + 2
    if long and w.startswith(long + "="):
        return w[len(long) + 1:], i + 1
    if short and len(short) == 2 and w.startswith(short) and len(w) > 2 and not w.startswith("--"):
        return w[2:], i + 1
    return None


def _options(argv: list[str], tool: str, with_value: dict[str, str], flags: dict[str, str]) -> int:
    """Index of the command after ``tool``'s options (getopt, stopping at the first non-option;
    ``with_value``/``flags``: short -> long spelling). Raises :class:`LaunchError` for an option
    orch does not read."""
    i = 1
    while i < len(argv):
        w = argv[i]
        if w == "--":
            return i + 1
        if not w.startswith("-") or w == "-":
            return i
        hit = None
        for short, long in with_value.items():
            hit = _opt_value(argv, i, short, long)
            if hit is not None:
                break
        if hit is not None:
            i = hit[1]
            continue
        if w in flags or w in flags.values():
            i += 1
            continue
        raise LaunchError(f"{tool} option {w} is not one orch reads (it reads "
                          f"{', '.join(sorted([*with_value.values(), *flags.values()]))})")
    raise LaunchError(f"{tool} runs no command")


_NUMACTL_VALUE = {"-N": "--cpunodebind", "-m": "--membind", "-C": "--physcpubind", "-i": "--interleave",
                  "-p": "--preferred", "-P": "--preferred-many", "-w": "--weighted-interleave"}
_NUMACTL_FLAGS = {"-l": "--localalloc", "-a": "--all", "-b": "--balancing"}


def _numactl(argv: list[str]) -> int:
    return _options(argv, "numactl", _NUMACTL_VALUE, _NUMACTL_FLAGS)


def _taskset(argv: list[str]) -> int:
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        w = argv[i]
        if w in ("-c", "--cpu-list", "-a", "--all-tasks") or re.fullmatch(r"-[ac]{2}", w):
            i += 1
            continue
        raise LaunchError(f"taskset option {w} is not one orch reads (it reads -c/--cpu-list, -a/--all-tasks; "
                          "-p changes a running process, it starts none)")
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i + 1 >= len(argv):
        raise LaunchError("taskset runs no command (it needs the CPU mask or list, then the command)")
    return i + 1


def _nice(argv: list[str]) -> int:
    i = 1
    if i < len(argv):
        hit = _opt_value(argv, i, "-n", "--adjustment")
        if hit is not None:
            i = hit[1]
        elif re.fullmatch(r"-\d+", argv[i]):
            i += 1
        elif argv[i].startswith("-") and argv[i] != "--":
            raise LaunchError(f"nice option {argv[i]} is not one orch reads (it reads -n N, --adjustment=N, -N)")
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i >= len(argv):
        raise LaunchError("nice runs no command")
    return i


def _stdbuf(argv: list[str]) -> int:
    return _options(argv, "stdbuf", {"-i": "--input", "-o": "--output", "-e": "--error"}, {})


_SSD_VALUE = {"-p": "--pidfile", "-O": "--output", "-x": "--exec", "-a": "--startas", "-d": "--chdir",
              "-n": "--name", "-u": "--user"}
_SSD_FLAGS = {"-S": "--start", "-b": "--background", "-m": "--make-pidfile", "-C": "--no-close", "-q": "--quiet",
              "-o": "--oknodo", "-v": "--verbose", "--remove-pidfile": "--remove-pidfile",
              "--notify-await": "--notify-await"}


def _start_stop_daemon(argv: list[str], launch: Launch) -> list[str]:
    """``start-stop-daemon --start ... (--exec|--startas) PROG -- ARGS``: the command ``[PROG,
    *ARGS]`` (start-stop-daemon(8): ``--startas`` is what runs, ``--exec`` what runs when it is
    not given; ARGS come after ``--``). Raises :class:`LaunchError` for another action than
    ``--start``, an option orch does not read (``--chuid``, ``--chroot``, ``--nicelevel``, ...:
    the payload would not run as the server runs), no program, or ``--background`` whose output
    goes to ``/dev/null`` (no ``--output``/``--no-close``)."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 1
    while i < len(argv) and argv[i] != "--":
        hit = None
        for short, long in _SSD_VALUE.items():
            hit = _opt_value(argv, i, short, long)
            if hit is not None:
                values[long] = hit[0]
                i = hit[1]
                break
        if hit is not None:
            continue
        w = argv[i]
        long = _SSD_FLAGS.get(w) or (w if w in _SSD_FLAGS.values() else None)
        if long is None:
            raise LaunchError(f"start-stop-daemon option {w} is not one orch reads (it reads "
                              f"{', '.join(sorted([*_SSD_VALUE.values(), *_SSD_FLAGS.values()]))})")
        flags.add(long)
        i += 1
    if "--start" not in flags:
        raise LaunchError("start-stop-daemon without --start starts no server")
    prog = values.get("--startas") or values.get("--exec")
    if not prog:
        raise LaunchError("start-stop-daemon --start names no program (--exec or --startas)")
    if "--background" in flags and "--output" not in values and "--no-close" not in flags:
        raise LaunchError("start-stop-daemon --background without --output sends the server's log to /dev/null, "
                          "and orch proves from the log which MoE config file the server read: add "
                          "--output /var/log/NAME.log (or --no-close, which keeps the unit's journal)")
    if "--output" in values:
        launch.log_files.append(values["--output"])
    if "--chdir" in values:
        launch.cwd = values["--chdir"]
    return [prog, *argv[i + 1:]]


_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)


def _env(argv: list[str], launch: Launch) -> tuple[list[str], list[str]]:
    """``env``'s options and assignments: ``(normalised env prefix, the command)``."""
    words = ["env"]
    rest = list(argv[1:])
    while rest:
        w = rest[0]
        if w in ("-i", "--ignore-environment") or w == "-":
            raise LaunchError("env -i (an empty environment) is not a form orch reads")
        if w in ("-S", "--split-string") or w.startswith("--split-string=") or (w.startswith("-S") and len(w) > 2):
            if w in ("-S", "--split-string"):
                if len(rest) < 2:
                    raise LaunchError("env -S has no string")
                text, rest = rest[1], rest[2:]
            else:
                text, rest = (w.split("=", 1)[1] if w.startswith("--") else w[2:]), rest[1:]
            try:
                rest = shlex.split(text) + rest
            except ValueError as exc:
                raise LaunchError(f"env -S string {text!r}: {exc}") from None
            continue
        hit = (_opt_value(rest, 0, "-u", "--unset") or _opt_value(rest, 0, "-C", "--chdir"))
        if hit is not None:
            value, nxt = hit
            if w.startswith(("-u", "--unset")):
                launch.env_unset.append(value)
                launch.env_set.pop(value, None)
                words += ["-u", value]
            else:
                launch.cwd = value if value.startswith("/") else posixpath.join(launch.cwd or "/", value)
                words += ["-C", value]
            rest = rest[nxt:]
            continue
        if w == "--":
            rest = rest[1:]
            break
        if w.startswith("-"):
            raise LaunchError(f"env option {w} is not one orch reads (it reads -u, -S, -C and NAME=VALUE)")
        if _ASSIGN.fullmatch(w):
            k, v = w.split("=", 1)
            launch.env_set[k] = v
            if k in launch.env_unset:
                launch.env_unset.remove(k)
            words.append(w)
            rest = rest[1:]
            continue
        break
    if not rest:
        raise LaunchError("env runs no command")
    return words, rest


_SHELL_OPERATORS = re.compile(r"^(;|&&|\|\||\||&|>|>>|<|2>|2>&1|\(|\))$|[`]|\$\(")


def _shell(argv: list[str], launch: Launch) -> tuple[list[str], list[str]] | None:
    """``bash -c 'SCRIPT'``: ``(env prefix for its assignments, the command)``; None when
    ``argv`` is no ``-c`` shell."""
    if len(argv) < 3 or _base(argv[0]) not in ("sh", "bash", "dash") or argv[1] not in ("-c", "-lc", "-ec"):
        return None
    try:
        inner = shlex.split(argv[2])
    except ValueError as exc:
        raise LaunchError(f"{_base(argv[0])} -c script {argv[2]!r}: {exc}") from None
    for w in inner:
        if _SHELL_OPERATORS.search(w):
            raise LaunchError(f"{_base(argv[0])} -c script {argv[2][:120]!r} is more than one simple command "
                              f"({w!r}); orch reads 'NAME=VALUE ... exec COMMAND' only")
    words = ["env"]
    while inner and (inner[0] == "exec" or _ASSIGN.fullmatch(inner[0])):
        if inner[0] != "exec":
            k, v = inner[0].split("=", 1)
            launch.env_set[k] = v
            words.append(inner[0])
        inner = inner[1:]
    if not inner:
        raise LaunchError(f"{_base(argv[0])} -c script {argv[2][:120]!r} runs no command")
    return (words if len(words) > 1 else []), inner


_UV_FLAGS = ("-q", "--quiet", "-v", "--verbose", "--no-sync", "--frozen", "--locked", "--offline", "--no-dev",
             "--no-cache", "-n", "--native-tls", "--all-extras", "--no-progress", "--exact", "--inexact",
             "--no-config", "--no-python-downloads", "--no-editable", "--all-packages", "--no-env-file")
_UV_VALUE = ("--directory", "--project", "--cache-dir", "--color", "--config-file", "--extra", "--group",
             "--only-group", "--no-group", "--package")
_UV_REFUSED = {"--with": "runs the command in a temporary environment", "--with-requirements":
               "runs the command in a temporary environment", "--with-editable":
               "runs the command in a temporary environment", "--isolated": "runs in a temporary environment",
               "--python": "selects another interpreter than the project's", "-p":
               "selects another interpreter than the project's", "--env-file": "loads an environment file orch does "
               "not read yet", "--no-project": "runs outside the project environment", "--script":
               "runs a script with inline dependencies", "--gui-script": "runs a script", "--module":
               "runs a module (use 'uv run python -m ...')", "-m": "runs a module (use 'uv run python -m ...')"}


def _uv(argv: list[str], launch: Launch, workdir: str, environment: dict[str, str],
        scripts: tuple[str, ...]) -> list[str]:
    """``uv [global options] run [options] CMD``: the command, with ``launch`` told the
    environment."""
    opts: dict[str, str] = {}
    i, seen_run = 1, False
    while i < len(argv):
        w = argv[i]
        if not seen_run and w == "run":
            seen_run, i = True, i + 1
            continue
        if w == "--":
            i += 1
            break
        if not w.startswith("-"):
            break
        name = w.split("=", 1)[0]
        if name in _UV_REFUSED:
            raise LaunchError(f"uv run {name} {_UV_REFUSED[name]}: not a form orch reads")
        if name in _UV_VALUE:
            if "=" in w:
                opts[name], i = w.split("=", 1)[1], i + 1
            else:
                if i + 1 >= len(argv):
                    raise LaunchError(f"uv option {w} has no value")
                opts[name], i = argv[i + 1], i + 2
            continue
        if w in _UV_FLAGS:
            i += 1
            continue
        raise LaunchError(f"uv option {w} is not one orch reads")
    if not seen_run:
        raise LaunchError(f"uv {' '.join(argv[1:3])} ... is not 'uv run': no command it starts is a server")
    if i >= len(argv):
        raise LaunchError("uv run runs no command")
    base = workdir if workdir.startswith("/") else ""
    if "--directory" in opts:
        base = posixpath.normpath(posixpath.join(base or "/", opts["--directory"]))
        launch.cwd = base
    project = base
    if "--project" in opts:
        project = posixpath.normpath(posixpath.join(base or "/", opts["--project"]))
    if not project.startswith("/"):
        raise LaunchError("uv run without --project/--directory needs the unit's WorkingDirectory= (an absolute "
                          "path) to find the project's environment")
    venv = environment.get("UV_PROJECT_ENVIRONMENT") or ".venv"
    venv = posixpath.normpath(posixpath.join(project, venv))
    launch.env_set["VIRTUAL_ENV"] = venv
    launch.wrapper += ["env", f"VIRTUAL_ENV={venv}"]
    launch.script_dirs.insert(0, venv + "/bin")
    cmd = list(argv[i:])
    if not cmd[0].startswith("/") and (_is_python(cmd[0]) or _base(cmd[0]) in scripts):
        cmd[0] = f"{venv}/bin/{cmd[0]}"
        if _is_python(argv[i]):
            launch.venv_python = cmd[0]
    return cmd


def _conda(argv: list[str], launch: Launch, scripts: tuple[str, ...]) -> list[str]:
    """``conda run ...``: the command; the wrapper (with ``--no-capture-output``) is kept."""
    if len(argv) < 2 or argv[1] != "run":
        raise LaunchError(f"conda {' '.join(argv[1:2])} ... is not 'conda run'")
    i, prefix, name, capture_off = 2, None, None, False
    kept = [argv[0], "run"]
    while i < len(argv):
        w = argv[i]
        for short, long in (("-n", "--name"), ("-p", "--prefix"), ("", "--cwd")):
            hit = _opt_value(argv, i, short, long)
            if hit is not None:
                value, i = hit
                if long == "--name":
                    name = value
                elif long == "--prefix":
                    prefix = value
                else:
                    launch.cwd = value
                kept += [long, value]
                break
        else:
            if w in ("--no-capture-output", "--live-stream", "-s"):
                capture_off, i = True, i + 1
                kept.append("--no-capture-output")
                continue
            if w in ("-v", "--verbose", "--dev", "--debug-wrapper-scripts", "-q", "--quiet"):
                kept.append(w)
                i += 1
                continue
            if w == "--":
                i += 1
                break
            if w.startswith("-"):
                raise LaunchError(f"conda run option {w} is not one orch reads (it reads -n/--name, -p/--prefix, "
                                  "--no-capture-output, --live-stream, --cwd)")
            break
    if (name is None) == (prefix is None):
        raise LaunchError("conda run needs exactly one of -n ENV and -p PREFIX")
    if i >= len(argv):
        raise LaunchError("conda run runs no command")
    if not capture_off:
        kept.append("--no-capture-output")
    launch.wrapper += kept
    cmd = list(argv[i:])
    if prefix is not None:
        launch.env_set["CONDA_PREFIX"] = prefix
        launch.script_dirs.insert(0, prefix.rstrip("/") + "/bin")
        if not cmd[0].startswith("/") and (_is_python(cmd[0]) or _base(cmd[0]) in scripts):
            cmd[0] = prefix.rstrip("/") + "/bin/" + cmd[0]
    return cmd


_PY_FLAGS = ("-u", "-O", "-OO", "-B", "-s", "-S", "-E", "-I", "-b", "-bb", "-q", "-v", "-d", "-P")


def _possessive(names: list[str]) -> str:
    return " nor ".join(f"{n}'s server" for n in names)


def _entry(argv: list[str], launch: Launch, entries: Sequence[EntryPoints]) -> bool:
    """The entry point of ``argv`` (no wrapper left): True when an engine of ``entries`` took it
    (``launch`` filled), False when ``argv`` is no entry point form. Raises :class:`LaunchError`
    for ``python -m`` of a module no engine starts, and what the engine raises."""
    scripts = {s: e for e in entries for s in e.scripts}
    if _base(argv[0]) in scripts:
        e = scripts[_base(argv[0])]
        e.enter_script(argv, launch)
        launch.engine = e.name
        return True
    i = 1
    while i < len(argv):
        w = argv[i]
        if w in ("-X", "-W"):
            i += 2
            continue
        if w in _PY_FLAGS or re.fullmatch(r"-[uOBsSEIbqvdP]+", w) or re.fullmatch(r"-[XW].+", w):
            i += 1
            continue
        break
    if i + 1 < len(argv) and argv[i] == "-m":
        module = argv[i + 1]
        e = next((e for e in entries if module in e.modules), None)
        if e is None:
            known = ", ".join(f"-m {m}" for en in entries for m in en.modules)
            raise LaunchError(f"python -m {module} is not {_possessive([en.display_name for en in entries])} "
                              f"(orch knows {known})")
        launch.interpreter = argv[0]
        e.enter_module(module, list(argv[i + 2:]), launch)
        launch.engine = e.name
        return True
    if i < len(argv) and _base(argv[i]) in scripts and _is_python(argv[0]):
        e = scripts[_base(argv[i])]
        launch.interpreter = argv[0]
        e.enter_script(list(argv[i:]), launch)
        launch.script = None
        launch.engine = e.name
        return True
    return False


def resolve(argv: list[str], entries: Sequence[EntryPoints], *, prefixes: str = "", workdir: str = "",
            environment: dict[str, str] | None = None, container: ContainerHook | None = None) -> Launch:
    """Resolve the ``ExecStart=`` words ``argv`` (variables already expanded, the systemd prefixes
    ``prefixes`` split off by :func:`split_exec_prefix`) into a :class:`Launch` whose entry point is
    one of ``entries`` (the engines' :class:`EntryPoints`; ``Launch.engine`` names the one).

    ``workdir``: the unit's ``WorkingDirectory=`` (``uv run``'s project); ``environment``: the
    unit's environment (``UV_PROJECT_ENVIRONMENT``); ``container``: the hook that reads a
    container run (``docker``/``podman``), see the module docstring. Raises :class:`LaunchError`
    for a form orch does not know, naming it (:func:`known_forms` lists the forms).
    """
    environment = environment or {}
    scripts = tuple(s for e in entries for s in e.scripts)
    launch = Launch()
    if prefixes:
        launch.forms.append(f"systemd prefix {prefixes}")
    cmd = apply_exec_prefix(prefixes, list(argv))
    for _ in range(32):
        if not cmd:
            raise LaunchError("the command is empty")
        name = _base(cmd[0])
        shell = _shell(cmd, launch)
        if shell is not None:
            launch.forms.append(f"{name} -c")
            launch.wrapper += shell[0]
            cmd = shell[1]
            continue
        if name == "env":
            words, cmd = _env(cmd, launch)
            launch.forms.append("env")
            if len(words) > 1:
                launch.wrapper += words
            continue
        if name in ("numactl", "taskset", "nice", "stdbuf"):
            k = {"numactl": _numactl, "taskset": _taskset, "nice": _nice, "stdbuf": _stdbuf}[name](cmd)
            launch.forms.append(name)
            launch.wrapper += cmd[:k]
            cmd = cmd[k:]
            continue
        if name == "uv":
            launch.forms.append("uv run")
            cmd = _uv(cmd, launch, workdir, environment, scripts)
            continue
        if name == "start-stop-daemon":
            launch.forms.append("start-stop-daemon")
            cmd = _start_stop_daemon(cmd, launch)
            continue
        if name in ("conda", "mamba", "micromamba"):
            launch.forms.append(f"{name} run")
            cmd = _conda(cmd, launch, scripts)
            continue
        if name in ("docker", "podman", "nerdctl"):
            found = container(cmd) if container is not None else None
            if found is None:
                raise LaunchError(f"'{name} {' '.join(cmd[1:2])}' (a container) is not a form orch reads yet")
            launch.forms.append(f"{name} run")
            cmd, launch.container = list(found[0]), found[1]
            continue
        if _entry(cmd, launch, entries):
            if launch.venv_python is None and "uv run" in launch.forms and launch.interpreter:
                launch.venv_python = launch.interpreter
            if launch.container is not None:
                in_image(launch)
            return launch
        raise LaunchError(f"{shlex.join(cmd)[:160]!r} is not a launch form orch knows")
    raise LaunchError("the command nests more than 32 wrappers")


#: the Python that runs a console script found on a container image's ``PATH``
IMAGE_PYTHON = "python3"


def in_image(launch: Launch) -> Launch:
    """``launch`` started inside a container image: a console script named without a folder (an
    engine's image whose entry point is its console script, ``EntryPoints.image_entrypoint``) is on
    the image's ``PATH`` and its shebang is in the image, not on the host, so it takes the image's
    :data:`IMAGE_PYTHON` as its interpreter (in the engine images orch knows, ``python3`` is the
    Python the engine is installed for; the payload runs in a container of the same image, where a
    wrong guess fails its probe). Returns ``launch``."""
    if launch.needs_shebang and "/" not in (launch.script or "/"):
        launch.interpreter = IMAGE_PYTHON
    return launch


def known_forms(entries: Sequence[EntryPoints]) -> tuple[str, ...]:
    """What a refusal lists as the forms orch knows: the engines' entry points, then the wrappers."""
    return tuple(f for e in entries for f in e.forms) + WRAPPER_FORMS


def refusal(exec_start: list[str], why: str, entries: Sequence[EntryPoints]) -> str:
    """The message that refuses an ``ExecStart=``: the command, why, and the forms orch knows."""
    servers = " nor ".join(e.server_phrase for e in entries)
    return (f"its ExecStart ({shlex.join(exec_start)[:200]}) does not start {servers} in a form orch "
            f"knows: {why}. orch knows: {'; '.join(known_forms(entries))}")


def shebang_interpreter(text: str) -> str | None:
    """The Python a console script runs with, from its first lines ``text``: ``#!/venv/bin/python3``
    -> ``/venv/bin/python3``; ``#!/usr/bin/env python3`` -> ``python3``; pip's form for long paths
    (``#!/bin/sh`` then ``'''exec' /long/venv/bin/python "$0" "$@"``) -> that path. None when
    there is no shebang naming a Python."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!"):
        return None
    try:
        words = shlex.split(lines[0][2:])
    except ValueError:
        words = lines[0][2:].split()
    if words and _base(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if words and _is_python(words[0]):
        return words[0]
    if words and _base(words[0]) == "sh" and len(lines) > 1:
        m = re.match(r"""^'''exec' (.+?) "\$0" "\$@"\s*$""", lines[1])
        if m:
            return m.group(1).strip("'\"")
    return None


def activates_environment(launch: Launch) -> bool:
    """Whether the launch wrappers activate an environment of their own (``conda run``: it puts
    the environment's ``bin`` first on ``PATH`` and finds the command there, as it does for the
    server): the payload then keeps that ``PATH`` and its bare interpreter name."""
    return "conda run" in launch.forms
