"""The unit's log (``journalctl -u UNIT``, or ``--user-unit``, and its log files) as a fact, and
the pure functions that cut it. Each read takes the unit's handle
(:class:`orchestrator.facts.systemd_unit.Unit`), which says which manager's journal holds it and
which files it writes to, so no read can miss either.

The server logs its MoE config lookups at start-up (``Engine.parse_log``; SGLang's:
:mod:`remote.engines.sglang.moe_log`); orch reads
the lines of one start: those after a mark taken before it started the unit (:func:`text_since`),
or those of the last start the log holds (:func:`last_start`). Logs accumulate across restarts
(journald, and docker-systemctl-replacement's per-unit files on the test bed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from remote.engines import Engine, engine_named

from .hostfiles import file_identity, tail
from .systemd_unit import Unit

#: lines read from the end of the unit's journal
LOG_LINES = 20000


def unit_log(connection, unit: Unit, lines: int = LOG_LINES) -> str:
    """The last ``lines`` lines of the unit's journal and of each of its log files
    (:meth:`orchestrator.facts.systemd_unit.Unit.log`); ``""`` when none.

    Its files are where the unit really writes when its ``StandardOutput=``/``StandardError=`` is
    a ``file:``/``append:``/``truncate:`` target (``orch_unit.log_files``; such output bypasses
    the journal, which then holds only systemd's own lines): their last lines are put after the
    journal's, so a start's SGLang lines are found where they are."""
    return unit.log(connection, lines)


def last_start_log(connection, unit: Unit, engine: Engine | None = None, lines: int = LOG_LINES) -> str | None:
    """The lines of the unit's last server start, as :func:`last_start` cuts them from its log
    (:func:`unit_log`, by ``engine``'s start line; None: the default engine), or, when the log holds
    no start line, the journal entries of the unit's current invocation (its ``InvocationID``:
    :func:`split_invocations`). A server run above INFO logs no start line (SGLang 0.5.23
    ``srt/utils/common.py`` ``configure_logger`` sets every logger's level from ``--log-level``; its
    start line and its loaded-file lines are INFO, its fallback, default and missing-down lines
    WARNING, issue 32 row 18). None when neither gives a line (no start logged, a manager without
    invocation IDs, output only in ``StandardOutput=`` files, which carry none)."""
    text = unit_log(connection, unit, lines)
    found = last_start(text, engine)
    if found is not None or not text.strip():  # a start, or no line at all of any invocation
        return found
    inv = invocation_id(connection, unit)
    if inv is None:
        return None
    res = unit.journal(connection, "-n", str(int(lines)), "-o", "json", "--all")
    if not res.ok:
        return None
    text, _others = split_invocations(res.stdout, unit.name, [inv])
    return text or None


@dataclass
class LogMark:
    """Where the unit's log stood before a start (:func:`mark_start`): ``cursor``, the journal
    cursor of the unit's last entry then (``journalctl --show-cursor``; None when the journal gave
    none, e.g. a unit with no entry yet, then ``text`` is read the old way); ``files``: path ->
    ``(inode, size in bytes)`` of each ``StandardOutput=``/``StandardError=`` file target (None:
    the file did not exist); ``journal``: a copy of the journal's part as it was (the fallback of
    :func:`text_since` without a cursor); ``text``: the copy with the files' last lines (what
    :func:`unit_log` reads); ``invocation``: the unit's ``InvocationID`` right after the start
    that followed the mark (:func:`note_invocation`; None until then, or when the manager gives
    none), which :func:`read_start` keeps the journal's entries to."""

    cursor: str | None = None
    files: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    text: str = ""
    journal: str = ""
    invocation: str | None = None


@dataclass
class StartLog:
    """The log lines of one start (:func:`read_start`) and the gaps in them: ``gaps`` are
    sentences, one per hole (journald's "Suppressed N messages from UNIT", a log file rotated or
    truncated during the start); a line that is not in ``text`` may be in a gap."""

    text: str
    gaps: list[str] = field(default_factory=list)
    by_cursor: bool = False
    #: journal entries after the cursor that belonged to another invocation of the unit, dropped
    #: (:func:`split_invocations`): ``{"invocation", "lines", "first"}`` per other invocation ID
    other_invocations: list[dict] = field(default_factory=list)
    #: the invocation IDs the entries were kept to (empty: none known, nothing was dropped)
    invocations: list[str] = field(default_factory=list)


_CURSOR = re.compile(r"^-- cursor: (\S+)\s*$", re.M)
#: journald's rate limiting line (systemd journald-server.c: "Suppressed %i messages from %s";
#: driver messages carry OBJECT_SYSTEMD_UNIT, so ``journalctl -u UNIT`` shows them, systemd #2913)
SUPPRESSED = re.compile(r"Suppressed (\d+) messages from (\S+)")


def mark_start(connection, unit: Unit) -> LogMark:
    """Mark the unit's log before a (re)start: the journal cursor of its last entry
    (``journalctl -u UNIT -n 0 --show-cursor``: journalctl(1) prints ``-- cursor: C``), each file
    target's inode and size (``stat``), and a copy of the log for the fallback. The cursor is a
    position in the journal, not a time: a backward clock step (systemd #43805) cannot hide the
    start's entries from ``--after-cursor`` as it can from ``--since``."""
    res = unit.journal(connection, "-n", "0", "--show-cursor")
    m = _CURSOR.search(res.stdout or "") if res.ok else None
    journal = unit.journal(connection, "-n", str(LOG_LINES)).stdout
    return LogMark(cursor=m.group(1) if m else None,
                   files={p: file_identity(connection, p) for p in unit.log_files},
                   text=journal + unit.file_tails(connection, LOG_LINES), journal=journal)


#: a 128-bit ID as systemd formats it (systemd.exec(5) ``$INVOCATION_ID``: 32 hexadecimal characters)
_ID128 = re.compile(r"^[0-9a-f]{32}$")


def invocation_id(connection, unit: Unit) -> str | None:
    """The unit's ``InvocationID`` now (``systemctl show -p InvocationID``, systemd 232+: a new
    random 128-bit ID each time the unit goes from inactive to activating or active, passed to
    its processes as ``$INVOCATION_ID``, systemd.exec(5), and stamped by journald on each entry of
    theirs as ``_SYSTEMD_INVOCATION_ID``, systemd.journal-fields(7)). None when the manager gives
    none (an older systemd, a unit never started) or the answer is not such an ID."""
    # reading a unit's properties needs no root (systemd grants D-Bus property reads to every
    # user), so it runs as the login user, as every other read of the server's unit does; an
    # older manager without the property, or a failed read, is "none known"
    res = unit.systemctl(connection, "show", "-p", "InvocationID", check=False)
    for line in (res.stdout or "").splitlines() if res.ok else []:
        key, _, value = line.partition("=")
        if key.strip() == "InvocationID":
            value = value.strip().replace("-", "").lower()
            return value if _ID128.match(value) else None
    return None


def note_invocation(connection, mark: LogMark | None, unit: Unit) -> str | None:
    """After the start that followed ``mark``: record the unit's invocation ID on the mark
    (:func:`invocation_id`), so the start's journal entries are told from an earlier invocation's.
    Returns it (None: none known; then nothing is filtered)."""
    if mark is None:
        return None
    mark.invocation = invocation_id(connection, unit)
    return mark.invocation


def _unit_name(unit: str) -> str:
    return unit if "." in unit else unit + ".service"


def entry_invocation(entry: dict, unit: str) -> str | None:
    """The invocation of ``unit`` a journal entry (``journalctl -o json``) belongs to, None when it
    names none. systemd.journal-fields(7): the unit's own processes' entries carry
    ``_SYSTEMD_UNIT`` and ``_SYSTEMD_INVOCATION_ID``; an entry another program logged about the
    unit (journald's "Suppressed N messages", systemd-coredump) carries ``OBJECT_SYSTEMD_UNIT`` and
    ``OBJECT_SYSTEMD_INVOCATION_ID``, its own ``_SYSTEMD_*`` fields being the logger's; the
    manager's own messages about the unit carry ``UNIT`` and ``INVOCATION_ID``. A field of an entry
    about another unit says nothing of this one."""
    name = _unit_name(unit)
    for unit_field, id_field in (("_SYSTEMD_UNIT", "_SYSTEMD_INVOCATION_ID"),
                                 ("OBJECT_SYSTEMD_UNIT", "OBJECT_SYSTEMD_INVOCATION_ID"),
                                 ("UNIT", "INVOCATION_ID")):
        if entry.get(unit_field) == name:
            value = entry.get(id_field)
            return value.lower() if isinstance(value, str) and value else None
    return None


def _message(entry: dict) -> str:
    """An entry's text as journalctl's short output ends it: ``IDENT[PID]: MESSAGE`` when the
    entry names its syslog identifier, else the message alone. ``MESSAGE`` of ``-o json`` is a
    string, or an array of bytes when it is not valid UTF-8, or null past 4096 bytes without
    ``--all`` (journalctl(1))."""
    msg = entry.get("MESSAGE")
    if isinstance(msg, list):
        msg = bytes(b & 0xFF for b in msg if isinstance(b, int)).decode("utf-8", "replace")
    elif not isinstance(msg, str):
        msg = ""
    ident = entry.get("SYSLOG_IDENTIFIER")
    if isinstance(ident, str) and ident:
        pid = entry.get("_PID") or entry.get("SYSLOG_PID")
        return f"{ident}[{pid}]: {msg}" if pid else f"{ident}: {msg}"
    return msg


def split_invocations(output: str, unit: str, keep: list[str]) -> tuple[str, list[dict]]:
    """The text of the journal entries in ``output`` (``journalctl -o json``, one object a line)
    that belong to ``unit``'s invocations ``keep``, and what was dropped.

    An entry that names another invocation of the unit (:func:`entry_invocation`) is dropped: a
    line journald stamped with an earlier invocation's ID after the cursor. journald caches each
    client process's metadata, the invocation ID included, and refreshes it at most once a second
    (systemd src/journal/journald-context.c), and it processes a stream's data after the writer
    wrote it (systemd commit "core: add invocation ID concept": "the journal will generally
    process log data after the service already ended"), so the old server's last lines, or a
    leftover child's writing to the old stdout stream, processed around orch's start keep the old
    ID; a ``Restart=`` cycle between the mark and orch's start has its own. A leftover whose lines
    journald stamps with the new ID (its cache refreshed after the start) is not told apart here:
    the reap and the port check end the unit's leftovers before a start. An entry
    that names no invocation is kept: journald loses the unit fields of a process that exits
    fast (systemd #2913, #7506), and such a line may be the start's own. With ``keep`` empty
    nothing is dropped. A line that is not JSON is kept as text. Returns ``(text, dropped)``,
    ``dropped`` one ``{"invocation", "lines", "first"}`` per other invocation, in log order."""
    want = {k.lower() for k in keep if k}
    lines: list[str] = []
    dropped: dict[str, dict] = {}
    for raw in output.splitlines():
        raw = raw.strip()
        if not raw:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            lines.append(raw)
            continue
        text = _message(entry)
        inv = entry_invocation(entry, unit)
        if want and inv is not None and inv not in want:
            d = dropped.setdefault(inv, {"invocation": inv, "lines": 0, "first": text[:200]})
            d["lines"] += 1
            continue
        lines.append(text)
    return "".join(x + "\n" for x in lines), list(dropped.values())


def journal_gaps(text: str, unit: str) -> list[str]:
    """journald's rate-limit lines in ``text`` (one start's journal lines) about ``unit``, as
    gap sentences (systemd #2913: journald drops a unit's lines past ``RateLimitBurst=`` in
    ``RateLimitIntervalSec=`` and says so in one line)."""
    out = []
    name = unit if "." in unit else unit + ".service"
    for m in SUPPRESSED.finditer(text):
        if m.group(2).rstrip(".").endswith((name, "/" + name)) or name in m.group(2):
            out.append(f"journald suppressed {m.group(1)} messages of {name} (rate limiting)")
    return out


def read_start(connection, unit: Unit, mark: LogMark | None, lines: int = LOG_LINES) -> StartLog:
    """The log of the start after ``mark`` (:func:`mark_start`), with its gaps.

    With a cursor: the journal's entries after it (``journalctl --after-cursor -o json``), kept to
    the start's invocation (:func:`split_invocations`: the mark's ``invocation`` and the unit's
    ``InvocationID`` now, in case systemd restarted it since; entries of another invocation are
    dropped and listed in ``other_invocations``, entries that name none are kept), and each file
    target from the recorded size on (``tail -c +SIZE+1``; a file has no invocation IDs: its lines
    are all kept); a file whose inode changed or that
    shrank was rotated or truncated during the start: it is read from its start and the rotation
    is a gap (the lines written before it are in the rotated copy, or lost). Without a cursor
    (a journal with no entry of the unit yet): the journal's part is cut after its copy
    (:func:`text_since`), the files still by offset. Without a mark (or one of only a copy, ``text``):
    the old way, the whole log now cut after the copy. journald's rate-limit lines are gaps in
    every case."""
    name = unit.name
    if mark is None or (mark.cursor is None and not mark.files and not mark.journal):
        text = text_since(mark.text if mark else "", unit_log(connection, unit, lines))
        return StartLog(text, journal_gaps(text, name))
    gaps: list[str] = []
    res = None
    dropped: list[dict] = []
    keep: list[str] = []
    if mark.cursor is not None:
        # -o json: each entry with its fields (_SYSTEMD_INVOCATION_ID); --all: no field is cut to null
        res = unit.journal(connection, "-n", str(int(lines)), "--after-cursor", mark.cursor, "-o", "json", "--all")
        if not res.ok:  # a cursor the journal no longer has (vacuumed): cut after the copy
            gaps.append("the journal no longer has the start's cursor")
    if res is not None and res.ok:
        now = invocation_id(connection, unit) if mark.invocation else None
        keep = [i for i in dict.fromkeys([mark.invocation, now]) if i]
        text, dropped = split_invocations(res.stdout, name, keep)
    else:
        text = text_since(mark.journal, unit.journal(connection, "-n", str(int(lines))).stdout)
    gaps = journal_gaps(text, name) + gaps
    for path in unit.log_files:
        before = mark.files.get(path)
        now = file_identity(connection, path)
        if now is None:
            continue
        if before is not None and now[0] == before[0] and now[1] >= before[1]:
            got = tail(connection, path, from_byte=before[1])
        else:
            got = tail(connection, path, lines=lines)
            if before is not None:
                how = "replaced (rotated)" if now[0] != before[0] else "truncated"
                gaps.append(f"{path} was {how} during the start: lines written before that are not read")
        text += got or ""
    return StartLog(text, gaps, by_cursor=res is not None and res.ok, other_invocations=dropped, invocations=keep)


def text_since(before: str, now: str) -> str:
    """The part of log text ``now`` written after ``before`` (an earlier read of the same log).

    ``before`` is matched as a prefix; when the journal rotated in between, the lines after the
    last line of ``before`` are returned; when that line is gone too, all of ``now``.
    """
    if before and now.startswith(before):
        return now[len(before):]
    last = before.strip().splitlines()[-1:] if before.strip() else []
    if last and last[0] in now:
        return now.rsplit(last[0], 1)[1]
    return now


def last_start(text: str, engine: Engine | None = None) -> str | None:
    """The lines of the last server start (from the line the engine logs a start on:
    ``Engine.last_start_at``, every release's wording; ``engine`` None: the default engine), or
    None when the log holds no start."""
    at = (engine or engine_named(None)).last_start_at(text)
    return None if at < 0 else text[at:]


#: words of a line that says why a server start failed (Python tracebacks, CUDA and OS errors)
_FAILURE_WORDS = ("Error", "error:", "Exception", "out of memory", "Traceback", "Killed", "failed")


def start_failure(text: str) -> str | None:
    """The last line of a start's log that says why it failed (an exception, CUDA out of memory,
    ...), without the journal's prefix; None when no line does. ``text``: one start's lines."""
    for line in reversed(text.splitlines()):
        if " systemd[" in line:  # systemd's own "Main process exited" says that, not why
            continue
        if any(w in line for w in _FAILURE_WORDS):
            body = line.split("]: ", 1)[-1] if "]: " in line else line
            return body.strip()[:300]
    return None
