"""The OpenSSH options orch reads from an inventory: ``ansible_ssh_common_args`` and ProxyJump specs.

Ansible passes ``ansible_ssh_common_args`` to the ``ssh`` command line; orch connects with
Paramiko, which reads no command line, so it understands exactly one thing there: the jump host
(``-J SPEC``, ``-JSPEC``, ``-o ProxyJump=SPEC``, ``-oProxyJump=SPEC``, ``-o "ProxyJump SPEC"``;
the option name in any case, as ``ssh -o`` takes it). Every other option is refused with a
message saying what to use instead, never ignored: an option that orch dropped silently (say
``-o StrictHostKeyChecking=no`` or ``-o Port=2222``) would make orch behave differently from
the ``ssh`` the operator tested with.

A ProxyJump SPEC is OpenSSH's (ssh_config(5) ``ProxyJump``, ssh(1) ``-J``): hops separated by
commas, each ``[user@]host[:port]`` or ``ssh://[user@]host[:port]``, an IPv6 address in
brackets (``[fd00::1]:22``); the first hop is connected to first. ``none`` means no jump host.

Pure functions (no I/O); the connection (:mod:`orchestrator.connection.route`) uses the result.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ..errors import internal_error

#: Host names and IPv4 addresses (RFC 1123 labels, plus ``_`` which ssh_config aliases allow).
_HOST = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?$")
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?$")
#: Login names (POSIX portable user names, plus ``$`` that Samba machine accounts end with).
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$")

#: Options people put into ansible_ssh_common_args, and where orch takes that setting from.
_INSTEAD = {
    "proxycommand": "orch reaches jump hosts through ProxyJump only (-J, ProxyJump in ~/.ssh/config, "
                    "or orch_jump_host)",
    "stricthostkeychecking": "orch always verifies host keys; use --accept-new-host-keys to add unknown ones",
    "userknownhostsfile": "set orch_known_hosts",
    "globalknownhostsfile": "orch reads /etc/ssh/ssh_known_hosts, or GlobalKnownHostsFile in ~/.ssh/config",
    "port": "set ansible_port",
    "user": "set ansible_user",
    "identityfile": "set ansible_ssh_private_key_file",
    "connecttimeout": "set orch_connect_timeout",
}


@internal_error("orchestrator.inventory.variables turns it into BadValue, the loader into an "
                "InventoryError naming the file and line")
class SSHArgsError(ValueError):
    """An option orch does not support, or a malformed value; ``str()`` is the whole message."""


@dataclass(frozen=True)
class JumpHop:
    """One jump host of a ProxyJump spec: ``user`` and ``port`` are None when not written
    (then ~/.ssh/config, else the local user / port 22, decide, as with OpenSSH)."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


def parse_proxy_jump(text: str) -> tuple[JumpHop, ...]:
    """Parse an OpenSSH ProxyJump spec into hops, first hop first; ``()`` for ``none``.

    ``"admin@login1:2222,login2"`` -> ``(JumpHop("login1", "admin", 2222), JumpHop("login2"))``.
    Rule from ssh_config(5) ``ProxyJump`` (OpenSSH 9.x: ``parse_ssh_uri``/``parse_user_host_port``:
    the user ends at the last ``@``). Raises :class:`SSHArgsError` for an empty hop, a bad port
    (1-65535), or a host or user with characters no host name or login has (spaces, quotes, ``;``,
    ``$(``...): such a value never reaches any command line.
    """
    if not isinstance(text, str) or not text.strip():
        raise SSHArgsError("a ProxyJump spec must be a non-empty string like 'user@bastion:22'")
    text = text.strip()
    if text.lower() == "none":
        return ()
    hops = []
    for part in text.split(","):
        hops.append(_parse_hop(part.strip(), text))
    return tuple(hops)


def _parse_hop(part: str, whole: str) -> JumpHop:
    where = f"in ProxyJump {whole!r}"
    if not part:
        raise SSHArgsError(f"empty jump host {where}")
    rest = part[len("ssh://"):] if part.lower().startswith("ssh://") else part
    user = None
    if "@" in rest:
        user, _, rest = rest.rpartition("@")
        if not _USER.match(user):
            raise SSHArgsError(f"bad user name {user!r} {where}")
    port = None
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not _IPV6.match(host):
            raise SSHArgsError(f"bad bracketed address {rest!r} {where}")
        if tail:
            if not tail.startswith(":"):
                raise SSHArgsError(f"bad jump host {part!r} {where}")
            port = _port(tail[1:], where)
    else:
        host, sep, tail = rest.partition(":")
        if sep:
            port = _port(tail, where)
        if not _HOST.match(host):
            raise SSHArgsError(f"bad host name {host!r} {where}")
    return JumpHop(host=host, user=user, port=port)


def _port(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise SSHArgsError(f"bad port {text!r} {where} (an integer 1-65535)")
    return int(text)


def parse_ssh_common_args(text: str) -> str | None:
    """The ProxyJump spec in an ``ansible_ssh_common_args`` string, or None when it sets none.

    The string is split as a shell would (``shlex``; Ansible does the same). Accepted: ``-J SPEC``,
    ``-JSPEC``, ``-o ProxyJump=SPEC``, ``-oProxyJump=SPEC``, ``-o 'ProxyJump SPEC'`` (option name
    in any case), once; SPEC is checked with :func:`parse_proxy_jump` (``none`` is returned as
    ``"none"``: no jump host, overriding ~/.ssh/config). Raises :class:`SSHArgsError` naming the
    first option orch does not support (and where orch takes that setting from), a second jump
    option, a bare word, or unbalanced quotes.
    """
    if not isinstance(text, str):
        raise SSHArgsError("ansible_ssh_common_args must be a string")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise SSHArgsError(f"ansible_ssh_common_args: cannot split {text!r}: {exc}") from None
    found: str | None = None
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-J", "-o"):
            if i + 1 >= len(words):
                raise SSHArgsError(f"ansible_ssh_common_args: {word} needs a value")
            value, i = words[i + 1], i + 2
        elif word.startswith(("-J", "-o")) and len(word) > 2:
            word, value, i = word[:2], word[2:], i + 1
        else:
            raise SSHArgsError(
                f"ansible_ssh_common_args: unsupported {word!r}: orch reads only the jump host from it "
                "(-J SPEC or -o ProxyJump=SPEC)")
        if word == "-o":
            key, value = _split_option(value)
            if key.lower() != "proxyjump":
                hint = _INSTEAD.get(key.lower())
                raise SSHArgsError(
                    f"ansible_ssh_common_args: unsupported option -o {key}: orch reads only the jump host "
                    "from it (-J SPEC or -o ProxyJump=SPEC)" + (f"; {hint}" if hint else ""))
        if found is not None:
            raise SSHArgsError("ansible_ssh_common_args: the jump host is given twice; give -J or "
                               "-o ProxyJump once")
        parse_proxy_jump(value)
        found = value.strip()
    return found


def _split_option(value: str) -> tuple[str, str]:
    """``Key=Value`` or ``Key Value`` (ssh -o) -> (key, value). Raises :class:`SSHArgsError`."""
    m = re.match(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*(?:=\s*|\s+)(.*?)\s*$", value, re.S)
    if not m or not m.group(2):
        raise SSHArgsError(f"ansible_ssh_common_args: -o {value!r} is not 'Option=value'")
    return m.group(1), m.group(2)
