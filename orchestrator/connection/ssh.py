"""SSH connection on Fabric (Paramiko), with host keys verified on every hop.

Fabric's ``Connection`` installs Paramiko's ``AutoAddPolicy`` and loads no known_hosts (fabric
#2071, #1804), and the jump hosts it opens for a ``ProxyJump`` get the same policy. Here every
SSH server on the way (each jump host, then the host) is a Fabric ``Connection`` built by orch from
a resolved :class:`~orchestrator.connection.route.Route`, with Paramiko's key stores left empty
and :class:`KnownHostsPolicy` deciding every key from the known_hosts files OpenSSH would read
(:mod:`orchestrator.connection.known_hosts`): reject an unknown key (default) or, with
``--accept-new-host-keys``, append it to the user's file; a changed or revoked key, or a host
vouched for only by ``@cert-authority``, is always refused. Jump hosts are chained with Fabric's
own gateway support (each hop's ``direct-tcpip`` channel is the next one's socket).

Files go over SFTP; a server without the SFTP subsystem (a hardened sshd without ``Subsystem
sftp``) gets them over the exec channel instead (``cat``), checked by sha256 at both ends.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import socket
import threading

import paramiko

from ..errors import internal_error
from .base import CommandResult, Connection, HostUnreachable, TransferFailed
from .deadline import clamp
from .known_hosts import (CERT_ONLY, CHANGED, OTHER_TYPES, REVOKED, TRUSTED, UNKNOWN, check_host_key,
                          describe_files, format_line, known_key_types, read_known_hosts)
from .route import Endpoint, Route

#: seconds between Paramiko keep-alive packets
KEEPALIVE_S = 10
#: seconds of unacknowledged data after which the link counts as dead (TCP_USER_TIMEOUT)
DEAD_PEER_S = 30
#: keep-alive requests left unanswered after which the peer counts as dead (OpenSSH's
#: ServerAliveCountMax): a peer whose kernel still acknowledges but whose sshd is frozen
ALIVE_COUNT_MAX = 3
#: bytes per read/write of a transfer over the exec channel
CHUNK = 1 << 16
#: host key algorithms Paramiko may negotiate, by the key type a known_hosts line names
_ALGORITHMS_OF_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}
_ALL_HOST_KEY_ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                            "rsa-sha2-512", "rsa-sha2-256", "ssh-rsa", "ssh-dss")


@internal_error("paramiko raises it from the host key policy inside SSHClient.connect; "
                "SshConnection._open_one turns it into HostUnreachable")
class HostKeyRefused(paramiko.SSHException):
    """Raised by :class:`KnownHostsPolicy` from inside Paramiko's connect; ``str()`` is the
    whole message (host, endpoint, key fingerprint, files searched, what to do)."""


class ServerAlive:
    """OpenSSH's ``ServerAliveInterval``/``ServerAliveCountMax`` for one Paramiko transport.

    Paramiko reads neither from ssh_config, and its own keep-alive (``set_keepalive``) asks for no
    answer, so a peer that stops answering while its kernel still acknowledges (a frozen sshd, a
    middlebox that drops the session but not TCP) is never noticed (paramiko #2463, pyinfra #1336).
    Every ``interval`` s a thread sends the ``keepalive@openssh.com`` global request wanting a
    reply (OpenSSH answers it with a failure, which counts); when none came for ``interval *
    count_max`` s it calls ``on_dead`` and closes the transport, which ends every channel on it
    (the running command fails and the rescue reconnects). Stops when the transport closes or
    :meth:`stop` is called."""

    def __init__(self, transport, interval: float, count_max: int, on_dead=None, name: str = "ssh"):
        self.transport, self.interval, self.count_max = transport, float(interval), int(count_max)
        self.on_dead = on_dead
        self._stop = threading.Event()
        self.dead = False
        self._thread = threading.Thread(target=self._run, name=f"server-alive {name}", daemon=True)

    def start(self) -> "ServerAlive":
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread at its next wake-up (it never closes the transport then)."""
        self._stop.set()

    def _ask(self, answered: threading.Event) -> None:
        try:
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except (paramiko.SSHException, OSError, EOFError):
            return
        answered.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            t = self.transport
            if t is None or not t.is_active():
                return
            answered = threading.Event()
            threading.Thread(target=self._ask, args=(answered,), daemon=True).start()
            if answered.wait(self.interval * self.count_max) or self._stop.is_set() or not t.is_active():
                continue
            self.dead = True
            if self.on_dead is not None:
                self.on_dead()
            t.close()
            return


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Paramiko's missing-key hook, used for EVERY key (orch leaves Paramiko's own stores empty).

    ``endpoint`` says which name to look up (``key_name``) and in which files; ``host`` is the
    inventory host (messages start with it); ``accept_new`` appends a key never seen for the name
    to ``endpoint.user_known_hosts[0]`` (OpenSSH ``StrictHostKeyChecking=accept-new``): never a
    changed or revoked key, and never one of a host listed only under ``@cert-authority``.
    Raises :class:`HostKeyRefused`.
    """

    _lock = threading.Lock()  # one writer of known_hosts at a time in this process

    def __init__(self, endpoint: Endpoint, host: str, accept_new: bool = False):
        self.endpoint = endpoint
        self.host = host
        self.accept_new = accept_new

    def missing_host_key(self, client, hostname, key) -> None:
        ep = self.endpoint
        files = ep.known_hosts_files
        lines, absent = read_known_hosts(files)
        verdict = check_host_key(lines, ep.key_name, key.get_name(), key.get_base64())
        if verdict.status == TRUSTED:
            return
        if verdict.status == UNKNOWN and self.accept_new and ep.user_known_hosts:
            with self._lock:  # another host may have added it meanwhile (a shared jump host)
                lines, absent = read_known_hosts(files)
                verdict = check_host_key(lines, ep.key_name, key.get_name(), key.get_base64())
                if verdict.status == UNKNOWN:
                    path = ep.user_known_hosts[0]
                    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                    with open(path, "a", encoding="ascii") as fh:
                        fh.write(format_line(ep.key_name, key.get_name(), key.get_base64()))
                    return
            if verdict.status == TRUSTED:
                return
        raise HostKeyRefused(self.message(verdict, key, describe_files(files, absent)))

    def message(self, verdict, key, searched: str) -> str:
        """The refusal for ``verdict`` (see :mod:`orchestrator.connection.known_hosts`)."""
        ep = self.endpoint
        got = f"{key.get_name()} {key.fingerprint}"
        where = ", ".join(ln.where for ln in verdict.lines)
        head = f"{self.host}: "
        if verdict.status == CHANGED:
            return (head + f"host key for {ep.label} CHANGED (got {got}; known: {where}); refusing to connect. If "
                    f"the host was reinstalled, remove its old entry from {_files_of(verdict)} (searched {searched})")
        if verdict.status == REVOKED:
            return head + f"host key for {ep.label} ({got}) is REVOKED at {where}; refusing to connect"
        if verdict.status == CERT_ONLY:
            return (head + f"the host key of {ep.label} ({got}) is vouched for only by a @cert-authority line "
                    f"({where}), and host certificates are not supported by orch (Paramiko cannot verify "
                    f"them); refusing to connect. List the host's own public key in {ep.user_known_hosts[0]}, "
                    f"after checking it against its certificate (searched {searched})")
        if verdict.status == OTHER_TYPES:
            types = ", ".join(dict.fromkeys(ln.key_type for ln in verdict.lines))
            return (head + f"{ep.label} presented a {got} key, but known_hosts lists only {types} for "
                    f"{ep.key_name} ({where}); refusing to connect (searched {searched})")
        return (head + f"unknown host key for {ep.label} ({got}); {ep.key_name} is not in {searched}; refusing "
                "to connect. Add it to known_hosts or run with --accept-new-host-keys")


def _files_of(verdict) -> str:
    return ", ".join(dict.fromkeys(ln.path for ln in verdict.lines))


def _key_algorithms(endpoint: Endpoint) -> dict:
    """``disabled_algorithms`` for Paramiko so the server shows a key of a type known_hosts lists
    for it (OpenSSH prefers known types the same way); ``{}`` when none is known."""
    lines, _ = read_known_hosts(endpoint.known_hosts_files)
    allowed = {a for t in known_key_types(lines, endpoint.key_name) for a in _ALGORITHMS_OF_TYPE.get(t, (t,))}
    if not allowed & set(_ALL_HOST_KEY_ALGORITHMS):
        return {}
    return {"keys": [a for a in _ALL_HOST_KEY_ALGORITHMS if a not in allowed]}


class SSHConnection(Connection):
    """A host reached over SSH with Fabric, directly or through jump hosts.

    ``host`` is the inventory name (used in messages); ``route`` (from
    :func:`orchestrator.connection.route.resolve_route`) says where to connect, as whom, with
    which keys, through which jump hosts, and which known_hosts files to trust.
    ``connect_timeout`` (seconds) bounds the TCP connect, the banner, the authentication and a jump
    host's channel to the next hop. Raises :class:`HostUnreachable` from :meth:`open` on a refused
    key, failed authentication, a jump host that cannot reach the next hop, or a timeout.
    """

    def __init__(self, host: str, route: Route, accept_new_host_keys: bool = False, connect_timeout: float = 15.0,
                 **kw):
        super().__init__(host, **kw)
        self.route = route
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self._alive: dict[int, ServerAlive] = {}  # id(Fabric connection) -> its watchdog
        self._hops = []
        gateway = None
        for ep in route.hops:
            gateway = self._fabric(ep, gateway, hop=True)
            self._hops.append(gateway)
        self._conn = self._fabric(route.target, gateway, hop=False)
        self.login_user = self._conn.user  # as resolved (inventory, ~/.ssh/config, else the local user)
        self._no_sftp: str | None = None  # why SFTP is unavailable, once seen
        # the lock heartbeat and the cancel watcher run commands from their own threads: one
        # (re)connect at a time, so a dropped link is reopened once, not raced
        self._open_lock = threading.RLock()

    def _fabric(self, ep: Endpoint, gateway, hop: bool):
        """A Fabric Connection for ``ep`` that resolves nothing itself (empty SSHConfig: the route
        is resolved already) and asks :class:`KnownHostsPolicy` about every key."""
        import fabric

        t = self.connect_timeout
        kwargs = {"allow_agent": ep.allow_agent, "look_for_keys": ep.look_for_keys, "banner_timeout": t,
                  "auth_timeout": t}
        keys = [k for k in ep.key_files if os.path.exists(k)]
        if keys:
            kwargs["key_filename"] = keys
        algorithms = _key_algorithms(ep)
        if algorithms:
            kwargs["disabled_algorithms"] = algorithms
        if hop:
            kwargs["channel_timeout"] = t  # the channel to the next hop: not the 1 h default
        conn = fabric.Connection(ep.host, user=ep.user, port=ep.port, connect_timeout=t,
                                 config=fabric.Config(ssh_config=paramiko.SSHConfig()),
                                 gateway=gateway if gateway is not None else False, connect_kwargs=kwargs)
        client = conn.client
        client._host_keys = paramiko.HostKeys()  # nothing decided by Paramiko: every key goes to the policy
        client._system_host_keys = paramiko.HostKeys()
        client.set_missing_host_key_policy(KnownHostsPolicy(ep, self.host, self.accept_new_host_keys))
        return conn

    @property
    def address(self) -> str:
        """``host:port`` of the host itself (after ~/.ssh/config aliases)."""
        return self.route.target.label

    @property
    def hostname(self) -> str:
        """The host's name or address as SSH connects to it (``HostName`` of an alias resolved)."""
        return self.route.target.host

    def open(self) -> None:
        """Connect now (otherwise the first command connects) through every jump host, and start
        keep-alives. Thread-safe: concurrent callers wait for one connect."""
        with self._open_lock:
            if self._conn.is_connected:
                return
            for ep, conn in zip(self.route.hops, self._hops):
                if not conn.is_connected:
                    self._open_one(ep, conn)
            self._open_one(self.route.target, self._conn)

    def _open_one(self, ep: Endpoint, conn) -> None:
        who = f"{self.host}: {ep.label}"
        try:
            conn.open()
        except HostKeyRefused as exc:
            raise HostUnreachable(str(exc)) from None
        except paramiko.AuthenticationException as exc:
            raise HostUnreachable(self._auth_failed(ep, conn, exc)) from None
        except paramiko.ChannelException as exc:
            raise HostUnreachable(f"{who}: the jump host could not open a connection to it: {exc}") from None
        except paramiko.SSHException as exc:
            msg = str(exc)
            if "no acceptable host key" in msg:
                lines, absent = read_known_hosts(ep.known_hosts_files)
                types = ", ".join(known_key_types(lines, ep.key_name))
                raise HostUnreachable(
                    f"{who}: the server offers none of the host key types known_hosts lists for {ep.key_name} "
                    f"({types}); refusing to connect (searched "
                    f"{describe_files(ep.known_hosts_files, absent)})") from None
            if "No authentication methods available" in msg:  # Paramiko found no key to offer at all
                raise HostUnreachable(self._auth_failed(ep, conn, exc)) from None
            raise HostUnreachable(f"{who}: SSH failed: {msg}") from None
        except (socket.timeout, TimeoutError) as exc:
            raise HostUnreachable(f"{who}: connect timed out after {self.connect_timeout} s") from exc
        except OSError as exc:
            raise HostUnreachable(f"{who}: cannot reach it: {exc}") from exc
        conn.transport.set_keepalive(KEEPALIVE_S)
        # Paramiko's keep-alives want no answer: ServerAlive asks for one and closes a silent link
        old = self._alive.pop(id(conn), None)
        if old is not None:
            old.stop()
        self._alive[id(conn)] = ServerAlive(conn.transport, KEEPALIVE_S, ALIVE_COUNT_MAX, name=who).start()
        # Keep-alives only send; a peer that vanished (link down, host lost) is noticed by TCP:
        # data unacknowledged for DEAD_PEER_S closes the socket, and the running command ends.
        # (Behind a jump host the socket is the first hop's: a lost hop ends every channel.)
        sock = conn.transport.sock
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(DEAD_PEER_S * 1000))
        except (OSError, AttributeError):  # not Linux / not a TCP socket (a channel through a jump host)
            pass

    def _auth_failed(self, ep: Endpoint, conn, exc) -> str:
        """Why a login was refused: the user, and the keys offered (files, agent, defaults)."""
        tried = [k for k in ep.key_files if os.path.exists(k)]
        missing = [k for k in ep.key_files if not os.path.exists(k)]
        agent = ep.allow_agent and os.environ.get("SSH_AUTH_SOCK")
        how = ", ".join(filter(None, [", ".join(tried), "the ssh-agent" if agent else "",
                                      "~/.ssh/id_*" if ep.look_for_keys else ""])) or "no key"
        return (f"{self.host}: {ep.label}: authentication failed as {conn.user} (tried {how}"
                + (f"; not found: {', '.join(missing)}" if missing else "") + f"): {exc}")

    def _ensure_open(self):
        if not self._conn.is_connected:
            self.open()  # re-checks under the lock

    def _invoke_run(self, command: str, **kwargs):
        self._ensure_open()
        return self._conn.run(command, **kwargs)

    # --- file transfer: SFTP, else the exec channel ------------------------------------------

    def _lost(self) -> bool:
        t = self._conn.transport
        return t is None or not t.is_active()

    def _sftp(self):
        """Fabric's SFTP client, or None when the server refuses the SFTP subsystem (remembered
        for this connection). Raises :class:`HostUnreachable` when the link itself is gone."""
        if self._no_sftp is None:
            cached = getattr(self._conn, "_sftp", None)  # Fabric 3 keeps one SFTP client per Connection
            chan = cached.get_channel() if cached is not None else None
            if cached is not None and (chan is None or chan.closed or chan.get_transport() is not self._conn.transport):
                # opened on a transport that has since dropped and been reconnected: open a new one
                self._conn._sftp = None
            try:
                return self._conn.sftp()
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if self._lost():
                    raise HostUnreachable(f"{self.host}: connection lost opening SFTP: {exc}") from exc
                self._no_sftp = str(exc) or type(exc).__name__
                self.echo(f"no SFTP on this host ({self._no_sftp}): copying files over the exec channel")
        return None

    def _put_file(self, local_path: str, remote_path: str) -> None:
        """Upload ``local_path`` to ``remote_path`` as the login user: over SFTP, else (no SFTP
        subsystem) as ``cat > PATH`` with the bytes on stdin, then checked with ``sha256sum``.
        Raises :class:`HostUnreachable` when the link drops, :class:`TransferFailed` otherwise."""
        self._ensure_open()
        sftp = self._sftp()
        if sftp is None:
            self._exec_put(local_path, remote_path)
            return
        try:
            self._conn.put(local_path, remote=remote_path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if self._lost():
                raise HostUnreachable(f"{self.host}: connection lost uploading to {remote_path}: {exc}") from exc
            raise TransferFailed(f"{self.host}: upload to {remote_path} failed: {exc}") from exc

    def _get_file(self, remote_path: str, local_path: str) -> None:
        """Download ``remote_path`` to ``local_path`` as the login user: over SFTP, else (no SFTP
        subsystem) as ``cat PATH``, checked with ``sha256sum``. Raises as :meth:`_put_file`."""
        self._ensure_open()
        sftp = self._sftp()
        if sftp is None:
            self._exec_get(remote_path, local_path)
            return
        try:
            self._conn.get(remote_path, local=local_path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if self._lost():
                raise HostUnreachable(f"{self.host}: connection lost downloading {remote_path}: {exc}") from exc
            raise TransferFailed(f"{self.host}: download of {remote_path} failed: {exc}") from exc

    def _exec(self, command: str, timeout: float):
        try:
            chan = self._conn.transport.open_session(timeout=timeout)
            chan.settimeout(timeout)
            chan.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(f"{self.host}: connection lost: {exc}") from exc
        return chan

    def _finish(self, chan, command: str, timeout: float, what: str) -> None:
        """Wait for ``chan``'s exit status; raise :class:`TransferFailed` with the command's stderr
        when it is not 0, :class:`HostUnreachable` when the link dropped first."""
        if not chan.status_event.wait(timeout):
            chan.close()
            raise TransferFailed(f"{self.host}: {what}: no answer within {timeout} s")
        err = b""
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(CHUNK)
        status = chan.recv_exit_status()
        chan.close()
        if status == -1 and self._lost():
            raise HostUnreachable(f"{self.host}: connection lost during {what}")
        if status != 0:
            tail = err.decode("utf-8", "replace").strip()
            raise TransferFailed(f"{self.host}: {what} failed (exit {status}): {command}"
                                 + (f"\n{tail}" if tail else ""),
                                 CommandResult(command, status, "", err.decode("utf-8", "replace")))

    def _exec_put(self, local_path: str, remote_path: str) -> None:
        timeout = clamp(self.default_timeout) or 600.0
        command = "cat > " + shlex.quote(remote_path)
        digest = hashlib.sha256()
        chan = self._exec(command, timeout)
        try:
            with open(local_path, "rb") as fh:
                for chunk in iter(lambda: fh.read(CHUNK), b""):
                    digest.update(chunk)
                    chan.sendall(chunk)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command ended early (it reports why below) or the link dropped (as well)
        self._finish(chan, command, timeout, f"upload to {remote_path} over the exec channel")
        self._same_bytes(remote_path, digest.hexdigest(), "upload")

    def _exec_get(self, remote_path: str, local_path: str) -> None:
        timeout = clamp(self.default_timeout) or 600.0
        command = "cat -- " + shlex.quote(remote_path)
        digest = hashlib.sha256()
        chan = self._exec(command, timeout)
        try:
            with open(local_path, "wb") as fh:
                for chunk in iter(lambda: chan.recv(CHUNK), b""):
                    digest.update(chunk)
                    fh.write(chunk)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            chan.close()
            if self._lost():
                raise HostUnreachable(f"{self.host}: connection lost downloading {remote_path}: {exc}") from exc
            raise TransferFailed(f"{self.host}: download of {remote_path} over the exec channel failed: {exc}") \
                from exc
        self._finish(chan, command, timeout, f"download of {remote_path} over the exec channel")
        self._same_bytes(remote_path, digest.hexdigest(), "download")

    def _same_bytes(self, remote_path: str, want: str, what: str) -> None:
        res = self.run(["sha256sum", "--", remote_path], check=False, timeout=120)
        got = res.stdout.split()[:1]
        if not res.ok or got != [want]:
            raise TransferFailed(f"{self.host}: {what} of {remote_path} over the exec channel: sha256 differs "
                                 f"(controller {want}, host {got[0] if got else res.stderr.strip() or '?'})")

    def close(self) -> None:
        for alive in self._alive.values():
            alive.stop()
        self._alive.clear()
        self._conn.close()
        for conn in reversed(self._hops):  # Fabric closes no gateway itself
            conn.close()
