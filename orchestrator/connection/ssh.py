"""SSH connection on Fabric (Paramiko), with host keys verified on every hop.

Fabric's ``Connection`` installs Paramiko's ``AutoAddPolicy`` and loads no known_hosts (fabric
#2071, #1804), and the jump hosts it opens for a ``ProxyJump`` get the same policy. Here every
SSH server on the way (each jump host, then the host) is a Fabric ``Connection`` built by orch from
a resolved :class:`~orchestrator.connection.route.Route`, with Paramiko's key stores left empty
and :class:`KnownHostsPolicy` deciding every key from the known_hosts files OpenSSH would read
(:mod:`orchestrator.connection.known_hosts`): reject an unknown key (default) or, with
``--accept-new-host-keys``, append it to the user's file; a changed or revoked key, or a host
vouched for only by ``@cert-authority``, is always refused. Jump hosts are chained with
``direct-tcpip`` channels (each hop's channel is the next one's socket). A jump host is logged in
to once per process and shared (:class:`_SharedHop`): every host behind it opens its channel over
that one connection, so a fleet behind one bastion costs the bastion one login, not one per host
(sshd's ``MaxStartups`` drops logins past 10 at once: paramiko #664, fabric #1992). Handshakes in
flight to one server are bounded and a dropped one is retried, sessions on one connection are
bounded (:mod:`orchestrator.connection.handshake`).

Files go over SFTP; a server without the SFTP subsystem (a hardened sshd without ``Subsystem
sftp``) gets them over the exec channel instead (``cat``), checked by sha256 at both ends.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shlex
import socket
import threading
import time
from contextlib import contextmanager

import paramiko

from ..errors import internal_error
from .base import CommandResult, CommandTimeout, ConnectError, Connection, HostUnreachable, LinkLost, TransferFailed
from .deadline import clamp
from .handshake import (HandshakeGate, SessionSlots, handshake_retrying, is_handshake_drop, is_session_refused,
                        session_retrying)
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
                "SSHConnection._login turns it into HostUnreachable")
class HostKeyRefused(paramiko.SSHException):
    """Raised by :class:`KnownHostsPolicy` from inside Paramiko's connect; ``str()`` is the
    whole message (host, endpoint, key fingerprint, files searched, what to do)."""


@internal_error("SSHConnection._handshake raises it for a server that sent no banner; "
                "SSHConnection._login turns it into HostUnreachable")
class NoBanner(paramiko.SSHException):
    """The server accepted the TCP connection and sent no SSH banner before the connect timeout
    (Paramiko then reports only ``No existing session``); ``str()`` is the whole message."""


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
    changed or revoked key, and never one of a host listed only under ``@cert-authority``. With
    ``remember`` False (check mode: it changes nothing, the controller's files included) such a
    key is trusted for the life of this process only and no file is written. What was accepted
    is said in :attr:`notes` (one line each), which the ``connect`` task shows.
    Raises :class:`HostKeyRefused`.
    """

    _lock = threading.Lock()  # one writer of known_hosts at a time in this process
    #: (name, key type, base64) of keys accepted in check mode: trusted until the process ends
    _this_run: set[tuple[str, str, str]] = set()

    def __init__(self, endpoint: Endpoint, host: str, accept_new: bool = False, remember: bool = True):
        self.endpoint = endpoint
        self.host = host
        self.accept_new = accept_new
        self.remember = remember
        self.notes: list[str] = []

    def missing_host_key(self, client, hostname, key) -> None:
        ep = self.endpoint
        files = ep.known_hosts_files
        lines, absent = read_known_hosts(files)
        verdict = check_host_key(lines, ep.key_name, key.get_name(), key.get_base64())
        if verdict.status == TRUSTED:
            return
        seen = (ep.key_name, key.get_name(), key.get_base64())
        if verdict.status == UNKNOWN and seen in self._this_run:
            return  # accepted earlier in this check-mode run
        if verdict.status == UNKNOWN and self.accept_new and ep.user_known_hosts:
            with self._lock:  # another host may have added it meanwhile (a shared jump host)
                lines, absent = read_known_hosts(files)
                verdict = check_host_key(lines, ep.key_name, key.get_name(), key.get_base64())
                if verdict.status == UNKNOWN:
                    path = ep.user_known_hosts[0]
                    what = f"the new host key of {ep.label} ({key.get_name()} {key.fingerprint})"
                    if not self.remember:
                        self._this_run.add(seen)
                        self.notes.append(f"check mode: accepted {what} for this run only; {path} is not "
                                          "written (run without --check to remember it)")
                        return
                    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                    with open(path, "a", encoding="ascii") as fh:
                        fh.write(format_line(ep.key_name, key.get_name(), key.get_base64()))
                    self.notes.append(f"added {what} to {path}")
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


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


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


def _fabric(ep: Endpoint, connect_timeout: float, policy: "KnownHostsPolicy", hop: bool):
    """A Fabric Connection for ``ep`` that resolves nothing itself (empty SSHConfig: the route is
    resolved already), has no gateway (orch hands it its socket: a jump host's channel) and asks
    ``policy`` about every key."""
    import fabric

    t = connect_timeout
    kwargs = {"allow_agent": ep.allow_agent, "look_for_keys": ep.look_for_keys, "banner_timeout": t,
              "auth_timeout": t}
    keys = [k for k in ep.key_files if os.path.exists(k)]
    if keys:
        kwargs["key_filename"] = keys
    algorithms = _key_algorithms(ep)
    if algorithms:
        kwargs["disabled_algorithms"] = algorithms
    if hop:
        kwargs["channel_timeout"] = t  # channels to the next hops: not the 1 h default
    conn = fabric.Connection(ep.host, user=ep.user, port=ep.port, connect_timeout=t,
                             config=fabric.Config(ssh_config=paramiko.SSHConfig()), gateway=False,
                             connect_kwargs=kwargs)
    client = conn.client
    client._host_keys = paramiko.HostKeys()  # nothing decided by Paramiko: every key goes to the policy
    client._system_host_keys = paramiko.HostKeys()
    client.set_missing_host_key_policy(policy)
    return conn


def _watch(conn, who: str) -> ServerAlive:
    """Keep-alives on ``conn``'s fresh transport: Paramiko's own, :class:`ServerAlive` (which
    wants an answer and closes a silent link), and TCP's dead-peer timeout on a real socket."""
    conn.transport.set_keepalive(KEEPALIVE_S)
    alive = ServerAlive(conn.transport, KEEPALIVE_S, ALIVE_COUNT_MAX, name=who).start()
    # Keep-alives only send; a peer that vanished (link down, host lost) is noticed by TCP:
    # data unacknowledged for DEAD_PEER_S closes the socket, and the running command ends.
    # (Behind a jump host the socket is the first hop's: a lost hop ends every channel.)
    sock = conn.transport.sock
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(DEAD_PEER_S * 1000))
    except (OSError, AttributeError):  # not Linux / not a TCP socket (a channel through a jump host)
        pass
    return alive


def _gate_key(chain: tuple[Endpoint, ...]) -> tuple:
    """The :class:`~orchestrator.connection.handshake.HandshakeGate` key of the last server of
    ``chain`` (jump hosts first): its address and port as reached through the ones before it."""
    return tuple((e.host.lower(), e.port) for e in chain)


class _SharedHop:
    """One login to a jump host, shared by every :class:`SSHConnection` of this process whose
    route goes through it: each host behind it opens its ``direct-tcpip`` channel over this one
    transport, so N hosts behind a bastion cost the bastion one login, not N at once (sshd's
    ``MaxStartups`` drops the ones past 10: paramiko #664, fabric #1992). ``direct-tcpip``
    channels are not sessions: sshd's ``MaxSessions`` does not count them (sshd_config(5)).

    Keyed by the whole chain up to it (each :class:`Endpoint`: address, port, user, key files,
    known_hosts files), ``accept_new`` and the connect timeout, so a connection reuses only a hop
    that was logged in to and whose key was checked exactly as it would have done itself. Opened
    on first use, reopened when its transport died (its :class:`ServerAlive` closes a silent one),
    kept for the life of the process (closed at exit): the find-servers pass and the play of one
    run share it. ``logins`` counts the logins done (tests)."""

    _all: dict[tuple, "_SharedHop"] = {}
    _all_lock = threading.Lock()

    def __init__(self, chain: tuple[Endpoint, ...], via: "_SharedHop | None", accept_new: bool,
                 connect_timeout: float, remember: bool = True):
        self.chain, self.endpoint, self.via = chain, chain[-1], via
        self.policy = KnownHostsPolicy(self.endpoint, "?", accept_new, remember)
        self.conn = _fabric(self.endpoint, connect_timeout, self.policy, hop=True)
        self.gate_key = _gate_key(chain)
        self.connect_timeout = connect_timeout
        self.logins = 0
        self._alive: ServerAlive | None = None
        self._lock = threading.Lock()  # one login at a time; the others wait and reuse it

    @classmethod
    def get(cls, chain: tuple[Endpoint, ...], accept_new: bool, connect_timeout: float,
            remember: bool = True) -> "_SharedHop":
        """The process's shared hop for ``chain`` (made, not opened, on first use); ``remember``:
        as :class:`KnownHostsPolicy`'s."""
        via = cls.get(chain[:-1], accept_new, connect_timeout, remember) if len(chain) > 1 else None
        key = (chain, bool(accept_new), float(connect_timeout), bool(remember))
        with cls._all_lock:
            hop = cls._all.get(key)
            if hop is None:
                hop = cls._all[key] = cls(chain, via, accept_new, connect_timeout, remember)
            return hop

    def open(self, owner: "SSHConnection") -> None:
        """Log in now unless logged in; a failure is raised as :class:`HostUnreachable` naming
        ``owner``'s host (each host waiting on a hop that fails tries it itself, one at a time)."""
        with self._lock:
            if self.conn.is_connected:
                return
            if self._alive is not None:
                self._alive.stop()
            self.policy.host = owner.host  # messages about this hop's key name the host being connected
            owner._login(self.endpoint, self.conn, self.via, self.gate_key)
            self.logins += 1
            self._alive = _watch(self.conn, f"{owner.host}: {self.endpoint.label}")

    def channel(self, owner: "SSHConnection", ep: Endpoint):
        """A ``direct-tcpip`` channel from this hop to ``ep`` (the next hop or the host), logging
        in first when needed; a transport found dead is reopened once. Raises
        ``paramiko.ChannelException`` when the jump host cannot reach ``ep``,
        :class:`HostUnreachable` when the hop itself cannot be logged in to."""
        for again in (True, False):
            self.open(owner)
            try:
                return self.conn.transport.open_channel("direct-tcpip", (ep.host, ep.port), ("", 0),
                                                        timeout=self.connect_timeout)
            except paramiko.ChannelException:
                raise
            except (paramiko.SSHException, EOFError, OSError):
                if not again or self.conn.is_connected:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close the login (every channel through it ends)."""
        if self._alive is not None:
            self._alive.stop()
        self.conn.close()

    @classmethod
    def close_all(cls) -> None:
        """Close every shared hop of the process, last hops first; registered with atexit."""
        with cls._all_lock:
            hops, cls._all = list(cls._all.values()), {}
        for hop in sorted(hops, key=lambda h: -len(h.chain)):
            hop.close()


atexit.register(_SharedHop.close_all)


class SSHConnection(Connection):
    """A host reached over SSH with Fabric, directly or through jump hosts.

    ``host`` is the inventory name (used in messages); ``route`` (from
    :func:`orchestrator.connection.route.resolve_route`) says where to connect, as whom, with
    which keys, through which jump hosts, and which known_hosts files to trust.
    ``connect_timeout`` (seconds) bounds the TCP connect, the banner, the authentication and a jump
    host's channel to the next hop. ``remember_host_keys`` False (check mode): a key
    ``accept_new_host_keys`` accepts is trusted for this process only, no known_hosts file is
    written (:class:`KnownHostsPolicy`); :meth:`host_key_notes` says what was accepted. Jump hosts are :class:`_SharedHop` logins shared with the
    other hosts behind them. ``max_handshakes`` (``orch_ssh_max_handshakes``) bounds the handshakes
    in flight to one server (each jump host, this host) from this process; a handshake the server
    drops before login is retried (:func:`~orchestrator.connection.handshake.handshake_retrying`).
    ``max_sessions`` (``orch_ssh_max_sessions``) bounds the sessions open at once on this
    connection (commands, SFTP); a command that waits past its timeout for one raises
    :class:`CommandTimeout`. Raises :class:`HostUnreachable` from :meth:`open` on a refused key,
    failed authentication, a jump host that cannot reach the next hop, a timeout, or a server that
    dropped every attempt.
    """

    def __init__(self, host: str, route: Route, accept_new_host_keys: bool = False, connect_timeout: float = 15.0,
                 max_handshakes: int = 8, max_sessions: int = 8, remember_host_keys: bool = True, **kw):
        super().__init__(host, **kw)
        self.route = route
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.max_handshakes = int(max_handshakes)
        self.sessions = SessionSlots(max_sessions)
        self._alive: ServerAlive | None = None
        self._via = (_SharedHop.get(route.hops, accept_new_host_keys, connect_timeout, remember_host_keys)
                     if route.hops else None)
        self._policy = KnownHostsPolicy(route.target, host, accept_new_host_keys, remember_host_keys)
        self._conn = _fabric(route.target, connect_timeout, self._policy, hop=False)
        self._gate_key = _gate_key(route.hops + (route.target,))
        self.login_user = self._conn.user  # as resolved (inventory, ~/.ssh/config, else the local user)
        self._no_sftp: str | None = None  # why SFTP is unavailable, once seen
        self._sftp_slot = False  # Fabric keeps its SFTP channel open: one session slot held for it
        # the lock heartbeat and the cancel watcher run commands from their own threads: one
        # (re)connect at a time, so a dropped link is reopened once, not raced
        self._open_lock = threading.RLock()

    def host_key_notes(self, clear: bool = True) -> list[str]:
        """What the host-key checks of this connection's logins accepted (its jump hosts' too)
        since the last call that cleared them, one line each: a key added to known_hosts, or in
        check mode one trusted for this run only. ``clear`` False leaves them for a later call."""
        policies = []
        hop = self._via
        while hop is not None:
            policies.insert(0, hop.policy)
            hop = hop.via
        out: list[str] = []
        for policy in [*policies, self._policy]:
            out += policy.notes
            if clear:
                policy.notes = []
        return out

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
            self._drop_sftp()  # a reconnect: the SFTP channel ended with the old transport
            if self._alive is not None:
                self._alive.stop()
            self._login(self.route.target, self._conn, self._via, self._gate_key)
            self._alive = _watch(self._conn, f"{self.host}: {self.route.target.label}")

    def _login(self, ep: Endpoint, conn, via: _SharedHop | None, gate_key: tuple) -> None:
        """Open Fabric connection ``conn`` to ``ep`` (its socket a channel from ``via``, or TCP),
        holding a slot of ``gate_key``'s handshake gate per attempt and retrying a drop before
        login; every failure raised as :class:`HostUnreachable` with the reason."""
        who = f"{self.host}: {ep.label}"
        gate = HandshakeGate.of(gate_key)

        def note(attempt: int, exc: BaseException, wait_s: float) -> None:
            self.echo(f"{ep.label}: the SSH server closed the connection before login ({_why(exc)}); "
                      f"attempt {attempt + 1} in {wait_s:.1f} s")

        retrying = handshake_retrying(on_retry=note)
        try:
            for attempt in retrying:
                with attempt, gate.slot(self.max_handshakes):
                    self._handshake(ep, conn, via)
        except HostKeyRefused as exc:
            raise HostUnreachable(str(exc)) from None
        except NoBanner as exc:
            # a hung sshd, or a link that went down under the handshake: a later login may succeed
            raise HostUnreachable(str(exc), transient=True) from None
        except paramiko.AuthenticationException as exc:
            raise HostUnreachable(self._auth_failed(ep, conn, exc)) from None
        except paramiko.ChannelException as exc:
            raise HostUnreachable(f"{who}: the jump host could not open a connection to it: {exc}",
                                  transient=True) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if is_handshake_drop(exc):
                raise HostUnreachable(
                    f"{who}: the SSH server closed the connection before login "
                    f"{retrying.statistics.get('attempt_number', 1)} times "
                    f"({_why(exc)}): too many connections at once for its sshd MaxStartups? lower "
                    f"orch_ssh_max_handshakes (now {self.max_handshakes}) or --forks", transient=True) from None
            if isinstance(exc, (socket.timeout, TimeoutError)):
                raise HostUnreachable(f"{who}: connect timed out after {self.connect_timeout} s",
                                      transient=True) from exc
            if isinstance(exc, OSError):
                raise HostUnreachable(f"{who}: cannot reach it: {exc}", transient=True) from exc
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
            raise HostUnreachable(f"{who}: SSH failed: {msg or type(exc).__name__}", transient=True) from None

    def _handshake(self, ep: Endpoint, conn, via: _SharedHop | None) -> None:
        """One attempt: a channel from ``via`` as the socket (else Paramiko's TCP connect), then
        Fabric's open (banner, key exchange, host key check, login). A failed attempt's transport
        and socket are closed before it is raised."""
        if via is not None:
            conn.connect_kwargs["sock"] = via.channel(self, ep)
        began = time.monotonic()
        try:
            conn.open()
        except BaseException as exc:
            transport = conn.client.get_transport()
            silent = (transport is not None and not transport.remote_version
                      and isinstance(exc, paramiko.SSHException) and not is_handshake_drop(exc))
            conn.client.close()
            if silent:  # Paramiko's own words ("No existing session") hide what happened
                waited = time.monotonic() - began
                if waited < 0.9 * self.connect_timeout:  # it ended before the timeout: the link, not a silent sshd
                    raise NoBanner(f"{self.host}: {ep.label}: the connection ended after {waited:.1f} s, before the "
                                   "server sent its SSH banner (the link went down, or the peer closed it)") from exc
                raise NoBanner(f"{self.host}: {ep.label}: the server accepted the TCP connection but sent no SSH "
                               f"banner within {self.connect_timeout:g} s (no SSH server on this port, or a hung "
                               "sshd)") from exc
            raise
        finally:
            conn.connect_kwargs.pop("sock", None)

    def _auth_failed(self, ep: Endpoint, conn, exc) -> str:
        """Why a login was refused: the user, and the keys offered (files, agent, defaults)."""
        tried = [k for k in ep.key_files if os.path.exists(k)]
        missing = [k for k in ep.key_files if not os.path.exists(k)]
        agent = ep.allow_agent and os.environ.get("SSH_AUTH_SOCK")
        how = ", ".join(filter(None, [", ".join(tried), "the ssh-agent" if agent else "",
                                      "~/.ssh/id_*" if ep.look_for_keys else ""])) or "no key"
        return (f"{self.host}: {ep.label}: authentication failed as {conn.user} (tried {how}"
                + (f"; not found: {', '.join(missing)}" if missing else "") + f"): {exc}")

    def reconnect(self, within: float, *, cancel=None, on_retry=None) -> int:
        """Log in again after a lost link (every jump host first, as :meth:`open` does), with
        :func:`orchestrator.connection.reconnect.reconnect`'s bounded backoff for at most
        ``within`` s; returns the attempts made. Raises the last :class:`HostUnreachable`."""
        from .reconnect import reconnect

        return reconnect(self.open, within, cancel=cancel, on_retry=on_retry)

    def _ensure_open(self):
        if not self._conn.is_connected:
            self.open()  # re-checks under the lock

    @contextmanager
    def _session(self, timeout: float | None, what: str):
        """Hold one of ``max_sessions`` session slots for the block, waiting at most ``timeout``
        s; raises :class:`CommandTimeout` past it."""
        try:
            self.sessions.take(timeout)
        except TimeoutError:
            raise CommandTimeout(f"{self.host}: no free SSH session within {timeout} s for {what} "
                                 f"(orch_ssh_max_sessions {self.sessions.limit} in use)") from None
        try:
            yield
        finally:
            self.sessions.give()

    def _invoke_run(self, command: str, **kwargs):
        self._ensure_open()
        with self._session(kwargs.get("timeout"), command):
            try:
                for attempt in session_retrying(alive=lambda: not self._lost()):
                    with attempt:
                        res = self._conn.run(command, **kwargs)
                        if res.exited in (None, -1) and self._lost():
                            # the channel ended with the transport, before any exit status: what
                            # the command did on the host is unknown; it is not a crash of it
                            raise LinkLost(f"{self.host}: connection lost while running "
                                           f"{command[:120]}{'...' if len(command) > 120 else ''}")
                        return res
            except paramiko.SSHException as exc:
                if self._lost():
                    raise LinkLost(f"{self.host}: connection lost: {exc}") from exc
                if not is_session_refused(exc):
                    raise
                raise ConnectError(
                    f"{self.host}: the SSH server refused a session ({exc}): more at once than its sshd "
                    f"MaxSessions? lower orch_ssh_max_sessions (now {self.sessions.limit})") from None

    # --- file transfer: SFTP, else the exec channel ------------------------------------------

    def _lost(self) -> bool:
        t = self._conn.transport
        return t is None or not t.is_active()

    def _sftp(self):
        """Fabric's SFTP client, or None when the server refuses the SFTP subsystem (remembered
        for this connection). Raises :class:`HostUnreachable` when the link itself is gone."""
        if self._no_sftp is None:
            with self._open_lock:  # one SFTP channel (and one slot for it) per transport
                cached = getattr(self._conn, "_sftp", None)  # Fabric 3 keeps one SFTP client per Connection
                chan = cached.get_channel() if cached is not None else None
                if cached is not None and (chan is None or chan.closed
                                           or chan.get_transport() is not self._conn.transport):
                    # opened on a transport that has since dropped and been reconnected: open a new one
                    self._drop_sftp()
                if self._sftp_slot:
                    return self._conn.sftp()
                try:
                    self.sessions.take(clamp(self.default_timeout))
                except TimeoutError:
                    raise CommandTimeout(f"{self.host}: no free SSH session for SFTP within "
                                         f"{clamp(self.default_timeout)} s (orch_ssh_max_sessions "
                                         f"{self.sessions.limit} in use)") from None
                try:
                    sftp = self._conn.sftp()
                except (OSError, EOFError, paramiko.SSHException) as exc:
                    self.sessions.give()
                    if self._lost():
                        raise LinkLost(f"{self.host}: connection lost opening SFTP: {exc}") from exc
                    self._no_sftp = str(exc) or type(exc).__name__
                    self.echo(f"no SFTP on this host ({self._no_sftp}): copying files over the exec channel")
                    return None
                self._sftp_slot = True
                return sftp
        return None

    def _drop_sftp(self) -> None:
        """Forget Fabric's SFTP client (its channel is gone or going) and give its slot back."""
        with self._open_lock:
            if self._conn._sftp is not None:
                try:
                    self._conn._sftp.close()
                except (OSError, EOFError, paramiko.SSHException):
                    pass
                self._conn._sftp = None
            if self._sftp_slot:
                self._sftp_slot = False
                self.sessions.give()

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
                raise LinkLost(f"{self.host}: connection lost uploading to {remote_path}: {exc}") from exc
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
                raise LinkLost(f"{self.host}: connection lost downloading {remote_path}: {exc}") from exc
            raise TransferFailed(f"{self.host}: download of {remote_path} failed: {exc}") from exc

    def _exec(self, command: str, timeout: float):
        try:
            chan = self._conn.transport.open_session(timeout=timeout)
            chan.settimeout(timeout)
            chan.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise LinkLost(f"{self.host}: connection lost: {exc}") from exc
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
            raise LinkLost(f"{self.host}: connection lost during {what}")
        if status != 0:
            tail = err.decode("utf-8", "replace").strip()
            raise TransferFailed(f"{self.host}: {what} failed (exit {status}): {command}"
                                 + (f"\n{tail}" if tail else ""),
                                 CommandResult(command, status, "", err.decode("utf-8", "replace")))

    def _exec_put(self, local_path: str, remote_path: str) -> None:
        timeout = clamp(self.default_timeout) or 600.0
        command = "cat > " + shlex.quote(remote_path)
        digest = hashlib.sha256()
        with self._session(timeout, command):
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
        with self._session(timeout, command):
            chan = self._exec(command, timeout)
            try:
                with open(local_path, "wb") as fh:
                    for chunk in iter(lambda: chan.recv(CHUNK), b""):
                        digest.update(chunk)
                        fh.write(chunk)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                chan.close()
                if self._lost():
                    raise LinkLost(f"{self.host}: connection lost downloading {remote_path}: {exc}") \
                        from exc
                raise TransferFailed(f"{self.host}: download of {remote_path} over the exec channel failed: "
                                     f"{exc}") from exc
            self._finish(chan, command, timeout, f"download of {remote_path} over the exec channel")
        self._same_bytes(remote_path, digest.hexdigest(), "download")

    def _same_bytes(self, remote_path: str, want: str, what: str) -> None:
        res = self.run(["sha256sum", "--", remote_path], check=False, timeout=120)
        got = res.stdout.split()[:1]
        if not res.ok or got != [want]:
            raise TransferFailed(f"{self.host}: {what} of {remote_path} over the exec channel: sha256 differs "
                                 f"(controller {want}, host {got[0] if got else res.stderr.strip() or '?'})")

    def close(self) -> None:
        """Close this host's connection; the jump hosts' shared logins stay for the other hosts
        (closed when the process exits)."""
        if self._alive is not None:
            self._alive.stop()
            self._alive = None
        self._drop_sftp()
        self._conn.close()
