"""``orch report RUN_ID``: write the self-contained HTML report of a run (:mod:`orchestrator.report`)."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="write an HTML report of a run (an earlier, different one is kept)")
    rp.add_argument("run_id", help="run id, 'latest', or a run folder")
    rp.add_argument("--state-dir", type=Path, help="controller run records (default $XDG_STATE_HOME/orch)")
    rp.add_argument("--out", type=Path, help="output file (default <run dir>/report.html)")
    rp.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """``orch report RUN_ID [--state-dir D] [--out FILE]``: write the report, print its path.

    Exit status 0 when written, 2 when the run is not found or unreadable, 1 when the file
    cannot be written. An earlier, different report at that path is kept under a new name
    (said on stderr). Without matplotlib (a broken install) the report has tables only (a note
    says so).
    """
    from ..report import ReportError, find_run_dir, have_matplotlib, write_report

    try:
        run_dir = find_run_dir(args.run_id, getattr(args, "state_dir", None))
        if not have_matplotlib():
            print("orch report: matplotlib (a dependency of orch) is not installed: writing tables without plots",
                  file=sys.stderr)
        path, kept = write_report(run_dir, getattr(args, "out", None))
        if kept:
            print(f"orch report: {path} existed and differed from this report: the earlier one is kept as {kept}",
                  file=sys.stderr)
    except ReportError as exc:
        print(f"orch: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"orch: error: cannot write the report: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
