"""One ``run`` API for every connection (Fabric ``Connection`` / Invoke ``Context``).

Commands are given as argument lists and quoted here with :func:`shlex.join`, so
nothing that came from an inventory or a host reaches a remote shell unquoted.
Every output line is written prefixed with the host name.

Least privilege (``ansible_become``): commands run as the login user (``ansible_user``); only
the calls that pass ``become=True`` go through ``sudo -S -p PROMPT -H -u <ansible_become_user> --``
(built and quoted here; PROMPT carries a random nonce per call, and :class:`SudoPromptAnswer`
writes ``ansible_become_password`` to sudo's stdin once, only when that exact prompt shows, so a
command whose output imitates sudo's prompt or its "Sorry, try again." gets nothing and fails
nothing). Without a password sudo runs with ``-n`` (a password prompt is refused at once, no
failed authentication is counted). The password never goes into a command line, an output or a
record. Copies into or out of
root-only folders (``put``/``get`` with ``become=True``) stage the file in a private temp folder
of the login user and move it with ``sudo install``.
"""

from __future__ import annotations

import posixpath
import re
import secrets
import shlex
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..errors import OrchError
from .deadline import clamp


class ConnectError(OrchError):
    """Base class of connection errors (pyinfra's name; Python's own ``ConnectionError`` is a
    different, OS-level class). The engine reports the host failed or unreachable."""

    exit_status = 1


class HostUnreachable(ConnectError):
    """The host could not be reached or authenticated (host key, auth, timeout, dropped).

    ``transient`` is True when asking again may succeed: the link was lost under a command, or a
    login attempt timed out or found no route (:mod:`orchestrator.connection.reconnect` retries
    those); False for an answer that a retry does not change (a refused host key or login)."""

    def __init__(self, msg: str, transient: bool = False):
        super().__init__(msg)
        self.transient = bool(transient)


class LinkLost(HostUnreachable):
    """The connection to a host that was reached in this run was lost under a command (the
    keep-alives or TCP gave up on the peer, the transport closed): the command's outcome on the
    host is unknown. Always transient."""

    def __init__(self, msg: str):
        super().__init__(msg, transient=True)


class TransferFailed(ConnectError):
    """A file copy to or from the host failed while the link stayed up (a path that cannot be
    written, a checksum that differs, ...): the host is reported failed with this reason, not
    unreachable. ``result`` is the :class:`CommandResult` of the copying command when there was one."""

    def __init__(self, msg: str, result: "CommandResult | None" = None):
        super().__init__(msg)
        self.result = result


class CommandTimeout(ConnectError):
    """A remote command ran past its timeout (seconds)."""


@dataclass
class CommandResult:
    """Outcome of one command: ``exited`` status, full ``stdout`` and ``stderr`` text."""

    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exited == 0


class CommandFailed(ConnectError):
    """A command exited non-zero while ``check=True``; carries the :class:`CommandResult`."""

    def __init__(self, result: CommandResult, host: str):
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        super().__init__(f"{host}: command failed (exit {result.exited}): {result.command}\n" + "\n".join(tail))
        self.result = result
        self.host = host


class BecomeFailed(CommandFailed):
    """sudo refused to run a ``become`` command (wrong or missing password, no sudo rights): the
    command never ran. Raised whatever ``check`` says. The message names the login user and the
    host, never the password."""

    def __init__(self, msg: str, result: CommandResult, host: str):
        ConnectError.__init__(self, msg)
        self.result = result
        self.host = host


#: sudo's own refusals on stderr (the command did not run): (pattern, kind)
_SUDO_REFUSALS = (
    (re.compile(r"^sudo: \d+ incorrect password attempts?", re.M), "password"),
    (re.compile(r"^sudo: (a password is required|no password was provided)", re.M), "password"),
    (re.compile(r"is not in the sudoers file", re.M), "rights"),
    (re.compile(r"^Sorry, user \S+ (is not allowed to execute|may not run sudo)", re.M), "rights"),
)


class SudoPromptAnswer:
    """Invoke stream watcher that answers sudo's password prompt, once.

    ``prompt`` is the exact text passed to ``sudo -p`` (with a random nonce, so no command
    output matches it by chance or by design); ``password`` is written to sudo's stdin the first
    time the prompt appears. sudo asks a second time only when it refused that answer: then
    ``invoke.watchers.ResponseNotAccepted`` is raised, which stops the command (Invoke raises
    ``Failure`` with it as ``reason``). Other text (a log line saying "[sudo] password:" or
    "Sorry, try again.") is ignored. Thread-safe (Invoke calls it from the stdout and the stderr
    reader, each with that stream's whole text so far).
    """

    def __init__(self, prompt: str, password: str):
        self._prompt = prompt
        self._password = password
        self._answered = False
        self._lock = threading.Lock()

    def submit(self, stream: str) -> list[str]:
        """Responses to write to the command's stdin for ``stream`` (text so far of one stream)."""
        from invoke.watchers import ResponseNotAccepted

        with self._lock:
            seen = stream.count(self._prompt)
            if seen > 1:
                raise ResponseNotAccepted("sudo asked for the password again: the answer was refused")
            if seen == 1 and not self._answered:
                self._answered = True
                return [self._password + "\n"]
            return []


def quote_argv(argv: Sequence[str] | str) -> str:
    """Quote an argument list for a POSIX shell (``shlex.join``); a ``str`` is taken as already built.

    Only code in this package builds strings (for ``env``/redirection wrappers);
    every value that came from an inventory or a host goes through a list.
    """
    if isinstance(argv, str):
        return argv
    return shlex.join(str(a) for a in argv)


class LineWriter:
    """File-like sink that splits a stream into lines and hands each to callbacks.

    ``on_line(line)`` gets every complete line (without the newline). Used as
    Invoke's ``out_stream``/``err_stream`` to prefix output with the host name and to
    parse the payload's JSON-lines protocol as it streams.
    """

    def __init__(self, on_line: Callable[[str], None]):
        self._on_line = on_line
        self._buf = ""
        self._lock = threading.Lock()

    def write(self, data: str) -> int:
        with self._lock:
            self._buf += data
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                self._on_line(line.rstrip("\r"))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        with self._lock:
            if self._buf:
                self._on_line(self._buf)
                self._buf = ""


class PrefixPrinter:
    """Writes ``[host] line`` to a console or stream, thread-safe across hosts."""

    _lock = threading.Lock()

    def __init__(self, host: str, stream=None, enabled: bool = True):
        self.host = host
        self.stream = stream or sys.stderr
        self.enabled = enabled

    def __call__(self, line: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.stream.write(f"[{self.host}] {line}\n")
            self.stream.flush()


class Connection:
    """Abstract host connection: :meth:`run`, :meth:`put`, :meth:`get`, :meth:`close`.

    Implementations: :class:`orchestrator.connection.ssh.SSHConnection` (Fabric) and
    :class:`orchestrator.connection.local.LocalConnection` (Invoke). Both delegate to
    Invoke's ``Runner`` through the same ``run(command, **kwargs)`` call.
    """

    host: str

    def _invoke_run(self, command: str, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    #: the account the connection logs in as (set by subclasses; used in messages)
    login_user: str = "the login user"

    def __init__(self, host: str, become: bool = False, become_user: str = "root",
                 become_password: str | None = None, echo: Callable[[str], None] | None = None,
                 default_timeout: float | None = 600.0):
        self.host = host
        self.become = become
        self.become_user = become_user
        self._become_password = become_password  # never logged or recorded
        self.echo = echo or PrefixPrinter(host, enabled=False)
        self.default_timeout = default_timeout

    def run(self, argv: Sequence[str] | str, *, check: bool = True, timeout: float | None = None,
            become: bool = False, on_stdout_line: Callable[[str], None] | None = None,
            on_stderr_line: Callable[[str], None] | None = None, echo: bool = False,
            stdin_text: str | None = None) -> CommandResult:
        """Run ``argv`` on the host and return a :class:`CommandResult`.

        ``timeout`` is in seconds (default ``default_timeout``), cut to what is left of the running
        task's ``timeout:`` (:mod:`orchestrator.connection.deadline`); it raises
        :class:`CommandTimeout`. ``become=True`` runs it through sudo when the host's
        ``ansible_become`` is set (the only steps that ask are those that need root);
        sudo's ``secure_path`` then applies, so commands are plain names found there or
        absolute paths. ``on_stdout_line``/``on_stderr_line`` get each line as it arrives; ``echo``
        also prints lines prefixed with the host. Raises :class:`CommandFailed` on a
        non-zero exit when ``check``, :class:`BecomeFailed` when sudo refused (any ``check``),
        :class:`HostUnreachable` when the link drops. ``stdin_text`` cannot go with sudo
        (``sudo -S`` reads the password from stdin): ValueError.
        """
        import invoke

        command = quote_argv(argv)
        use_sudo = bool(become and self.become)
        if use_sudo and stdin_text is not None:
            raise ValueError("stdin_text cannot be combined with become: sudo -S reads the password from stdin")
        kwargs = dict(hide=True, warn=True, in_stream=False,
                      timeout=clamp(timeout if timeout is not None else self.default_timeout))
        full, prompt = self._sudo_command(command, kwargs) if use_sudo else (command, None)
        out_cb = self._line_cb(on_stdout_line, echo)
        err_cb = self._line_cb(on_stderr_line, echo, strip=prompt)
        out_w, err_w = LineWriter(out_cb), LineWriter(err_cb)
        kwargs.update(out_stream=out_w, err_stream=err_w)
        if stdin_text is not None:
            import io
            kwargs["in_stream"] = io.StringIO(stdin_text)
        try:
            res = self._invoke_run(full, **kwargs)
        except invoke.exceptions.CommandTimedOut as exc:
            raise CommandTimeout(f"{self.host}: command timed out after {exc.timeout} s: {command}") from None
        except (OSError, EOFError) as exc:
            raise LinkLost(f"{self.host}: connection lost: {exc}") from exc
        except invoke.exceptions.Failure as exc:
            if isinstance(exc.reason, invoke.watchers.ResponseNotAccepted):  # sudo asked again: wrong password
                raise BecomeFailed(self._become_refused("password"), CommandResult(command, -1, "", ""),
                                   self.host) from None
            res = exc.result
        finally:
            out_w.close()
            err_w.close()
        stderr = res.stderr.replace(prompt, "", 1) if prompt else res.stderr  # sudo's prompt is no output
        result = CommandResult(command=command, exited=res.exited if res.exited is not None else -1,
                               stdout=res.stdout, stderr=stderr)
        if use_sudo and not result.ok:
            for pattern, kind in _SUDO_REFUSALS:
                if pattern.search(result.stderr or ""):
                    raise BecomeFailed(self._become_refused(kind), result, self.host)
        if check and not result.ok:
            raise CommandFailed(result, self.host)
        return result

    def _sudo_command(self, command: str, kwargs: dict) -> tuple[str, str | None]:
        """``command`` (already quoted) wrapped in sudo to ``become_user``, every part quoted, and
        the prompt sudo will show (None when it will not ask).

        With a password: ``sudo -S -p PROMPT`` and a :class:`SudoPromptAnswer` for this call's
        random PROMPT is put in ``kwargs["watchers"]``; without one: ``sudo -n`` (never prompts).
        """
        prompt = None
        if self._become_password:
            prompt = f"[sudo via orch {secrets.token_hex(8)}] password: "
            kwargs["watchers"] = [SudoPromptAnswer(prompt, self._become_password)]
            head = ["sudo", "-S", "-p", prompt]
        else:
            head = ["sudo", "-n"]
        return f"{shlex.join([*head, '-H', '-u', str(self.become_user), '--'])} {command}", prompt

    def _become_refused(self, kind: str) -> str:
        """One-line cause of a sudo refusal (``kind``: ``password`` or ``rights``); never the password."""
        if kind == "password" and not self._become_password:
            return (f"{self.host}: sudo: {self.login_user} on {self.host} needs a password to become "
                    f"{self.become_user}, and ansible_become_password is not set")
        if kind == "password":
            return f"{self.host}: sudo: incorrect become password for {self.login_user} on {self.host}"
        return (f"{self.host}: sudo: {self.login_user} may not run commands as {self.become_user} on "
                f"{self.host} (not allowed by sudoers)")

    def _line_cb(self, cb, echo, strip: str | None = None):
        def handle(line: str) -> None:
            if strip and strip in line:  # sudo's prompt, glued to the first line of stderr
                line = line.replace(strip, "", 1)
                if not line:
                    return
            if cb is not None:
                cb(line)
            if echo:
                self.echo(line)
        return handle

    def put(self, local_path: str, remote_path: str, *, become: bool = False) -> None:
        """Copy the local file ``local_path`` to ``remote_path`` on the host.

        ``become=True`` means the target is root-only (e.g. under ``/var/lib/orch``): with the
        host's ``ansible_become`` set, the file is uploaded as the login user into a private temp
        folder (``mktemp -d``), moved into place by sudo (``install -m 0600``, so it belongs to the
        become user) and the temp folder is removed. Otherwise it is copied directly as the login
        user. Raises :class:`HostUnreachable` when the link drops, :class:`TransferFailed` when the
        copy itself fails (the host is then failed, not unreachable), :class:`CommandFailed` /
        :class:`BecomeFailed` when the move fails.
        """
        if not (become and self.become):
            self._put_file(local_path, remote_path)
            return
        with self._staged() as staged:
            self._put_file(local_path, staged)
            self.run(["install", "-m", "0600", "-T", "--", staged, remote_path], become=True, timeout=300)

    def get(self, remote_path: str, local_path: str, *, become: bool = False) -> None:
        """Copy ``remote_path`` on the host to the local file ``local_path``.

        ``become=True`` means the source is root-only: with ``ansible_become`` set, sudo copies it
        (``install -m 0644``) into a private temp folder of the login user (mode 0700, so no one
        else can read it there), which is downloaded and then removed. Raises as :meth:`put`.
        """
        if not (become and self.become):
            self._get_file(remote_path, local_path)
            return
        with self._staged() as staged:
            self.run(["install", "-m", "0644", "-T", "--", remote_path, staged], become=True, timeout=300)
            self._get_file(staged, local_path)

    @contextmanager
    def _staged(self) -> Iterator[str]:
        """Path of a file inside a new private (0700) temp folder of the login user on the host
        (``mktemp -d``); the folder is removed on exit, also after an error."""
        res = self.run(["mktemp", "-d", "-t", "orch-xfer.XXXXXXXXXX"], timeout=60)
        tmpdir = res.stdout.strip()
        if not tmpdir.startswith("/") or "\n" in tmpdir:
            raise CommandFailed(CommandResult(res.command, res.exited, res.stdout, "not a folder path"), self.host)
        try:
            yield posixpath.join(tmpdir, "file")
        finally:
            self.run(["rm", "-rf", "--", tmpdir], check=False, timeout=60)

    def _put_file(self, local_path: str, remote_path: str) -> None:  # pragma: no cover - abstract
        """Copy a local file to ``remote_path`` as the login user."""
        raise NotImplementedError

    def _get_file(self, remote_path: str, local_path: str) -> None:  # pragma: no cover - abstract
        """Copy ``remote_path`` (readable by the login user) to a local file."""
        raise NotImplementedError

    def reconnect(self, within: float, *, cancel=None, on_retry=None) -> int:
        """Open the connection again after a lost link, retrying for at most ``within`` seconds
        (:func:`orchestrator.connection.reconnect.reconnect`); returns the attempts made. A
        connection that cannot lose its link (local) has nothing to do: 0."""
        return 0

    def close(self) -> None:
        """Close the connection; safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
