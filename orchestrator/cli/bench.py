"""``orch bench``: served tokens/s at the operator's concurrency, per host.

Runs ``playbooks/bench.yaml``: the payload's ``bench`` command runs on each host against
the unit's own URL (so the controller's network does not distort it), with
``sglang.bench_serving``'s metric names (``output_throughput`` tokens/s, ``median_ttft_ms``,
``median_itl_ms``, ...). ``--bench-tool NAME`` (``--tool NAME``; default the inventory's
``orch_bench_tool``) runs the unit's engine's own client there: ``sglang`` SGLang's
``bench_serving``, ``vllm`` ``vllm bench serve``; another engine's client is refused per host.
A level where more than 1% of requests failed is marked invalid and the host fails.
"""


from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remote.protocol import BENCH_TOOLS

from ..ui import field_block, fits, make_console, print_table_or_blocks
from ..errors import UsageError
from ..records.layout import BENCH_LABEL, BENCH_SUMMARY, bench_file, host_dir
from .common import add_batch_flags, add_host_flags, batching, checked_as, positive_seconds
from .run import run_playbook


BENCH_COLUMNS = ("host", "concurrency", "completed", "failed", "output tok/s", "total tok/s", "req/s",
                 "median TTFT ms", "p99 TTFT ms", "median ITL ms", "valid")


def level_cells(lv: dict) -> list[str]:
    """One concurrency level of the payload's ``bench`` result (:mod:`remote.bench.command`) as
    :data:`BENCH_COLUMNS` without host (tokens/s, requests/s, milliseconds)."""
    def f(k, nd=1):
        v = lv.get(k)
        return "-" if v is None else f"{v:.{nd}f}"
    return [str(lv.get("max_concurrency")), str(lv.get("completed")),
            str((lv.get("failed") or 0) + (lv.get("timed_out") or 0)), f("output_throughput"),
            f("total_throughput"), f("request_throughput", 2), f("median_ttft_ms"), f("p99_ttft_ms"),
            f("median_itl_ms"), "yes" if lv.get("valid", True) else "no"]


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="throughput benchmark of each host's unit, run on the host")
    add_host_flags(b)
    add_batch_flags(b)
    b.add_argument("--concurrency", help="levels, e.g. 1,16,64,256 (default orch_bench_concurrency)")
    b.add_argument("--input-len", type=int, help="prompt tokens (default orch_bench_input_len)")
    b.add_argument("--output-len", type=int, help="output tokens (default orch_bench_output_len)")
    b.add_argument("--level-timeout", type=float, default=600, help="seconds per concurrency level (default 600)")
    b.add_argument("--bench-tool", "--tool", dest="bench_tool", choices=BENCH_TOOLS, default=None,
                   help="orch's client or the unit's engine's own benchmark client (named after the engine; "
                        "another engine's is refused); default orch_bench_tool (builtin)")
    b.set_defaults(func=cmd_bench)


def bench_table(recaps: dict, results: dict) -> Table:
    """One row per host and concurrency level (:data:`BENCH_COLUMNS`), cells never wrapped
    (printed only when it fits: :func:`print_bench`); a host without results gets one row with
    its outcome, the cause is printed in full below."""
    t = Table(title="orch bench")
    for col in BENCH_COLUMNS:
        t.add_column(col, justify="left" if col == "host" else "right", no_wrap=True)
    for host, r in recaps.items():
        levels = (results.get(host) or {}).get("levels") or []
        if not levels:
            t.add_row(host, "-", "-", "-", "-", "-", "-", "-", "-", "-", Text(r.outcome, style="red"))
        for lv in levels:
            cells = level_cells(lv)
            t.add_row(host, *cells[:-1], Text(cells[-1], style="" if cells[-1] == "yes" else "red"))
    return t


def _levels(text: str | None) -> list[int] | None:
    """``--concurrency 1,16,64`` -> [1, 16, 64]; UsageError naming the flag for anything else."""
    if text is None:
        return None
    try:
        levels = [int(c) for c in text.split(",")]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise UsageError(f"--concurrency: expected positive integers separated by commas, got {text!r}")
    return levels


def _level_line(lv: dict) -> str:
    c = dict(zip(BENCH_COLUMNS[1:], level_cells(lv)))
    return (f"{c['output tok/s']} output tok/s, {c['total tok/s']} total tok/s, {c['req/s']} req/s; "
            f"TTFT median {c['median TTFT ms']} ms, p99 {c['p99 TTFT ms']} ms; ITL median {c['median ITL ms']} ms; "
            f"{c['completed']} completed, {c['failed']} failed; valid: {c['valid']}")


def print_bench(console: Console, recaps: dict, results: dict) -> None:
    """The benchmark as a table when it fits ``console.width``, else one block per host (a line
    per concurrency level); then the cause of each failed host in full."""
    table = bench_table(recaps, results)
    if fits(console, table):
        console.print(table)
    else:
        print_table_or_blocks(console, table, [
            field_block(host, [(f"concurrency {lv.get('max_concurrency')}", _level_line(lv))
                               for lv in (results.get(host) or {}).get("levels") or []] or [("outcome", r.outcome)])
            for host, r in recaps.items()])
    for host, r in recaps.items():
        if r.is_failure and r.cause:
            console.print(field_block(Text.assemble((host, "bold"), "  ", (r.outcome, "red")), [("cause", r.cause)]))


def cmd_bench(args) -> int:
    """Run the bench playbook; print the table or ``--json``; exit 1 if any host failed."""
    extra = {k: v for k, v in {
        "bench_concurrency": _levels(args.concurrency),
        "bench_input_len": checked_as("--input-len", args.input_len, "orch_bench_input_len"),
        "bench_output_len": checked_as("--output-len", args.output_len, "orch_bench_output_len")}.items()
        if v is not None}
    extra.update(bench_level_timeout=positive_seconds("--level-timeout", args.level_timeout))
    if args.bench_tool is not None:  # else the inventory's orch_bench_tool
        extra["bench_tool"] = args.bench_tool
    res = run_playbook("bench", args.inventory, limit=args.limit, service=args.service, extra=extra,
                       batching=batching(args), state_dir=args.state_dir, read_only=True,
                       accept_new_host_keys=args.accept_new_host_keys, verbose=args.verbose)
    recaps, record = res.recaps, res.record
    results = {}
    for host in recaps:
        p = host_dir(record.dir, host) / bench_file(BENCH_LABEL)
        results[host] = json.loads(p.read_text()) if p.exists() else {}
    record.write_json(BENCH_SUMMARY, results)
    record.close()
    if args.json:
        print(json.dumps({"run_id": record.run_id, "hosts": results}, indent=2, default=str))
    else:
        print_bench(make_console(), recaps, results)
    return 1 if any(r.is_failure for r in recaps.values()) else 0
