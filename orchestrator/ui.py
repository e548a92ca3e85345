"""Terminal output: per-task lines prefixed with the host, a progress bar per host, the recap.

Uses rich. Everything goes to stderr except ``--json`` output, so stdout stays
machine-readable.
"""

from __future__ import annotations

import threading

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "skipped": "cyan", "unreachable": "bold magenta"}


class Reporter:
    """Receives engine callbacks and renders them with rich.

    ``task_result(host, task, result)`` prints ``[host] status: task - msg``;
    ``progress(host, stage=, done=, total=, eta_s=)`` drives the host's bar;
    ``line(text)`` prints a plain line.
    """

    def __init__(self, console: Console | None = None, verbose: bool = False):
        self.console = console or Console(stderr=True, highlight=False)
        self.verbose = verbose
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._bars: dict[str, int] = {}

    def __enter__(self):
        self._progress = Progress(TextColumn("[bold]{task.fields[host]}"), TextColumn("{task.description}"),
                                  BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                                  TimeRemainingColumn(), console=self.console, transient=True)
        self._progress.start()
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def line(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False)

    def task_result(self, host: str, task: str, result) -> None:
        style = STYLE.get(result.status, "white")
        msg = result.msg if (self.verbose or len(result.msg) < 2000) else result.msg[:2000] + " ..."
        text = Text()
        text.append(f"{result.status:>11} ", style=style)
        text.append(host, style="bold")
        text.append(f" {task}")
        if msg:
            text.append(f" — {msg}")
        with self._lock:
            self.console.print(text, soft_wrap=True)
        if host in self._bars and self._progress is not None and task.startswith("Tune"):
            self._progress.update(self._bars[host], visible=False)

    def progress(self, host: str, stage: str = "", done: float = 0, total: float = 0, eta_s=None, **_):
        if self._progress is None or not total:
            return
        with self._lock:
            if host not in self._bars:
                self._bars[host] = self._progress.add_task(stage, total=total, host=host)
            self._progress.update(self._bars[host], description=stage, completed=done, total=total, visible=True)


def recap_table(recaps: dict, title: str = "PLAY RECAP") -> Table:
    """Ansible-style recap: one row per host with ok/changed/failed/unreachable/skipped/rescued."""
    t = Table(title=title, show_lines=False)
    for col in ("host", "ok", "changed", "unreachable", "failed", "skipped", "rescued", "outcome"):
        t.add_column(col, justify="left" if col in ("host", "outcome") else "right")
    for name, r in recaps.items():
        style = "red" if r.is_failure else ("green" if r.outcome in ("completed", "check") else "yellow")
        t.add_row(name, str(r.ok), str(r.changed), str(r.unreachable), str(r.failed), str(r.skipped),
                  str(r.rescued), f"[{style}]{r.outcome}[/]")
    return t


def summary_table(recaps: dict) -> Table:
    """Per-host summary: files installed, kernel speedup the payload measured, throughput before -> after."""
    t = Table(title="SUMMARY")
    for col in ("host", "files", "kernel speedup vs default", "output tok/s before → after", "cause"):
        t.add_column(col)
    for name, r in recaps.items():
        s = r.summary or {}
        files = "\n".join(str(p).rsplit("/", 1)[-1] for p in (s.get("installed") or [])) or "-"
        sp = s.get("speedup_vs_default") or {}
        if isinstance(sp, dict) and sp:
            vals = [float(v) for v in sp.values() if isinstance(v, (int, float))]
            speed = f"{min(vals):.2f}x–{max(vals):.2f}x" if vals else "-"
        else:
            speed = "-"
        b, a = (s.get("bench_before") or {}).get("output_throughput"), (s.get("bench_after") or {}).get("output_throughput")
        tp = f"{b:.1f} → {a:.1f}" if b and a else (f"→ {a:.1f}" if a else "-")
        if s.get("throughput_change_pct") is not None:
            tp += f" ({s['throughput_change_pct']:+.1f}%)"
        t.add_row(name, files, speed, tp, r.cause[:120] if r.cause else "")
    return t
