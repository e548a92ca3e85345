"""The ranks of a multi-node server meeting within a task (shared by the systemd and readiness
tasks): :func:`meet` and :func:`peer_failure`, over ``RunOptions.barrier``
(:class:`orchestrator.fleet.ServerBarrier`; None on a run without multi-node servers)."""

from __future__ import annotations

from ..engine.results import TaskFailed
from ..fleet import BarrierBroken


def meet(ctx, phase: str, strict: bool = True, among: list[str] | None = None) -> None:
    """Wait until the other ranks of this host's multi-node server have reached ``phase``
    (:meth:`orchestrator.fleet.ServerBarrier.wait`; ``among``: only those hosts). No-op without a
    barrier (a single-node run). Raises TaskFailed when a rank failed first (strict), on timeout
    or when interrupted."""
    barrier = ctx.options.barrier
    if barrier is None:
        return
    if barrier.peers(ctx.name):
        ctx.say(f"waiting for the other ranks: {phase}")
    try:
        barrier.wait(ctx.name, phase, strict=strict, cancel=ctx.options.cancel, among=among)
    except BarrierBroken as exc:
        raise TaskFailed(str(exc)) from None


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
