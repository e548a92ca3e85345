"""The unit's log (``journalctl -u UNIT``) as a fact, and the pure functions that cut it.

SGLang logs its MoE config lookups at start-up (see :mod:`remote.sglang.moe_log`); orch reads
the lines of one start: those after a mark taken before it started the unit (:func:`text_since`),
or those of the last start the log holds (:func:`last_start`). Logs accumulate across restarts
(journald, and docker-systemctl-replacement's per-unit files on the test bed).
"""

from __future__ import annotations

from remote.sglang.moe_log import last_start_at

#: lines read from the end of the unit's journal
LOG_LINES = 20000


def unit_log(connection, unit: str, lines: int = LOG_LINES, scope: str = "system",
             files: list[str] | None = None) -> str:
    """The last ``lines`` lines of ``unit``'s journal (root: ``become``); ``""`` when none.

    ``scope`` ``user``: a unit of a user's own manager (``journalctl --user-unit``).
    ``files``: where the unit really writes when its ``StandardOutput=``/``StandardError=`` is a
    ``file:``/``append:``/``truncate:`` target (``orch_unit.log_files``; such output bypasses the
    journal, which then holds only systemd's own lines): the last ``lines`` lines of each are read
    too (``tail``, through sudo) and put after the journal's, so a start's SGLang lines are found
    where they are."""
    which = ["--user-unit", unit] if scope == "user" else ["-u", unit]
    text = connection.run(["journalctl", *which, "--no-pager", "-n", str(int(lines))],
                          check=False, become=True, timeout=60).stdout
    for path in files or []:
        res = connection.run(["tail", "-n", str(int(lines)), "--", path], check=False, become=True, timeout=60)
        if res.ok:
            text += res.stdout if res.stdout.endswith("\n") or not res.stdout else res.stdout + "\n"
    return text


def log_files(ctx) -> list[str]:
    """The unit's log files besides the journal (``orch_unit.log_files``); [] without unit facts."""
    unit = ctx.facts.unit
    return list(unit.log_files) if unit is not None else []


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


def last_start(text: str) -> str | None:
    """The lines of the last server start (from the line SGLang logs its server arguments on:
    :func:`remote.sglang.moe_log.last_start_at`, every release's wording), or None when the log
    holds no start."""
    at = last_start_at(text)
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
