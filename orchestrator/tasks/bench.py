"""Task ``bench``: throughput benchmark run ON the host against the unit's own URL.

The URL is ``orch_bench_url`` when set, else the address where ``plan`` found the server
answering on the host (``orch_endpoint``), else the first address its ``--host``/``--port`` give
(:func:`orchestrator.host.endpoint.endpoint_candidates`).

The payload's ``bench`` command drives the server with fixed random-token prompts,
streaming, and reports ``sglang.bench_serving``'s metric names (``output_throughput``
in tokens/s, ``median_ttft_ms``, ``median_itl_ms``, ...). ``label`` is ``before`` or
``after``; with ``compare_to`` the task fails when output tokens/s at the highest
concurrency fell by more than ``regression_threshold`` percent (automatic rollback).
"""

from __future__ import annotations

import json
from typing import Literal

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import task
from ..facts.bench import BenchResult
from ..facts.journal import last_start_log
from ..facts.schema import FactError
from ..host.answering import check_answering_process
from ..host.endpoint import container_of, endpoint_candidates, endpoint_of
from ..host.sigkill import requests_without_tokens
from ..payload.client import stop_tagged
from ..payload.model_args import payload_env
from ..records.layout import bench_file
from remote.protocol import BENCH_TOOLS


def loaded_by_server(ctx, unit: str) -> dict:
    """What the running server's last start loaded, from the unit's log (the lines since the
    engine's start line, :func:`orchestrator.facts.journal.last_start`, read by ``Engine.parse_log``):
    ``{"loaded": [paths], "fallback": [[wanted, used,
    triton]], "default": [wanted paths], "down_missing": [paths], "text"}``, or ``{"text"}`` saying
    the log shows no start. ``text``: one line for the recap."""
    engine = ctx.facts.engine
    start = last_start_log(ctx.connection, ctx.facts.unit_handle(unit), engine)
    if start is None:
        return {"text": "the unit's log shows no server start: what it loaded is unknown"}
    rep = engine.parse_log(start)
    out = {"loaded": rep.loaded, "fallback": [list(f) for f in rep.fallback], "default": rep.default,
           "down_missing": rep.down_missing}
    parts = [f"loaded {p.rsplit('/', 1)[-1]}" for p in rep.loaded]
    parts += [f"fell back to {used} (Triton {ver}'s folder) for {wanted.rsplit('/', 1)[-1]}"
              for wanted, used, ver in rep.fallback]
    parts += [f"default config (no {w.rsplit('/', 1)[-1]})" for w in rep.default]
    parts += [f"no {w.rsplit('/', 1)[-1]} (up config reused)" for w in rep.down_missing]
    if not rep.any_lookup:
        parts = ["no Triton MoE config lookup in its log"]
    out["text"] = "; ".join(parts)
    return out


@task("bench", rerun=True, sets=("orch_bench_*",))
def bench(ctx, label: str, concurrency: list[int], input_len: int, output_len: int, level_timeout: float = 300,
          tool: Literal[BENCH_TOOLS] = "builtin", compare_to: str | None = None,
          regression_threshold: float = 3.0) -> TaskResult:
    """Benchmark the unit's server on the host; the result is the fact ``orch_bench_<label>``.

    ``concurrency``: levels (parallel requests); ``input_len``/``output_len``: tokens per request;
    ``level_timeout``: seconds per level; ``tool``: orch's own client or the engine's own
    (``Engine.bench_tool``, named after the engine: its ``bench_serving``, ``bench serve``); another
    engine's client fails the task before anything runs, naming the host, the unit and its engine.
    With ``compare_to`` (an earlier label), fails when output tokens/s at the highest concurrency
    valid in both fell by more than ``regression_threshold`` percent (automatic rollback). A level
    with more than 1% failed requests is invalid and fails the task. After this run SIGKILLed a
    process (``orch_run.summary.sigkilled``), every request of every level must return tokens
    (sglang #22779), else the task fails. Before it runs, the process answering on the unit's
    port must be the unit's main process (after a restart, the new one); the ``before`` run also
    records what the server had loaded, from the log of its start (``before_loaded``).
    """
    unit = ctx.facts.unit.unit if ctx.facts.unit is not None else None
    engine = ctx.facts.engine
    if tool != "builtin" and tool != engine.bench_tool:
        # an engine's own client speaks only to its own server: refused before anything runs
        own = f"--bench-tool {engine.bench_tool} or " if engine.bench_tool else ""
        raise TaskFailed(f"{ctx.name}: unit {unit or '(none)'} runs {engine.display_name}; the benchmark client "
                         f"{tool!r} is another engine's own: use {own}--bench-tool builtin (orch_bench_tool)")
    summary = ctx.run.summary
    answering, loaded = {}, None
    if unit and not ctx.vars.get("orch_bench_url"):
        # the server measured must be the unit's (after a restart: its new main process)
        answering = check_answering_process(ctx, unit, f"the benchmark {label}",
                                            not_pid=ctx.facts.unit.main_pid if label == "after" else None)
    if unit and label == "before":
        loaded = loaded_by_server(ctx, unit)
        summary.before_loaded = loaded
    endpoint = endpoint_of(ctx)
    url = ctx.vars.get("orch_bench_url") or (endpoint.url if endpoint.via == "host"
                                             else (endpoint_candidates(ctx.facts.server, container_of(ctx))
                                                   or [endpoint.url])[0])
    conc = [int(c) for c in concurrency]
    args = ["--url", url, "--concurrency", ",".join(map(str, conc)), "--input-len", str(int(input_len)),
            "--output-len", str(int(output_len)), "--level-timeout", str(level_timeout), "--tool", tool,
            "--engine", engine.name]
    # an engine's own client (its bench_serving, bench serve) needs about a minute of its own start-up per level
    per_level = float(level_timeout) + (60 if tool != "builtin" else 0)
    if tool != "builtin" and ctx.facts.unit is not None:
        # the engine's own client runs with the unit's Python and the unit's environment (its
        # PYTHONPATH finds the engine's package, as the probe's does)
        ctx.payload.env.update(payload_env(ctx))
    if ctx.attempt > 1:
        # run again after a lost link: the first run's client may still load the server (its SSH
        # channel is gone, not the process): end it, so the levels measure one client alone
        stop_tagged(ctx.connection, ctx.options.run_id)
    data = ctx.payload.call("bench", args, timeout=per_level * (len(conc) + 1) + 120, interruptible=True,
                            on_progress=lambda m: ctx.progress(stage=f"bench {label}", done=m.get("done", 0),
                                                               total=m.get("total", 0)))
    (ctx.host_dir / bench_file(label)).write_text(json.dumps(data, indent=2, sort_keys=True))
    try:
        result = BenchResult.parse(data, "bench")
    except FactError as exc:
        raise TaskFailed(f"{exc} (the payload's bench answer; {ctx.host_dir / bench_file(label)})") from None
    top = result.top()
    summary.benches[label] = result.summary()
    otp = top.get("output_throughput")
    msg = (f"{label}: {otp:.1f} output tok/s at concurrency {top.get('max_concurrency')}"
           if otp is not None else f"{label}: no throughput measured")
    if loaded is not None:
        msg += f"; what the server had loaded (from its log): {loaded['text']}"
    if label != "before" and summary.sigkilled:
        # sglang #22779: after a SIGKILL the new server may stall; 1% forgiven would hide it
        short = requests_without_tokens(data.get("levels") or [])
        killed = ", ".join(f"{k.get('pid')} ({str(k.get('cmdline'))[:60]})" for k in summary.sigkilled)
        if short:
            raise TaskFailed(f"{label}: after orch SIGKILLed {killed}, every request must return tokens: "
                             + "; ".join(short), data)
        msg += f"; every request returned tokens (checked: orch SIGKILLed {killed})"
    if top and not top.get("valid", True):
        raise TaskFailed(msg + f" (invalid level: {top.get('failed')} failed requests)", data)
    if compare_to:
        # compare the same concurrency: the highest level valid in both runs
        reference = ctx.facts.bench(compare_to) or BenchResult()
        ok_before, ok_after = reference.valid_levels(), result.valid_levels()
        common = sorted(set(ok_before) & set(ok_after), key=lambda c: c or 0)
        ref = ok_before[common[-1]] if common else {}
        if not common and reference.levels:
            raise TaskFailed(f"{label}: no concurrency level valid both {compare_to} and after; cannot compare", data)
        if ref.get("output_throughput") and ok_after[common[-1]].get("output_throughput") is not None:
            before, after = float(ref["output_throughput"]), float(ok_after[common[-1]]["output_throughput"])
            change = (after - before) / before * 100.0
            summary.throughput_change_pct = round(change, 2)
            msg += f" ({compare_to} {before:.1f}, {change:+.1f}%)"
            if change < -float(regression_threshold):
                raise TaskFailed(f"throughput regression: {msg}; threshold -{regression_threshold}%",
                                 {"before": before, "after": after, "change_pct": change})
    return TaskResult.ok(msg, facts={f"orch_bench_{label}": result}, answering=answering, loaded=loaded, **data)
