"""The unit's downtime and the tune's preparation before it.

- :class:`PreparedTune` (``orch_prepared``, set by the ``prepare_tune`` task before the stop):
  where the prepared folder is on the host and what the payload's ``prepare`` compiled there, or
  why there is none; the ``tune`` task reads it (``--prepared``) and the summary shows it.
- :class:`Downtime` (the run summary's ``downtime``): how long the unit was down, from the steps'
  own clocks. The tasks that stop, tune, install, start and wait for the unit record when they began
  and ended (:meth:`orchestrator.engine.context.HostContext.mark_phase`); :func:`downtime` splits
  the time from the stop's start to the end of the readiness wait into consecutive parts that add
  up to the total:

  - ``stop``: the stop step (``systemctl stop`` until the unit is down);
  - ``tune``: from the end of the stop to the end of the tune step (the host record, the reap of
    leftover GPU processes and the tune; the kernels were compiled before the stop when
    :class:`PreparedTune` says so);
  - ``install``: from the end of the tune to the end of the install step (the GPU health check, the
    backup and the install);
  - ``start``: from the end of the install to the end of the start step;
  - ``readiness``: from the end of the start to the end of the readiness wait (the server
    generated a token).

  A part whose step did not run (a tune skipped for files from the store) is 0, its time falls
  into the next part; without a readiness wait the downtime ends at the start; a unit that was not
  started again has no total (``ended`` is False).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .schema import Record

#: the downtime's parts, in order (module docstring)
PARTS = ("stop", "tune", "install", "start", "readiness")


@dataclass(slots=True)
class PreparedTune(Record):
    """The tune's preparation before the stop (``orch_prepared``).

    ``ok``: the prepared folder can be handed to the tune; ``dir``: where it is on the host;
    ``reason``: why there is none (a failed or switched-off prepare: the tune compiles after the
    stop, as without one), or what limited it; ``kernels``/``failed``: compile requests compiled /
    failed; ``candidates``: candidate configs; ``seconds``: the prepare command's wall time;
    ``workers``/``nice``: its CPU bounds; ``cut``: its time budget ended the compile early;
    ``target``: the GPU target compiled for (``cuda`` sm_90 ...); ``how``: where it ran (the
    transient unit, or the SSH session and why)."""

    ok: bool
    dir: str | None = None
    reason: str = ""
    kernels: int = 0
    failed: int = 0
    candidates: int = 0
    seconds: float | None = None
    workers: int | None = None
    nice: int | None = None
    cut: bool = False
    target: str | None = None
    how: str = ""

    def line(self) -> str:
        """One line for the terminal and the report."""
        if not self.ok:
            return f"not prepared: {self.reason or 'no prepare step'}; compiled after the stop"
        text = f"{self.kernels} kernels compiled before the stop"
        if self.target:
            text += f" for {self.target}"
        if self.seconds is not None:
            text += f" in {self.seconds:.1f} s"
        if self.workers:
            text += f" ({self.workers} workers, nice {self.nice})"
        if self.cut:
            text += "; cut by its time budget, the rest compiled after the stop"
        if self.reason:
            text += f"; {self.reason}"
        return text


@dataclass(slots=True)
class Phase(Record):
    """One step that bounds the downtime: ``name`` (one of :data:`PARTS`), ``start`` and ``end``
    (wall clock, seconds since the epoch)."""

    name: str
    start: float
    end: float


@dataclass(slots=True)
class Downtime(Record):
    """The unit's downtime on one host, in seconds (module docstring): ``total`` (None when the
    unit was not started again) and each of :data:`PARTS`; ``stopped_at``/``back_at`` (wall clock,
    seconds since the epoch); ``ended``: the unit came back (start, and readiness when waited for);
    ``prepared``: the kernels were compiled before the stop."""

    total: float | None = None
    stop: float = 0.0
    tune: float = 0.0
    install: float = 0.0
    start: float = 0.0
    readiness: float = 0.0
    stopped_at: float | None = None
    back_at: float | None = None
    ended: bool = False
    prepared: bool = False
    phases: list[Phase] = field(default_factory=list)

    def parts(self) -> dict[str, float]:
        """``{part: seconds}`` in :data:`PARTS` order."""
        return {p: getattr(self, p) for p in PARTS}

    def line(self) -> str:
        """``"95.2 s: stop 3.1, tune 70.4, install 0.5, start 1.2, readiness 20.0"``; ``"still down
        after ..."`` when the unit was not started again."""
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.parts().items())
        if self.total is None:
            return f"not back: {parts} s so far"
        return f"{self.total:.1f} s: {parts}" + ("" if self.prepared else " (compiled after the stop)")


def downtime(phases: list[Phase], prepared: bool = False) -> Downtime | None:
    """The :class:`Downtime` of the steps ``phases`` recorded (in the order they ran); None when
    none stopped the unit. The last stop counts, with the steps after it. Pure."""
    stops = [i for i, p in enumerate(phases) if p.name == "stop"]
    if not stops:
        return None
    rest = phases[stops[-1]:]
    stop = rest[0]
    ends = {"stop": stop.end}
    for p in rest[1:]:
        if p.name in PARTS and p.name != "stop":
            ends[p.name] = max(ends.get(p.name, p.end), p.end)
    out = Downtime(stopped_at=stop.start, prepared=prepared, phases=list(rest))
    t = stop.start
    for name in PARTS:
        if name in ends and ends[name] >= t:
            setattr(out, name, round(ends[name] - t, 3))
            t = ends[name]
    back = ends.get("readiness") or ends.get("start")
    if back is not None and back >= stop.start:
        out.ended = True
        out.back_at = back
        out.total = round(back - stop.start, 3)
    return out
