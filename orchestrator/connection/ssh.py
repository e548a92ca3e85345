"""SSH connection on Fabric (Paramiko), with verified host keys.

Fabric's ``Connection`` installs Paramiko's ``AutoAddPolicy`` and loads no
known_hosts (fabric #2071, #1804): here we load the known_hosts file ourselves
and pick the policy for a missing key: reject (default) or accept-new, which adds
an unknown key to the file and never replaces a known one. A changed key is
always refused by Paramiko (``BadHostKeyException``).
"""

from __future__ import annotations

import getpass
import os
import socket
import threading

import paramiko

from .base import HostUnreachable, Connection

#: seconds between Paramiko keep-alive packets
KEEPALIVE_S = 10
#: seconds of unacknowledged data after which the link counts as dead (TCP_USER_TIMEOUT)
DEAD_PEER_S = 30


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Accept a host key never seen before and append it to ``known_hosts_path``.

    Same meaning as OpenSSH's ``StrictHostKeyChecking=accept-new``: a host that is
    already listed with another key still fails (Paramiko raises
    ``BadHostKeyException`` before this policy is asked).
    """

    _lock = threading.Lock()

    def __init__(self, known_hosts_path: str):
        self.path = known_hosts_path

    def missing_host_key(self, client, hostname, key):
        with self._lock:
            client.get_host_keys().add(hostname, key.get_name(), key)
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a", encoding="ascii") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHConnection(Connection):
    """A host reached over SSH with Fabric.

    ``host`` is the inventory name (used in messages), ``address``/``port``/``user``
    come from ``ansible_host``/``ansible_port``/``ansible_user``. ``known_hosts`` is the
    file whose keys are trusted (``orch_known_hosts`` or ``~/.ssh/known_hosts``).
    Raises :class:`HostUnreachable` from :meth:`open` on a refused key, failed auth or
    a connect timeout (``connect_timeout`` seconds).
    """

    def __init__(self, host: str, address: str, port: int = 22, user: str | None = None,
                 key_filename: str | None = None, known_hosts: str | None = None,
                 accept_new_host_keys: bool = False, connect_timeout: float = 15.0, **kw):
        super().__init__(host, **kw)
        import fabric

        self.address = address
        self.port = int(port)
        self.known_hosts = os.path.expanduser(known_hosts or "~/.ssh/known_hosts")
        connect_kwargs = {"allow_agent": False, "look_for_keys": key_filename is None,
                          "banner_timeout": connect_timeout, "auth_timeout": connect_timeout}
        if key_filename:
            connect_kwargs["key_filename"] = [os.path.expanduser(key_filename)]
        self._conn = fabric.Connection(address, user=user, port=self.port,
                                       connect_timeout=connect_timeout,
                                       connect_kwargs=connect_kwargs)
        self.login_user = self._conn.user or getpass.getuser()  # as resolved by Fabric (~/.ssh/config)
        if self._conn.gateway:
            # Fabric opens ProxyJump/ProxyCommand hops from ~/.ssh/config with AutoAddPolicy,
            # which would accept any key of the jump host: refuse rather than trust blindly.
            raise HostUnreachable(f"{host}: ~/.ssh/config sets a ProxyJump/ProxyCommand for {address}; orch cannot "
                                  "verify the jump host's key, so it does not use one (connect directly)")
        client = self._conn.client
        # Replace Fabric's AutoAddPolicy: trust only what known_hosts says.
        client._host_keys = paramiko.HostKeys()
        client._system_host_keys = paramiko.HostKeys()
        if os.path.exists(self.known_hosts):
            client.load_host_keys(self.known_hosts)
        policy = AcceptNewPolicy(self.known_hosts) if accept_new_host_keys else paramiko.RejectPolicy()
        client.set_missing_host_key_policy(policy)
        # the lock heartbeat and the cancel watcher run commands from their own threads: one
        # (re)connect at a time, so a dropped link is reopened once, not raced
        self._open_lock = threading.RLock()

    def open(self) -> None:
        """Connect now (otherwise the first command connects) and start keep-alives.
        Thread-safe: concurrent callers wait for one connect."""
        with self._open_lock:
            if self._conn.is_connected:
                return
            self._open()

    def _open(self) -> None:
        try:
            self._conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostUnreachable(
                f"{self.host}: host key for {self.address}:{self.port} CHANGED "
                f"(got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}); refusing to connect. "
                f"If the host was reinstalled, remove its old entry from {self.known_hosts}") from None
        except paramiko.SSHException as exc:
            msg = str(exc)
            if "not found in known_hosts" in msg:
                raise HostUnreachable(
                    f"{self.host}: unknown host key for {self.address}:{self.port} (not in {self.known_hosts}); "
                    "refusing to connect. Add it to known_hosts or run with --accept-new-host-keys") from None
            raise HostUnreachable(f"{self.host}: SSH failed: {msg}") from None
        except (socket.timeout, TimeoutError) as exc:
            raise HostUnreachable(f"{self.host}: connect to {self.address}:{self.port} timed out") from exc
        except OSError as exc:
            raise HostUnreachable(f"{self.host}: cannot reach {self.address}:{self.port}: {exc}") from exc
        self._conn.transport.set_keepalive(KEEPALIVE_S)
        # Keep-alives only send; a peer that vanished (link down, host lost) is noticed by TCP:
        # data unacknowledged for DEAD_PEER_S closes the socket, and the running command ends.
        sock = self._conn.transport.sock
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(DEAD_PEER_S * 1000))
        except (OSError, AttributeError):  # not Linux / not a TCP socket (a proxy command)
            pass

    def _ensure_open(self):
        if not self._conn.is_connected:
            self.open()  # re-checks under the lock

    def _invoke_run(self, command: str, **kwargs):
        self._ensure_open()
        return self._conn.run(command, **kwargs)

    def _put_file(self, local_path: str, remote_path: str) -> None:
        """Upload ``local_path`` to ``remote_path`` over SFTP (as the login user)."""
        self._ensure_open()
        try:
            self._conn.put(local_path, remote=remote_path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(f"{self.host}: upload to {remote_path} failed: {exc}") from exc

    def _get_file(self, remote_path: str, local_path: str) -> None:
        """Download ``remote_path`` to ``local_path`` over SFTP (as the login user)."""
        self._ensure_open()
        try:
            self._conn.get(remote_path, local=local_path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(f"{self.host}: download of {remote_path} failed: {exc}") from exc

    def close(self) -> None:
        self._conn.close()
