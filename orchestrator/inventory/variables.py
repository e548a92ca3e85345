"""The table of inventory variables orch knows: type, default, meaning, validation.

``KNOWN_VARS`` is the one place these are defined. The loader validates every assignment
against it, :func:`effective_vars` applies its defaults, and :func:`known_vars_markdown`
renders it for the README.

Rules (decided here, tested in tests/unit/inventory/test_inventory.py):

* A variable whose name starts with ``ansible_`` or ``orch_`` must be in ``KNOWN_VARS``;
  anything else with those prefixes is an error with a did-you-mean (difflib). Other names
  are the user's own and pass through unchecked.
* An explicit ``null`` for a known variable means "use the default".
* A string containing ``{{`` or ``{%`` is a Jinja2 template, rendered per host in
  :func:`effective_vars` (context: the host's variables, ``inventory_hostname``,
  ``group_names``; sandboxed; native types, so ``"{{ sizes }}"`` stays a list) and validated
  after rendering, as Ansible templates variables lazily.
* ``ansible_become_password`` is secret: its value never appears in an error, a repr or
  :func:`redact` output.
* ``ansible_group_priority`` is consumed by the loader (merge order of sibling groups) and is
  only honoured in the inventory file's group ``vars``, as in Ansible (see loader).
* ``ansible_ssh_common_args``: orch connects with Paramiko, which reads no OpenSSH command line;
  it takes the jump host from it (``-J SPEC`` / ``-o ProxyJump=SPEC``) and refuses every other
  option by name (:mod:`orchestrator.inventory.ssh_args`), so nothing is ignored silently.
* ``ansible_port`` and ``ansible_user`` have no fixed default, as in Ansible's ssh plugin:
  unset, ``~/.ssh/config`` (``Port``, ``User``) decides, else 22 and the local user.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from remote.engines import engine_named
from remote.protocol import (BENCH_TOOLS, DEFAULT_ENGINE, DEFAULT_PROVIDER, DEFAULT_SEARCH_SPACE, DEFAULT_TUNE_BUDGET_S,
                             ENGINE_NAMES, PROVIDER_NAMES, SEARCH_SPACES)

from remote.gpus import VENDORS as GPU_VENDORS

from ..errors import internal_error
from ..facts.legacy import VARIABLES as OLD_NAMES
from ..templating import is_template, referenced_names, render_text
from .errors import InventoryError
from .ssh_args import SSHArgsError, parse_proxy_jump, parse_ssh_common_args

#: Processes never signalled by the reaper, whatever the inventory says: each known GPU vendor's
#: (:attr:`remote.gpus.GpuVendor.protected_processes`: a persistence daemon, monitoring and
#: exporters, X hold the GPUs' device files without being leftovers; a SIGKILLed dcgm-exporter froze
#: GPUs until reboot: dcgm-exporter #84, as :mod:`remote.host.reap` says), and the display servers.
#: The inventory is read before any host is asked which vendor it has, so every vendor's are in it.
#: ``orch_protected_processes`` adds to this list.
BUILTIN_PROTECTED_PROCESSES: tuple[str, ...] = tuple(dict.fromkeys(
    [*(p for v in GPU_VENDORS for p in v.protected_processes), "Xorg", "Xwayland"]))

#: Ansible "magic" variables: they cannot be set in an inventory.
RESERVED_NAMES = frozenset({
    "inventory_hostname", "inventory_hostname_short", "group_names", "groups",
    "hostvars", "omit", "playbook_dir", "inventory_dir", "inventory_file",
})

_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@internal_error("the inventory loader and effective_vars turn it into an InventoryError naming the file "
                "and line; orchestrator.cli.common.checked_as into a UsageError naming the flag")
class BadValue(ValueError):
    """A value failed a :class:`VarSpec` check; ``str()`` is the message without location."""


def _shown(value: Any, secret: bool) -> str:
    if secret:
        return f"a value of type {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(spec: "VarSpec", value: Any) -> BadValue:
    return BadValue(f"{spec.name} must be {spec.expect}, got {_shown(value, spec.secret)}")


# ---------------------------------------------------------------- checkers
# Each returns the normalised value or raises BadValue via _fail. ``None`` never reaches them.

def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    return None


def _int_range(lo: int, hi: int | None) -> Callable[["VarSpec", Any], int]:
    def check(spec: VarSpec, value: Any) -> int:
        n = _as_int(value)
        if n is None or n < lo or (hi is not None and n > hi):
            raise _fail(spec, value)
        return n
    return check


def _seconds(spec: "VarSpec", value: Any) -> float:
    if isinstance(value, bool):
        raise _fail(spec, value)
    try:
        n = float(value) if isinstance(value, (int, float, str)) else None
    except ValueError:
        n = None
    if n is None or not (n > 0) or n == float("inf"):
        raise _fail(spec, value)
    return int(n) if n == int(n) else n


def _nonneg_number(spec: "VarSpec", value: Any) -> float:
    """A finite number >= 0 (int when whole)."""
    if isinstance(value, bool):
        raise _fail(spec, value)
    try:
        n = float(value) if isinstance(value, (int, float, str)) else None
    except ValueError:
        n = None
    if n is None or not (n >= 0) or n == float("inf"):
        raise _fail(spec, value)
    return int(n) if n == int(n) else n


def _percent(spec: "VarSpec", value: Any) -> float:
    if isinstance(value, bool):
        raise _fail(spec, value)
    text = value.strip().rstrip("%") if isinstance(value, str) else value
    try:
        n = float(text) if isinstance(text, (int, float, str)) else None
    except ValueError:
        n = None
    if n is None or not (0 <= n <= 100):
        raise _fail(spec, value)
    return n


_TRUE = {"true", "yes", "on", "1", "y"}
_FALSE = {"false", "no", "off", "0", "n"}


def _bool(spec: "VarSpec", value: Any) -> bool:
    """Ansible's ``boolean()`` spellings: yes/no, true/false, on/off, 1/0 (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise _fail(spec, value)


def _text(spec: "VarSpec", value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    # Numbers are fine as text for user names and host addresses (YAML turns 1000 into int).
    if isinstance(value, (int, float)) and not isinstance(value, bool) and spec.numbers_as_text:
        return str(value)
    raise _fail(spec, value)


def _choice(*choices: str) -> Callable[["VarSpec", Any], str]:
    def check(spec: VarSpec, value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        err = _fail(spec, value)
        if isinstance(value, str):
            close = difflib.get_close_matches(value, choices, n=1)
            if close:
                err = BadValue(f"{err} (did you mean {close[0]!r}?)")
        raise err
    return check


def _abs_path(spec: "VarSpec", value: Any) -> str:
    if isinstance(value, str) and value.startswith("/") and "\n" not in value:
        return value.rstrip("/") or "/"
    raise _fail(spec, value)


def _local_path(spec: "VarSpec", value: Any) -> str:
    """A path on the controller: ``~`` is expanded (as Ansible does for key files)."""
    if isinstance(value, str) and value.strip() and "\n" not in value:
        return os.path.expanduser(value)
    raise _fail(spec, value)


def _ssh_spec(spec: "VarSpec", value: Any, parse, prefix: str) -> str:
    """A string that ``parse`` (a parser of ``orchestrator.inventory.ssh_args``) accepts; its
    ``SSHArgsError`` becomes ``BadValue`` with ``prefix`` in front."""
    if not isinstance(value, str):
        raise _fail(spec, value)
    try:
        parse(value)
    except SSHArgsError as exc:
        raise BadValue(f"{prefix}{exc}") from None
    return value


def _ssh_common_args(spec: "VarSpec", value: Any) -> str:
    """``ansible_ssh_common_args``: only the jump host is read from it, anything else is refused."""
    return _ssh_spec(spec, value, parse_ssh_common_args, "")


def _proxy_jump(spec: "VarSpec", value: Any) -> str:
    """An OpenSSH ProxyJump spec (``[user@]host[:port][,...]`` or ``none``)."""
    return _ssh_spec(spec, value, parse_proxy_jump, f"{spec.name}: ").strip()


def _capability(spec: "VarSpec", value: Any) -> str:
    """``MAJOR.MINOR`` (``9.0``, ``12.0``); YAML reads an unquoted ``9.0`` as a float, which is fine."""
    text = str(value).strip() if isinstance(value, (str, float)) and not isinstance(value, bool) else ""
    if not re.fullmatch(r"\d{1,2}\.\d", text):
        raise _fail(spec, value)
    return text


def _url(spec: "VarSpec", value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        return value.rstrip("/")
    raise _fail(spec, value)


def _str_list(spec: "VarSpec", value: Any) -> list[str]:
    if isinstance(value, str):  # a single name is a one-element list
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip() for v in value):
        return list(value)
    raise _fail(spec, value)


def _posint_list(spec: "VarSpec", value: Any) -> list[int]:
    if isinstance(value, (list, tuple)) and value:
        out = [_as_int(v) for v in value]
        if all(n is not None and n > 0 for n in out):
            if len(set(out)) != len(out):
                raise BadValue(f"{spec.name} must not repeat a value, got {value!r}")
            return out  # type: ignore[return-value]
    raise _fail(spec, value)


# ---------------------------------------------------------------- the table

Default = Any  # a value, or a callable(get, host_name) -> value for derived defaults


@dataclass(frozen=True)
class VarSpec:
    """One known inventory variable.

    ``type`` is the human-readable type for the docs, ``expect`` the phrase used in errors
    ("an integer 1-65535"), ``default`` the value (or a callable ``(get, host_name) -> value``
    where ``get(var)`` returns another effective variable of the same host) applied by
    :func:`effective_vars`. ``group_only``: consumed by the loader, not a host variable.
    ``warn``: the loader's warning for a value that is accepted but likely wrong: a text, or a
    function of the (checked) value returning one or None. ``alias_of``: the new name of a variable
    renamed (:data:`orchestrator.facts.legacy.VARIABLES`): the old name is still read (it sets the
    new one when that is unset) and given the same value.
    """

    name: str
    type: str
    expect: str
    default: Default
    meaning: str
    checker: Callable[["VarSpec", Any], Any] = field(repr=False, default=_text)
    secret: bool = False
    numbers_as_text: bool = False
    group_only: bool = False
    warn: str | Callable[[Any], str | None] | None = None
    alias_of: str | None = None

    def warning(self, value: Any) -> str | None:
        """:attr:`warn` for ``value`` (None: nothing to say; templates are not judged)."""
        if value is None or not self.warn or is_template(value):
            return None
        return self.warn(value) if callable(self.warn) else self.warn

    def check(self, value: Any) -> Any:
        """Return the normalised value; ``None`` passes (= default). Raises :class:`BadValue`."""
        if value is None:
            return None
        return self.checker(self, value)

    @property
    def default_text(self) -> str:
        """The default as shown in the docs."""
        if callable(self.default):
            return self.default.__doc__ or "derived"
        if self.default is None:
            return "(none)"
        return repr(self.default) if isinstance(self.default, str) else str(self.default)


def _choice_var(name: str, choices: tuple[str, ...], default: str, meaning: str) -> VarSpec:
    """A variable whose value is one of ``choices``: its doc type (``a|b``), error phrase and check
    all come from the one tuple."""
    return VarSpec(name, "|".join(choices), "one of " + ", ".join(repr(c) for c in choices), default, meaning,
                   _choice(*choices))


def _device_name_warning(value: Any) -> str | None:
    """A device name not in torch's form (``H200``): orch would install files the engine does not
    look for on that GPU (``Engine.device_name_hint`` of the default engine)."""
    hint = engine_named(None).device_name_hint(str(value))
    return None if hint is None else (f"orch_device_name {value!r} is not in torch's form "
                                      f"(torch.cuda.get_device_name() starts with the vendor): "
                                      f"did you mean {hint!r}?")


def _default_host(get: Callable[[str], Any], host: str) -> str:
    """inventory host name"""
    return host


_SPECS: list[VarSpec] = [
    # --- connection (Ansible names, Ansible meaning) ---
    VarSpec("ansible_host", "str", "a host name or address", _default_host,
            "Address to connect to.", numbers_as_text=True),
    VarSpec("ansible_user", "str", "a non-empty string", None,
            "SSH login user (default: ~/.ssh/config, else the local user).", numbers_as_text=True),
    VarSpec("ansible_port", "int", "an integer 1-65535", None,
            "SSH port (default: ~/.ssh/config Port, else 22).", _int_range(1, 65535)),
    VarSpec("ansible_ssh_private_key_file", "path", "a path", None,
            "Private key on the controller (~ expanded).", _local_path),
    VarSpec("ansible_python_interpreter", "str", "an interpreter path", None,
            "Python that runs the payload (default: the interpreter of the server's unit)."),
    _choice_var("ansible_connection", ("ssh", "local"), "ssh",
                "'local' runs on the controller machine itself, without SSH."),
    VarSpec("ansible_become", "bool", "a boolean", False, "Run remote commands with sudo.", _bool),
    VarSpec("ansible_become_user", "str", "a non-empty string", "root", "sudo target user."),
    VarSpec("ansible_become_password", "str", "a non-empty string", None,
            "sudo password (never logged).", secret=True, numbers_as_text=True),
    VarSpec("ansible_ssh_common_args", "str", "a string", None,
            "Read for the jump host only: '-J SPEC' or '-o ProxyJump=SPEC' (SPEC: [user@]host[:port],"
            " comma-separated hops, or 'none'); any other option is refused by name.", _ssh_common_args),
    VarSpec("ansible_group_priority", "int", "an integer", 1,
            "Merge order of groups at the same depth (inventory file group vars only).",
            _int_range(-(2**31), 2**31), group_only=True),
    # --- orch ---
    VarSpec("orch_service", "str", "a systemd unit name", f"{DEFAULT_ENGINE}.service",
            "systemd unit of the inference server."),
    VarSpec("orch_engine", "|".join(ENGINE_NAMES), "one of " + ", ".join(repr(c) for c in ENGINE_NAMES), None,
            "The inference engine the unit runs (default: recognised from the unit's ExecStart=; set it "
            "to read the unit by that engine's rules alone).", _choice(*ENGINE_NAMES)),
    _choice_var("orch_systemd_scope", ("system", "user"), "system",
                "Whose systemd runs the unit: ``system`` (``systemctl``, through sudo) or ``user`` (the "
                "login user's own manager: ``systemctl --user``, without sudo; keep it running with "
                "``loginctl enable-linger USER``)."),
    VarSpec("orch_server_url", "url", "an http(s) URL", None,
            "Base URL of the server as the controller reaches it; readiness is then polled from the "
            "controller (default: unset, the server is asked on its host where its --host/--port say).", _url),
    VarSpec("orch_device_name", "str", "a non-empty string", None,
            "torch.cuda.get_device_name() override (default: probed on the host).",
            warn=_device_name_warning),
    VarSpec("orch_gpu_capability", "str", "a compute capability MAJOR.MINOR (e.g. 9.0)", None,
            "GPU 0's CUDA compute capability override (default: probed on the host); the engine picks the "
            "MoE runner by it.", _capability),
    VarSpec("orch_model_config", "str", "a non-empty string", None,
            "Model config.json (or its folder) on the host (default: from the unit's --model-path)."),
    VarSpec("orch_protected_processes", "list[str]", "a list of process names", [],
            "Process names never killed, added to the built-in set "
            + ", ".join(BUILTIN_PROTECTED_PROCESSES) + ".", _str_list),
    VarSpec("orch_tune_batch_sizes", "list[int]", "a list of positive integers", None,
            f"Batch sizes M to tune (default: the engine's tuning list, {engine_named(None).display_name}'s "
            + ", ".join(map(str, engine_named(None).default_batch_sizes)) + ", for every space).", _posint_list),
    _choice_var("orch_tune_space", SEARCH_SPACES, DEFAULT_SEARCH_SPACE, "Size of the kernel search space."),
    VarSpec("orch_tune_budget", "seconds", "a number of seconds >= 0", DEFAULT_TUNE_BUDGET_S,
            "Seconds of GPU timing per GPU the tune may spend on all its batch sizes (0: unbounded); the "
            "tune report says what it cut ([tuning.md](tuning.md)).", _nonneg_number),
    VarSpec("orch_tune_routing_file", "str", "a path on the host", None,
            "Recorded routing the tune times candidates with, on the host, in a format the unit's engine "
            "records ([tuning.md](tuning.md) lists them; default: random router logits, the fused "
            "shared expert in every row where the engine fuses it).", _abs_path),
    VarSpec("orch_tune_routing_skew", "float", "a number >= 0", 0,
            "What-if skew of the expert loads the tune times with (0: as recorded, or uniform).", _nonneg_number),
    VarSpec("orch_tune_memory_max", "int", "a positive number of bytes", None,
            "MemoryMax= of the tuner's transient unit, in bytes (default: 80% of the host's MemAvailable "
            "when the tune starts); above it the kernel ends the tuner only.", _int_range(1, None)),
    VarSpec("orch_prepare", "bool", "a boolean", True,
            "Compile the tune's candidates before the unit stops, on the host's CPUs while the server "
            "serves (docs/tuning.md); false: compile after the stop.", _bool),
    VarSpec("orch_triton_interpret", "bool", "a boolean", False,
            "Run the tuner with TRITON_INTERPRET=1 (CPU test beds only).", _bool),
    VarSpec("orch_ready_timeout", "seconds", "a positive number of seconds", 1800,
            "Wait at most this long for the server to become ready after a start.", _seconds),
    VarSpec("orch_ready_generate_timeout", "seconds", "a positive number of seconds", 60,
            "Readiness ends with a one-token generation; one that gets no answer within this while "
            "/health says 200 is a failed start.", _seconds),
    VarSpec("orch_stop_timeout", "seconds", "a positive number of seconds", 120,
            "Wait at most this long for the unit to stop.", _seconds),
    VarSpec("orch_start_timeout", "seconds", "a positive number of seconds", 120,
            "Wait at most this long for the unit to be active after a start (readiness after that: "
            "orch_ready_timeout).", _seconds),
    VarSpec("orch_bench", "bool", "a boolean", True,
            "Run the throughput benchmark before and after the retune.", _bool),
    VarSpec("orch_bench_concurrency", "list[int]", "a list of positive integers", [1, 16, 64],
            "Benchmark concurrency levels.", _posint_list),
    VarSpec("orch_bench_input_len", "int", "a positive integer", 1024,
            "Benchmark prompt length (tokens).", _int_range(1, None)),
    VarSpec("orch_bench_output_len", "int", "a positive integer", 256,
            "Benchmark output length (tokens).", _int_range(1, None)),
    _choice_var("orch_bench_tool", BENCH_TOOLS, "builtin",
                "Benchmark client of orch bench and the tune's and rollback's benchmarks: orch's own, or the "
                "unit's engine's own (named after the engine, docs/commands.md; another engine's is refused)."),
    VarSpec("orch_state_dir", "path", "an absolute path", "/var/lib/orch",
            "State folder on the host (payload, backups, run records).", _abs_path),
    VarSpec("orch_known_hosts", "path", "a path", None,
            "known_hosts file on the controller that --accept-new-host-keys writes (~ expanded; default: "
            "~/.ssh/config UserKnownHostsFile, else ~/.ssh/known_hosts and ~/.ssh/known_hosts2). "
            "/etc/ssh/ssh_known_hosts (or GlobalKnownHostsFile) is trusted too.", _local_path),
    VarSpec("orch_jump_host", "str", "a ProxyJump spec like 'user@bastion:22'", None,
            "Jump host(s) to reach the host through, OpenSSH ProxyJump syntax ([user@]host[:port], "
            "comma-separated, 'none' for none); wins over ansible_ssh_common_args and ~/.ssh/config. "
            "Each hop's key is verified like the host's.", _proxy_jump),
    VarSpec("orch_jump_private_key_file", "path", "a path", None,
            "Private key for the hops of orch_jump_host (default: their ~/.ssh/config IdentityFile, "
            "the ssh-agent, ~/.ssh/id_*).", _local_path),
    _choice_var("orch_tune_provider", PROVIDER_NAMES, DEFAULT_PROVIDER,
                "Tuner: the engine's own kernel (named after the engine), orch's built-in, or auto."),
    VarSpec("orch_command_timeout", "seconds", "a positive number of seconds", 300,
            "Timeout of one ordinary remote command.", _seconds),
    VarSpec("orch_connect_timeout", "seconds", "a positive number of seconds", 10,
            "SSH connect timeout.", _seconds),
    VarSpec("orch_ssh_max_handshakes", "int", "an integer 1-1000", 8,
            "SSH handshakes (connect to login) orch keeps in flight at once to one SSH server, jump hosts "
            "included; keep it below the server's sshd MaxStartups (OpenSSH's default 10:30:100 starts "
            "dropping at 10).", _int_range(1, 1000)),
    VarSpec("orch_ssh_max_sessions", "int",
            "an integer 3-1000 (orch may hold 3 sessions on one connection at once: SFTP, a long command "
            "and the lock heartbeat beside it)", 8,
            "Sessions (commands, SFTP) orch opens at once on one SSH connection; keep it at most the "
            "server's sshd MaxSessions (OpenSSH's default 10).", _int_range(3, 1000)),
    VarSpec("orch_lock_heartbeat_interval", "seconds", "a positive number of seconds", 60,
            "Renew the host lock's heartbeat this often while the run holds it (a lock is stale after 600 s).",
            _seconds),
    VarSpec("orch_reconnect_timeout", "seconds", "a positive number of seconds", 300,
            "When the link to a host drops mid-run, log in again (bounded backoff) for this long, then run the "
            "step again or reattach to the running tune; past it the host is failed unreachable.", _seconds),
    VarSpec("orch_host_deadman", "bool", "a boolean", True,
            "Arm a dead-man on the host before its unit is stopped: when no controller has checked in (the "
            "lock's heartbeat) for `orch_host_deadline` seconds, the host stops the tune, puts the earlier "
            "configs back and starts the unit by itself.", _bool),
    VarSpec("orch_host_deadline", "seconds", "a positive number of seconds", 900,
            "The dead-man's deadline; it must exceed `orch_reconnect_timeout` + `orch_lock_heartbeat_interval` "
            "+ `orch_connect_timeout` + 40 s, so a controller that is still reconnecting has given up first.",
            _seconds),
    VarSpec("orch_regression_threshold", "percent", "a percentage 0-100", 3.0,
            "Roll back when throughput drops by more than this percentage.", _percent),
    VarSpec("orch_moe_runners", "str", "runner names separated by commas, or auto", None,
            "Runner trial (`orch tune --moe-runners`): the MoE runners to start and compare "
            "([runners-trial.md](runners-trial.md)).", _text),
    VarSpec("orch_runner_check_prompts", "path", "a path", None,
            "Runner trial: a file of check prompts on the controller (one per line; default the set "
            "shipped with orch).", _local_path),
    VarSpec("orch_runner_check_tokens", "int", "an integer 1-4096", 32,
            "Runner trial: greedy tokens generated per check prompt.", _int_range(1, 4096)),
    VarSpec("orch_runner_min_agreement", "percent", "a percentage 0-100", 90.0,
            "Runner trial: a candidate passes the output check when at least this percentage of the "
            "check prompts get the reference runner's answer, token for token.", _percent),
    VarSpec("orch_runner_min_gain", "percent", "a percentage 0-100", 3.0,
            "Runner trial: another runner is kept only when it beats the unit's runner by more than this "
            "percentage of output tokens/s (else the unit stays as it was).", _percent),
    VarSpec("orch_autotune_stall_timeout", "seconds", "a positive number of seconds", 300,
            "Runner trial: a start whose FlashInfer autotune reads a warm cache and logs nothing for this "
            "long, without its end line, is taken as hung (vllm PR #54618): the unit is stopped, the "
            "autotune cache put back as it was before the run, and the unit started once more.", _seconds),
    VarSpec("orch_allow_daemon_reload", "bool", "a boolean", False,
            "Runner trial: run `systemctl daemon-reload` even where GPU containers of the NVIDIA container "
            "toolkit run (they can lose their devices, NVIDIA/nvidia-container-toolkit #48).", _bool),
]

# the old names of renamed variables (orchestrator/facts/legacy.py), each right after its new one
for _old, _new in OLD_NAMES.items():
    _at = next(i for i, s in enumerate(_SPECS) if s.name == _new)
    _SPECS.insert(_at + 1, dataclasses.replace(_SPECS[_at], name=_old, default=None, alias_of=_new,
                                               meaning=f"Old name of {_new}, still read."))

#: name -> VarSpec, in documentation order. The single table of known variables.
KNOWN_VARS: dict[str, VarSpec] = {s.name: s for s in _SPECS}

#: Names whose values are never shown.
SECRET_VARS = frozenset(s.name for s in _SPECS if s.secret)


def var(variables: Mapping[str, Any], name: str) -> Any:
    """The value of the known variable ``name`` in ``variables`` (a host's effective variables),
    or its default from :data:`KNOWN_VARS` when absent or null (a derived default, such as
    ``ansible_host``'s, gives None here). Code reads inventory values through this, so every
    default is written once, in the table. Raises KeyError for a name not in the table."""
    spec = KNOWN_VARS[name]
    value = variables.get(name)
    if value is None and not callable(spec.default):
        value = spec.check(copy.deepcopy(spec.default))
    return value



def check_name(name: Any) -> str | None:
    """Return an error message for a bad variable name, else None.

    Unknown ``ansible_*``/``orch_*`` names get a did-you-mean from difflib over KNOWN_VARS.
    """
    if not isinstance(name, str) or not _VAR_NAME.match(name):
        return f"invalid variable name {name!r} (letters, digits and _ only, not starting with a digit)"
    if name in RESERVED_NAMES:
        return f"{name!r} is a reserved Ansible variable and cannot be set in an inventory"
    if name.startswith(("ansible_", "orch_")) and name not in KNOWN_VARS:
        close = difflib.get_close_matches(name, list(KNOWN_VARS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown variable {name!r}{hint}"
    return None


def check_value(name: str, value: Any) -> Any:
    """Validate and normalise one assignment; unknown (user) names pass through unchanged.

    Templates are not checked here (see :func:`effective_vars`). Raises :class:`BadValue`.
    """
    spec = KNOWN_VARS.get(name)
    if spec is None or is_template(value):
        return value
    return spec.check(value)


def redact(vars: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``vars`` with secret values replaced by ``'***'`` (for logs and reprs)."""
    return {k: ("***" if k in SECRET_VARS and v is not None else v) for k, v in vars.items()}


# ---------------------------------------------------------------- effective variables

def effective_vars(host: Any) -> dict[str, Any]:
    """All variables of one host, with defaults applied and templates rendered.

    ``host`` is an :class:`orchestrator.inventory.Host` (uses ``name``, ``vars``, ``groups``,
    ``origins``). Returns a new dict: every known variable except group-only ones (default when
    unset or null), plus the user's own variables. ``orch_protected_processes`` is the built-in
    set followed by the inventory's names (it can grow, never shrink).
    Raises :class:`InventoryError` naming the file:line of the assignment when a template fails
    or a rendered value has the wrong type.
    """
    raw: dict[str, Any] = dict(host.vars)
    origins: dict[str, str] = dict(getattr(host, "origins", {}) or {})
    for old, new in OLD_NAMES.items():  # an old name sets the new one it was renamed to
        if old in raw and new not in raw:
            raw[new] = raw[old]
            if old in origins:
                origins[new] = origins[old]
    done: dict[str, Any] = {}
    stack: list[str] = []
    magic = {"inventory_hostname": host.name,
             "inventory_hostname_short": host.name.split(".")[0],
             "group_names": list(host.groups)}

    def where(name: str) -> tuple[str | None, int | None]:
        origin = origins.get(name)
        if not origin:
            return None, None
        path, _, line = origin.rpartition(":")
        return (path, int(line)) if line.isdigit() else (origin, None)

    def error(name: str, msg: str) -> InventoryError:
        path, line = where(name)
        return InventoryError(f"host {host.name!r}: {msg}", path, line)

    def get(name: str) -> Any:
        if name in done:
            return done[name]
        if name in magic:
            return magic[name]
        if name in stack:
            cycle = " -> ".join(stack[stack.index(name):] + [name])
            raise error(name, f"template loop: {cycle}")
        spec = KNOWN_VARS.get(name)
        if name not in raw and spec is None:
            raise KeyError(name)
        stack.append(name)
        try:
            value = raw.get(name)
            if is_template(value):
                value = render(name, value)
            if spec is not None:
                try:
                    value = spec.check(value)
                except BadValue as e:
                    raise error(name, str(e)) from None
                if value is None and callable(spec.default):
                    value = spec.default(get, host.name)
                elif value is None:
                    value = spec.check(copy.deepcopy(spec.default))  # e.g. expands ~
                if name == "orch_protected_processes":
                    value = list(dict.fromkeys([*BUILTIN_PROTECTED_PROCESSES, *value]))
        finally:
            stack.pop()
        done[name] = value
        return value

    def render(name: str, value: Any) -> Any:
        if isinstance(value, list):
            return [render(name, v) for v in value]
        if isinstance(value, dict):
            return {k: render(name, v) for k, v in value.items()}
        if not isinstance(value, str) or not is_template(value):
            return value
        try:
            context: dict[str, Any] = {}
            for ref in referenced_names(value):
                try:
                    context[ref] = get(ref)
                except KeyError:
                    pass  # StrictUndefined reports it below
            return render_text(value, context)
        except InventoryError:
            raise
        except Exception as e:  # TemplateError, and e.g. TypeError from "{{ 'a' * [] }}"
            msg = "secret value" if name in SECRET_VARS else repr(value)
            raise error(name, f"{name}: cannot render template {msg}: {e}") from None

    out: dict[str, Any] = {}
    for name, spec in KNOWN_VARS.items():
        if not spec.group_only:
            out[name] = get(name)
    for name in raw:
        out[name] = get(name)
    for name, spec in KNOWN_VARS.items():  # an old name reads as the value of its new one
        if spec.alias_of is not None:
            out[name] = out[spec.alias_of]
    return out


def known_vars_markdown() -> str:
    """The KNOWN_VARS table as Markdown (variable | type | default | meaning), for the README."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for s in _SPECS:
        cells = [f"`{s.name}`", s.type, s.default_text, s.meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
