"""Read-only facts about a systemd unit that runs ``sglang.launch_server``.

Gathered with ``systemctl show`` (ActiveState, MainPID, ControlGroup, Environment,
ExecStart) and ``systemctl cat`` (the unit file text: ``ExecStart=`` and
``Environment=`` lines, needed where ``show`` lacks ExecStart, as
docker-systemctl-replacement does). The launch command line is parsed into the
server arguments orch needs (SGLang ``server_args.py`` flag names).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field

from ..errors import OrchError

#: SGLang server flags orch reads, with their aliases (SGLang 0.5.23 server_args.py)
FLAG_ALIASES = {
    "--model-path": "model_path", "--model": "model_path",
    "--tp": "tp", "--tp-size": "tp", "--tensor-parallel-size": "tp",
    "--ep": "ep", "--ep-size": "ep", "--expert-parallel-size": "ep",
    "--port": "port", "--host": "host",
    "--moe-runner-backend": "moe_runner_backend",
    "--quantization": "quantization", "--dtype": "dtype",
    "--served-model-name": "served_model_name",
    "--disable-shared-experts-fusion": "disable_shared_experts_fusion",
    "--disable-flashinfer-autotune": "disable_flashinfer_autotune",
}
BOOL_FLAGS = {"disable_shared_experts_fusion", "disable_flashinfer_autotune"}
ENV_KEYS = ("SGLANG_MOE_CONFIG_DIR", "HF_HOME", "CUDA_VISIBLE_DEVICES", "SGLANG_CACHE_DIR", "PYTHONPATH")


class UnitError(OrchError):
    """The unit is missing or is not an SGLang server; the message names the unit."""

    exit_status = 1


@dataclass
class ServerArgs:
    """The parts of an SGLang launch command orch needs.

    ``interpreter``: the Python that runs SGLang (absolute path as in ExecStart);
    ``tp``/``ep``: tensor/expert parallel sizes (SGLang defaults 1/1); ``port``
    (default 30000) and ``host`` (default 127.0.0.1) as SGLang's defaults;
    ``moe_runner_backend``: ``auto`` when not given.
    """

    interpreter: str
    argv: list[str]
    model_path: str | None = None
    tp: int = 1
    ep: int = 1
    port: int = 30000
    host: str = "127.0.0.1"
    moe_runner_backend: str = "auto"
    quantization: str | None = None
    dtype: str | None = None
    served_model_name: str | None = None
    disable_shared_experts_fusion: bool = False
    disable_flashinfer_autotune: bool = False


@dataclass
class UnitFacts:
    """A unit's state and parsed launch command (``server`` is None for a non-SGLang unit)."""

    unit: str
    load_state: str
    active_state: str
    sub_state: str
    main_pid: int
    control_group: str
    environment: dict[str, str] = field(default_factory=dict)
    exec_start: list[str] = field(default_factory=list)
    server: ServerArgs | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_show(text: str) -> dict[str, str]:
    """Parse ``systemctl show`` output (``Key=Value`` lines) into a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v
    return out


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


def parse_unit_file(text: str) -> tuple[list[str], dict[str, str]]:
    """Return (ExecStart argv, Environment) from ``systemctl cat`` text.

    The last non-empty ``ExecStart=`` wins (an empty one resets, as in drop-ins);
    systemd's prefixes ``-@:+!`` are dropped. ``Environment=`` assignments are split
    with shell-like quoting, as systemd does. Raises :class:`UnitError` on a
    command line with unbalanced quotes.
    """
    exec_start: list[str] = []
    env: dict[str, str] = {}
    for line in _unit_file_lines(text):
        if line.startswith("ExecStart="):
            value = line[len("ExecStart="):].strip()
            if not value:
                exec_start = []
                continue
            value = value.lstrip("-@:+!")
            try:
                exec_start = shlex.split(value)
            except ValueError as exc:
                raise UnitError(f"cannot parse ExecStart {value!r}: {exc}") from None
        elif line.startswith("Environment="):
            try:
                parts = shlex.split(line[len("Environment="):])
            except ValueError:
                continue
            for p in parts:
                if "=" in p:
                    k, v = p.split("=", 1)
                    env[k] = v
    return exec_start, env


def parse_show_exec_start(value: str) -> list[str]:
    """Parse real systemd's ``ExecStart={ path=... ; argv[]=... ; ... }`` property."""
    m = re.search(r"argv\[\]=(.*?) ;", value)
    if not m:
        return []
    try:
        return shlex.split(m.group(1))
    except ValueError:
        return m.group(1).split()


def _unwrap_shell(argv: list[str]) -> list[str]:
    """``bash -c 'exec python -m sglang.launch_server ...'`` -> the inner argv."""
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in ("sh", "bash", "dash") and argv[1] in ("-c", "-lc"):
        try:
            inner = shlex.split(argv[2])
        except ValueError:
            return argv
        while inner and (inner[0] == "exec" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", inner[0])):
            inner = inner[1:]
        return inner
    if argv and argv[0].rsplit("/", 1)[-1] == "env":
        rest = argv[1:]
        while rest and (rest[0].startswith("-") or "=" in rest[0]):
            rest = rest[1:]
        return rest
    return argv


def parse_server_args(exec_start: list[str]) -> ServerArgs | None:
    """Find ``<python> -m sglang.launch_server ...`` in ``exec_start`` and parse its flags.

    Accepts ``python -m sglang.launch_server``, ``bash -c '...'`` and ``env VAR=x python ...``
    wrappers. Returns None when the command is not an SGLang server. Flag values come
    as ``--flag value`` or ``--flag=value``.
    """
    argv = _unwrap_shell(list(exec_start))
    try:
        i = argv.index("sglang.launch_server")
    except ValueError:
        return None
    if i < 2 or argv[i - 1] != "-m":
        return None
    interpreter = argv[0]
    args = argv[i + 1:]
    sa = ServerArgs(interpreter=interpreter, argv=list(exec_start))
    j = 0
    while j < len(args):
        tok = args[j]
        key, val = (tok.split("=", 1) + [None])[:2] if tok.startswith("--") and "=" in tok else (tok, None)
        field_name = FLAG_ALIASES.get(key)
        if field_name is None:
            j += 1
            continue
        if field_name in BOOL_FLAGS:
            setattr(sa, field_name, True)
            j += 1
            continue
        if val is None:
            if j + 1 >= len(args):
                raise UnitError(f"flag {key} has no value in ExecStart")
            val = args[j + 1]
            j += 2
        else:
            j += 1
        if field_name in ("tp", "ep", "port"):
            try:
                setattr(sa, field_name, int(val))
            except ValueError:
                raise UnitError(f"flag {key} must be an integer, got {val!r}") from None
        else:
            setattr(sa, field_name, val)
    return sa


def gather_unit(connection, unit: str) -> UnitFacts:
    """Query ``unit`` on a host through ``connection`` (read-only).

    Raises :class:`UnitError` when the unit does not exist or is not an SGLang
    server. Every value is passed to systemctl as its own argument (no shell).
    """
    if not re.fullmatch(r"[A-Za-z0-9:_.@][A-Za-z0-9:_.@\\-]*", unit or ""):
        raise UnitError(f"invalid unit name {unit!r}")
    show = connection.run(["systemctl", "show", unit, "-p", "LoadState", "-p", "ActiveState", "-p", "SubState",
                          "-p", "MainPID", "-p", "ControlGroup", "-p", "Environment", "-p", "ExecStart"],
                         check=False)
    props = parse_show(show.stdout)
    cat = connection.run(["systemctl", "cat", unit], check=False)
    if props.get("LoadState") in ("not-found", "") and not cat.ok:
        raise UnitError(f"unit {unit} not found")
    if not cat.ok and not props.get("ExecStart"):
        raise UnitError(f"unit {unit} not found ({(cat.stderr or cat.stdout).strip()[:200]})")
    exec_start, env = parse_unit_file(cat.stdout) if cat.ok else ([], {})
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
    try:
        main_pid = int(props.get("MainPID") or 0)
    except ValueError:
        main_pid = 0
    facts = UnitFacts(unit=unit, load_state=props.get("LoadState", "loaded"),
                      active_state=props.get("ActiveState", "unknown"), sub_state=props.get("SubState", ""),
                      main_pid=main_pid, control_group=props.get("ControlGroup", ""),
                      environment={k: env[k] for k in env}, exec_start=exec_start)
    facts.server = parse_server_args(exec_start)
    if facts.server is None:
        raise UnitError(f"unit {unit} is not an SGLang server: its ExecStart does not run "
                        f"'python -m sglang.launch_server' ({shlex.join(exec_start)[:200]})")
    return facts


def is_active(connection, unit: str) -> str:
    """``systemctl is-active UNIT`` output (``active``, ``inactive``, ``failed``, ...)."""
    return connection.run(["systemctl", "is-active", unit], check=False).stdout.strip() or "unknown"
