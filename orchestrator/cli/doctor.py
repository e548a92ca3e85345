"""``orch doctor``: find hosts that silently run untuned MoE kernels, and say why.

Runs ``playbooks/doctor.yaml`` in check mode (nothing changes on any host) and prints
one row per host with a verdict: ``tuned``, ``fallback``, ``default``, ``not-triton``,
``restart-needed`` or ``broken`` (see :mod:`orchestrator.tasks.doctor`). Exit status 0
only when every host is ``tuned`` or ``not-triton``, so it can run from cron or CI.
"""

from __future__ import annotations

import json
import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .common import add_host_flags, batching
from .run import run_playbook

GOOD = {"tuned", "not-triton"}
STYLE = {"tuned": "green", "not-triton": "cyan", "fallback": "yellow", "default": "yellow",
         "restart-needed": "magenta", "broken": "bold red", "unreachable": "bold red", "failed": "bold red"}


def fix_command(host: str, row: dict, inventory: str, service: str) -> str | None:
    """The command that would fix a host, or None for ``tuned``/``not-triton`` (printed by
    ``--fix``; doctor never runs it).

    ``fallback``/``default``: ``orch tune``. ``restart-needed``: restart the unit (SGLang caches
    configs in-process). ``broken``: ``orch rollback`` when an orch run wrote the invalid file
    (``row["installed_by_run"]``), else ``orch tune`` (it writes valid files over the invalid
    one, keeping a backup; with the exact file in the installed folder SGLang never reaches the
    fallback sort that an unparsable ``triton_*`` folder breaks).
    """
    v = row.get("verdict")
    q = shlex.quote
    tune = f"orch tune {q(inventory)} --service {q(service)} --limit {q(host)}"
    if v in ("fallback", "default"):
        return tune
    if v == "restart-needed":
        return f"ssh {q(host)} systemctl restart {q(service)}   # or: {tune} (re-tunes and verifies)"
    if v == "broken":
        if row.get("installed_by_run"):
            return (f"orch rollback {q(inventory)} --service {q(service)} --limit {q(host)} "
                    f"--to {q(row['installed_by_run'])}   # undoes the orch run that wrote the invalid file")
        bad = [f for f in (row.get("files") or {}).values() if f.get("fallback_error")]
        return tune + ("   # then remove the unparsable configs/triton_* folder" if bad else
                       "   # replaces the invalid file (a backup is kept)")
    if v in ("unreachable", "failed"):
        return f"orch doctor {q(inventory)} --service {q(service)} --limit {q(host)} -v   # host not diagnosed"
    return None


def last_start_summary(row: dict) -> str:
    """What the unit logged at its last start about MoE configs, for the table (one line per
    kind of lookup, files named by role ``up``/``down``; every release's lines, parsed by
    :mod:`orchestrator.facts.moe_log`)."""
    lg = row.get("log")
    if lg is None:
        return "no start logged"
    names = row.get("file_names") or {}
    roles = {v: k for k, v in names.items() if v}

    def role(path: str) -> str:
        base = str(path).rsplit("/", 1)[-1]
        return roles.get(base, base)

    parts = []
    if lg.get("loaded"):
        parts.append("loaded " + ", ".join(role(p) for p in lg["loaded"]))
    by_version: dict[str, list[str]] = {}
    for wanted, _used, version in lg.get("fallback") or []:
        by_version.setdefault(version, []).append(role(wanted))
    parts += [f"fallback to triton {v}: {', '.join(rs)}" for v, rs in by_version.items()]
    if lg.get("default"):
        parts.append("default config: " + ", ".join(role(p) for p in lg["default"]))
    if lg.get("down_missing"):
        parts.append("down file missing (up config reused)")
    return "\n".join(parts) or "no Triton MoE lookup"


def doctor_table(rows: dict[str, dict]) -> Table:
    """The doctor table: one row per host."""
    t = Table(title="orch doctor", show_lines=True)
    for col in ("host", "device name", "triton / sglang", "backend", "E / N (TP/EP)", "up file", "down file",
                "last start", "verdict"):
        t.add_column(col, overflow="fold", min_width=46 if col == "verdict" else None)
    for host, r in rows.items():
        if "verdict" not in r or r.get("error"):
            t.add_row(host, "-", "-", "-", "-", "-", "-", "-", f"[bold red]{r.get('verdict', 'failed')}[/]: "
                      f"{escape(str(r.get('error') or ''))[:300]}")
            continue

        def fcell(info):
            if not info or not info.get("name"):
                return "-"
            where = ("installed folder" if info.get("in_installed_folder") else
                     ("only " + ", ".join(info.get("other_folders") or []) if info.get("other_folders") else "missing"))
            err = f"\n[red]{escape(info['error'])}[/]" if info.get("error") else ""
            return escape(f"{info['name']}\n{where}") + err

        last = escape(last_start_summary(r))
        style = STYLE.get(r["verdict"], "white")
        gpus = r.get("gpus") or []
        gpu = f"{r.get('device_name')}" + (f"\n{len(gpus)}x {', '.join(sorted(set(gpus)))}" if gpus else "") + (
            f"\nsm {r['capability']}" if r.get("capability") else "")
        t.add_row(host, gpu,
                  f"{r.get('triton_version')} / {r.get('sglang_version')}", r.get("backend", "-"),
                  f"{r.get('E')} / {r.get('N')} ({r.get('tp')}/{r.get('ep')})"
                  + (f"\n{r['dtype_selector'].lstrip(',')}" if r.get("dtype_selector") else ""),
                  fcell((r.get("files") or {}).get("up")), fcell((r.get("files") or {}).get("down")), last,
                  f"[{style}]{r['verdict']}[/]\n"
                  + escape(str(r.get("why") or "") + "".join(f"\n· {n}" for n in r.get("notes") or [])))
    return t


def add_parser(sub) -> None:
    d = sub.add_parser("doctor", help="find hosts that silently run untuned MoE kernels, and say why (read-only)")
    add_host_flags(d)
    d.add_argument("--fix", action="store_true", help="print the command that would fix each host (runs nothing)")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    """Run the doctor playbook and print the table (or ``--json``); exit 0 only if all hosts are fine."""
    res = run_playbook("doctor", args.inventory, limit=args.limit, service=args.service, check=True,
                       batching=batching(args), state_dir=args.state_dir,
                       accept_new_host_keys=args.accept_new_host_keys, verbose=args.verbose)
    recaps, record = res.recaps, res.record
    rows = {}
    for host, r in recaps.items():
        row = dict((r.summary or {}).get("doctor") or {})
        if r.is_failure or not row:
            row = {"verdict": "unreachable" if r.outcome == "unreachable" else "failed", "error": r.cause}
        rows[host] = row
    for host, row in rows.items():
        row["fix"] = fix_command(host, row, str(args.inventory), args.service or "UNIT")
    record.write_json("doctor.json", rows)
    record.close()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        Console(width=200).print(doctor_table(rows))
    if args.fix and not args.json:  # with --json the command is each row's "fix"
        for host, row in rows.items():
            if row["fix"]:
                print(f"{host}: {row['fix']}")
    return 0 if all(r.get("verdict") in GOOD for r in rows.values()) else 1
