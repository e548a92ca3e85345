"""Connections to hosts: SSH (Fabric) and local (Invoke), behind one ``run`` API."""

from __future__ import annotations

from ..inventory.variables import var
from .base import (BecomeFailed, CommandFailed, CommandResult, CommandTimeout, ConnectError, Connection,
                   HostUnreachable, PrefixPrinter, quote_argv)


def connect(name: str, hostvars: dict, *, accept_new_host_keys: bool = False,
            echo_output: bool = False) -> Connection:
    """Build the connection for inventory host ``name`` from its merged variables.

    Reads ``ansible_connection`` (``ssh`` or ``local``), ``ansible_host``,
    ``ansible_port``, ``ansible_user``, ``ansible_ssh_private_key_file``,
    ``ansible_become``/``ansible_become_user``/``ansible_become_password``,
    ``orch_known_hosts``, ``orch_connect_timeout`` (s) and ``orch_command_timeout`` (s); absent
    ones take their defaults from the variable table (:data:`orchestrator.inventory.KNOWN_VARS`).
    The SSH connection is opened here so an unreachable host fails at once with
    :class:`HostUnreachable`.
    """
    common = dict(
        become=bool(var(hostvars, "ansible_become")),
        become_user=var(hostvars, "ansible_become_user"),
        become_password=hostvars.get("ansible_become_password"),
        echo=PrefixPrinter(name, enabled=echo_output),
        default_timeout=float(var(hostvars, "orch_command_timeout")),
    )
    if var(hostvars, "ansible_connection") == "local":
        from .local import LocalConnection

        return LocalConnection(name, **common)
    from .ssh import SSHConnection

    conn = SSHConnection(
        name,
        address=hostvars.get("ansible_host") or name,
        port=int(var(hostvars, "ansible_port")),
        user=hostvars.get("ansible_user"),
        key_filename=hostvars.get("ansible_ssh_private_key_file"),
        known_hosts=var(hostvars, "orch_known_hosts"),
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout=float(var(hostvars, "orch_connect_timeout")),
        **common,
    )
    conn.open()
    return conn


__all__ = ["connect", "Connection", "CommandResult", "CommandFailed", "BecomeFailed", "CommandTimeout",
           "ConnectError", "HostUnreachable", "quote_argv"]
