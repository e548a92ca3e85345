"""Read-only facts about a systemd unit that runs an inference engine's server (SGLang's
``sglang.launch_server``, ...).

Gathered with ``systemctl show`` (ActiveState, MainPID, ControlGroup, Environment,
ExecStart, WorkingDirectory) and ``systemctl cat`` (the unit file text: ``ExecStart=``,
``Environment=``, ``EnvironmentFile=`` and ``UnsetEnvironment=`` lines, needed where ``show``
lacks ExecStart, as docker-systemctl-replacement does).

The unit's environment is the one systemd gives the server (:mod:`.systemd_env`): its
``Environment=`` assignments overridden by its ``EnvironmentFile=`` files (read on the host), and
``ExecStart=`` is expanded with it (``$VAR``, ``${VAR}``). Which engine the command line starts is
recognised once (:func:`remote.engines.engine_for`, or the inventory's ``orch_engine``: the
engine is then asked alone) and kept as ``launch.engine``; the command line is parsed into the
server arguments orch needs by that engine's flag rules (``Engine.parse_server_args``, a record
satisfying :class:`remote.engines.ServerArgs`); a server config file (SGLang's ``--config
FILE.yaml``) is read on the host and merged as the engine merges it (:mod:`.server_config`).
When the unit runs, its main process's ``/proc/PID/environ`` is compared with the computed
environment for the variables the engine reads (``Engine.env_keys``); a difference is reported in
``warnings``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from remote.engines import (Engine, EngineError, Launch, LaunchError, ServerArgs, container_command, engine_for,
                            engine_named, in_image, launch_refusal, servers_phrase, shebang_interpreter,
                            split_exec_prefix)

from ..errors import OrchError
from .container import ContainerError, ContainerRun, container_environment, detach_reason, parse_container_run
from .hostfiles import HostFileError, is_executable, names_in_folder, process_environ, read_file
from .schema import fields_from_dict, from_dict
from .server_config import ConfigFileError, config_path, merge_config
from .systemd_unit import Unit, parse_show  # noqa: F401  (parse_show: read here by the recorded-output tests)
from .systemd_env import (EnvFileRef, SpecifierError, effective_environment, env_file_refs, expand_exec_argv,
                          expand_specifiers, parse_env_file, parse_environ, parse_show_env_files)

#: largest EnvironmentFile / --config file read (bytes)
MAX_FILE_BYTES = 1024 * 1024


class UnitError(OrchError):
    """The unit is missing or runs no server of an engine orch knows; the message names the unit."""

    exit_status = 1


@dataclass
class UnitShape:
    """How systemd runs and stops the unit (systemd.service(5), systemd.kill(5)), from its file.

    ``type``: ``Type=`` (``simple`` when not set); ``restart``: ``Restart=`` (``no``);
    ``kill_mode``: ``KillMode=`` (``control-group``); ``timeout_stop``: ``TimeoutStopSec=`` as
    written (``""``: systemd's default; ``infinity``: systemd waits for ever, orch applies its own
    ``orch_stop_timeout`` and then ends the unit's processes with ``systemctl kill``);
    ``exec_start_pre``/``exec_stop``/``exec_stop_post``: those commands, in order (an empty
    assignment resets the list, as in drop-ins); ``scope``: ``system`` or ``user``
    (``orch_systemd_scope``).
    """

    type: str = "simple"
    restart: str = "no"
    kill_mode: str = "control-group"
    timeout_stop: str = ""
    exec_start_pre: list[str] = field(default_factory=list)
    exec_stop: list[str] = field(default_factory=list)
    exec_stop_post: list[str] = field(default_factory=list)
    scope: str = "system"

    @property
    def stop_waits_forever(self) -> bool:
        """``TimeoutStopSec=infinity`` (or ``0``, which systemd also reads as no timeout)."""
        return self.timeout_stop.strip() in ("infinity", "0")

    @property
    def restarts(self) -> bool:
        """systemd restarts the unit on its own after some exits (``Restart=`` other than ``no``)."""
        return self.restart not in ("", "no")

    def describe(self) -> str:
        """What differs from a plain unit, for the task message (``""`` when nothing)."""
        parts = []
        if self.type != "simple":
            parts.append(f"Type={self.type}")
        if self.restarts:
            parts.append(f"Restart={self.restart}")
        if self.kill_mode != "control-group":
            parts.append(f"KillMode={self.kill_mode}")
        if self.timeout_stop:
            parts.append(f"TimeoutStopSec={self.timeout_stop}")
        for key, cmds in (("ExecStartPre", self.exec_start_pre), ("ExecStop", self.exec_stop),
                          ("ExecStopPost", self.exec_stop_post)):
            if cmds:
                parts.append(f"{len(cmds)} {key}=")
        if self.scope == "user":
            parts.append("user unit")
        return ", ".join(parts)


@dataclass
class UnitFacts:
    """A unit's state and parsed launch command (``server`` is None for a unit no engine starts).

    ``environment``: what systemd gives the server (Environment= overridden by EnvironmentFile=);
    ``env_files``: ``[{"path", "optional", "read"}]`` of its EnvironmentFile= entries (``read``:
    found and read); ``exec_start``: the ExecStart words with variables expanded;
    ``warnings``: what the caller should show (e.g. the running process has another value);
    ``container``: the parsed ``docker run``/``podman run`` of a container unit (None: the server
    runs on the host), whose ``command`` is the launch ``server`` was parsed from; for such a unit
    ``environment`` is the container's (``-e``, ``--env-file``: what the server sees) and
    ``unit_environment`` the runtime client's (systemd's).
    """

    unit: str
    load_state: str
    active_state: str
    sub_state: str
    main_pid: int
    control_group: str
    environment: dict[str, str] = field(default_factory=dict)
    exec_start: list[str] = field(default_factory=list)
    server: ServerArgs | None = None
    env_files: list[dict] = field(default_factory=list)
    working_directory: str = ""
    warnings: list[str] = field(default_factory=list)
    exec_prefix: str = ""
    launch: Launch | None = None
    shape: UnitShape = field(default_factory=UnitShape)
    container: ContainerRun | None = None
    unit_environment: dict[str, str] = field(default_factory=dict)
    #: files the server logs to instead of the journal (``StandardOutput=append:FILE``, ...)
    log_files: list[str] = field(default_factory=list)
    #: ``User=`` (``""``: none, the system manager runs it as root; a user unit runs as its manager's user)
    user: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def engine(self) -> str | None:
        """The name of the engine the unit's command line starts (``launch.engine``), None before it
        was resolved."""
        return (self.launch.engine or None) if self.launch is not None else None

    @property
    def handle(self) -> Unit:
        """The unit as a :class:`orchestrator.facts.systemd_unit.Unit`: its name, its manager
        (``shape.scope``) and its log files."""
        return Unit(self.unit, self.shape.scope, list(self.log_files))

    @classmethod
    def from_dict(cls, data: Any) -> "UnitFacts":
        """Leniently, from a run record or a test's partial facts (:func:`orchestrator.facts.schema.from_dict`):
        ``server`` is read as the unit's engine's own record (``Engine.parse_server_args``'s type;
        the default engine's for a record that names none)."""
        data = dict(data) if isinstance(data, dict) else {}
        server = data.pop("server", None)
        facts = fields_from_dict(cls, data)
        if isinstance(server, dict):
            engine = engine_named(facts.engine)
            facts.server = from_dict(type(engine.parse_server_args([])), server)
        return facts


def _unit_file_lines(text: str) -> list[str]:
    """Logical lines of a unit file: comments dropped, backslash continuations joined."""
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.rstrip()
        if not cur and (s.lstrip().startswith("#") or s.lstrip().startswith(";")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        lines.append(cur.strip())
        cur = ""
    if cur:
        lines.append(cur.strip())
    return lines


@dataclass
class UnitSettings:
    """What a unit file says about the server's start: ``exec_start`` words (variables not yet
    expanded), ``exec_prefix`` (systemd's ``-@:+!`` prefixes of that line), ``environment`` (``Environment=``, in order, later wins), ``env_files``
    (``EnvironmentFile=`` entries after resets), ``unset`` (``UnsetEnvironment=``), ``shape``
    (:class:`UnitShape`: ``Type=``, ``Restart=``, ``KillMode=``, ``TimeoutStopSec=``, the
    ``ExecStartPre=``/``ExecStop=``/``ExecStopPost=`` commands)."""

    exec_start: list[str] = field(default_factory=list)
    exec_prefix: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    env_files: list[EnvFileRef] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    shape: UnitShape = field(default_factory=UnitShape)
    #: ``StandardOutput=``/``StandardError=`` as written (last wins; "" when unset)
    stdout: str = ""
    stderr: str = ""

    def log_files(self) -> list[str]:
        """Files the server's output goes to instead of the journal: the paths of
        ``StandardOutput=``/``StandardError=`` ``file:``, ``append:`` or ``truncate:`` targets
        (systemd.exec(5); ``StandardError=`` defaults to ``inherit``, the output's), in that
        order, each once."""
        out = []
        for value in (self.stdout, self.stderr or "inherit"):
            kind, _, path = value.partition(":")
            if kind in ("file", "append", "truncate") and path.startswith("/") and path not in out:
                out.append(path)
        return out


_SHAPE_LISTS = {"ExecStartPre": "exec_start_pre", "ExecStop": "exec_stop", "ExecStopPost": "exec_stop_post"}
_SHAPE_VALUES = {"Type": "type", "Restart": "restart", "KillMode": "kill_mode", "TimeoutStopSec": "timeout_stop"}


def parse_unit_settings(text: str) -> UnitSettings:
    """Parse ``systemctl cat`` text (the unit file and its drop-ins, in order).

    The last non-empty ``ExecStart=`` wins (an empty one resets, as in drop-ins); systemd's
    prefixes ``-@:+!`` go to ``exec_prefix``. ``Environment=`` assignments are split with shell-like
    quoting, as systemd does; an empty ``Environment=`` (or ``EnvironmentFile=``,
    ``UnsetEnvironment=``) resets that list. Raises :class:`UnitError` on a command line with
    unbalanced quotes.
    """
    st = UnitSettings()
    file_values: list[str] = []
    for line in _unit_file_lines(text):
        key, _, value = line.partition("=")
        key = key.strip()
        if key == "ExecStart":
            value = value.strip()
            if not value:
                st.exec_start, st.exec_prefix = [], ""
                continue
            st.exec_prefix, value = split_exec_prefix(value)
            try:
                st.exec_start = shlex.split(value)
            except ValueError as exc:
                raise UnitError(f"cannot parse ExecStart {value!r}: {exc}") from None
        elif key == "Environment":
            if not value.strip():
                st.environment = {}
                continue
            try:
                parts = shlex.split(value)
            except ValueError:
                continue
            for p in parts:
                if "=" in p:
                    k, v = p.split("=", 1)
                    st.environment[k] = v
        elif key in _SHAPE_LISTS:
            cmds = getattr(st.shape, _SHAPE_LISTS[key])
            if not value.strip():
                cmds.clear()
            else:
                cmds.append(value.strip())
        elif key in _SHAPE_VALUES:
            setattr(st.shape, _SHAPE_VALUES[key], value.strip() or getattr(UnitShape(), _SHAPE_VALUES[key]))
        elif key == "TimeoutSec":  # sets the stop timeout too (the last assignment wins)
            st.shape.timeout_stop = value.strip()
        elif key == "EnvironmentFile":
            file_values.append(value)
        elif key == "StandardOutput":
            st.stdout = value.strip()
        elif key == "StandardError":
            st.stderr = value.strip()
        elif key == "UnsetEnvironment":
            if not value.strip():
                st.unset = []
                continue
            try:
                st.unset += shlex.split(value)
            except ValueError:
                continue
    st.env_files = env_file_refs(file_values)
    return st


def parse_show_exec_start(value: str) -> list[str]:
    """Parse real systemd's ``ExecStart={ path=... ; argv[]=... ; ... }`` property."""
    m = re.search(r"argv\[\]=(.*?) ;", value)
    if not m:
        return []
    try:
        argv = shlex.split(m.group(1))
    except ValueError:
        argv = m.group(1).split()
    path = re.search(r"path=(\S+) ;", value)
    if path and argv and path.group(1) != argv[0]:  # the '@' prefix: argv[0] is not the program
        argv = [path.group(1), *argv[1:]]
    return argv


def parse_server_args(exec_start: list[str], launch_args: list[str] | None = None,
                      engine: str | None = None) -> ServerArgs | None:
    """The server arguments of the launch command in ``exec_start`` by its engine's flag rules
    (``engine``: the ``orch_engine`` override; None: recognised, :func:`remote.engines.engine_for`);
    ``launch_args`` replaces the command's own (its config file merged). None when no engine
    starts the command; :class:`UnitError` for a flag the engine would refuse (the message names
    the flag)."""
    try:
        found, launch = engine_for(list(exec_start), name=engine)
    except LaunchError:
        return None
    except EngineError as exc:
        raise UnitError(str(exc)) from None
    return server_args_of(found, launch, list(exec_start),
                          list(launch_args) if launch_args is not None else launch.server_argv,
                          interpreter=launch.interpreter or launch.script or "")


def read_host_file(connection, path: str, what: str) -> str | None:
    """Text of the file ``path`` on the host (at most :data:`MAX_FILE_BYTES`), read as the login
    user and through sudo only when that is refused; None when it does not exist. Raises
    :class:`UnitError` naming ``what`` and the path when it cannot be read or is too large."""
    try:
        return read_file(connection, path, limit=MAX_FILE_BYTES)
    except HostFileError as exc:
        if exc.too_large:
            raise UnitError(f"{what} {path} is larger than {MAX_FILE_BYTES} bytes") from None
        raise UnitError(f"cannot read {what} {path}: {exc.reason}") from None


def _glob_files(connection, ref: EnvFileRef) -> list[str]:
    """The files a wildcard ``EnvironmentFile=`` names (sorted, as glob(3)); wildcards only in the
    last path component."""
    folder, _, pattern = ref.path.rpartition("/")
    if any(c in folder for c in "*?["):
        raise UnitError(f"EnvironmentFile={ref.path}: orch reads wildcards only in the file name, not in folders")
    return names_in_folder(connection, folder, pattern)


def read_env_files(connection, refs: list[EnvFileRef]) -> tuple[list[dict[str, str]], list[dict]]:
    """Read the ``EnvironmentFile=`` files ``refs`` on the host: ``(parsed contents in order,
    [{"path", "optional", "read"}])``. A missing optional file is skipped, as systemd does.
    Raises :class:`UnitError` for a missing file without ``-`` (systemd would refuse to start the
    unit, so orch must not stop it) and for an unreadable one."""
    contents: list[dict[str, str]] = []
    report: list[dict] = []
    for ref in refs:
        paths = _glob_files(connection, ref) if ref.is_glob else [ref.path]
        if not paths and not ref.optional:
            raise UnitError(f"EnvironmentFile={ref.path} matches no file, and it is not optional ('-'): "
                            "systemd would refuse to start the unit")
        for path in paths:
            text = read_host_file(connection, path, "EnvironmentFile")
            if text is None and not ref.optional:
                raise UnitError(f"EnvironmentFile={path} does not exist and is not optional ('-'): "
                                "systemd would refuse to start the unit")
            report.append({"path": path, "optional": ref.optional, "read": text is not None})
            if text is not None:
                contents.append(parse_env_file(text))
    return contents, report


def running_environment(connection, main_pid: int) -> dict[str, str] | None:
    """``/proc/MAIN_PID/environ`` of the running server (through sudo when the login user may
    not read it), or None when it cannot be read."""
    if not main_pid:
        return None
    raw = process_environ(connection, main_pid)
    return parse_environ(raw) if raw else None


def environment_differences(computed: dict[str, str], running: dict[str, str] | None,
                            keys: tuple[str, ...] | None = None) -> list[str]:
    """The variables of ``keys`` (None: the default engine's ``Engine.env_keys``) whose value differs
    between the unit's computed environment and the running process's (``KEY: unit 'a', running
    'b'``); [] when ``running`` is None. Pure."""
    if running is None:
        return []
    out = []
    for k in keys if keys is not None else engine_named(None).env_keys:
        if computed.get(k) != running.get(k):
            out.append(f"{k}: unit {computed.get(k)!r}, running {running.get(k)!r}")
    return out


def container_hook():
    """The reader of container runs (``docker run``/``podman run`` in ExecStart) that
    :func:`remote.engines.engine_for` hands such a command to: ``parse_container_run(argv)
    -> (inner argv, container facts) | None`` over :func:`.container.parse_container_run`.
    :func:`gather_unit` unwraps a unit whose ExecStart is the container run itself before it
    resolves the launch; the hook covers a run behind a wrapper (``numactl ... docker run``).
    Raises :class:`.container.ContainerError` for a run command it cannot read."""
    def hook(argv: list[str]):
        run = parse_container_run(argv)
        if run is None:
            return None
        return container_command(run.image, run.entrypoint, run.command), run
    return hook


def _script_path(connection, launch: Launch, environment: dict[str, str]) -> str | None:
    """Where the console script ``launch.script`` is on the host: itself when absolute, else the
    first of ``launch.script_dirs`` then ``$PATH`` (the unit's, else systemd's search path) that
    has it; None when none has it."""
    name = launch.script or ""
    if name.startswith("/"):
        return name
    path = environment.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    for folder in [*launch.script_dirs, *path.split(":")]:
        if folder.startswith("/"):
            candidate = folder.rstrip("/") + "/" + name
            if is_executable(connection, candidate):
                return candidate
    return None


def resolve_launch(connection, unit: str, exec_start: list[str], prefix: str, workdir: str,
                   environment: dict[str, str], engine: str | None = None,
                   in_container: bool = False) -> tuple[Engine, Launch]:
    """Which engine ``exec_start`` starts and how (:func:`remote.engines.engine_for`; ``engine``:
    the ``orch_engine`` override, that engine asked alone), completed on the host: a console
    script's interpreter from its shebang (the script must be the engine's own,
    ``Engine.is_console_script``), and ``uv run``'s environment Python must exist.
    ``in_container``: ``exec_start`` is a container image's command, so a console script on the
    image's ``PATH`` is not read on the host (:func:`remote.engines.in_image`). Raises
    :class:`UnitError` naming the unit, the ExecStart and the forms orch knows when it is no form
    orch knows."""
    try:
        found, launch = engine_for(exec_start, name=engine, prefixes=prefix, workdir=workdir,
                                   environment=environment, container=container_hook())
    except LaunchError as exc:
        raise UnitError(f"unit {unit} is not {servers_phrase(engine)}: "
                        f"{launch_refusal(exec_start, str(exc), engine)}") from None
    except EngineError as exc:
        raise UnitError(f"unit {unit}: {exc}") from None
    if in_container:
        in_image(launch)
    if launch.needs_shebang:
        path = _script_path(connection, launch, launch.environment(environment))
        text = read_host_file(connection, path, "console script") if path else None
        if text is None:
            raise UnitError(f"unit {unit}: its ExecStart runs {launch.script!r}, which is not on the host "
                            f"(looked in {', '.join(launch.script_dirs) or 'PATH'})")
        interpreter = shebang_interpreter(text)
        if interpreter is None or not found.is_console_script(text):
            raise UnitError(f"unit {unit}: {path} is not {found.display_name}'s console script (no Python shebang "
                            "running its entry point)")
        launch.script, launch.interpreter = path, interpreter
    if launch.venv_python:
        if not is_executable(connection, launch.venv_python):
            raise UnitError(f"unit {unit}: uv run's project environment has no {launch.venv_python} (orch reads "
                            "the environment of --project/--directory, else of WorkingDirectory=)")
    return found, launch


def server_args_of(engine: Engine, launch: Launch, exec_start: list[str], args: list[str],
                   interpreter: str | None = None) -> ServerArgs:
    """The server arguments of ``launch`` with the arguments ``args`` (its ``server_argv`` with the
    config file merged), by ``engine``'s flag rules (``Engine.parse_server_args``); ``interpreter``
    (None: ``launch.interpreter``) and ``argv`` (``exec_start``) filled in. :class:`UnitError` for
    a flag the engine would refuse."""
    try:
        sa = engine.parse_server_args(args)
    except EngineError as exc:
        raise UnitError(str(exc)) from None
    sa.interpreter = interpreter if interpreter is not None else (launch.interpreter or "")
    sa.argv = list(exec_start)
    return sa


def gather_unit(connection, handle: Unit, engine: str | None = None) -> UnitFacts:
    """Query the unit ``handle`` names on a host through ``connection`` (read-only), on its manager
    (:class:`orchestrator.facts.systemd_unit.Unit`: ``systemctl --user`` for a user unit); the
    facts' own handle (:attr:`UnitFacts.handle`) adds the log files the unit file names.
    ``engine``: the inventory's ``orch_engine`` (None: recognised from the command line).

    Reads the unit's EnvironmentFile= files and its server config file (SGLang's ``--config``) on
    the host (see the module docstring). Raises :class:`UnitError` when the unit does not exist or
    runs no engine's server, when an EnvironmentFile= that is not optional is missing, or when the
    engine would refuse its config file (the message names the file). Every value is passed to the
    host's commands as its own argument (no shell).
    """
    unit, scope = handle.name, handle.scope
    if not handle.valid_name():
        raise UnitError(f"invalid unit name {unit!r}")
    show_text = handle.show_text(connection, "LoadState", "ActiveState", "SubState", "MainPID", "ControlGroup",
                                 "Environment", "ExecStart", "EnvironmentFiles", "WorkingDirectory", "User")
    props = parse_show(show_text)
    cat = handle.cat(connection)
    if props.get("LoadState") in ("not-found", "") and not cat.ok:
        raise UnitError(f"unit {unit} not found")
    if not cat.ok and not props.get("ExecStart"):
        raise UnitError(f"unit {unit} not found ({(cat.stderr or cat.stdout).strip()[:200]})")
    settings = parse_unit_settings(cat.stdout) if cat.ok else UnitSettings()
    try:  # the unit file's own text (`systemctl show` has them expanded already)
        exec_start = [expand_specifiers(w, unit) for w in settings.exec_start]
        env = {k: expand_specifiers(v, unit) for k, v in settings.environment.items()}
        refs = [EnvFileRef(expand_specifiers(r.path, unit), r.optional) for r in settings.env_files]
    except SpecifierError as exc:
        raise UnitError(f"unit {unit}: {exc}") from None
    if not exec_start and props.get("ExecStart"):
        exec_start = parse_show_exec_start(props["ExecStart"])
    if props.get("Environment"):
        try:
            for p in shlex.split(props["Environment"]):
                if "=" in p:
                    k, v = p.split("=", 1)
                    env.setdefault(k, v)
        except ValueError:
            pass
    if not cat.ok:
        refs = parse_show_env_files(show_text)
    file_envs, env_report = read_env_files(connection, refs)
    env = effective_environment(env, file_envs, settings.unset)
    if ":" not in settings.exec_prefix:  # ':' turns off systemd's variable expansion
        exec_start = expand_exec_argv(exec_start, env)
    try:
        main_pid = int(props.get("MainPID") or 0)
    except ValueError:
        main_pid = 0
    workdir = props.get("WorkingDirectory", "")
    # a container unit (docker/podman run): the image's command is the launch; the runtime
    # client's wrappers and prefixes stay outside (orchestrator/facts/container.py)
    container, container_env = _container_of(connection, unit, exec_start, env)
    command = exec_start
    if container is not None:
        command = container_command(container.image, container.entrypoint, container.command)
    try:
        found, launch = resolve_launch(connection, unit, command, settings.exec_prefix if container is None else "",
                                       workdir, env if container is None else container_env, engine,
                                       in_container=container is not None)
    except UnitError as exc:
        if container is None:
            raise
        raise UnitError(f"unit {unit} runs the container {container.image}, whose command is not "
                        f"{servers_phrase(engine)} ({shlex.join(command)[:200] or 'the image default command'}): "
                        f"{exc}") from None
    facts = UnitFacts(unit=unit, load_state=props.get("LoadState", "loaded"),
                      active_state=props.get("ActiveState", "unknown"), sub_state=props.get("SubState", ""),
                      main_pid=main_pid, control_group=props.get("ControlGroup", ""),
                      environment=launch.environment(env), exec_start=exec_start, env_files=env_report,
                      working_directory=workdir, user=props.get("User", ""), exec_prefix=settings.exec_prefix,
                      launch=launch,
                      shape=settings.shape,
                      log_files=[*settings.log_files(), *(f for f in launch.log_files if f not in settings.log_files())])
    facts.shape.scope = scope
    if container is not None:
        facts.container = container
        facts.unit_environment = facts.environment
        facts.environment = container_env
    args, cfg = launch.server_argv, None
    cwd = launch.cwd or workdir
    what = f"{found.display_name} {found.config_flag} file"
    try:
        cfg = config_path(args, found)
        if cfg is not None:
            if container is not None:
                cfg = _container_file_on_host(unit, container, cfg, what)
            elif not cfg.startswith("/"):
                if not cwd.startswith("/"):
                    raise UnitError(f"unit {unit}: {found.config_flag} {cfg} is relative and the unit has no "
                                    "absolute WorkingDirectory= to resolve it against")
                cfg = cwd.rstrip("/") + "/" + cfg
            text = read_host_file(connection, cfg, what)
            if text is None:
                raise UnitError(f"unit {unit}: {what} {cfg} does not exist ({found.display_name} would "
                                "refuse to start)")
            args = merge_config(args, text, cfg, found)
    except ConfigFileError as exc:
        raise UnitError(f"unit {unit}: {exc}") from None
    facts.server = server_args_of(found, launch, exec_start, args)
    facts.server.config_file = cfg
    if facts.active_state == "active" and container is None:  # a container's main PID is the client
        diff = environment_differences(facts.environment, running_environment(connection, main_pid), found.env_keys)
        if diff:
            facts.warnings.append("the running server was started with another environment than the unit "
                                  "now gives (a restart applies the unit's): " + "; ".join(diff))
    return facts


def _container_file_on_host(unit: str, container: ContainerRun, path: str, what: str) -> str:
    """The host path of the container path ``path`` (through its bind mounts); raises
    :class:`UnitError` when no bind mount holds it (orch reads the file on the host)."""
    workdir = dict(container.options).get("workdir") or "/"
    full = path if path.startswith("/") else workdir.rstrip("/") + "/" + path
    found = container.host_path(full)
    if found is None:
        raise UnitError(f"unit {unit}: {what} {path} is inside the container {container.image}, in no folder "
                        "bind-mounted from the host, so orch cannot read it")
    return found[0]


def _container_of(connection, unit: str, exec_start: list[str],
                  env: dict[str, str]) -> tuple[ContainerRun | None, dict[str, str]]:
    """The parsed container run command of ``exec_start`` (None: not ``docker``/``podman``) and
    the container's environment (:func:`.container.container_environment`, its ``--env-file``
    files read on the host; ``env``: the unit's, which the runtime client runs with). Raises :class:`UnitError` for a
    run command orch cannot read, one with ``-d``, and a missing env file (the runtime refuses to
    start without it)."""
    try:
        container = parse_container_run(exec_start)
    except ContainerError as exc:
        raise UnitError(f"unit {unit}: {exc}") from None
    if container is None:
        return None, {}
    why = detach_reason(container)
    if why:
        raise UnitError(f"unit {unit}: {why}; nothing was changed")
    texts = []
    for path in container.env_files:
        text = read_host_file(connection, path, "--env-file")
        if text is None:
            raise UnitError(f"unit {unit}: --env-file {path} does not exist ({container.runtime} would refuse to "
                            "start the container)")
        texts.append(text)
    return container, container_environment(container, env, texts)

