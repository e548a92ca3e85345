"""Task ``config_source``: where this host's config files come from (tune once per group).

Runs after ``plan`` and before the unit is stopped. Sets ``orch_config_source``:

- ``store``: the controller's store has a result for this host's tuning key (reused
  unless ``--retune``): nothing is tuned;
- ``tune`` / ``shard``: this host tunes (all batch sizes, or its slice with
  ``--shard-tuning``); the ``tune`` task publishes the result to the group
  (:func:`orchestrator.host.sharing.publish_result`);
- ``reuse``: another host of the same key tunes; this host waits for its result while
  its server keeps serving, then installs the same bytes.
"""

from __future__ import annotations

import json

from typing import Literal

from remote.protocol import PROVIDER_NAMES, SEARCH_SPACES

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.catalog import GroupRole, TuningKey
from ..facts.summary import ConfigSource
from ..host.sharing import write_configs
from ..records.layout import TUNE_REPORT
from ..store import ConfigStore, key_hash, measured_on, provenance_text, tuning_key

FACTS = ("orch_tuning_key", "orch_config_source", "orch_group_role")


def reused_speedup(ctx, report: dict | None, measured_on: str | None) -> None:
    """For a host whose files were tuned elsewhere (group member or store): put the tuner's
    per-batch-size ``speedup_vs_default`` (from its ``report.json``, written by remote/tuning/command.py) in the host's
    summary with ``speedup_measured_on`` naming the host that measured it, so the terminal summary
    and the HTML report show the same number and say where it comes from."""
    per_m = {m: row.get("speedup_vs_default") for m, row in ((report or {}).get("batch_sizes") or {}).items()
             if isinstance(row, dict)}
    if per_m and measured_on:
        summary = ctx.run.summary
        summary.speedup_vs_default = per_m
        summary.speedup_measured_on = measured_on


@task("config_source", check_mode=READ_ONLY, sets=FACTS)
def config_source(ctx, space: Literal[SEARCH_SPACES], batch_sizes: list[int] | None,
                  provider: Literal[PROVIDER_NAMES]) -> TaskResult:
    """Decide where this host's files come from: the controller's store, its own tune, a shard of
    its group's tune, or another host's tune (``orch_config_source``; see the module docstring).
    Refuses, before anything is stopped, a model whose weights the tuner cannot run."""
    probe = ctx.facts.probe
    if probe is None:
        raise TaskFailed("no probe of this host (orch_probe): run the probe task before config_source")
    names = probe.file_names or {}
    key = tuning_key(probe, space, batch_sizes, provider)
    kh = key_hash(key)
    facts = {"orch_tuning_key": TuningKey(kh, key)}
    groups = ctx.options.fleet
    store = ConfigStore(ctx.options.state_dir) if ctx.options.state_dir else None
    entry = store.get(key) if (store and not ctx.options.retune) else None
    if entry is not None:
        if groups is not None:
            groups.report_key(ctx.name, "store:" + kh)
        prov = entry.provenance
        facts["orch_config_source"] = "store"
        msg = f"reusing stored result {kh} ({provenance_text(prov)})"
        if not ctx.check:
            configs = {role: json.loads(p.read_text()) for role, p in entry.files.items()}
            ctx.run.tuned_files = write_configs(ctx, configs, names)
            if entry.report:
                (ctx.host_dir / TUNE_REPORT).write_text(entry.report.read_text())
                reused_speedup(ctx, json.loads(entry.report.read_text()), measured_on(prov))
        ctx.run.summary.config_source = ConfigSource("store", kh)
        return TaskResult.ok(msg, facts=facts, source="store", key=kh)
    why = probe.untunable_reason(provider)
    if why:  # refuse before the unit is stopped: nothing on the host has changed
        raise TaskFailed(why)
    if groups is None:
        facts["orch_config_source"] = "tune"
        return TaskResult.ok("tuning on this host", facts=facts, source="tune", key=kh)
    groups.report_key(ctx.name, kh)
    try:
        role = groups.assign(ctx.name, list(batch_sizes or ctx.facts.engine.default_batch_sizes),
                             cancel=ctx.options.cancel)
    except TimeoutError as exc:
        raise TaskFailed(str(exc)) from None
    server = ctx.facts.server_group
    if server is not None:
        others = [h for h in server.members if h not in role.members]
        if others:  # the ranks probed to other tuning keys: other GPUs, Triton or engine release
            raise TaskFailed(f"multi-node server {server.key}: rank(s) {', '.join(others)} have another tuning key "
                             "than this host (GPU kind, Triton or engine release differ), so one tune cannot fit "
                             "every rank; nothing was stopped")
    facts["orch_config_source"] = role.kind
    facts["orch_group_role"] = GroupRole(kind=role.kind, key=kh, members=role.members, tuner=role.tuner,
                                         batch_sizes=role.batch_sizes, shard_index=role.shard_index)
    ctx.run.summary.config_source = ConfigSource(role.kind, kh, role.members)
    group = f"group {kh} of {len(role.members)}: {', '.join(role.members)}"
    if role.kind == "tune":
        return TaskResult.ok(("would tune" if ctx.check else "tuning") + f" for {group}", facts=facts, source="tune",
                             key=kh)
    if role.kind == "shard":
        return TaskResult.ok(("would tune" if ctx.check else "tuning") + f" batch sizes {role.batch_sizes} for {group}",
                             facts=facts, source="shard", key=kh)
    if ctx.check:
        return TaskResult.ok(f"would reuse what {role.tuner} tunes for {group}", facts=facts, source="reuse", key=kh)
    ctx.say(f"waiting for {role.tuner} to tune {kh} (the server keeps serving)")
    try:
        result = groups.wait_result(kh, cancel=ctx.options.cancel)
    except RuntimeError as exc:
        raise TaskFailed(f"no configs from {role.tuner}: {exc}") from None
    ctx.run.tuned_files = write_configs(ctx, result["configs"], names)
    if result.get("report"):
        (ctx.host_dir / TUNE_REPORT).write_text(json.dumps(result["report"], indent=2))
        reused_speedup(ctx, result["report"], role.tuner)
    return TaskResult.ok(f"reusing the configs {role.tuner} tuned for {group}", facts=facts, source="reuse", key=kh)
