"""Where and how to log in: a host's SSH endpoint and its jump hosts, resolved as OpenSSH would.

Inputs are the host's inventory variables (Ansible's names, which map to ``ssh`` command-line
options: ``ansible_host`` is the destination, ``ansible_port`` ``-p``, ``ansible_user`` ``-l``,
``ansible_ssh_private_key_file`` ``-i``, ``ansible_ssh_common_args`` more options) and the
parsed ``~/.ssh/config`` + ``/etc/ssh/ssh_config`` (a ``paramiko.SSHConfig``, loaded by Fabric's
``Config``; Paramiko's ``lookup`` applies ``Host``/``Match`` blocks, first value wins, tokens).
OpenSSH's rules applied here (ssh(1), ssh_config(5), OpenSSH 9.x):

* the destination name is looked up in ssh_config: ``HostName`` (aliases), ``User``, ``Port``,
  ``IdentityFile`` (all of them, after ``-i``), ``IdentitiesOnly``, ``IdentityAgent``,
  ``HostKeyAlias``, ``UserKnownHostsFile``, ``GlobalKnownHostsFile``, ``ProxyJump``;
  command-line values (the inventory's) win over the file's;
* default identities (``~/.ssh/id_*``) are tried only when no identity file is given; keys of the
  ssh-agent (``SSH_AUTH_SOCK``) are tried unless ``IdentitiesOnly yes`` or ``IdentityAgent none``;
* the jump hosts come from ``orch_jump_host``, else ``ansible_ssh_common_args`` (``-J`` / ``-o
  ProxyJump``: command line), else ssh_config's ``ProxyJump``; ``none`` means none. Options on
  the command line apply to the destination, not to the jump hosts: each hop is looked up in
  ssh_config by its own name (its ``HostName``, ``User``, ``Port``, ``IdentityFile``...), and the
  first hop's own ``ProxyJump`` is followed (a hop naming itself is its own end, as with
  ``Host * / ProxyJump bastion``);
* ``ProxyCommand`` is not supported (orch would not see the jump host's key): refused by name.

orch's own settings are never taken from ssh_config: the host-key policy (``StrictHostKeyChecking``
is ignored; orch always verifies, ``--accept-new-host-keys`` adds unknown keys) and timeouts.
Pure: no I/O (the SSHConfig object is given).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..inventory.ssh_args import JumpHop, SSHArgsError, parse_proxy_jump, parse_ssh_common_args
from ..inventory.variables import var
from .base import ConnectError
from .known_hosts import expand_paths, host_key_name

#: OpenSSH's default UserKnownHostsFile and GlobalKnownHostsFile (ssh_config(5)).
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
#: a ProxyJump chain longer than this is a loop in ssh_config
MAX_HOPS = 8


class RouteError(ConnectError):
    """The SSH settings of a host cannot be followed (unsupported ProxyCommand, a ProxyJump loop,
    two jump settings at once, a bad ProxyJump in ~/.ssh/config). The host is reported failed."""


@dataclass(frozen=True)
class Endpoint:
    """One SSH server on the way to a host (a jump host or the host itself).

    ``host``/``port``: what to connect to (``HostName`` resolved); ``user``: login (None: the
    local user); ``key_files``: identity files in the order tried; ``look_for_keys``: also try
    ``~/.ssh/id_*``; ``allow_agent``: also try the ssh-agent's keys; ``key_name``: the name
    looked up in known_hosts (``[host]:port`` off port 22, or ``HostKeyAlias``);
    ``user_known_hosts``: files trusted and written by ``--accept-new-host-keys`` (first one);
    ``global_known_hosts``: files trusted, never written; ``label``: how messages name it.
    """

    host: str
    port: int
    user: str | None
    key_files: tuple[str, ...]
    look_for_keys: bool
    allow_agent: bool
    key_name: str
    user_known_hosts: tuple[str, ...]
    global_known_hosts: tuple[str, ...]
    label: str

    @property
    def known_hosts_files(self) -> tuple[str, ...]:
        """Every file searched for this endpoint's key, user files first."""
        return tuple(dict.fromkeys(self.user_known_hosts + self.global_known_hosts))


@dataclass(frozen=True)
class Route:
    """A host's ``target`` endpoint and the ``hops`` to go through, first hop (connected to
    directly) first; ``jump_source`` says where the hops came from (``orch_jump_host``,
    ``ansible_ssh_common_args`` or ``~/.ssh/config``; None without hops)."""

    target: Endpoint
    hops: tuple[Endpoint, ...] = field(default=())
    jump_source: str | None = None


def resolve_route(name: str, hostvars: Mapping[str, Any], ssh_config) -> Route:
    """The :class:`Route` to inventory host ``name`` from its effective variables ``hostvars``
    and ``ssh_config`` (``paramiko.SSHConfig``). Raises :class:`RouteError` (see there);
    inventory values were validated when the inventory was loaded.
    """
    dest = str(hostvars.get("ansible_host") or name)
    cfg = ssh_config.lookup(dest)
    known = var(hostvars, "orch_known_hosts")
    target = _endpoint(cfg, dest, user=hostvars.get("ansible_user"), port=var(hostvars, "ansible_port"),
                       key=hostvars.get("ansible_ssh_private_key_file"), known_hosts=known, label=None)
    jump_var = hostvars.get("orch_jump_host")
    try:
        common = parse_ssh_common_args(hostvars["ansible_ssh_common_args"]) \
            if hostvars.get("ansible_ssh_common_args") else None
    except SSHArgsError as exc:  # validated at load; a hand-made hostvars may still carry one
        raise RouteError(f"{name}: {exc}") from None
    if jump_var and common:
        raise RouteError(f"{name}: both orch_jump_host ({jump_var}) and ansible_ssh_common_args ({common}) "
                         "set a jump host; keep one")
    if jump_var:
        spec, source = str(jump_var), "orch_jump_host"
    elif common:
        spec, source = common, "ansible_ssh_common_args"
    else:
        spec, source = cfg.get("proxyjump"), "~/.ssh/config"
        if not spec:
            _refuse_proxy_command(name, dest, cfg)
    hops = _parse(spec, name, source) if spec else ()
    if not hops:
        return Route(target)
    key = hostvars.get("orch_jump_private_key_file") if source == "orch_jump_host" else None
    chain = [_hop_endpoint(ssh_config, h, key, known) for h in hops]
    if _same(chain[-1], target):  # "Host * / ProxyJump bastion" looked up for the bastion itself
        return Route(target)
    # the first hop is reached as OpenSSH reaches it: by its own ssh_config entry, ProxyJump included
    while True:
        first = hops[0]
        fcfg = ssh_config.lookup(first.host)
        more = fcfg.get("proxyjump")
        if not more:
            _refuse_proxy_command(name, first.host, fcfg)
            break
        before = tuple(h for h in _parse(more, name, f"~/.ssh/config (Host {first.host})")
                       if not _same(_hop_endpoint(ssh_config, h, None, known), chain[0]))
        if not before:
            break
        if len(chain) + len(before) > MAX_HOPS:
            raise RouteError(f"{name}: more than {MAX_HOPS} jump hosts: ProxyJump in ~/.ssh/config loops "
                             f"(at {first.host}); end it with 'ProxyJump none' on the jump host")
        hops = before + hops
        chain = [_hop_endpoint(ssh_config, h, None, known) for h in before] + chain
    return Route(target, tuple(chain), source)


def _parse(spec: str, name: str, source: str) -> tuple[JumpHop, ...]:
    try:
        return parse_proxy_jump(spec)
    except SSHArgsError as exc:
        raise RouteError(f"{name}: {source}: {exc}") from None


def _refuse_proxy_command(name: str, dest: str, cfg) -> None:
    command = cfg.get("proxycommand")
    if command and command.strip().lower() != "none":
        raise RouteError(f"{name}: ~/.ssh/config sets ProxyCommand for {dest}; orch does not run proxy "
                         "commands (it could not verify the jump host's key): use ProxyJump, or orch_jump_host")


def _same(a: Endpoint, b: Endpoint) -> bool:
    return (a.host.lower(), a.port) == (b.host.lower(), b.port)


def _hop_endpoint(ssh_config, hop: JumpHop, key: str | None, known: str | None) -> Endpoint:
    cfg = ssh_config.lookup(hop.host)
    return _endpoint(cfg, hop.host, user=hop.user, port=hop.port, key=key, known_hosts=known,
                     label=f"jump host {hop}")


def _endpoint(cfg, dest: str, *, user, port, key, known_hosts, label) -> Endpoint:
    host = cfg.get("hostname") or dest
    port = int(port or cfg.get("port") or 22)
    user = str(user) if user else cfg.get("user")
    keys = ([key] if key else []) + list(cfg.get("identityfile") or [])
    keys = tuple(expand_paths(keys))
    only = str(cfg.get("identitiesonly", "no")).lower() == "yes"
    agent = str(cfg.get("identityagent", "")).lower() != "none" and not only
    alias = cfg.get("hostkeyalias")
    user_files = (known_hosts,) if known_hosts else tuple((cfg.get("userknownhostsfile") or "").split()) \
        or DEFAULT_USER_KNOWN_HOSTS
    global_files = tuple((cfg.get("globalknownhostsfile") or "").split()) or DEFAULT_GLOBAL_KNOWN_HOSTS
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    return Endpoint(host=host, port=port, user=user, key_files=keys, look_for_keys=not keys, allow_agent=agent,
                    key_name=alias or host_key_name(host, port),
                    user_known_hosts=tuple(expand_paths(user_files)),
                    global_known_hosts=tuple(expand_paths(global_files)),
                    label=f"{label} ({where})" if label else where)
