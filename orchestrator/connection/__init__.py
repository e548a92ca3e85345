"""Connections to hosts: SSH (Fabric) and local (Invoke), behind one ``run`` API."""

from __future__ import annotations

from ..inventory.variables import var
from .base import (BecomeFailed, CommandFailed, CommandResult, CommandTimeout, ConnectError, Connection,
                   HostUnreachable, LinkLost, PrefixPrinter, TransferFailed, quote_argv)


def connect(name: str, hostvars: dict, *, accept_new_host_keys: bool = False,
            echo_output: bool = False, remember_host_keys: bool = True) -> Connection:
    """Build the connection for inventory host ``name`` from its merged variables.

    Reads ``ansible_connection`` (``ssh`` or ``local``), ``ansible_host``, ``ansible_port``,
    ``ansible_user``, ``ansible_ssh_private_key_file``, ``ansible_ssh_common_args`` (its jump
    host), ``orch_jump_host``/``orch_jump_private_key_file``,
    ``ansible_become``/``ansible_become_user``/``ansible_become_password``,
    ``orch_known_hosts``, ``orch_connect_timeout`` (s), ``orch_command_timeout`` (s),
    ``orch_ssh_max_handshakes`` and ``orch_ssh_max_sessions``; absent
    ones take their defaults from the variable table (:data:`orchestrator.inventory.KNOWN_VARS`),
    and for SSH what ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` say, as OpenSSH would
    (:func:`orchestrator.connection.route.resolve_route`). The SSH connection is opened here so
    an unreachable host fails at once with :class:`HostUnreachable`; settings orch cannot follow
    raise :class:`~orchestrator.connection.route.RouteError`. ``remember_host_keys`` False (check
    mode): a key ``accept_new_host_keys`` accepts is trusted for this run and written nowhere.
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
    import fabric

    from .route import resolve_route
    from .ssh import SSHConnection

    # Fabric's Config reads ~/.ssh/config then /etc/ssh/ssh_config (first value wins, as in OpenSSH)
    route = resolve_route(name, hostvars, fabric.Config().base_ssh_config)
    conn = SSHConnection(name, route, accept_new_host_keys=accept_new_host_keys, remember_host_keys=remember_host_keys,
                         connect_timeout=float(var(hostvars, "orch_connect_timeout")),
                         max_handshakes=int(var(hostvars, "orch_ssh_max_handshakes")),
                         max_sessions=int(var(hostvars, "orch_ssh_max_sessions")), **common)
    conn.open()
    return conn


__all__ = ["connect", "Connection", "CommandResult", "CommandFailed", "BecomeFailed", "CommandTimeout",
           "ConnectError", "HostUnreachable", "LinkLost", "TransferFailed", "quote_argv"]
