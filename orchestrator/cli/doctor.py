"""``orch doctor``: find hosts that silently run untuned MoE kernels, and say why.

Runs ``playbooks/doctor.yaml`` in check mode (nothing changes on any host) and prints
one row per host with a verdict: ``tuned``, ``fallback``, ``default``, ``not-triton``, ``not-applicable``,
``restart-needed``, ``broken`` or ``unfinished-run`` (see :mod:`orchestrator.tasks.diagnose`). A
rank of a multi-node server also shows its rank and server, and the server's problems
(:func:`add_servers`).
Exit status 0 only when every host is ``tuned``, ``not-triton`` or ``not-applicable`` and no multi-node server has a
problem, so it can run from cron or CI.
"""

from __future__ import annotations

import json
import shlex

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..facts.legacy import DOCTOR_KEYS, LEGACY_ENGINE, renamed

from ..records.layout import DOCTOR
from ..ui import field_block, fits, make_console, print_causes, print_table_or_blocks

from .common import add_host_flags, batching
from .run import run_playbook

GOOD = {"tuned", "not-triton", "not-applicable"}
STYLE = {"tuned": "green", "not-triton": "cyan", "not-applicable": "cyan", "fallback": "yellow", "default": "yellow",
         "restart-needed": "magenta", "broken": "bold red", "unreachable": "bold red", "failed": "bold red",
         "unfinished-run": "bold red"}


def fix_command(host: str, row: dict, inventory: str, service: str) -> str | None:
    """The command that would fix a host, or None for ``tuned``/``not-triton`` (printed by
    ``--fix``; doctor never runs it).

    ``fallback``/``default``: ``orch tune``. ``unfinished-run``: ``orch recover``.
    ``restart-needed``: restart the unit (SGLang caches configs in-process). ``broken``: ``orch rollback`` when an orch run wrote the invalid file
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
    if v == "unfinished-run":
        return (f"orch recover {q(inventory)} --service {q(service)} --limit {q(host)}   # restores and records the "
                "run an orch controller left unfinished")
    if v in ("unreachable", "failed"):
        return f"orch doctor {q(inventory)} --service {q(service)} --limit {q(host)} -v   # host not diagnosed"
    return None


def last_start_summary(row: dict) -> str:
    """What the unit logged at its last start about MoE configs, for the table (one line per
    kind of lookup, files named by role ``up``/``down``; every release's lines, parsed by the
    engine's log model, ``Engine.parse_log``)."""
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


COLUMNS = ("host", "device name", "triton / engine", "backend", "E / N (TP/EP)", "up file", "down file",
           "last start", "verdict")


def _file_cell(info: dict | None, with_error: bool) -> str:
    """A config file: its name, then where it is (installed folder / only other folders / missing);
    with ``with_error``, the reason it is invalid in full (else ``invalid``: the reason is in the
    verdict's explanation)."""
    if not info or not info.get("name"):
        return "-"
    where = ("installed folder" if info.get("in_installed_folder") else
             ("only " + ", ".join(info.get("other_folders") or []) if info.get("other_folders") else "missing"))
    err = ("\n" + (str(info["error"]) if with_error else "invalid")) if info.get("error") else ""
    return f"{info['name']}\n{where}{err}"


def backend_cell(row: dict) -> str:
    """The runner backend the unit asks for, then the runner the engine uses (``runner X``, ``runner
    ?`` when not known) and, for a runner that autotunes, its autotune state in one line (on/off,
    this server's cache, a stale cache of another FlashInfer version: :class:`remote.engines.AutotuneState`)."""
    lines = [str(row.get("backend", "-"))]
    runner = row.get("runner") or {}
    if runner:
        lines.append(f"runner {runner.get('runner') or '?'}")
    tune = row.get("autotune")
    if tune:
        head = {True: "autotune on", False: "autotune off", None: "autotune ?"}[tune.get("enabled")]
        if tune.get("enabled") is not False:
            head += f", cache {tune.get('cache')}"
            if tune.get("other_versions"):
                head += ", stale cache"
        lines.append(head)
    return "\n".join(lines)


def doctor_fields(row: dict, full: bool = False) -> list[tuple[str, str]]:
    """``(column, text)`` of one diagnosed host in :data:`COLUMNS` order without host and verdict
    (plain text; from the host, never markup). ``full``: file errors in full (the block layout)."""
    gpus = row.get("gpus") or []
    gpu = f"{row.get('device_name')}" + (f"\n{len(gpus)}x {', '.join(sorted(set(gpus)))}" if gpus else "") + (
        f"\nsm {row['capability']}" if row.get("capability") else "")
    files = row.get("files") or {}
    return [("device name", gpu),
            ("triton / engine", f"{row.get('triton_version')} / {row.get('engine') or LEGACY_ENGINE} "
                                f"{renamed(row, DOCTOR_KEYS).get('engine_version')}"),
            ("backend", backend_cell(row)),
            ("E / N (TP/EP)", f"{row.get('E')} / {row.get('N')} ({row.get('tp')}/{row.get('ep')})"
             + (f"\n{row['dtype_selector'].lstrip(',')}" if row.get("dtype_selector") else "")),
            ("up file", _file_cell(files.get("up"), full)), ("down file", _file_cell(files.get("down"), full)),
            ("last start", last_start_summary(row))]


def add_servers(rows: dict[str, dict], servers: dict) -> None:
    """Add to each row of a rank of a multi-node server its ``server``: ``key``
    (``<unit>@<dist-init-addr>``), ``rank``, ``nnodes``, ``hosts`` (by rank, ``""`` for a rank not
    in the run) and ``problems``, the same on every rank. ``servers``: host name -> its
    :class:`orchestrator.facts.server_group.ServerGroup` (``RunResult.options.servers``). A problem:
    the group's refusal (a rank missing from the inventory or ``--limit``, ranks that disagree on
    ``--nnodes`` or claim one rank), GPUs of different kinds, or different up/down files SGLang
    would load on different ranks (their sha256): SGLang 0.5.23 looks up each rank's file on that
    rank, so every rank must hold the same bytes (docs/multi-node.md). Pure; changes ``rows``."""
    by_key: dict[str, list[str]] = {}
    for host, group in servers.items():
        if host in rows:
            by_key.setdefault(group.key, []).append(host)
    for key, hosts in by_key.items():
        first = servers[hosts[0]]
        problems = []
        if first.refusal:
            problems.append(first.refusal.removesuffix(". Nothing was stopped on any of its ranks"))
        seen = [h for h in hosts if _diagnosed(rows[h])]
        kinds = {rows[h].get("device_name") for h in seen}
        if len(kinds) > 1:
            said = ", ".join(f"{h} {rows[h].get('device_name')}" for h in seen)
            problems.append(f"the ranks' GPUs are of different kinds ({said}): one tune cannot fit every rank")
        for role in ("up", "down"):
            digests = {h: ((rows[h].get("files") or {}).get(role) or {}).get("sha256") for h in seen}
            if len(set(digests.values())) > 1:
                said = ", ".join(f"{h} {(d or 'none')[:12]}" for h, d in digests.items())
                problems.append(f"the ranks load different {role} files (sha256 {said}): "
                                "orch tune installs the same files on every rank")
        for h in hosts:
            g = servers[h]
            rows[h]["server"] = {"key": key, "rank": g.rank, "nnodes": g.nnodes, "hosts": list(g.hosts),
                                 "problems": list(problems)}


def server_cell(row: dict) -> str:
    """``rank R of N`` and the server's key, for the host of a multi-node server (else "")."""
    srv = row.get("server")
    return f"rank {srv['rank']} of {srv['nnodes']}\n{srv['key']}" if srv else ""


def verdict_reason(row: dict) -> str:
    """Why the host got its verdict, then its notes (``· ...``) and its multi-node server's
    problems (``· server ...``), one per line; for a host that was not diagnosed, the error."""
    srv = [f"· server {row['server']['key']}: {p}" for p in (row.get("server") or {}).get("problems") or []]
    if "verdict" not in row or row.get("error"):
        return "\n".join([str(row.get("error") or "")] + srv).strip()
    return "\n".join([str(row.get("why") or "")] + [f"· {n}" for n in row.get("notes") or []] + srv).strip()


def _verdict(row: dict) -> Text:
    v = str(row.get("verdict", "failed"))
    return Text(v, style=STYLE.get(v, "white"))


def _diagnosed(row: dict) -> bool:
    return "verdict" in row and not row.get("error")


def doctor_table(rows: dict[str, dict]) -> Table:
    """The wide layout: one row per host, :data:`COLUMNS`, cells never wrapped (so it is printed
    only when it fits the terminal: :func:`print_doctor`); the verdicts' reasons go below it."""
    t = Table(title="orch doctor", show_lines=True)
    for col in COLUMNS:
        t.add_column(col, no_wrap=True)
    for host, r in rows.items():
        cells = [Text(v) for _, v in doctor_fields(r)] if _diagnosed(r) else [Text("-")] * (len(COLUMNS) - 2)
        t.add_row("\n".join(x for x in (host, server_cell(r)) if x), *cells, _verdict(r))
    return t


def add_parser(sub) -> None:
    d = sub.add_parser("doctor", help="find hosts that silently run untuned MoE kernels, and say why (read-only)")
    add_host_flags(d)
    d.add_argument("--fix", action="store_true", help="print the command that would fix each host (runs nothing)")
    d.set_defaults(func=cmd_doctor)


def doctor_blocks(rows: dict[str, dict]) -> list:
    """The narrow layout: one block per host (verdict and reason first, then the fields)."""
    blocks = []
    for host, r in rows.items():
        title = Text.assemble((host, "bold"), "  ", _verdict(r))
        fields = [("why", verdict_reason(r))] + ([("server", server_cell(r))] if r.get("server") else []) + (
            doctor_fields(r, full=True) if _diagnosed(r) else [])
        blocks.append(field_block(title, fields))
    return blocks


def print_doctor(rows: dict[str, dict], console: Console) -> None:
    """Print the doctor's findings to fit ``console.width``: the table and below it each host's
    verdict with its reason (wrapped at spaces) when the table fits, else one block per host.
    Nothing is cut: file names, verdicts and reasons appear whole."""
    table = doctor_table(rows)
    if not fits(console, table):
        print_table_or_blocks(console, table, doctor_blocks(rows))
        return
    console.print(table)
    width = max(len(h) for h in rows)
    print_causes(console, [(f"{host.ljust(width)}  {_verdict(r).plain}", verdict_reason(r)) for host, r in rows.items()])


def cmd_doctor(args) -> int:
    """Run the doctor playbook and print the table (or ``--json``); exit 0 only if all hosts are fine."""
    res = run_playbook("doctor", args.inventory, limit=args.limit, service=args.service, check=True,
                       batching=batching(args), state_dir=args.state_dir,
                       accept_new_host_keys=args.accept_new_host_keys, remember_host_keys=True,
                       verbose=args.verbose, multi_node=True)
    recaps, record = res.recaps, res.record
    rows = {}
    for host, r in recaps.items():
        row = dict(r.summary.doctor or {})
        if r.is_failure or not row:
            row = {"verdict": "unreachable" if r.outcome == "unreachable" else "failed", "error": r.cause}
        rows[host] = row
    add_servers(rows, res.options.servers if res.options is not None else {})
    for host, row in rows.items():
        row["fix"] = fix_command(host, row, str(args.inventory), args.service or "UNIT")
    record.write_json(DOCTOR, rows)
    record.close()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_doctor(rows, make_console())
    if args.fix and not args.json:  # with --json the command is each row's "fix"
        for host, row in rows.items():
            if row["fix"]:
                print(f"{host}: {row['fix']}")
    fine = all(r.get("verdict") in GOOD and not (r.get("server") or {}).get("problems") for r in rows.values())
    return 0 if fine else 1
