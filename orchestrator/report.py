"""HTML report of one controller run: ``orch report RUN_ID [--state-dir D] [--out FILE]``.

Reads the controller's run record ``<state_dir>/runs/<run_id>/`` (layout in
:mod:`orchestrator.records.controller`) and writes ONE self-contained HTML file (default
``<run dir>/report.html``): no JavaScript, no external references; plots are PNG images
drawn with matplotlib's Agg canvas (a dependency of orch) and embedded as
``data:image/png;base64`` URIs. An earlier, different report at the same path is kept
(:func:`write_report`). The HTML comes from ``orchestrator/templates/report.html.j2``
rendered by Jinja2 with autoescaping ON: host names, paths and messages come from the
hosts and are escaped.

What it shows, per host (from ``hosts/<host>/``):

- the recap row (``recap.json``: outcome, cause, ok/changed/failed/...);
- kernel time per batch size M for the default, shipped (if any) and tuned configs, a
  log-log plot, and the speedup per M (table and plot). Source: the payload tuner's
  ``report.json`` (remote/tuning/command.py): ``batch_sizes[M].default_us``, ``shipped_us``,
  ``tuned_us`` (microseconds of the whole fused MoE, remote/tuning/tuner/driver.py
  ``compare``), ``speedup_vs_default`` = default_us / tuned_us, ``speedup_vs_shipped``;
- output throughput (tokens/s) and median ITL (ms) against max_concurrency, before
  and after (``bench_before.json`` / ``bench_after.json``, remote/bench/ levels);
- the installed files with their paths and hashes (``install_manifest.json``, else
  ``summary.installed``) and the tuned config files themselves (``configs/*.json``);
- the task timeline (``events.jsonl``).

Hosts are grouped by the up config file name SGLang looks up (device name + E + N +
dtype/block-shape/per-channel selectors: SGLang 0.5.23 ``get_config_file_name``), taken
from ``probe.json`` ``file_names.up`` or ``report.json`` ``files.up``. A group of two or
more hosts with tuning data gets a comparison plot and a speedup table (hosts x M).

Errors: :class:`ReportError` (run record not found or unreadable ``run.json``/``recap.json``).
"""

from __future__ import annotations

from remote.engines import engine_named

from .atomic import write_text
from .errors import OrchError
from .facts.probe import ProbeFacts
from .facts.summary import RunSummary, finite, speedup_stats
from .records.layout import (CONFIGS, HOSTS, INSTALL_MANIFEST, PROBE, RECAP, REPORT_HTML, RESULT, RUN, RUNS,
                             TUNE_REPORT, bench_file, host_dir)

import base64
import datetime as _dt
import hashlib
import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

TEMPLATE = "report.html.j2"
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
# line colours of the plots (also what tests look for in a screenshot)
COLORS = {"default": "#7f7f7f", "shipped": "#ff7f0e", "tuned": "#1f77b4", "before": "#7f7f7f", "after": "#1f77b4"}
HOST_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
MAX_CONFIG_CHARS = 65536


class ReportError(OrchError):
    """The run record cannot be found or read."""


# ----------------------------------------------------------------------------- loading

def find_run_dir(run_id: str, state_dir: Path | None = None) -> Path:
    """The run folder of ``run_id``.

    ``run_id`` may be a run id under ``<state_dir>/runs/`` (default state dir:
    :func:`orchestrator.records.default_state_dir`), ``latest`` (the newest run id, ids sort
    by time), or the path of a run folder. Raises :class:`ReportError` when absent.
    """
    from .records import default_state_dir

    p = Path(run_id)
    if p.is_dir() and ((p / RUN).exists() or (p / RECAP).exists()):
        return p
    runs = Path(state_dir or default_state_dir()) / RUNS
    if run_id == "latest":
        ids = sorted(d.name for d in runs.iterdir() if d.is_dir()) if runs.is_dir() else []
        if not ids:
            raise ReportError(f"no runs in {runs}")
        changing = [i for i in ids if changed_or_tried(runs / i)]
        if not changing:
            raise ReportError(f"no run in {runs} changed or tried to change hosts (its {len(ids)} run(s) are "
                              f"read-only, such as doctor, runs and --check, or changed nothing); open one by id, "
                              f"e.g. orch report {ids[-1]}")
        return runs / changing[-1]
    if "/" in run_id or run_id in (".", ".."):
        raise ReportError(f"{run_id}: not a run folder (no run.json)")
    d = runs / run_id
    if not d.is_dir():
        raise ReportError(f"run {run_id} not found in {runs}")
    return d


def is_read_only(run_dir: Path) -> bool:
    """True for the record of a run that changed nothing by design (``run.json`` ``read_only``:
    ``orch doctor``, ``orch runs``, ``--check``; records written before that field: ``check``).
    A folder whose ``run.json`` cannot be read counts as not read-only."""
    try:
        run = json.loads((Path(run_dir) / RUN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(run, dict):
        return False
    return bool(run.get("read_only", run.get("check")))


def changed_or_tried(run_dir: Path) -> bool:
    """True for a run that changed or tried to change hosts: not read-only (:func:`is_read_only`),
    and either a host changed something or did not complete (failed, unreachable, not started),
    or the run has no ``recap.json`` (it was killed before the end). A re-run that found every
    host as it should be (all completed, nothing changed: ``orch tune`` on unchanged files) is not."""
    if is_read_only(run_dir):
        return False
    try:
        recap = json.loads((Path(run_dir) / RECAP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    if not isinstance(recap, dict) or not recap:
        return True
    return any(not isinstance(r, dict) or r.get("outcome") != "completed" or r.get("changed")
               for r in recap.values())


def _read_json(path: Path, required: bool = False) -> Any:
    if not path.exists():
        if required:
            raise ReportError(f"{path}: missing")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        if required:
            raise ReportError(f"{path}: unreadable: {exc}") from None
        return {"_unreadable": f"{path.name}: {exc}"}


def _kernel_rows(tune: dict | None) -> list[dict]:
    """Per batch size rows from a tuner report.json (sorted by M)."""
    rows = []
    for key, r in ((tune or {}).get("batch_sizes") or {}).items():
        try:
            m = int(key)
        except ValueError:
            continue
        if not isinstance(r, dict):
            continue
        rows.append({"M": m, "default_us": finite(r.get("default_us")), "shipped_us": finite(r.get("shipped_us")),
                     "tuned_us": finite(r.get("tuned_us")), "speedup_default": finite(r.get("speedup_vs_default")),
                     "speedup_shipped": finite(r.get("speedup_vs_shipped")), "up": r.get("up"),
                     "down": r.get("down"), "default_config": r.get("default_config"),
                     "evaluated": r.get("evaluated"), "rel_err": finite(r.get("rel_err"))})
    return sorted(rows, key=lambda r: r["M"])


def _bench_rows(before: dict | None, after: dict | None) -> list[dict]:
    """Rows per max_concurrency joining the before and after benchmark levels."""
    by: dict[int, dict] = {}
    for label, data in (("before", before), ("after", after)):
        for lvl in (data or {}).get("levels") or []:
            c = lvl.get("max_concurrency")
            if isinstance(c, int):
                by.setdefault(c, {"c": c, "before": None, "after": None})[label] = lvl
    rows = []
    for c in sorted(by):
        row = by[c]
        b = finite((row["before"] or {}).get("output_throughput"))
        a = finite((row["after"] or {}).get("output_throughput"))
        row["change_pct"] = (a - b) / b * 100.0 if a is not None and b else None
        rows.append(row)
    return rows


def _runner_rows(summary: RunSummary) -> dict | None:
    """The runner trial's table (``summary.runner_trial``) for the template: ``{"levels": [conc],
    "rows": [{"runner", "reference", "tps": [tokens/s per level], "agreement", "batch_agreement", "passed",
    "kept", "why"}], "trial"}``; None when the run had no trial."""
    t = summary.runner_trial
    if t is None:
        return None
    levels = sorted({int(c) for r in t.candidates for c in r.tokens_per_s}, key=int)
    rows = [{"runner": r.runner, "reference": r.reference, "tps": [r.tokens_per_s.get(str(c)) for c in levels],
             "agreement": r.agreement, "batch_agreement": r.batch_agreement, "passed": r.passed, "kept": r.kept,
             "why": r.why} for r in t.candidates]
    return {"levels": levels, "rows": rows, "trial": t}


def _installed(manifest: dict | None, summary: RunSummary) -> list[dict]:
    files = (manifest or {}).get("files") if isinstance(manifest, dict) else None
    if isinstance(files, list) and files:
        return [{"path": f.get("path"), "action": f.get("action") or ("replaced" if f.get("existed") else "created"),
                 "existed": f.get("existed"), "sha256_before": f.get("sha256_before"),
                 "sha256_after": f.get("sha256_after"), "backup": f.get("backup"), "bytes": f.get("bytes_after")}
                for f in files if isinstance(f, dict)]
    return [{"path": p, "action": "installed", "existed": None, "sha256_before": None, "sha256_after": None,
             "backup": None, "bytes": None} for p in (summary.installed or [])]


def _configs(host_dir: Path) -> list[dict]:
    out = []
    d = host_dir / CONFIGS
    if d.is_dir():
        for p in sorted(d.glob("*.json")):
            raw = p.read_bytes()
            text = raw[:MAX_CONFIG_CHARS].decode("utf-8", "replace")
            out.append({"name": p.name, "sha256": hashlib.sha256(raw).hexdigest(), "text": text,
                        "truncated": len(raw) > MAX_CONFIG_CHARS})
    return out


def _tasks(events: list[dict], host: str, t0: float | None) -> list[dict]:
    out = []
    for e in events:
        if e.get("host") != host or e.get("event") != "task":
            continue
        t = finite(e.get("time"))
        msg = str(e.get("msg") or "")
        out.append({"t": (t - t0) if t is not None and t0 is not None else None, "task": e.get("task"),
                    "status": e.get("status"), "msg": msg[:400] + ("…" if len(msg) > 400 else "")})
    return out


def _downtime(summary: RunSummary, tune: dict | None) -> dict | None:
    """The unit's downtime for the template: ``total`` (s, None when not back), ``parts``
    ``[(part, s)]`` (stop, tune, install, start, readiness: :mod:`orchestrator.facts.downtime`),
    ``prepared`` (how the tune's kernels were compiled, one line) and ``split`` (the tune's own
    ``time_split`` from report.json: compile, first launch, timing, ...); None when this run did
    not stop the unit."""
    d = summary.downtime
    if d is None:
        return None
    used = summary.prepared_used or {}
    if used.get("used"):
        prepared = f"{used.get('kernels', 0)} kernels compiled before the stop"
        if summary.prepared is not None:
            prepared = summary.prepared.line()
    else:
        why = used.get("reason") or (summary.prepared.reason if summary.prepared is not None else "")
        prepared = "compiled after the stop" + (f": {why}" if why else "")
    split = (tune or {}).get("time_split") or {}
    return {"total": d.total, "parts": list(d.parts().items()), "prepared": prepared,
            "split": [(k, v) for k, v in split.items() if k not in ("wall", "batch_sizes") and finite(v) is not None],
            "tune_wall_s": (tune or {}).get("wall_s")}


def _facts(p: ProbeFacts, tune: dict | None) -> list[tuple[str, str]]:
    t = tune or {}
    model = p.model
    shape = t.get("shape") or ({k: getattr(model, k) for k in ("E", "N", "hidden", "topk")
                                if getattr(model, k) is not None} if model else {})
    naming = t.get("naming") or {}
    gpus = p.gpus
    facts = [
        ("device name", t.get("device_name") or p.device_name),
        ("GPUs", f"{len(gpus)} × {gpus[0].name}" if gpus and gpus[0].name else (str(len(gpus)) if gpus else None)),
        (engine_named(p.engine_name).display_name, p.engine.version),
        ("Triton", t.get("triton_version") or p.triton_version),
        ("config folder", p.install_dir),
        ("torch", t.get("torch_version") or p.torch_version),
        ("model", p.model_config_path or naming.get("shape_source")),
        ("architecture", model.architecture if model else None),
        ("MoE shape", ", ".join(f"{k}={v}" for k, v in shape.items()) if shape else None),
        ("TP / EP", f"{model.tp} / {model.ep}" if model and model.tp else None),
        ("weights", naming.get("weight_dtype") or (model.weight_dtype if model else None)),
        ("timed dtype", t.get("dtype")),
        ("tuner", " · ".join(f"{k} {t[k]}" for k in ("provider", "space", "seed") if t.get(k) is not None) or None),
        ("timing", t.get("timing")),
    ]
    return [(k, str(v)) for k, v in facts if v not in (None, "", [])]


def _group_key(probe: ProbeFacts, tune: dict | None) -> str | None:
    name = (probe.file_names or {}).get("up")
    if not name:
        up = ((tune or {}).get("files") or {}).get("up")
        name = str(up).rsplit("/", 1)[-1] if up else None
    return name


def load_run(run_dir: Path) -> dict:
    """Everything the template needs, read from a run folder (see the module docstring).

    Returns ``{"run": {...}, "hosts": [host, ...], "groups": [group, ...]}``; times in
    microseconds (kernel), tokens/s (throughput), milliseconds (latencies).
    Raises :class:`ReportError` when neither ``run.json`` nor ``recap.json`` can be read.
    """
    run_dir = Path(run_dir)
    run = _read_json(run_dir / RUN) or {}
    recap = _read_json(run_dir / RECAP) or {}
    if not run and not recap:
        raise ReportError(f"{run_dir}: no run.json or recap.json: not a run record")
    from .records.controller import read_events
    try:
        events = read_events(run_dir)
    except (OSError, ValueError):
        events = []
    times = [t for t in (finite(e.get("time")) for e in events) if t is not None]
    t0, t1 = (min(times), max(times)) if times else (None, None)

    names: list[str] = []
    for n in list(run.get("hosts") or []) + list(recap) + (
            sorted(d.name for d in (run_dir / HOSTS).iterdir() if d.is_dir()) if (run_dir / HOSTS).is_dir() else []):
        if n not in names:
            names.append(str(n))

    hosts = []
    for i, name in enumerate(names):
        hd = host_dir(run_dir, name)
        rc = recap.get(name) or _read_json(hd / RESULT) or {}
        summary = RunSummary.from_dict(rc.get("summary"))
        probe = ProbeFacts.from_dict(_read_json(hd / PROBE))  # any release's probe.json
        tune = _read_json(hd / TUNE_REPORT)
        before, after = _read_json(hd / bench_file("before")), _read_json(hd / bench_file("after"))
        rows = _kernel_rows(tune)
        shown = {"bench_before", "bench_after", "installed", "speedup_vs_default", "reaped", "plan", "provider",
                 "throughput_change_pct", "speedup_measured_on", "runner_trial", "collected",
                 "log_other_invocations", "recover_restart", "downtime", "prepared", "prepared_used"}
        hosts.append({
            "name": name, "anchor": f"host-{i}", "outcome": rc.get("outcome", "not started"),
            "cause": rc.get("cause") or "",
            "counts": {k: rc.get(k, 0) for k in ("ok", "changed", "failed", "unreachable", "skipped", "rescued")},
            "summary": summary, "probe": probe, "tune": tune, "kernel": rows,
            "has_shipped": any(r["shipped_us"] is not None for r in rows),
            "interpret": bool((tune or {}).get("interpret")),
            "geomean": (speedup_stats(r["speedup_default"] for r in rows) or (None,))[0],
            "speedup_measured_on": summary.speedup_measured_on,
            # the host timed these kernels itself (not a group member or a store reuse that shows
            # the tuning host's report): only such hosts get a line in a group's chart and table
            "measured": bool(rows) and not summary.speedup_measured_on,
            "bench": _bench_rows(before, after),
            "bench_invalid": any(not (lv or {}).get("valid", True) for r in _bench_rows(before, after)
                                 for lv in (r["before"], r["after"])),
            "bench_tool": ((after or before) or {}).get("tool"), "bench_url": ((after or before) or {}).get("url"),
            "bench_settings": ((after or before) or {}).get("settings") or {},
            "throughput_change_pct": finite(summary.throughput_change_pct),
            "installed": _installed(_read_json(hd / INSTALL_MANIFEST), summary),
            "configs": _configs(hd), "reaped": summary.reaped or [], "plan": summary.plan,
            "extra": {k: json.dumps(v, default=str) for k, v in summary.to_dict().items() if k not in shown},
            "facts": _facts(probe, tune), "group": _group_key(probe, tune),
            "tasks": _tasks(events, name, t0), "kernel_png": None, "bench_png": None,
            "runner_trial": _runner_rows(summary),
            "collected": [c for c in summary.collected or [] if isinstance(c, dict)],
            "other_invocations": [o for o in summary.log_other_invocations or [] if isinstance(o, dict)],
            "recover_restart": summary.recover_restart,
            "downtime": _downtime(summary, tune),
        })

    groups = []
    for key in dict.fromkeys(h["group"] for h in hosts if h["group"]):
        members = [h for h in hosts if h["group"] == key]
        measured = [h for h in members if h["measured"]]
        ms = sorted({r["M"] for h in measured for r in h["kernel"]})
        table = []
        for m in ms:
            vals = {h["name"]: next((r["speedup_default"] for r in h["kernel"] if r["M"] == m), None) for h in measured}
            got = sorted(v for v in vals.values() if v is not None)
            table.append({"M": m, "by_host": [vals[h["name"]] for h in measured],
                          "min": got[0] if got else None, "max": got[-1] if got else None,
                          "median": (got[len(got) // 2] if len(got) % 2 else (got[len(got) // 2 - 1] + got[len(got) // 2]) / 2)
                          if got else None})
        ups = {c["sha256"] for h in members for c in h["configs"] if not c["name"].endswith("_down.json")}
        groups.append({"key": key, "hosts": members, "anchor": f"group-{len(groups)}", "table": table,
                       "tuned": measured, "identical_configs": len(ups) == 1 if ups else None,
                       "outcomes": {o: sum(1 for h in members if h["outcome"] == o) for o in
                                    dict.fromkeys(h["outcome"] for h in members)},
                       "png": None})

    def iso(t):
        return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if t else None

    cmd = run.get("command")
    outcomes: dict[str, int] = {}
    for h in hosts:
        outcomes[h["outcome"]] = outcomes.get(h["outcome"], 0) + 1
    info = {"run_id": run.get("run_id") or run_dir.name, "dir": str(run_dir),
            "command": shlex.join(map(str, cmd)) if isinstance(cmd, list) else (str(cmd) if cmd else None),
            "inventory": run.get("inventory"), "playbook": run.get("playbook"), "check": bool(run.get("check")),
            "started": iso(t0), "ended": iso(t1), "duration_s": (t1 - t0) if times else None,
            "outcomes": outcomes}
    return {"run": info, "hosts": hosts, "groups": groups, "doctor": _doctor_rows(run_dir, hosts)}


def _doctor_rows(run_dir: Path, hosts: list[dict]) -> list[dict]:
    """The verdicts of an ``orch doctor`` run (``doctor.json``, else each host's ``summary.doctor``):
    ``[{"host", "verdict", "why", "fix"}]`` in host order; ``[]`` for any other run."""
    from .records.layout import DOCTOR

    rows = _read_json(run_dir / DOCTOR) or {}
    if not isinstance(rows, dict):
        rows = {}
    out = []
    for h in hosts:
        row = rows.get(h["name"]) or h["summary"].doctor
        if not isinstance(row, dict) or not row:
            continue
        why = row.get("error") or "\n".join([str(row.get("why") or "")] + [f"· {n}" for n in row.get("notes") or []])
        out.append({"host": h["name"], "anchor": h["anchor"], "verdict": str(row.get("verdict") or "failed"),
                    "why": why.strip(), "fix": row.get("fix")})
    return out


# ----------------------------------------------------------------------------- plots

def _mpl_text(s: str) -> str:
    """Host text safe for matplotlib labels: no mathtext ($), no leading '_' (hidden from legends)."""
    s = str(s).replace("$", r"\$")
    return ("\u200b" + s) if s.startswith("_") else s


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _log2_x(ax, xs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs], fontsize=7, rotation=45 if len(xs) > 8 else 0)
        ax.minorticks_off()
        if len(xs) == 1:
            ax.set_xlim(xs[0] / 2, xs[0] * 2)
    ax.grid(True, which="major", alpha=0.3)


def _log_y(ax, values: list[float]) -> None:
    """Log y axis with plain-number tick labels (minor ticks labelled only within one decade)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 10 else f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    vals = [v for v in values if v and v > 0]
    if vals and max(vals) / min(vals) < 10:
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _pos: (f"{v:,.0f}" if v >= 10 else f"{v:g}") if f"{v:.1e}"[0] in "1235" else ""))
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="y", which="both", labelsize=7)


def _legend_room(ax, frac: float = 0.45) -> None:
    """Raise the top of a linear y axis so an upper legend does not cover the lines."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + (hi - lo) * frac)


def kernel_plot(rows: list[dict]) -> str | None:
    """Base64 PNG: kernel time (µs, log) per batch size (log2) for default/shipped/tuned,
    and below it the speedup of tuned vs default (and vs shipped). None without rows."""
    from matplotlib.figure import Figure

    if not rows:
        return None
    fig = Figure(figsize=(5.2, 4.4))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    ms = [r["M"] for r in rows]
    for key, label, marker, ls in (("default_us", "default config", "o", "--"), ("shipped_us", "shipped config", "s", "-."),
                                   ("tuned_us", "tuned config", "^", "-")):
        pts = [(r["M"], r[key]) for r in rows if r[key]]
        if pts:
            ax.plot(*zip(*pts), marker=marker, ls=ls, lw=2, ms=5, color=COLORS[key.split("_")[0]], label=label)
    _log_y(ax, [r[k] for r in rows for k in ("default_us", "shipped_us", "tuned_us") if r[k]])
    ax.set_ylabel("fused MoE time (µs)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    for key, label, color in (("speedup_default", "vs default", COLORS["tuned"]),
                              ("speedup_shipped", "vs shipped", COLORS["shipped"])):
        pts = [(r["M"], r[key]) for r in rows if r[key]]
        if pts:
            ax2.plot(*zip(*pts), marker="o", lw=2, ms=4, color=color, label=label)
    ax2.axhline(1.0, color="black", lw=0.8)
    _legend_room(ax2)
    ax2.set_ylabel("speedup (×)")
    ax2.set_xlabel("batch size M (tokens)")
    ax2.legend(fontsize=7, loc="upper left", ncol=2)
    _log2_x(ax2, ms)
    fig.tight_layout()
    return _png(fig)


def bench_plot(rows: list[dict]) -> str | None:
    """Base64 PNG: output throughput (tokens/s) and median ITL (ms) vs max_concurrency,
    before and after; invalid levels are left out. None without rows."""
    from matplotlib.figure import Figure

    if not rows:
        return None
    fig = Figure(figsize=(5.2, 2.7))
    ax, ax2 = fig.subplots(1, 2)
    for label, marker, ls in (("before", "o", "--"), ("after", "^", "-")):
        for a, field in ((ax, "output_throughput"), (ax2, "median_itl_ms")):
            pts = [(r["c"], finite(r[label].get(field))) for r in rows
                   if r[label] and r[label].get("valid", True) and finite(r[label].get(field)) is not None]
            if pts:
                a.plot(*zip(*pts), marker=marker, ls=ls, lw=2, ms=5, color=COLORS[label], label=label)
    cs = [r["c"] for r in rows]
    for a, yl in ((ax, "output throughput (tok/s)"), (ax2, "median ITL (ms)")):
        _log2_x(a, cs)
        a.set_xlabel("max concurrency")
        a.set_ylabel(yl)
        a.set_ylim(bottom=0, top=a.get_ylim()[1] * 1.3)  # room for the legend above the lines
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def group_plot(group: dict) -> str | None:
    """Base64 PNG for a group of identical hosts: tuned (solid) and default (dashed) time
    per batch size for each host, and the speedup vs default per host."""
    from matplotlib.figure import Figure

    hosts = group["tuned"]
    if not hosts:
        return None
    fig = Figure(figsize=(5.2, 4.4))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    ms = sorted({r["M"] for h in hosts for r in h["kernel"]})
    for i, h in enumerate(hosts):
        c = HOST_COLORS[i % len(HOST_COLORS)]
        name = _mpl_text(h["name"] if len(h["name"]) <= 40 else h["name"][:39] + "…")
        for key, ls, lab, lw, alpha in (("tuned_us", "-", " tuned", 1.8, 1.0), ("default_us", "--", " default", 1.0, 0.6)):
            pts = [(r["M"], r[key]) for r in h["kernel"] if r[key]]
            if pts:
                ax.plot(*zip(*pts), ls=ls, marker="o", ms=3, lw=lw, alpha=alpha, color=c, label=name + lab)
        pts = [(r["M"], r["speedup_default"]) for r in h["kernel"] if r["speedup_default"]]
        if pts:
            ax2.plot(*zip(*pts), marker="o", ms=3, lw=1.6, color=c)
    _log_y(ax, [r[k] for h in hosts for r in h["kernel"] for k in ("default_us", "tuned_us") if r[k]])
    ax.set_ylabel("fused MoE time (µs)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_ylabel("speedup vs default")
    ax2.set_xlabel("batch size M (tokens)")
    _log2_x(ax2, ms)
    fig.tight_layout()
    return _png(fig)


def have_matplotlib() -> bool:
    """True when matplotlib can be found (a dependency of orch; absent only in a broken install)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


# ----------------------------------------------------------------------------- rendering

def _fmt(x, spec: str, suffix: str = "") -> str:
    return "–" if finite(x) is None else format(float(x), spec) + suffix


def _cfg(c) -> str:
    """``16/64/64/1/4/2`` = BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages of a kernel config dict."""
    if not isinstance(c, dict):
        return "–"
    keys = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
    return "/".join(str(c.get(k, "?")) for k in keys)


def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(
        us=lambda x: _fmt(x, ",.1f"), tps=lambda x: _fmt(x, ",.1f"), ms=lambda x: _fmt(x, ".2f"),
        speedup=lambda x: _fmt(x, ".3f", "×"), pct=lambda x: _fmt(x, "+.1f", " %"), secs=lambda x: _fmt(x, ".1f", " s"),
        cfg=_cfg, short=lambda s: (str(s)[:12] if s else "–"))
    return env


def render(data: dict) -> str:
    """HTML text of the report for :func:`load_run` data (plots as filled in by :func:`build_report`)."""
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    from . import __version__

    return _env().get_template(TEMPLATE).render(**data, generated=now, version=__version__, colors=COLORS)


_GENERATED = re.compile(r'<p class="muted">Generated [^<]*</p>')


def _same_report(a: str, b: str) -> bool:
    """True when two report texts differ at most in their "Generated <time> by orch <version>" line."""
    return _GENERATED.sub("", a) == _GENERATED.sub("", b)


def _keep_earlier(out: Path) -> Path:
    """Rename the existing ``out`` to ``<stem>.<its mtime, UTC>[-n]<suffix>`` beside it; return the new path."""
    stamp = _dt.datetime.fromtimestamp(out.stat().st_mtime, _dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept, n = out.with_name(f"{out.stem}.{stamp}{out.suffix}"), 1
    while kept.exists():
        n += 1
        kept = out.with_name(f"{out.stem}.{stamp}-{n}{out.suffix}")
    out.rename(kept)
    return kept


def write_report(run_dir: Path, out: Path | None = None, plots: bool | None = None) -> tuple[Path, Path | None]:
    """Write the HTML report of ``run_dir`` to ``out`` (default ``<run_dir>/report.html``).

    Returns ``(path written, earlier report kept or None)``. A report already at ``out`` that
    says the same (only its "Generated" line may differ) is left as it is; one that differs (the run
    record or orch changed since) is kept, renamed ``report.<its time>.html``, never lost.
    ``plots``: None = draw them when matplotlib is importable; False = tables only (the
    report says so). Written atomically (temporary file + rename), mode 0644.
    Raises :class:`ReportError` (see :func:`load_run`), ``OSError`` when ``out`` cannot be written.
    """
    run_dir = Path(run_dir)
    data = load_run(run_dir)
    if plots is None:
        plots = have_matplotlib()
    data["plots"] = bool(plots)
    if plots:
        for h in data["hosts"]:
            h["kernel_png"] = kernel_plot(h["kernel"])
            h["bench_png"] = bench_plot(h["bench"])
        for g in data["groups"]:
            if len(g["hosts"]) > 1:
                g["png"] = group_plot(g)
    html = render(data)
    out = Path(out) if out else run_dir / REPORT_HTML
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = None
    if out.is_file():
        try:
            earlier = out.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            earlier = None
        if earlier is not None and _same_report(earlier, html):
            return out, None  # the same report: left as it is
        kept = _keep_earlier(out)
    write_text(out, html)
    return out, kept


def build_report(run_dir: Path, out: Path | None = None, plots: bool | None = None) -> Path:
    """:func:`write_report` returning only the path written."""
    return write_report(run_dir, out, plots)[0]


def report_after_run(run_dir: Path, console) -> Path | None:
    """Hook for ``orch tune``/``rollback``: write the report and print its path on ``console``.

    Never raises (a report failure must not change the command's exit status); skipped,
    with a note, when matplotlib is not installed.
    """
    from .ui import print_wrapped  # wrapped at spaces, a long path whole on its own line

    try:
        if not have_matplotlib():
            print_wrapped(console, "report: skipped (matplotlib, a dependency of orch, is not installed: pip install "
                          f"matplotlib, then orch report {Path(run_dir).name})")
            return None
        path, kept = write_report(run_dir)
        print_wrapped(console, f"report: {path}" + (f" (the earlier, different report is kept as {kept})"
                                                     if kept else ""))
        return path
    except Exception as exc:  # noqa: BLE001 - reporting is best effort here
        print_wrapped(console, f"report: not written: {type(exc).__name__}: {exc}")
        return None
