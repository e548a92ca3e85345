"""Transports to hosts: SSH (Fabric) and local (Invoke), behind one ``run`` API."""

from __future__ import annotations

from .base import (BecomeFailed, CommandFailed, CommandResult, CommandTimeout, HostUnreachable,
                   PrefixPrinter, Transport, quote_argv)


def connect(name: str, hostvars: dict, *, accept_new_host_keys: bool = False,
            echo_output: bool = False) -> Transport:
    """Build the transport for inventory host ``name`` from its merged variables.

    Reads ``ansible_connection`` (``ssh`` default, or ``local``), ``ansible_host``,
    ``ansible_port``, ``ansible_user``, ``ansible_ssh_private_key_file``,
    ``ansible_become``/``ansible_become_user``/``ansible_become_password``,
    ``orch_known_hosts``, ``orch_connect_timeout`` (s) and ``orch_command_timeout`` (s).
    The SSH transport is opened here so an unreachable host fails at once with
    :class:`HostUnreachable`.
    """
    common = dict(
        become=bool(hostvars.get("ansible_become", False)),
        become_user=hostvars.get("ansible_become_user") or "root",
        become_password=hostvars.get("ansible_become_password"),
        echo=PrefixPrinter(name, enabled=echo_output),
        default_timeout=float(hostvars.get("orch_command_timeout") or 600),
    )
    kind = hostvars.get("ansible_connection") or "ssh"
    if kind == "local":
        from .local import LocalTransport

        return LocalTransport(name, **common)
    if kind not in ("ssh", "paramiko"):
        raise ValueError(f"host {name}: ansible_connection {kind!r} is not supported (ssh or local)")
    from .ssh import SSHTransport

    t = SSHTransport(
        name,
        address=hostvars.get("ansible_host") or name,
        port=int(hostvars.get("ansible_port") or 22),
        user=hostvars.get("ansible_user"),
        key_filename=hostvars.get("ansible_ssh_private_key_file"),
        known_hosts=hostvars.get("orch_known_hosts"),
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout=float(hostvars.get("orch_connect_timeout") or 15),
        **common,
    )
    t.open()
    return t


__all__ = ["connect", "Transport", "CommandResult", "CommandFailed", "BecomeFailed", "CommandTimeout",
           "HostUnreachable", "quote_argv"]
