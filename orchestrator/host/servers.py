"""The ranks of a multi-node server meeting within a task (shared by the systemd and readiness
tasks): :func:`meet` and :func:`peer_failure`, over ``RunOptions.barrier``
(:class:`orchestrator.fleet.ServerBarrier`; None on a run without multi-node servers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.results import TaskFailed
from ..fleet import BarrierBroken


def meet(ctx, phase: str, strict: bool = True, among: list[str] | None = None,
         value: object = None) -> dict[str, object]:
    """Wait until the other ranks of this host's multi-node server have reached ``phase``
    (:meth:`orchestrator.fleet.ServerBarrier.wait`; ``among``: only those hosts), bringing
    ``value``. Returns what every rank met brought (host name -> value, this host included;
    :meth:`~orchestrator.fleet.ServerBarrier.shared`); ``{ctx.name: value}`` without a barrier (a
    single-node run). Raises TaskFailed when a rank failed first (strict), on timeout or when
    interrupted."""
    barrier = ctx.options.barrier
    if barrier is None:
        return {ctx.name: value}
    if barrier.peers(ctx.name):
        ctx.say(f"waiting for the other ranks: {phase}")
    try:
        barrier.wait(ctx.name, phase, strict=strict, cancel=ctx.options.cancel, among=among, value=value)
    except BarrierBroken as exc:
        raise TaskFailed(str(exc)) from None
    return barrier.shared(ctx.name, phase)


def peer_failure(ctx) -> str | None:
    """Why another rank of this host's server failed (None when none did, or no barrier): a
    wait on this rank (readiness) stops at once instead of running to its timeout."""
    barrier = ctx.options.barrier
    return barrier.failed_peer(ctx.name) if barrier is not None else None


def server_refusal(ctx, action: str) -> str | None:
    """Why ``action`` (``rollback``, ``recover``) must not touch this host's multi-node server,
    or None (a single-node unit, or a server whose ranks were all found and meet). The group's
    own refusal (:func:`orchestrator.facts.server_group.group_servers`: a rank missing from the
    run, ranks that disagree) comes first; a multi-node unit whose ranks were not found (a run
    without the discovery pass) is refused too: restarting one rank alone breaks the server
    (SGLang 0.5.23: every rank joins at ``--dist-init-addr``, docs/multi-node.md)."""
    facts = ctx.facts.unit
    server = facts.server if facts is not None else None
    if server is None or int(server.nnodes or 1) <= 1:
        return None
    group = ctx.facts.server_group
    if group is not None and group.refusal:
        return group.refusal
    if group is None or ctx.options.barrier is None:
        return (f"multi-node server (--nnodes {server.nnodes}, --dist-init-addr {server.dist_init_addr or '?'}): "
                f"its ranks were not found in this run, so orch would {action} one rank alone. Nothing was stopped")
    return None


@dataclass(frozen=True)
class RankRecovery:
    """What one rank brings to ``orch recover``'s meeting (``recover_select``): its unfinished runs
    (``"<run id> (<state>)"``), whether one of them went past ``started`` (it stopped a rank: rank 0
    stops first), whether one backed up FlashInfer's autotune cache (put back with the unit
    stopped), and its unit's ``ActiveState`` as read at the start of the play."""

    runs: list[str] = field(default_factory=list)
    past_start: bool = False
    autotune_cache: bool = False
    active_state: str = "unknown"


def server_restart(seen: dict[str, RankRecovery]) -> str | None:
    """Why ``orch recover`` must stop every rank of a multi-node server and start them together
    (None: it must not). ``seen``: host name -> :class:`RankRecovery`, every rank's.

    Nothing is restarted when no rank has an unfinished run, or when every unfinished run is still
    at ``started`` (it stopped nothing), every rank is active and none backed up the autotune cache.
    Otherwise the server was disturbed and all ranks are restarted, the running ones too. In
    SGLang 0.5.23 the ranks meet only at their start (``srt/distributed/bootstrap.py``
    ``_init_parallel_groups`` at ``--dist-init-addr``, within ``--dist-timeout``), and a rank reads
    its MoE configs after that meeting, at CUDA-graph capture. So a rank still running has either
    loaded the files the run installed (which recover has just put back under it), or waits at the
    meeting for a rank 0 that may never come within its timeout, or is held in a collective with a
    rank whose process is gone (until the process-group timeout). orch cannot tell these apart from
    outside; a start of every rank from the restored files is the state it can prove
    (docs/multi-node.md).
    """
    with_runs = {h: r for h, r in seen.items() if r.runs}
    if not with_runs:
        return None
    down = sorted(h for h, r in seen.items() if r.active_state != "active")
    past = sorted(h for h, r in with_runs.items() if r.past_start)
    cache = sorted(h for h, r in with_runs.items() if r.autotune_cache)
    if not (down or past or cache):
        return None
    why = []
    if past:
        why.append(f"an unfinished run stopped ranks ({', '.join(f'{h}: {with_runs[h].runs[0]}' for h in past)})")
    if down:
        why.append(f"not running: {', '.join(f'{h} ({seen[h].active_state})' for h in down)}")
    if cache:
        why.append(f"FlashInfer's autotune cache to put back on {', '.join(cache)}")
    return "; ".join(why)


def rollback_disagreement(group, seen: dict[str, str | None]) -> str | None:
    """Why ``orch rollback`` must refuse the whole multi-node server ``group``
    (:class:`orchestrator.facts.server_group.ServerGroup`), or None. ``seen``: host name -> the run
    id that rank would undo (None: nothing to undo on it), every rank's.

    The ranks are rolled back together, so they must undo the same run: ranks that chose
    different runs, or a rank with nothing to undo beside ranks with a run, are refused on every
    rank before any change, naming each rank, its host and its run. None when they agree (all
    on one run, or none with anything to undo)."""
    if len(set(seen.values())) <= 1:
        return None
    ranks = ", ".join(f"rank {r} ({h}): {seen.get(h) or 'nothing to undo'}" for r, h in enumerate(group.hosts)
                      if h in seen)
    return (f"the ranks of multi-node server {group.key} would not undo the same run ({ranks}); they are rolled "
            "back together, so each must undo the same run (pass --to RUN_ID with a run every rank has). "
            "Nothing was stopped")
