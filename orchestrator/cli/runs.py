"""``orch runs``: each host's run records, read from the host itself (true even when several
controllers were used)."""

from __future__ import annotations

import difflib
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import UsageError
from ..facts.summary import RunSummary
from ..inventory import load_inventory
from ..ui import field_block, fits, make_console, print_table_or_blocks
from .common import add_host_flags, batching
from .run import run_playbook


RUN_COLUMNS = ("host", "run id", "created", "action", "files changed", "output tok/s before → after", "state")


def run_fields(run: dict) -> list[tuple[str, str]]:
    """``(column, text)`` of one run record of a host (:data:`RUN_COLUMNS` without host): file
    names whole, one per line, with what the run did to each. The run's summary is read as the
    run that wrote it recorded it (:meth:`RunSummary.from_dict`, any release's)."""
    st = run.get("state") or {}
    summ = RunSummary.from_dict((st.get("data") or {}).get("summary"))
    b = summ.bench_before.output_throughput if summ.bench_before else None
    a = summ.bench_after.output_throughput if summ.bench_after else None
    tp = f"{b:.1f} → {a:.1f}" if b and a else (f"→ {a:.1f}" if a else "-")
    files = "\n".join(f"{c.get('action')}: {str(c.get('path')).rsplit('/', 1)[-1]}"
                      for c in run.get("changed") or []) or "-"
    return [("run id", str(run.get("run_id", "?"))), ("created", str(run.get("created", ""))[:19]),
            ("action", str(run.get("action") or "-")), ("files changed", files),
            ("output tok/s before → after", tp), ("state", str(st.get("state") or run.get("status") or "-"))]


def _selected(recaps: dict, only_host: str | None):
    return [(h, r) for h, r in recaps.items() if not only_host or h == only_host]


def add_parser(sub) -> None:
    h = sub.add_parser("runs", help="the run records of orch runs, read from the hosts themselves")
    add_host_flags(h)
    h.add_argument("--host", help="only this host")
    h.set_defaults(func=cmd_runs)


def runs_table(recaps: dict, only_host: str | None = None) -> Table:
    """One row per (host, run): :data:`RUN_COLUMNS`, cells never wrapped (printed only when it
    fits: :func:`print_runs`). A host whose history could not be read gets a row saying so; the
    cause is printed in full below the table."""
    t = Table(title="orch runs")
    for col in RUN_COLUMNS:
        t.add_column(col, no_wrap=True)
    for host, r in _selected(recaps, only_host):
        if r.is_failure:
            t.add_row(host, "-", "-", "-", "-", "-", Text(r.outcome, style="red"))
            continue
        for run in r.summary.runs or []:
            t.add_row(host, *(Text(v) for _, v in run_fields(run)))
    return t


def print_runs(console: Console, recaps: dict, only_host: str | None = None) -> None:
    """The history as a table when it fits ``console.width``, else one block per run; the cause
    of each host that failed in full (wrapped at spaces)."""
    table = runs_table(recaps, only_host)
    failures = [(h, r) for h, r in _selected(recaps, only_host) if r.is_failure]
    if fits(console, table):
        console.print(table)
    else:
        blocks = []
        for host, r in _selected(recaps, only_host):
            if not r.is_failure:
                for run in r.summary.runs or []:
                    (_, run_id), *fields = run_fields(run)
                    fields = [("output tok/s", "before → after: " + v) if k.startswith("output tok/s") else (k, v)
                              for k, v in fields]
                    blocks.append(field_block(Text.assemble((host, "bold"), "  ", run_id), fields))
        print_table_or_blocks(console, table, blocks)
    for host, r in failures:
        console.print(field_block(Text.assemble((host, "bold"), "  ", (r.outcome, "red")), [("cause", r.cause)]))


def host_limit(inventory: str, host: str | None, limit: str | None) -> str | None:
    """The ``--limit`` pattern for ``--host H`` (with ``--limit`` too: their intersection). A name
    that is no host of the inventory is a :class:`UsageError` naming ``--host`` (not ``--limit``,
    which the operator did not give) and the closest host name, before any host is contacted."""
    if not host:
        return limit
    names = [h.name for h in load_inventory(inventory).hosts]
    if host not in names:
        close = difflib.get_close_matches(host, names, n=1)
        raise UsageError(f"--host {host!r}: no host of that name in {inventory}"
                         + (f" (did you mean {close[0]!r}?)" if close else f" (its hosts: {', '.join(names)})"))
    return f"{limit},&{host}" if limit else host


def cmd_runs(args) -> int:
    """Run ``playbooks/runs.yaml`` over the inventory and print the run records (or JSON)."""
    limit = host_limit(args.inventory, args.host, args.limit)
    res = run_playbook("runs", args.inventory, limit=limit, service=args.service, check=True, remember_host_keys=True,
                       batching=batching(args), state_dir=args.state_dir,
                       accept_new_host_keys=args.accept_new_host_keys, verbose=args.verbose)
    recaps = res.recaps
    res.record.close()
    if args.json:
        print(json.dumps({h: {"outcome": r.outcome, "cause": r.cause, "runs": r.summary.runs}
                          for h, r in recaps.items()}, indent=2, default=str))
    else:
        print_runs(make_console(), recaps, args.host)
    return 1 if any(r.is_failure for r in recaps.values()) else 0
