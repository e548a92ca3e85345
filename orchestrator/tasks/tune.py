"""Tasks ``prepare_tune`` and ``tune``: prepare the fused-MoE tune before the unit stops, then run
the payload's tuner on the host and fetch what it wrote.

Options come from inventory variables: ``orch_tune_batch_sizes`` (list of M),
``orch_tune_space`` (one of ``remote.protocol.SEARCH_SPACES``), ``orch_tune_provider``,
``orch_tune_budget`` (``--budget``), ``orch_tune_routing_file`` / ``orch_tune_routing_skew``
(``--routing-file`` / ``--routing-skew``), ``orch_triton_interpret`` (test beds only), and
``orch_prepare`` (on by default: prepare before the stop; the prepare step's CPU bounds are its
arguments ``workers``, ``nice`` and ``max_seconds``, which a copied playbook may set). The tuner's
working folder on the host is keyed by the config file names, space and batch sizes, so re-running
resumes from its checkpoint; the prepared folder is ``<work>/prepared``. The up/down files and
``report.json`` are copied into the controller's run record (``hosts/<host>/configs/``).

Why two steps (docs/tuning.md): compiling the candidates takes CPU time, not the GPU, so
``prepare_tune`` does it while the server still serves (payload ``prepare``: no CUDA context, niced,
a bounded number of workers); after the stop the tune loads the prepared kernels and only launches
and times them. A prepare that failed or was refused leaves the tune as it was: it compiles after
the stop, and the summary says so.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time

from typing import Literal

from remote.protocol import PROVIDER_NAMES, SEARCH_SPACES

from .. import __version__
from ..connection import CommandTimeout
from ..engine.results import TaskFailed, TaskResult
from ..engine.task import task
from ..facts.hostfiles import meminfo
from ..facts.downtime import PreparedTune
from ..host.sharing import publish_failure, publish_result
from ..payload.client import stop_tagged
from ..payload.model_args import model_flags
from ..payload.transient import MEMORY_SHARE, UnitUnavailable, memory_max, unit_name
from ..records.layout import CONFIGS, TUNE_REPORT


@task("tune", rerun=True)
def tune(ctx, space: Literal[SEARCH_SPACES], batch_sizes: list[int] | None,
         provider: Literal[PROVIDER_NAMES], timeout: float = 172800) -> TaskResult:
    """Tune the fused-MoE kernel on the host (payload ``tune``, with a progress bar) and fetch the
    up and down files it wrote. ``space``: search space size; ``batch_sizes``: the M to tune
    (None: the engine's list, ``Engine.default_batch_sizes``); ``provider``: whose kernel is timed;
    ``timeout`` in seconds (48 h).

    With a group role (``config_source``): a ``shard`` host tunes only its slice of the
    batch sizes; the result is published to the group and stored on the controller.
    """
    source = ctx.facts.config_source or "tune"  # without config_source, this host tunes alone
    if source in ("store", "reuse"):
        return TaskResult.skipped(f"configs come from the {source}")
    batch_sizes = _batch_sizes(ctx, batch_sizes)
    try:
        return _tune(ctx, space, batch_sizes, provider, timeout)
    except Exception as exc:
        publish_failure(ctx, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise


def _work_args(ctx, space, batch_sizes, provider) -> tuple[str, list[str]]:
    """The tuner's work folder on the host (keyed by the file names, space, batch sizes and
    provider) and the payload flags ``tune`` and ``prepare`` share."""
    probe = ctx.facts.probe
    names = (probe.file_names if probe is not None else None) or {}
    routing = tuning_flags(ctx.vars)
    key_src = json.dumps([names, space, batch_sizes, provider] + ([routing[2:]] if len(routing) > 2 else []),
                         sort_keys=True)
    work = posixpath.join(ctx.payload.state_dir, "work", hashlib.sha256(key_src.encode()).hexdigest()[:16])
    args = model_flags(ctx) + ["--space", space, "--out", work, "--provider", provider] + routing
    if batch_sizes:
        args += ["--batch-sizes", ",".join(str(int(b)) for b in batch_sizes)]
    if ctx.vars.get("orch_triton_interpret") and not any(a == "--device-name" for a in args):
        args += ["--device-name", (probe.device_name if probe is not None else None) or "cpu"]
    return work, args


def _batch_sizes(ctx, batch_sizes):
    """This host's batch sizes: a ``shard`` host's slice of its group's, else ``batch_sizes``."""
    if ctx.facts.config_source == "shard" and ctx.facts.group_role is not None:
        return ctx.facts.group_role.batch_sizes or batch_sizes
    return batch_sizes


@task("prepare_tune", sets=("orch_prepared",))
def prepare_tune(ctx, space: Literal[SEARCH_SPACES], batch_sizes: list[int] | None,
                 provider: Literal[PROVIDER_NAMES], workers: int | None = None, nice: int = 10,
                 max_seconds: float = 900.0, timeout: float = 3600.0) -> TaskResult:
    """Before the stop, while the server serves: compile the tune's candidates for the GPU's
    target on the host's CPUs (payload ``prepare``, :mod:`remote.tuning.prepare`: no CUDA context,
    at niceness ``nice``, ``workers`` processes (None: half the host's cores), compiling for at
    most ``max_seconds``), in the transient unit ``orch-prepare-<run id>`` (``Nice=``,
    ``MemoryMax=`` as the tune's) or, where that cannot start, in the SSH session. Sets
    ``orch_prepared`` (:class:`orchestrator.facts.downtime.PreparedTune`), which ``tune`` hands to
    the tuner. Never fails the host: a prepare that fails leaves ``orch_prepared.ok`` False with
    the reason, and the tune compiles after the stop as before (the summary says so).
    ``timeout``: seconds for the whole command (its unit's ``RuntimeMaxSec=``)."""
    source = source_of(ctx)
    if source in ("store", "reuse"):
        return TaskResult.skipped(f"configs come from the {source}: nothing to tune")
    work, args = _work_args(ctx, space, _batch_sizes(ctx, batch_sizes), provider)
    probe = ctx.facts.probe
    cap = ctx.vars.get("orch_gpu_capability") or (probe.capability if probe is not None else None)
    if cap:
        args += ["--capability", str(cap)]
    gpus = probe.gpus if probe is not None else []
    if gpus and gpus[0].smem_per_block_optin:
        args += ["--smem-limit", str(int(gpus[0].smem_per_block_optin))]
    if workers:
        args += ["--workers", str(int(workers))]
    args += ["--nice", str(int(nice)), "--max-seconds", str(float(max_seconds))]
    started = time.monotonic()

    def on_progress(msg: dict) -> None:
        ctx.progress(stage="prepare", done=msg.get("done", 0), total=msg.get("total", 0))

    try:
        data, how = _run_payload(ctx, "prepare", args, timeout, on_progress, properties=[f"Nice={int(nice)}"])
    except (TaskFailed, CommandTimeout) as exc:  # PayloadFailed is a TaskFailed: the tune compiles as before
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        rec = PreparedTune(ok=False, reason=why[:400])
        ctx.run.summary.prepared = rec
        return TaskResult.ok(f"{rec.line()}", facts={"orch_prepared": rec})
    gpu = data.get("gpu") or {}
    target = gpu.get("target") or []
    rec = PreparedTune(ok=True, dir=data.get("dir"), reason=data.get("nothing_compiled") or "",
                       kernels=int(data.get("kernels") or 0), failed=int(data.get("failed") or 0),
                       candidates=int(data.get("candidates") or 0), seconds=data.get("seconds"),
                       workers=data.get("workers"), nice=data.get("nice"), cut=bool(data.get("cut")),
                       target=(f"{target[0]} sm_{target[1]} ({gpu.get('device_name') or '?'})" if len(target) > 1
                               else None),
                       how=how.get("unit") or f"in the SSH session ({how.get('fallback')})")
    ctx.run.summary.prepared = rec
    took = round(time.monotonic() - started, 1)
    return TaskResult.changed(f"{rec.line()} ({took} s, {rec.how})", facts={"orch_prepared": rec},
                              seconds=took, remote=data)


def _tune(ctx, space, batch_sizes, provider, timeout) -> TaskResult:
    probe = ctx.facts.probe
    names = (probe.file_names if probe is not None else None) or {}
    work, args = _work_args(ctx, space, batch_sizes, provider)
    prep = ctx.facts.prepared
    if prep is not None and prep.ok and prep.dir:
        args += ["--prepared", prep.dir]
    started = time.monotonic()

    def on_progress(msg: dict) -> None:
        ctx.progress(stage=msg.get("stage", "tune"), done=msg.get("done", 0), total=msg.get("total", 0),
                     eta_s=msg.get("eta_s"), best_us=msg.get("best_us"), batch_size=msg.get("batch_size"))

    key = ctx.facts.tuning_key
    # what `orch recover` needs to collect this tune's result should the controller die before
    # fetching it (orchestrator.tasks.recover.recover_collect)
    ticket = {"run_id": ctx.options.run_id, "host": ctx.name, "work": work, "names": names, "space": space,
              "batch_sizes": batch_sizes, "provider": provider, "source": source_of(ctx),
              "tuning_key": key.key if key is not None else None, "key_hash": key.hash if key is not None else None,
              "payload_version": (ctx.run.payload or {}).get("version"), "orch_version": __version__}
    try:
        data, detached = _run_tuner(ctx, args, timeout, on_progress, ticket)
        used = data.get("prepared") or {}
        if prep is not None and not prep.ok:  # the prepare step failed: said where the tune compiled
            used = {"used": False, "reason": f"the prepare step failed: {prep.reason}"}
        ctx.run.summary.prepared_used = {k: v for k, v in used.items() if k != "idents"} or None
    finally:
        ctx.mark_phase("tune")  # a part of the unit's downtime (orchestrator.facts.downtime)
    files = data.get("files") or {}
    if not files.get("up"):
        raise TaskFailed(f"tuner wrote no up-projection file: {data}")
    local_dir = ctx.host_dir / CONFIGS
    local_dir.mkdir(parents=True, exist_ok=True)
    fetched = {}
    for role, remote_path in files.items():
        if not remote_path:
            continue
        local = local_dir / posixpath.basename(remote_path)
        ctx.connection.get(remote_path, str(local), become=True)  # the tuner's folder is root-only
        fetched[role] = str(local)
    if data.get("report"):
        ctx.connection.get(data["report"], str(ctx.host_dir / TUNE_REPORT), become=True)
    expected = dict(names)  # what the probe derived: the names the payload's tuner must agree on
    for role, local in fetched.items():
        if expected.get(role) and posixpath.basename(local) != expected[role]:
            raise TaskFailed(f"tuner wrote {posixpath.basename(local)}, but the probe derived {expected[role]}")
    fetched = publish_result(ctx, fetched, str(ctx.host_dir / TUNE_REPORT) if data.get("report") else None,
                             {"host": ctx.name, "run_id": ctx.options.run_id, "provider": data.get("provider"),
                              "payload_version": (ctx.run.payload or {}).get("version"),
                              "orch_version": __version__, "batch_sizes": batch_sizes})
    ctx.run.tuned_files = fetched
    summary = ctx.run.summary
    summary.speedup_vs_default = data.get("speedup_vs_default")
    summary.provider = data.get("provider")
    took = round(time.monotonic() - started, 1)
    how = detached.get("unit") or f"in the SSH session ({detached.get('fallback')})"
    pu = ctx.run.summary.prepared_used or {}
    prepared = (f"{pu.get('kernels', 0)} kernels compiled before the stop" if pu.get("used") else
                f"compiled after the stop: {pu.get('reason') or 'no prepare step'}")
    return TaskResult.changed(f"tuned {', '.join(sorted(fetched))} with {data.get('provider')} in {took} s "
                              f"({how}; {prepared})", files=fetched, remote=data, seconds=took, detached=detached)


def tuning_flags(variables) -> list[str]:
    """The payload's ``--budget`` (``orch_tune_budget``, seconds of GPU timing per GPU; 0 unbounded),
    then ``--routing-file`` / ``--routing-skew`` (``orch_tune_routing_file``, ``orch_tune_routing_skew``)
    when set, from a host's effective variables."""
    from remote.protocol import DEFAULT_TUNE_BUDGET_S
    budget = variables.get("orch_tune_budget")
    out = ["--budget", str(DEFAULT_TUNE_BUDGET_S if budget is None else budget)]
    if variables.get("orch_tune_routing_file"):
        out += ["--routing-file", str(variables["orch_tune_routing_file"])]
    if variables.get("orch_tune_routing_skew"):
        out += ["--routing-skew", str(variables["orch_tune_routing_skew"])]
    return out


def source_of(ctx) -> str:
    """This host's part in its group's tune (``orch_config_source``: ``tune`` alone or for the
    group, ``shard`` for a slice of the batch sizes)."""
    return ctx.facts.config_source or "tune"


def _run_tuner(ctx, args, timeout, on_progress, ticket: dict | None = None) -> tuple[dict, dict]:
    """Run the payload ``tune`` as the transient unit ``orch-tune-<run id>`` under
    ``MemoryMax=`` (``orch_tune_memory_max`` bytes, else :data:`MEMORY_SHARE` of the host's
    MemAvailable now), polled (:meth:`PayloadClient.call_in_unit`); where that unit cannot start
    (no usable ``systemd-run``) or the unit's image runs the tuner (a container unit: the runtime
    owns its processes), in the SSH session as before (:meth:`PayloadClient.call`). Returns the
    result's data and how it ran (``unit``, ``memory_max`` or ``fallback``: why not), which is also
    emitted as the event ``tune_launch`` for the run record."""
    return _run_payload(ctx, "tune", args, timeout, on_progress, ticket=ticket)


def _run_payload(ctx, command: str, args, timeout, on_progress, ticket: dict | None = None,
                 properties: list[str] | None = None) -> tuple[dict, dict]:
    """:func:`_run_tuner` for the payload ``command`` (``tune`` or ``prepare``), in the transient
    unit ``orch-<command>-<run id>`` with the extra unit ``properties`` (``Nice=10``); emits
    ``<command>_launch``."""
    pl = ctx.payload
    if pl.container is not None and command in pl.container.commands:
        how = {"fallback": "the tuner runs in the unit's container image"}
    else:
        unit = unit_name(ctx.options.run_id, command)
        limit = ctx.vars.get("orch_tune_memory_max")
        if not limit:
            limit = memory_max(meminfo(ctx.connection))
        try:
            if pl.started(unit):  # run again after a lost link: the unit this run started is polled again
                ctx.emit(f"{command}_reattach", unit=unit, attempt=ctx.attempt)
            else:
                ctx.emit(f"{command}_launch", unit=unit, memory_max=limit)
            # the server's whole environment (EnvironmentFile=, drop-ins: TRITON_PTXAS_PATH, CUDA_HOME, ...)
            data = pl.call_in_unit(command, args, unit, memory_max=limit, timeout=timeout, on_progress=on_progress,
                                   ticket=ticket, environment=dict(ctx.facts.environment), properties=properties)
            return data, {"unit": unit, "memory_max": limit}
        except UnitUnavailable as exc:
            how = {"fallback": str(exc)}
    if ctx.attempt > 1:
        # run again after a lost link: the first tuner (in the dropped session) may still run; it is
        # ended first and the new one resumes from its checkpoint
        stop_tagged(ctx.connection, ctx.options.run_id)
    ctx.emit(f"{command}_launch", unit=None, fallback=how["fallback"])
    return pl.call(command, args, timeout=timeout, on_progress=on_progress, interruptible=True), how
