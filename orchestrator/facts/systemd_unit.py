"""The server's systemd unit as a typed handle (``orch_systemd_unit``): its name, the manager it
belongs to (the system manager, or the login user's own: ``orch_systemd_scope: user``) and where
its output goes (the journal, and the files of its ``StandardOutput=``/``StandardError=``
``file:``/``append:``/``truncate:`` targets).

Every ``systemctl`` and ``journalctl`` orch runs for the unit is built here, from the handle, as
pyinfra builds every systemd fact's command through one ``_make_systemctl_cmd(user_mode, ...)``:
no caller passes a scope or a list of log files, so none can leave them out.

- The system manager's unit (systemd(1)): changes (``stop``, ``start``, ``restart``, ``kill``,
  ``daemon-reload``) go through sudo; reads (``show``, ``cat``, ``is-active``) run as the login
  user (systemd grants every user D-Bus property reads); its journal (``journalctl -u UNIT``) is
  read through sudo (the system journal is root's and ``adm``/``systemd-journal``'s).
- A user manager's unit (systemd.unit(5) "user units"; ``systemctl --user``): every call runs as
  the login user, never through sudo, which would ask root's own manager; its journal is
  ``journalctl --user-unit UNIT`` as the login user too: journalctl matches a user unit's entries
  together with ``_UID=`` of its caller (systemd 252 ``src/journal/journalctl.c``
  ``add_matches_for_user_unit(j, u, getuid())``), so through sudo it would read root's own
  user units and find nothing.
- Drop-ins (systemd.unit(5) "drop-in directories"): ``/etc/systemd/system/UNIT.d/`` for the
  system manager; ``$XDG_CONFIG_HOME/systemd/user/UNIT.d/`` (``~/.config/systemd/user``, where
  ``systemctl --user edit`` writes) for a user manager, read on the host as the login user.
- Log files: read through sudo in both scopes (a system unit's are often root's).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from .schema import Record

#: systemctl verbs that only read (run as the login user in either scope)
READ_VERBS = frozenset({"show", "cat", "is-active", "is-failed", "status", "list-units"})
#: the system manager's folder for the administrator's units and drop-ins (systemd.unit(5))
SYSTEM_UNIT_DIR = "/etc/systemd/system"
#: a user manager's folder for the user's own units and drop-ins, below ``$XDG_CONFIG_HOME``
#: (``~/.config`` when unset: XDG Base Directory spec; systemd.unit(5) user unit search path)
USER_UNIT_SUBDIR = "systemd/user"
#: prints the login user's ``$XDG_CONFIG_HOME`` (or ``$HOME/.config``); no host data in it
_CONFIG_HOME = 'printf "%s" "${XDG_CONFIG_HOME:-$HOME/.config}"'
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@][A-Za-z0-9:_.@\\-]*")


@dataclass(slots=True)
class Unit(Record):
    """A systemd unit: ``name`` as given (``sglang-qwen`` or ``sglang-qwen.service``), ``scope``
    (``system`` or ``user``: which manager runs it) and ``log_files`` (its ``StandardOutput=``/
    ``StandardError=`` file targets, where its output goes instead of the journal). See the module
    docstring for how each call runs; ``root_reads``: its reads go through sudo too (orch's own
    transient units, which ``systemd-run`` made through sudo: :mod:`orchestrator.payload.transient`).
    ``connection`` arguments are :class:`orchestrator.connection.base.Connection` objects."""

    name: str
    scope: str = "system"
    log_files: list[str] = field(default_factory=list)
    root_reads: bool = False

    def __post_init__(self) -> None:
        if self.scope not in ("system", "user"):
            raise ValueError(f"unit {self.name}: scope must be system or user, got {self.scope!r}")

    # ---------------------------------------------------------------- names
    @property
    def full_name(self) -> str:
        """The name with its type (``.service`` added to a bare name), as the manager names it."""
        return self.name if "." in self.name else self.name + ".service"

    @property
    def user_scope(self) -> bool:
        """True for a unit of the login user's own manager (``systemctl --user``)."""
        return self.scope == "user"

    @property
    def manager(self) -> str:
        """The manager it belongs to, in words (for messages)."""
        return "the login user's systemd (systemctl --user)" if self.user_scope else "the system's systemd"

    @property
    def root(self) -> bool:
        """Whether changing it needs root (``become``): a system unit's changes do."""
        return not self.user_scope

    def valid_name(self) -> bool:
        """Whether the name is a unit name systemd accepts (no shell or path characters)."""
        return bool(_UNIT_NAME.fullmatch(self.name or ""))

    # ---------------------------------------------------------------- systemctl
    def systemctl_argv(self, *args: str) -> list[str]:
        """``systemctl ARGS`` for this unit's manager (``--user`` for a user unit). Pure."""
        return ["systemctl", "--user", *args] if self.user_scope else ["systemctl", *args]

    def systemctl(self, connection, verb: str, *options: str, timeout: float = 60, check: bool = True):
        """Run ``systemctl VERB OPTIONS... NAME`` on its manager and return the
        :class:`orchestrator.connection.base.CommandResult`. A read (:data:`READ_VERBS`) runs as
        the login user; a change of a system unit through sudo. ``check``: raise
        :class:`orchestrator.connection.base.CommandFailed` on a non-zero exit (pass False where
        the exit status is an answer, e.g. a start whose failure is then read from the unit)."""
        become = self.root and (verb not in READ_VERBS or self.root_reads)
        return connection.run(self.systemctl_argv(verb, *options, self.name), check=check, become=become,
                              timeout=timeout)

    def daemon_reload(self, connection, timeout: float = 120):
        """``systemctl daemon-reload`` of its manager (the system's through sudo; the user's as the
        login user), after a change of its unit files; its failure is returned, not raised (the
        caller names what the reload was for)."""
        return connection.run(self.systemctl_argv("daemon-reload"), check=False, become=self.root, timeout=timeout)

    def show(self, connection, *props: str, timeout: float = 60) -> dict[str, str]:
        """``systemctl show NAME -p P...``: ``{property: value}`` (all of them without ``props``),
        :func:`parse_show` of :meth:`show_text`."""
        return parse_show(self.show_text(connection, *props, timeout=timeout))

    def show_text(self, connection, *props: str, timeout: float = 60) -> str:
        """The text of ``systemctl show NAME -p P...`` (what :func:`parse_show` reads). An unknown
        unit shows ``LoadState=not-found`` rather than failing, and a manager that fails says so in
        what it printed (nothing): the output is the answer either way, so the exit is not checked."""
        argv = [x for p in props for x in ("-p", p)]
        return connection.run(self.systemctl_argv("show", self.name, *argv), check=False,
                              become=self.root and self.root_reads, timeout=timeout).stdout

    def manager_environment(self, connection, timeout: float = 60) -> dict[str, str]:
        """The environment of this unit's manager (``systemctl show-environment``: for a user unit the
        user manager's, whose ``HOME`` its services get); ``{}`` when the manager does not answer."""
        res = connection.run(self.systemctl_argv("show-environment"), check=False, become=False, timeout=timeout)
        return dict(ln.split("=", 1) for ln in res.stdout.splitlines() if "=" in ln) if res.ok else {}

    def cat(self, connection, timeout: float = 60):
        """``systemctl cat NAME`` (the unit file and its drop-ins): the command's result, whose
        failure says the manager has no file for it (a transient or generated unit, or none)."""
        return connection.run(self.systemctl_argv("cat", self.name), check=False, timeout=timeout)

    def is_active(self, connection, timeout: float = 60) -> str:
        """``systemctl is-active NAME``: ``active``, ``inactive``, ``failed``, ``activating``, ...
        (``unknown`` when it printed nothing); its exit status says the same, so it is not checked."""
        res = connection.run(self.systemctl_argv("is-active", self.name), check=False, timeout=timeout)
        return res.stdout.strip() or "unknown"

    def main_pid(self, connection) -> int:
        """The unit's ``MainPID`` now; 0 when it has none."""
        try:
            return int(self.show(connection, "MainPID").get("MainPID") or 0)
        except ValueError:
            return 0

    # ---------------------------------------------------------------- journal
    def journal_argv(self, *args: str) -> list[str]:
        """``journalctl -u NAME ARGS`` (``--user-unit`` for a user unit). Pure."""
        which = ["--user-unit", self.name] if self.user_scope else ["-u", self.name]
        return ["journalctl", *which, "--no-pager", *args]

    def journal(self, connection, *args: str, timeout: float = 60):
        """Run ``journalctl`` on its entries (:meth:`journal_argv`; through sudo for a system unit,
        as the login user for a user unit: module docstring) and return the result; a journal
        without the unit's entries, or a cursor it no longer has, is an answer, not an error."""
        return connection.run(self.journal_argv(*args), check=False, become=self.root, timeout=timeout)

    def log(self, connection, lines: int) -> str:
        """The last ``lines`` lines of its journal, then of each of its log files (``tail -n``),
        each ending in a newline; ``""`` when there are none. What one read of "the unit's log" is:
        a start's SGLang lines are found where the unit writes them."""
        text = self.journal(connection, "-n", str(int(lines))).stdout
        return text + self.file_tails(connection, lines)

    def file_tails(self, connection, lines: int) -> str:
        """The last ``lines`` lines of each of its log files; a file that cannot be read adds nothing."""
        from .hostfiles import tail

        return "".join(tail(connection, p, lines=lines) or "" for p in self.log_files)

    # ---------------------------------------------------------------- drop-ins
    def unit_dir(self, connection) -> str:
        """The folder its manager reads the administrator's (or user's) units and drop-ins from:
        :data:`SYSTEM_UNIT_DIR`, or the login user's ``$XDG_CONFIG_HOME/systemd/user`` read on the
        host. Raises :class:`orchestrator.connection.base.CommandFailed` when that cannot be read."""
        if not self.user_scope:
            return SYSTEM_UNIT_DIR
        home = connection.run(["sh", "-c", _CONFIG_HOME], timeout=30).stdout.strip()
        if not home.startswith("/"):
            raise ValueError(f"unit {self.name}: the login user's config folder is not absolute ({home!r})")
        return posixpath.join(home, USER_UNIT_SUBDIR)

    def dropin_dir(self, connection) -> str:
        """``UNIT_DIR/NAME.d`` (:meth:`unit_dir`): where a drop-in for it goes."""
        return posixpath.join(self.unit_dir(connection), self.full_name + ".d")


def parse_show(text: str) -> dict[str, str]:
    """Parse ``systemctl show`` output (``Key=Value`` lines) into a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v
    return out


def scope_of(variables) -> str:
    """``system`` or ``user``: whose systemd runs the unit, from the host's variables
    (``orch_systemd_scope``)."""
    return "user" if variables.get("orch_systemd_scope") == "user" else "system"
