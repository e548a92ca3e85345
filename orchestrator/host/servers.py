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
