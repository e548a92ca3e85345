"""One ``run`` API for every transport (Fabric ``Connection`` / Invoke ``Context``).

Commands are given as argument lists and quoted here with :func:`shlex.join`, so
nothing that came from an inventory or a host reaches a remote shell unquoted.
Every output line is written prefixed with the host name.
"""

from __future__ import annotations

import shlex
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Sequence


class ConnectionError_(Exception):
    """Base class for transport errors (named with a trailing ``_`` to avoid the builtin)."""


class HostUnreachable(ConnectionError_):
    """The host could not be reached or authenticated (host key, auth, timeout, dropped)."""


class CommandTimeout(ConnectionError_):
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


class CommandFailed(ConnectionError_):
    """A command exited non-zero while ``check=True``; carries the :class:`CommandResult`."""

    def __init__(self, result: CommandResult, host: str):
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        super().__init__(f"{host}: command failed (exit {result.exited}): {result.command}\n" + "\n".join(tail))
        self.result = result
        self.host = host


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


class Transport:
    """Abstract host transport: :meth:`run`, :meth:`put`, :meth:`get`, :meth:`close`.

    Implementations: :class:`orchestrator.connection.ssh.SSHTransport` (Fabric) and
    :class:`orchestrator.connection.local.LocalTransport` (Invoke). Both delegate to
    Invoke's ``Runner`` through the same ``run(command, **kwargs)`` call.
    """

    host: str

    def _invoke_run(self, command: str, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def _invoke_sudo(self, command: str, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

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

        ``timeout`` is in seconds (default ``default_timeout``); it raises
        :class:`CommandTimeout`. ``become=True`` runs it through sudo when the host's
        ``ansible_become`` is set (the only steps that ask are those that need root).
        ``on_stdout_line``/``on_stderr_line`` get each line as it arrives; ``echo``
        also prints lines prefixed with the host. Raises :class:`CommandFailed` on a
        non-zero exit when ``check``, :class:`HostUnreachable` when the link drops.
        """
        import invoke

        command = quote_argv(argv)
        out_cb = self._line_cb(on_stdout_line, echo)
        err_cb = self._line_cb(on_stderr_line, echo)
        out_w, err_w = LineWriter(out_cb), LineWriter(err_cb)
        kwargs = dict(hide=True, warn=True, out_stream=out_w, err_stream=err_w, in_stream=False,
                      timeout=timeout if timeout is not None else self.default_timeout)
        if stdin_text is not None:
            import io
            kwargs["in_stream"] = io.StringIO(stdin_text)
        try:
            if become and self.become:
                res = self._invoke_sudo(command, user=self.become_user,
                                        password=self._become_password or "", **kwargs)
            else:
                res = self._invoke_run(command, **kwargs)
        except invoke.exceptions.CommandTimedOut as exc:
            raise CommandTimeout(f"{self.host}: command timed out after {exc.timeout} s: {command}") from None
        except (OSError, EOFError) as exc:
            raise HostUnreachable(f"{self.host}: connection lost: {exc}") from exc
        except invoke.exceptions.Failure as exc:  # sudo auth failures surface here
            res = exc.result
        finally:
            out_w.close()
            err_w.close()
        result = CommandResult(command=command, exited=res.exited if res.exited is not None else -1,
                               stdout=res.stdout, stderr=res.stderr)
        if check and not result.ok:
            raise CommandFailed(result, self.host)
        return result

    def _line_cb(self, cb, echo):
        def handle(line: str) -> None:
            if cb is not None:
                cb(line)
            if echo:
                self.echo(line)
        return handle

    def put(self, local_path: str, remote_path: str) -> None:  # pragma: no cover - abstract
        """Copy a local file to ``remote_path`` on the host."""
        raise NotImplementedError

    def get(self, remote_path: str, local_path: str) -> None:  # pragma: no cover - abstract
        """Copy ``remote_path`` on the host to a local file."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the transport; safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
