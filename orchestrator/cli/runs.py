"""``orch runs``: each host's run records, read from the host itself (true even when several
controllers were used)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from .common import add_host_flags, batching
from .run import run_playbook


def add_parser(sub) -> None:
    h = sub.add_parser("runs", help="the run records of orch runs, read from the hosts themselves")
    add_host_flags(h)
    h.add_argument("--host", help="only this host")
    h.set_defaults(func=cmd_runs)


def runs_table(recaps: dict, only_host: str | None = None) -> Table:
    """One row per (host, run): run id, time, action, files changed, throughput before → after, outcome."""
    t = Table(title="orch runs")
    for col in ("host", "run id", "created", "action", "files changed", "output tok/s before → after", "state"):
        t.add_column(col)
    for host, r in recaps.items():
        if only_host and host != only_host:
            continue
        if r.is_failure:
            t.add_row(host, "-", "-", "-", "-", "-", f"[red]{r.outcome}: {r.cause[:80]}[/]")
            continue
        for run in (r.summary or {}).get("runs") or []:
            st = run.get("state") or {}
            summ = ((st.get("data") or {}).get("summary")) or {}
            b = (summ.get("bench_before") or {}).get("output_throughput")
            a = (summ.get("bench_after") or {}).get("output_throughput")
            tp = f"{b:.1f} → {a:.1f}" if b and a else (f"→ {a:.1f}" if a else "-")
            files = "\n".join(f"{c.get('action')}: {str(c.get('path')).rsplit('/', 1)[-1]}"
                              for c in run.get("changed") or []) or "-"
            t.add_row(host, run.get("run_id", "?"), str(run.get("created", ""))[:19], str(run.get("action") or "-"),
                      files, tp, str(st.get("state") or run.get("status") or "-"))
    return t


def cmd_runs(args) -> int:
    """Run ``playbooks/runs.yaml`` over the inventory and print the run records (or JSON)."""
    res = run_playbook("runs", args.inventory, limit=args.host or args.limit, service=args.service, check=True,
                       batching=batching(args), state_dir=args.state_dir,
                       accept_new_host_keys=args.accept_new_host_keys, verbose=args.verbose)
    recaps = res.recaps
    res.record.close()
    if args.json:
        print(json.dumps({h: {"outcome": r.outcome, "cause": r.cause, "runs": (r.summary or {}).get("runs")}
                          for h, r in recaps.items()}, indent=2, default=str))
    else:
        Console().print(runs_table(recaps, args.host))
    return 1 if any(r.is_failure for r in recaps.values()) else 0
