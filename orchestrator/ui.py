"""Terminal output: per-task lines prefixed with the host, a progress bar per host, the recap.

Uses rich. Everything goes to stderr except ``--json`` output, so stdout stays
machine-readable.

The output rules, on a terminal and into a pipe or a file alike (``tests/unit/cli/test_output_width.py``):
a line is broken only at spaces (:func:`wrap_words`) to fit the width (the terminal's, else
``$COLUMNS``, else 80); a word wider than the line (a path, a URL, a file name) is put whole on a
line of its own, the one kind of line that may be wider; a table is printed only when it fits,
else one block per host (:func:`print_table_or_blocks`), and a table's cells are never cut
(``unreachab…``); without a terminal no line ends in padding (:class:`OrchConsole`).
"""

from __future__ import annotations

import re
import threading
import time

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .facts.legacy import LEGACY_ENGINE
from .facts.summary import RunSummary, speedup_stats

STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "skipped": "cyan", "unreachable": "bold magenta"}

#: the end of a line: spaces before it (a table's or a block's padding), then any closing style codes
_PADDED_EOL = re.compile(r" +((?:\x1b\[[0-9;]*m)*)(?=\n|$)")


class OrchConsole(Console):
    """rich's Console, which into a pipe or a file writes no line that ends in spaces: rich pads
    every line of a table's title, a grid or a block to the width, and a log full of trailing
    blanks is what ``grep`` and ``diff`` users stumble on. On a terminal it is rich's own."""

    def _render_buffer(self, buffer) -> str:  # rich's one place where the output text is made
        text = super()._render_buffer(buffer)
        return text if self.is_terminal else _PADDED_EOL.sub(r"\1", text)


def make_console(stderr: bool = False) -> Console:
    """The console orch's commands print with (:class:`OrchConsole`; stderr for the progress of a
    run, stdout for a command's result)."""
    return OrchConsole(stderr=stderr, highlight=False)


def wrap_words(text: str, width: int, indent: int = 0) -> list[str]:
    """``text`` (one line, its own leading spaces kept) as lines of at most ``width`` cells,
    broken only at spaces; the lines after the first start with ``indent`` spaces. A word wider
    than a line (a path, a URL, an fp8 file name) is put whole on a line of its own, the one line
    that may be wider than ``width``: a path broken in two can be neither copied nor found with
    grep. A line that fits is returned as it is."""
    if cell_len(text) <= width:
        return [text]
    lead = text[:len(text) - len(text.lstrip(" "))]
    lines: list[str] = []
    cur, gap = lead, ""  # gap: the spaces before the next word, as the text has them
    for word, spaces in re.findall(r"(\S+)(\s*)", text[len(lead):]):
        if cur.strip() and cell_len(cur) + cell_len(gap) + cell_len(word) > width:
            lines.append(cur)
            cur = " " * indent + word
        else:
            cur += gap + word
        gap = spaces
    lines.append(cur)
    return lines


def wrap_block(text: str, width: int, indent: int = 0, more: int = 2) -> list[str]:
    """Every line of a multi-line ``text`` through :func:`wrap_words` at ``width`` with ``indent``
    spaces before it; the wrapped continuation of a line is indented ``more`` spaces further."""
    out: list[str] = []
    for line in (text.split("\n") if text else [""]):
        out += wrap_words(" " * indent + line, width, indent + more)
    return out


def print_wrapped(console: Console, text: str | Text, indent: int = 2, style: str | None = None) -> None:
    """Print prose (a message, a cause) wrapped at spaces to the console's width
    (:func:`wrap_words`; continuation lines indented ``indent``), never folded inside a word.
    ``text`` is plain (never rich markup: it may come from a host)."""
    plain = text.plain if isinstance(text, Text) else str(text)
    if not isinstance(getattr(console, "width", None), int):  # not a rich console: one print, unwrapped
        console.print(plain, soft_wrap=True)
        return
    for line in plain.split("\n"):
        for part in wrap_words(line, console.width, indent):
            console.print(Text(part, style=style or ""), soft_wrap=True)


class Reporter:
    """Receives engine callbacks and renders them with rich.

    ``task_result(host, task, result)`` prints ``[host] status: task - msg``;
    ``progress(host, stage=, done=, total=, eta_s=)`` drives the host's bar;
    ``line(text)`` prints a plain line.

    Without a terminal (a log file, a pipe: cron, CI) rich draws no bar; instead, every
    ``progress_interval`` seconds (default :data:`PROGRESS_INTERVAL_S`) each host with a step in
    progress gets one plain line (:meth:`tick`): ``progress gpu-a tune: 3/18 batch sizes done,
    1m12s elapsed, about 4m10s left``, so a tune of several minutes never looks hung.
    """

    def __init__(self, console: Console | None = None, verbose: bool = False,
                 progress_interval: float | None = None):
        self.console = console or make_console(stderr=True)
        self.verbose = verbose
        self.progress_interval = PROGRESS_INTERVAL_S if progress_interval is None else progress_interval
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._bars: dict[str, int] = {}
        #: host -> the last progress report without a terminal: stage, done, total, eta_s, started
        self._plain: dict[str, dict] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self):
        self._progress = Progress(TextColumn("[bold]{task.fields[host]}"), TextColumn("{task.description}"),
                                  BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                                  TimeRemainingColumn(), console=self.console, transient=True)
        self._progress.start()
        if not self.console.is_terminal and self.progress_interval > 0:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick_loop, name="orch-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.progress_interval):
            self.tick()

    def tick(self, now: float | None = None) -> list[str]:
        """Print (and return) one plain progress line per host with a step in progress (see the
        class docstring); ``now``: monotonic seconds (default: the clock)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            lines = [plain_progress_line(host, st, now) for host, st in sorted(self._plain.items())]
            for ln in lines:
                print_wrapped(self.console, ln, indent=6)
        return lines

    def line(self, text: str) -> None:
        """Print one plain line (wrapped at spaces, :func:`wrap_words`)."""
        with self._lock:
            print_wrapped(self.console, text, indent=4)

    def task_result(self, host: str, task: str, result) -> None:
        """Print ``status host task — msg`` wrapped at spaces to the width of the terminal (or of
        ``$COLUMNS``/80 into a file or a pipe): the status right-aligned in 11 columns, the
        wrapped part of the first line under the host, the lines of a multi-line ``msg`` after
        the first indented a little more (:func:`task_lines`). Nothing is cut inside a word: a path
        wider than the line is put whole on a line of its own."""
        style = STYLE.get(result.status, "white")
        msg = result.msg if (self.verbose or len(result.msg) < 2000) else result.msg[:2000] + " ..."
        lines = task_lines(result.status, host, task, msg, self.console.width)
        head = Text(lines[0])
        head.stylize(style, 0, 11)
        head.stylize("bold", 12, 12 + len(host))
        with self._lock:
            self.console.print(head, soft_wrap=True)
            for line in lines[1:]:
                self.console.print(Text(line), soft_wrap=True)
            self._plain.pop(host, None)  # the host's step that reported progress has ended
        if host in self._bars and self._progress is not None and task.startswith("Tune"):
            self._progress.update(self._bars[host], visible=False)

    def progress(self, host: str, stage: str = "", done: float = 0, total: float = 0, eta_s=None, **_):
        if not total:
            return
        if not self.console.is_terminal:
            with self._lock:
                st = self._plain.setdefault(host, {"started": time.monotonic()})
                st.update(stage=stage, done=done, total=total, eta_s=eta_s, at=time.monotonic())
            return
        if self._progress is None:
            return
        with self._lock:
            if host not in self._bars:
                self._bars[host] = self._progress.add_task(stage, total=total, host=host)
            self._progress.update(self._bars[host], description=stage, completed=done, total=total, visible=True)


#: seconds between two plain progress lines of a host when output is not a terminal
PROGRESS_INTERVAL_S = 30.0


def task_lines(status: str, host: str, task: str, msg: str, width: int) -> list[str]:
    """The lines of one task result (:meth:`Reporter.task_result`) at ``width`` columns: the
    first line's continuations start under the host (column 12), the further lines of ``msg`` at
    column 14 and their continuations at 16 (:func:`wrap_words`)."""
    first, *rest = msg.split("\n") if msg else [""]
    lines = wrap_words(f"{status:>11} {host} {task}" + (f" — {first}" if first else ""), width, 12)
    for extra in rest:
        lines += wrap_words(" " * 14 + extra, width, 16)
    return lines


def _duration(seconds: float) -> str:
    """``1h02m``, ``4m10s`` or ``35s`` (whole seconds)."""
    s = int(round(max(0.0, seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def plain_progress_line(host: str, st: dict, now: float) -> str:
    """One progress line of ``host`` for a log (``st``: the last report, :class:`Reporter`): what
    is done of how many (batch sizes, for the tune), the time since the first report, and the time
    left: the payload's estimate (``eta_s``, less the time since it came), else the pace so far."""
    done, total = int(st.get("done") or 0), int(st.get("total") or 0)
    elapsed = now - st.get("started", now)
    unit = " batch sizes" if st.get("stage") in ("tune", "", None) else ""
    eta = st.get("eta_s")
    if isinstance(eta, (int, float)):
        left = max(0.0, float(eta) - (now - st.get("at", now)))
    elif done and total > done:
        left = elapsed / done * (total - done)
    else:
        left = None
    text = f"   progress {host} {st.get('stage') or 'tune'}: {done}/{total}{unit} done, {_duration(elapsed)} elapsed"
    return text + (f", about {_duration(left)} left" if left is not None and done < total else "")


RECAP_COUNTS = ("ok", "changed", "unreachable", "failed", "skipped", "rescued")


def _outcome_style(r) -> str:
    return "red" if r.is_failure else ("green" if r.outcome in ("completed", "check") else "yellow")


def recap_table(recaps: dict, title: str = "PLAY RECAP") -> Table:
    """Ansible-style recap: one row per host with ok/changed/failed/unreachable/skipped/rescued.
    Its cells never wrap or get cut: :func:`print_recap` prints it only when it fits."""
    t = Table(title=title, show_lines=False)
    for col in ("host", *RECAP_COUNTS, "outcome"):
        t.add_column(col, justify="left" if col in ("host", "outcome") else "right", no_wrap=True)
    for name, r in recaps.items():
        t.add_row(name, *(str(getattr(r, c)) for c in RECAP_COUNTS), Text(r.outcome, style=_outcome_style(r)))
    return t


def recap_lines(recaps: dict) -> list[Text]:
    """The recap much as Ansible prints it, one line per host (``gpu-a : completed  ok=20
    changed=6 unreachable=0 failed=0 skipped=0 rescued=0``), for a terminal too narrow for
    :func:`recap_table`: the counts keep their names, so none is cut to ``unreachab…``."""
    out = []
    for name, r in recaps.items():
        line = Text.assemble((name, "bold"), " : ", (r.outcome, _outcome_style(r)), "  ")
        line.append(" ".join(f"{c}={getattr(r, c)}" for c in RECAP_COUNTS))
        out.append(line)
    return out


def print_recap(console: Console, recaps: dict, title: str = "PLAY RECAP") -> None:
    """The recap table when it fits ``console.width``, else its title and one line per host
    (:func:`recap_lines`, wrapped at spaces)."""
    table = recap_table(recaps, title)
    if fits(console, table):
        console.print(table)
        return
    console.print(Text(title, style="bold"))
    for line in recap_lines(recaps):
        for i, part in enumerate(wrap_words(line.plain, console.width, 4)):
            # the first part is the line's start, spaces as they were: it keeps the host's style
            console.print(line[:len(part)] if i == 0 else Text(part), soft_wrap=True)


def natural_width(console: Console, renderable: RenderableType) -> int:
    """Cells that ``renderable`` takes on one line per row, with nothing wrapped."""
    return Measurement.get(console, console.options.update_width(1 << 20), renderable).maximum


def fits(console: Console, renderable: RenderableType) -> bool:
    """True when ``renderable`` (a table whose columns do not wrap) fits the console's width."""
    return natural_width(console, renderable) <= console.width


class FieldBlock:
    """One host's block for terminals too narrow for a table (:func:`field_block`): ``title`` on
    its own line, then one ``label  value`` row per field, labels in a column; each line of a value
    is wrapped at spaces within the width (:func:`wrap_words`) and its further lines stay under
    it. A word wider than the room (a path) is put whole on a line of its own. Values are plain
    text (never rich markup: they come from hosts)."""

    def __init__(self, title: Text | str, fields: list[tuple[str, str | Text]], indent: int = 2):
        self.title = title if isinstance(title, Text) else Text(str(title), style="bold")
        self.fields = [(str(label), value.plain if isinstance(value, Text) else str(value))
                       for label, value in fields]
        self.indent = indent

    def lines(self, width: int) -> list[Text]:
        """The block's lines at ``width`` cells (styles: the title's, the labels dim)."""
        out = [self.title]
        label_w = max([cell_len(label) for label, _ in self.fields] or [0])
        col = self.indent + label_w + 2
        for label, value in self.fields:
            first = True
            for vline in (value.split("\n") if value else [""]):
                for part in wrap_words(" " * col + vline, width, col):
                    line = Text(" " * self.indent)
                    line.append(label.ljust(label_w) if first else " " * label_w, style="dim")
                    line.append(part[self.indent + label_w:])
                    out.append(line)
                    first = False
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines(options.max_width):
            line.no_wrap = True
            line.overflow = "ignore"
            yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max(cell_len(line.plain) for line in self.lines(1 << 20))
        return Measurement(min(widest, options.max_width), widest)


def field_block(title: Text | str, fields: list[tuple[str, str | Text]]) -> RenderableType:
    """One host's block for terminals too narrow for a table: ``title`` on its own line, then one
    ``label  value`` row per field; a value wraps at spaces within the terminal and its further
    lines stay under it (:class:`FieldBlock`). Values are plain text (never rich markup: they
    come from hosts)."""
    return FieldBlock(title, fields)


def print_table_or_blocks(console: Console, table: Table, blocks: list[RenderableType]) -> None:
    """Print ``table`` when it fits the console's width, else its title and each of ``blocks``
    (one per host) separated by blank lines."""
    if fits(console, table):
        console.print(table)
        return
    if table.title:
        console.print(Text(str(table.title), style="bold"))
    for i, block in enumerate(blocks):
        if i:
            console.print()
        console.print(block)


def speedup_text(summary: RunSummary) -> str:
    """The kernel speedup of a host's summary as both the terminal and the HTML report show it:
    the geometric mean over batch sizes of ``speedup_vs_default`` (default time / tuned time, the
    payload's numbers; :func:`orchestrator.facts.summary.speedup_stats`), its range, and the host it
    was measured on when the files came from another host of the group (``speedup_measured_on``).
    ``-`` when nothing was measured."""
    stats = speedup_stats(summary.speedups())
    if stats is None:
        return "-"
    gm, lo, hi = stats
    text = f"{gm:.3f}x geo-mean ({lo:.2f}x–{hi:.2f}x)" if hi > lo else f"{gm:.3f}x"
    if summary.speedup_measured_on:
        text += f"\nmeasured on {summary.speedup_measured_on}"
    return text


def downtime_text(summary: RunSummary) -> str:
    """The unit's downtime on a host as the terminal and the HTML report show it: the total, its
    parts (stop, tune, install, start, readiness, seconds, from the steps' own clocks:
    :func:`orchestrator.facts.downtime.downtime`) and whether the kernels were compiled before the
    stop; ``-`` when this run did not stop the unit."""
    d = summary.downtime
    if d is None:
        return "-"
    p = d.parts()
    lines = [f"{d.total:.1f} s" if d.total is not None else "not back",
             f"stop {p['stop']:.1f}, tune {p['tune']:.1f}, install {p['install']:.1f}",
             f"start {p['start']:.1f}, readiness {p['readiness']:.1f}"]
    used = summary.prepared_used or {}
    if used.get("used"):
        lines.append(f"{used.get('kernels', 0)} kernels prepared before the stop")
    elif summary.prepared is not None or used:
        lines.append("compiled after the stop")
    return "\n".join(lines)


def _summary_fields(r) -> list[tuple[str, str]]:
    s: RunSummary = r.summary
    files = "\n".join(str(p).rsplit("/", 1)[-1] for p in (s.installed or []))
    if s.rolled_back:  # a rollback: what it put back and what it removed
        files = "\n".join([f"restored {str(p).rsplit('/', 1)[-1]}" for p in s.installed or []]
                          + [f"removed {str(p).rsplit('/', 1)[-1]}" for p in s.deleted or []])
    if s.unchanged and not s.installed:  # a re-run that found the files installed and loaded
        files = "\n".join(f"unchanged {str(p).rsplit('/', 1)[-1]}" for p in s.unchanged)
    files = files or "-"
    before, after = s.bench_before, s.bench_after
    b = before.output_throughput if before else None
    a = after.output_throughput if after else None
    tp = f"{b:.1f} → {a:.1f}" if b and a else (f"→ {a:.1f}" if a else "-")
    if s.throughput_change_pct is not None:
        tp += f" ({s.throughput_change_pct:+.1f}%)"
    version = (after or before).server_version if (after or before) else None
    if version and tp != "-":
        # what the server says it is (a test bed's stand-in says so)
        tp += f"\nserver: {s.engine or LEGACY_ENGINE} {version}"
    if s.runner_trial is not None:  # the runner trial: its table, one runner a line
        t = s.runner_trial
        tp = "\n".join(f"{r.runner}{' (unit)' if r.reference else ''}: {r.top() or 0:.1f}, agreement "
                       f"{'-' if r.agreement is None else f'{r.agreement:.0%}'}"
                       f"{'' if r.batch_agreement is None else f' (batch {r.batch_agreement:.0%})'}, "
                       f"{'KEPT' if r.kept else (r.why or 'not kept')}" for r in t.candidates)
        if t.self_agreement is not None and t.self_agreement < 1.0:  # a non-deterministic reference (issue 32)
            tp += f"\nreference agrees with itself on {t.self_agreement:.0%}"
        if t.autotune_hangs:
            tp += f"\nautotune hung on a warm cache {t.autotune_hangs}x: cache put back, started again"
        if t.measured_on:
            tp += f"\nmeasured on {t.measured_on} (same tuning group), reused here"
        if t.measuring_failed:
            tp += f"\nmeasuring host {t.measuring_failed} (no verdict): measured here"
        files = files if t.changed else "-"
    if s.sigkilled:  # sglang #22779: say it; the benchmark after checked every request for tokens
        tp += "\nSIGKILL: " + ", ".join(f"pid {k.get('pid')} ({k.get('by')})" for k in s.sigkilled)
    if s.log_gaps:  # systemd #2913: the log proof may be incomplete; the benchmark decided
        tp += "\nlog gap: " + "; ".join(s.log_gaps)
    if s.log_other_invocations:  # an earlier start's lines after the cursor: not read as this start's
        tp += "\nlog: ignored " + ", ".join(f"{o.get('lines')} line(s) of invocation {str(o.get('invocation'))[:8]}"
                                           for o in s.log_other_invocations)
    if s.collected:  # orch recover: a dead run's finished tune, now in the controller's store
        tp += "\ncollected: " + ", ".join(f"run {c.get('run_id')}: {c.get('what')}" for c in s.collected)
    if s.before_loaded and s.before_loaded.get("text"):  # what the "before" arm really ran (its log)
        tp += f"\nbefore: {s.before_loaded['text']}"
    return [("files", files), ("kernel speedup vs default", speedup_text(s)), ("output tok/s before → after", tp),
            ("unit downtime", downtime_text(s))]


def _block_fields(r) -> list[tuple[str, str]]:
    """:func:`_summary_fields` for the one-block-per-host layout of a narrow terminal: each file
    on its own row, labelled with what the run did to it (``installed``, ``restored``, ``removed``,
    ``unchanged``), so a file name never wraps away from its action."""
    out: list[tuple[str, str]] = []
    for label, value in _summary_fields(r):
        if label != "files" or value == "-":
            out.append((label, value))
            continue
        for line in value.splitlines():
            action, _, name = line.partition(" ")
            out.append((action, name) if name and action in ("restored", "removed", "unchanged")
                       else ("installed", line))
    return out


def summary_table(recaps: dict) -> Table:
    """Per-host summary: files installed, kernel speedup the payload measured (geo-mean over batch
    sizes, as in the HTML report; for a host that reused its group's files, the tuning host's
    measurement, named), output throughput before -> after; causes are printed below it by
    :func:`print_summary`. Columns do not wrap."""
    t = Table(title="SUMMARY")
    for label in ("host", "files", "kernel speedup vs default", "output tok/s before → after", "unit downtime"):
        t.add_column(label, no_wrap=True)
    for name, r in recaps.items():
        t.add_row(name, *(Text(v) for _, v in _summary_fields(r)))
    return t


def print_summary(console: Console, recaps: dict) -> None:
    """The summary as a table when it fits the terminal, else one block per host; then each
    host's cause in full (wrapped at spaces)."""
    table = summary_table(recaps)
    if not fits(console, table):
        print_table_or_blocks(console, table, [field_block(name, _block_fields(r) + ([("cause", r.cause)] if r.cause
                                                                                    else []))
                                               for name, r in recaps.items()])
        return
    console.print(table)
    causes = [(name, r.cause) for name, r in recaps.items() if r.cause]
    if causes:
        print_causes(console, causes)


def print_causes(console: Console, rows: list[tuple[str, str]]) -> None:
    """``host  cause`` rows under a table, the host in bold and the cause wrapped at spaces under
    itself (:class:`FieldBlock`'s layout without a title)."""
    width = max(cell_len(h) for h, _ in rows)
    for host, cause in rows:
        for i, part in enumerate(wrap_block(str(cause), console.width - width - 2, 0)):
            line = Text(host.ljust(width) if i == 0 else " " * width, style="bold" if i == 0 else "")
            line.append("  " + part)
            console.print(line, soft_wrap=True)
