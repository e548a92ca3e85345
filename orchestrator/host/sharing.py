"""Tuned files shared with the host's group (tune once per group, :mod:`orchestrator.fleet`) and
the controller's store (:mod:`orchestrator.store`): written into the host's run record
(config_source, tune) and published after this host's tune (tune)."""

from __future__ import annotations

import json

from ..engine.results import TaskFailed
from ..records.layout import CONFIGS, TUNE_REPORT
from ..store import ConfigStore


def write_configs(ctx, configs: dict[str, dict], names: dict[str, str]) -> dict[str, str]:
    """Write ``configs`` (role -> SGLang config dict) under the host's record as the exact file names."""
    from remote.engines import dumps_config

    out = {}
    d = ctx.host_dir / CONFIGS
    d.mkdir(parents=True, exist_ok=True)
    for role, cfg in configs.items():
        path = d / names[role]
        path.write_text(dumps_config(cfg, extra_fields=ctx.facts.engine.config_extra_fields))
        out[role] = str(path)
    return out


def publish_result(ctx, files: dict[str, str], report_path: str | None, provenance: dict) -> dict[str, str]:
    """After ``tune`` on this host: publish to the group and the store; returns the files to install.

    A shard host waits for the merged result of all shards and returns it.
    """
    role = ctx.facts.group_role
    tuning_key = ctx.facts.tuning_key
    kh = tuning_key.hash if tuning_key is not None else None
    groups = ctx.options.fleet
    names = (ctx.facts.probe.file_names if ctx.facts.probe is not None else None) or {}
    configs = {r: json.loads(open(p).read()) for r, p in files.items()}
    report = json.loads(open(report_path).read()) if report_path else None
    result = {"configs": configs, "report": report}
    is_shard = role is not None and role.kind == "shard"
    if groups is not None and is_shard:
        groups.publish(kh, result, shard=role.shard_index, merge=groups.merged)
        try:
            merged = groups.wait_result(kh, cancel=ctx.options.cancel)
        except RuntimeError as exc:
            raise TaskFailed(f"shard merge failed: {exc}") from None
        files = write_configs(ctx, merged["configs"], names)
        result = merged
    elif groups is not None and kh:
        groups.publish(kh, result)
    if ctx.options.state_dir and kh and (not is_shard or role.shard_index == 0):
        report_file = ctx.host_dir / TUNE_REPORT
        ConfigStore(ctx.options.state_dir).put(tuning_key.key, files, report_file if report_file.exists() else None,
                                               provenance)
    return files


def publish_failure(ctx, error: str) -> None:
    """Tell hosts waiting on this host's key that its tuning failed (they fail at once)."""
    tuning_key = ctx.facts.tuning_key
    if ctx.options.fleet is not None and tuning_key is not None and tuning_key.hash:
        ctx.options.fleet.publish(tuning_key.hash, None, error=f"{ctx.name}: {error}")
