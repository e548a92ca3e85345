"""The run summary of one host (``HostRun.summary``): what the run did there, written by the
tasks, shown by the terminal (:mod:`orchestrator.ui`), ``orch runs``/``orch doctor`` and the HTML
report (:mod:`orchestrator.report`), and stored in the run records (the controller's
``recap.json``/``result.json`` and the host's ``state.json``).

Its JSON form keeps the keys earlier releases wrote: a field is written once a task assigned it
(None included: ``reap_devices: null`` says the unit's GPUs were not known, an absent key that no
reap ran), each benchmark as ``bench_<label>``, and keys of older records that this release does
not know are kept as they were (:meth:`RunSummary.from_dict`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from .bench import BenchSummary
from .downtime import Downtime, PreparedTune
from .plan import Endpoint, Plan
from .runner_trial import RunnerTrial
from .schema import Record, fields_from_dict, from_dict, optional, to_dict

BENCH_PREFIX = "bench_"


@dataclass(slots=True)
class ConfigSource(Record):
    """Where the host's files came from (``config_source``): ``source`` (``store``, ``tune``,
    ``shard`` or ``reuse``), the tuning key's hash ``key``, and the hosts of its ``group`` (absent
    for the store and a host tuning alone)."""

    source: str
    key: str
    group: list[str] | None = optional()


@dataclass
class RunSummary(Record):
    """What this run did on one host (see the module docstring for its JSON form)."""

    #: the inference engine the unit runs (``orch_engine``, unit_facts; None in records written before
    #: orch named engines: they were SGLang's, :data:`orchestrator.facts.legacy.LEGACY_ENGINE`)
    engine: str | None = None
    #: the plan task's decision (``orch_plan``)
    plan: Plan | None = None
    #: where the server answered when plan ran (``orch_endpoint``)
    endpoint: Endpoint | None = None
    #: where the files came from (config_source task)
    config_source: ConfigSource | None = None
    #: batch size M (text) -> kernel speedup, default time / tuned time (tuner's report.json)
    speedup_vs_default: dict[str, float | None] | None = None
    #: the host that measured ``speedup_vs_default`` when the files were tuned elsewhere
    speedup_measured_on: str | None = None
    #: whose kernel the tuner timed (an engine's provider, or ``builtin``)
    provider: str | None = None
    #: the device files the reaper scanned, comma separated (None: the unit's GPUs were not known)
    reap_devices: str | None = None
    #: leftover GPU processes ended (payload ``reap``: ``{"pid", "cmdline", "signal", ...}``)
    reaped: list[dict[str, Any]] | None = None
    #: leftovers of the unit ended because they held its port (payload ``port``)
    port_freed: list[dict[str, Any]] | None = None
    #: starts made once more after a port race (``{"unit", "why"}``: orchestrator.host.port_race)
    start_retried: list[dict[str, Any]] | None = None
    #: what the server measured by the "before" benchmark had loaded, from its log
    #: (``{"loaded", "fallback", "default", "down_missing", "text"}``, :func:`orchestrator.tasks.bench.loaded_by_server`)
    before_loaded: dict[str, Any] | None = None
    #: processes orch ended by SIGKILL this run (``{"pid", "cmdline", "by"}``, ``by``: ``reap`` or
    #: ``port``): the benchmark after the next start then checks every request returned tokens
    sigkilled: list[dict[str, Any]] | None = None
    #: paths written (install), or put back (rollback)
    installed: list[str] | None = None
    #: paths already holding the files to install, loaded at the last start: nothing was done
    unchanged: list[str] | None = None
    #: the restore of this run's files (payload ``restore`` files: ``{"path", "action", ...}``)
    restored: list[dict[str, Any]] | None = None
    #: the run a rollback undid
    rolled_back: str | None = None
    #: files a rollback removed (they did not exist before the run it undid)
    deleted: list[str] | None = None
    #: output tokens/s after vs before at the highest concurrency valid in both, percent
    throughput_change_pct: float | None = None
    #: label -> the benchmark's summary line (JSON keys ``bench_<label>``: ``bench_before``, ...)
    benches: dict[str, BenchSummary] = field(default_factory=dict)
    #: the doctor's row for the host (:func:`orchestrator.tasks.diagnose.classify`)
    doctor: dict[str, Any] | None = None
    #: the host's run records, newest first (``orch runs``)
    runs: list[dict[str, Any]] | None = None
    #: unfinished runs ``orch recover`` restored (``{"run_id", "files", "note"?}``)
    recovered: list[dict[str, Any]] | None = None
    #: what ``orch recover`` collected of unfinished runs' tunes (``{"run_id", "what", "state", ...}``:
    #: ``collected`` a finished tune's files put in the controller's store, ``progress kept`` the
    #: batch sizes a stopped tune's checkpoint holds for the rerun, ``not collected`` and why)
    collected: list[dict[str, Any]] | None = None
    #: why ``orch recover`` restarted a running single-node unit after the restore (its process was
    #: started after an unfinished run's stop, :func:`orchestrator.tasks.recover.single_restart`)
    recover_restart: str | None = None
    #: the runner trial's table (``orch tune --moe-runners``)
    runner_trial: RunnerTrial | None = None
    #: fatal Xids that appeared in the kernel log during the tune (``{"pci", "code", "text",
    #: "time_s", "fatal"}``, :class:`orchestrator.facts.gpu_health.Xid`): the rollout stopped there
    gpu_lost: list[dict[str, Any]] | None = None
    #: holes in the log of a start this run made (:class:`orchestrator.facts.journal.StartLog`
    #: ``gaps``: journald's "Suppressed N messages", a log file rotated during the start): a
    #: line the log proof did not find may be in one (``not proven (log gap)``)
    log_gaps: list[str] | None = None
    #: journal entries after a start's cursor that belonged to another invocation of the unit
    #: and were dropped (``{"invocation", "lines", "first", "unit", "kept"}``,
    #: :func:`orchestrator.facts.journal.split_invocations`): an earlier start's straggler
    log_other_invocations: list[dict[str, Any]] | None = None
    #: FlashInfer's autotune cache: the backup (``{"dir", "files"}``) or a rollback's restore of it
    autotune_cache: dict[str, Any] | None = None
    #: links lost and found again during the run (``{"task", "attempts", "after_s"}``): the step ran again
    reconnects: list[dict[str, Any]] | None = None
    #: what the host's dead-man did for unfinished runs (remote/host/deadman.py's report with
    #: ``run_id``), as ``orch recover`` found it
    deadman: list[dict[str, Any]] | None = None
    #: the tune's preparation before the stop (prepare_tune; ``used`` set by the tune when it took
    #: the prepared kernels): :class:`orchestrator.facts.downtime.PreparedTune`
    prepared: PreparedTune | None = None
    #: whether the tune took the prepared kernels, and why not (its report's ``prepared``)
    prepared_used: dict[str, Any] | None = None
    #: the unit's downtime split into stop, tune, install, start and readiness, seconds
    #: (:func:`orchestrator.facts.downtime.downtime`)
    downtime: Downtime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_given", {f.name for f in dataclasses.fields(self)
                                            if f.name != "benches" and getattr(self, f.name) is not None})
        object.__setattr__(self, "_other", {})

    def __setattr__(self, name: str, value: Any) -> None:
        names = self.__dataclass_fields__
        if name not in names:
            raise AttributeError(f"RunSummary has no field {name!r} (fields: {', '.join(names)})")
        object.__setattr__(self, name, value)
        given = self.__dict__.get("_given")
        if given is not None and name != "benches":
            given.add(name)

    @property
    def bench_before(self) -> BenchSummary | None:
        """The ``before`` benchmark's line."""
        return self.benches.get("before")

    @property
    def bench_after(self) -> BenchSummary | None:
        """The ``after`` benchmark's line."""
        return self.benches.get("after")

    def speedups(self) -> list[float | None]:
        """The per-batch-size kernel speedups (``speedup_vs_default`` values); [] when none."""
        return list(self.speedup_vs_default.values()) if isinstance(self.speedup_vs_default, dict) else []

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the assigned fields, ``bench_<label>`` per benchmark, unknown keys of the
        record it was read from."""
        out = {name: to_dict(getattr(self, name)) for name in self.__dataclass_fields__ if name in self._given}
        out.update({BENCH_PREFIX + label: b.to_dict() for label, b in self.benches.items()})
        out.update(self._other)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "RunSummary":
        """A summary read from a run record (any release's: lenient, unknown keys kept)."""
        data = data if isinstance(data, dict) else {}
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "benches"}
        s = fields_from_dict(cls, known)
        s._given.clear()
        s._given.update(known)
        for key, value in data.items():
            if key.startswith(BENCH_PREFIX) and key[len(BENCH_PREFIX):]:
                s.benches[key[len(BENCH_PREFIX):]] = from_dict(BenchSummary, value)
            elif key not in known:
                s._other[key] = value
        return s


def finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number (never a bool), else None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def speedup_stats(values: Iterable[Any]) -> tuple[float, float, float] | None:
    """``(geometric mean, min, max)`` of per-batch-size kernel speedups (``speedup_vs_default``:
    default µs / tuned µs, from the payload's tuner), ignoring missing and non-positive values;
    None when there is none. The one statistic both the HTML report and the terminal show."""
    vals = [v for v in (finite(x) for x in values) if v and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals)), min(vals), max(vals)
