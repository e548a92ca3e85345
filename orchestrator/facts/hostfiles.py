"""Reads of a host's files and processes as facts: each helper owns its command and the parsing
of its answer, as pyinfra's facts do (``FactBase.command()`` and ``process()``).

A plain :meth:`orchestrator.connection.base.Connection.run` raises on a non-zero exit
(``check=True``, as Invoke's ``run(warn=False)``); a read whose failure is itself an answer ("no
such file", "not executable", "cannot be told") runs here with ``check=False`` and turns that
failure into a value or a :class:`HostFileError`, once, with the reason written beside it.

Every path is passed as its own argument after ``--`` (never through a shell), and a file the
login user may not read is read through sudo only when that user is refused ("Permission
denied"), so least privilege holds for what needs no root.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Literal

from ..errors import OrchError

#: how a read may use sudo: ``retry`` (as the login user, through sudo only when that is refused
#: with "Permission denied"), ``root`` (through sudo at once: orch's own root-only files),
#: ``never`` (as the login user only)
Become = Literal["retry", "root", "never"]


class HostFileError(OrchError):
    """A file on the host could not be read (``reason``: the command's words, cut to 200
    characters) or is larger than the read's limit (``too_large``). Callers turn it into their
    own error naming what the file is (an ``EnvironmentFile=``, a config file)."""

    exit_status = 1

    def __init__(self, path: str, reason: str, too_large: bool = False):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.too_large = path, reason, too_large


def _run(connection, argv: list[str], become: Become, timeout: float):
    """``argv`` as the login user, then (``retry``) through sudo when refused; ``root``: through
    sudo only. A failed read is an answer here (the callers say what it means): ``check=False``."""
    if become == "root":
        return connection.run(argv, check=False, become=True, timeout=timeout)
    res = connection.run(argv, check=False, timeout=timeout)
    if become == "retry" and not res.ok and "Permission denied" in res.stderr:
        res = connection.run(argv, check=False, become=True, timeout=timeout)
    return res


def read_file(connection, path: str, *, limit: int | None = None, become: Become = "retry",
              missing_ok: bool = True, timeout: float = 60) -> str | None:
    """The text of the file ``path`` on the host; None when it does not exist and ``missing_ok``.

    ``limit``: the largest size read (bytes; ``head -c LIMIT+1``, so a larger file is told from
    one of exactly ``limit`` bytes); None reads it whole (``cat``). ``become``: :data:`Become`.
    Raises :class:`HostFileError` when it cannot be read (with ``missing_ok`` False, also when it
    does not exist) or is larger than ``limit`` (``too_large``)."""
    argv = ["head", "-c", str(int(limit) + 1), "--", path] if limit is not None else ["cat", "--", path]
    res = _run(connection, argv, become, timeout)
    if not res.ok:
        if missing_ok and "No such file" in res.stderr:
            return None
        raise HostFileError(path, res.stderr.strip()[:200] or f"exit {res.exited}")
    if limit is not None and len(res.stdout.encode()) > limit:
        raise HostFileError(path, f"larger than {limit} bytes", too_large=True)
    return res.stdout


def file_sha256(connection, path: str, timeout: float = 60) -> str | None:
    """The sha256 (hex) of the file ``path`` on the host (``sha256sum``; through sudo only when the
    login user is refused), or None when it cannot be read."""
    res = _run(connection, ["sha256sum", "--", path], "retry", timeout)
    words = res.stdout.split()
    return words[0] if res.ok and words and len(words[0]) == 64 else None


def is_executable(connection, path: str, timeout: float = 30) -> bool:
    """Whether ``path`` is a file the login user may execute (``test -x``: its exit status is the
    answer)."""
    return connection.run(["test", "-x", path], check=False, timeout=timeout).ok


def is_folder(connection, path: str, timeout: float = 30) -> bool:
    """Whether ``path`` is a folder on the host (``test -d``, through sudo: a server's working
    directory may be root's; its exit status is the answer)."""
    return connection.run(["test", "-d", path], check=False, become=True, timeout=timeout).ok


def files_in_folders(connection, folders: list[str] | tuple[str, ...], suffixes: tuple[str, ...],
                     timeout: float = 30) -> list[str]:
    """The plain files directly in each of ``folders`` whose name ends in one of ``suffixes``
    (``.yaml``), folder by folder in the order given, then suffix by suffix, each as the shell's
    glob sorts them; through sudo (root's folders). A folder that is missing adds nothing; [] when
    the listing cannot run. Raises ValueError for a suffix that is not ``.`` and letters or digits
    (it is written into the shell's glob)."""
    if not all(re.fullmatch(r"\.[A-Za-z0-9]+", s) for s in suffixes):
        raise ValueError(f"files_in_folders: suffixes must be .WORD: {suffixes!r}")
    dirs = " ".join(shlex.quote(d) for d in folders)
    globs = " ".join(f'"$d"/*{s}' for s in suffixes)
    script = f"for d in {dirs}; do for f in {globs}; do [ -f \"$f\" ] && printf '%s\\n' \"$f\"; done; done; true"
    # the listing ends in `true`: only a refused sudo fails it, and then no file is known
    res = connection.run(["sh", "-c", script], check=False, become=True, timeout=timeout)
    return [line for line in res.stdout.splitlines() if line] if res.ok else []


def missing_paths(connection, paths: list[str], timeout: float = 30) -> list[str]:
    """Those of ``paths`` (absolute; a relative one is not asked about) that do not exist on the host
    (``[ -e ]``, one command, through sudo: root's folders); [] when the check cannot run."""
    paths = [p for p in paths if posixpath.isabs(p)]
    if not paths:
        return []
    res = connection.run(["sh", "-c", 'for p; do [ -e "$p" ] || printf "%s\\n" "$p"; done', "sh", *paths],
                         check=False, become=True, timeout=timeout)
    return [line for line in res.stdout.splitlines() if line] if res.ok else []


def command_path(connection, name: str, search_path: str, timeout: float = 60) -> str | None:
    """Where the command ``name`` is on the host when ``search_path`` (a ``PATH`` value) is the
    search path, as a shell finds it (``command -v``, run with that ``PATH``); None when it is not
    found there (its exit status says so) or the answer is not an absolute path."""
    res = connection.run(["env", f"PATH={search_path}", "sh", "-c", 'command -v -- "$1"', "sh", name],
                         check=False, timeout=timeout)
    found = res.stdout.strip().splitlines()[-1:] if res.ok else []
    return found[0] if found and found[0].startswith("/") else None


def names_in_folder(connection, folder: str, pattern: str, timeout: float = 60) -> list[str]:
    """The paths of the entries of ``folder`` whose name matches the shell pattern ``pattern``
    (``find FOLDER -mindepth 1 -maxdepth 1 -name PATTERN``; through sudo only when refused),
    sorted as glob(3) sorts them; [] when the folder cannot be listed."""
    res = _run(connection, ["find", folder or "/", "-mindepth", "1", "-maxdepth", "1", "-name", pattern, "-print"],
               "retry", timeout)
    return sorted(line for line in res.stdout.splitlines() if line)


def file_identity(connection, path: str, timeout: float = 60) -> tuple[int, int] | None:
    """``(inode, size in bytes)`` of the file ``path`` (``stat -L``, through sudo: a unit's log
    file may be root's); None when it does not exist or cannot be read."""
    res = connection.run(["stat", "-L", "-c", "%i %s", "--", path], check=False, become=True, timeout=timeout)
    try:
        inode, size = res.stdout.split()
        return int(inode), int(size)
    except ValueError:
        return None


def tail(connection, path: str, *, lines: int | None = None, from_byte: int | None = None,
         timeout: float = 60) -> str | None:
    """The end of the file ``path``, through sudo: its last ``lines`` lines (``tail -n``), or
    everything from byte ``from_byte`` on (0-based; ``tail -c +N``). None when it cannot be read.
    Text that does not end in a newline gets one, so two reads can be put one after the other."""
    if (lines is None) == (from_byte is None):
        raise ValueError("tail: give lines or from_byte")
    where = ["-n", str(int(lines))] if lines is not None else ["-c", f"+{int(from_byte) + 1}"]
    res = connection.run(["tail", *where, "--", path], check=False, become=True, timeout=timeout)
    if not res.ok:
        return None
    return res.stdout if res.stdout.endswith("\n") or not res.stdout else res.stdout + "\n"


def process_environ(connection, pid: int, timeout: float = 30) -> str | None:
    """The raw ``/proc/PID/environ`` of process ``pid`` (NUL-separated; through sudo when the
    login user may not read it), or None when it cannot be read (the process is gone)."""
    argv = ["cat", f"/proc/{int(pid)}/environ"]
    res = connection.run(argv, check=False, timeout=timeout)
    if not res.ok:  # another user's process: only root may read its environment
        res = connection.run(argv, check=False, become=True, timeout=timeout)
    return res.stdout if res.ok and res.stdout else None


def meminfo(connection, timeout: float = 60) -> str:
    """The host's ``/proc/meminfo`` text; ``""`` when it cannot be read (then no memory limit is
    derived from it)."""
    try:
        return read_file(connection, "/proc/meminfo", become="never", timeout=timeout) or ""
    except HostFileError:
        return ""


def user_home(connection, user: str, timeout: float = 60) -> str:
    """The home folder of ``user`` on the host (``getent passwd``'s sixth field): what systemd gives a
    ``User=`` service as ``HOME``; ``/root`` for root, ``/home/USER`` when the passwd database has no
    entry (an unknown user: the usual home is then the best guess)."""
    if user == "root":
        return "/root"
    got = connection.run(["getent", "passwd", user], check=False, timeout=timeout).stdout.split(":")
    return got[5] if len(got) > 5 and got[5] else f"/home/{user}"
