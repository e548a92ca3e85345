"""Every fact a task sets, with its type, and the typed way to read them: ``ctx.facts``.

A fact is a host variable one task produces (its ``@task(sets=...)`` declaration) and later
tasks and playbook templates read (``orch_plan.action``). :class:`HostFacts` lists each one
once, as a :class:`Fact` (variable name or ``fnmatch`` pattern, and type); tasks read them by
attribute (``ctx.facts.probe.file_names``), never as ``ctx.vars["orch_probe"]``, so a renamed
field raises instead of silently reading a default. The engine refuses a fact of another type
than declared here (:meth:`HostFacts.check`), and ``tests/test_fact_flow.py`` checks that every
fact read is declared and produced by a task, and every declared fact is produced.

Templates read the same objects (Jinja reads attributes: ``orch_unit.active_state``); the run
record gets their JSON form (:func:`orchestrator.facts.schema.to_dict`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Mapping

from remote.gpus import GpuVendor, vendor_for

from .bench import BenchResult
from .downtime import PreparedTune
from .gpu_health import GpuHealth
from .plan import Endpoint, Plan
from .probe import ProbeFacts
from .runner_trial import RunnerTrial, RunnerTritonFiles
from .schema import FactError, Record
from .server_group import ServerGroup
from .systemd_unit import Unit, scope_of
from .unit import ServerArgs, UnitFacts

from remote.engines import Engine, engine_named


@dataclass(slots=True)
class TuningKey(Record):
    """This host's tuning key (``orch_tuning_key``): ``hash`` (16 hex digits,
    :func:`orchestrator.store.key_hash`) and the ``key`` itself (:data:`orchestrator.store.KEY_FIELDS`).
    Its dict form is the key with ``hash`` added, as templates read it."""

    hash: str
    key: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.hash, **self.key}

    @classmethod
    def from_dict(cls, data: Any) -> "TuningKey":
        data = dict(data) if isinstance(data, dict) else {}
        return cls(str(data.pop("hash", "")), data)


@dataclass(slots=True)
class GroupRole(Record):
    """This host's part in its group (``orch_group_role``, :class:`orchestrator.fleet.Role`):
    ``kind`` (``tune``, ``shard`` or ``reuse``), the tuning ``key`` hash, the group's ``members``,
    the ``tuner`` host, the ``batch_sizes`` a shard tunes and its ``shard_index``."""

    kind: str
    key: str
    members: list[str] = field(default_factory=list)
    tuner: str | None = None
    batch_sizes: list[int] | None = None
    shard_index: int = 0


class Fact:
    """One declared fact: ``name`` (a host variable, or a pattern with one ``*`` such as
    ``orch_bench_*`` for a family of them) and its ``type``. As a class
    attribute of :class:`HostFacts` it reads the fact, typed (None when no task set it yet); a
    pattern's attribute is a function of the part the ``*`` stands for
    (``ctx.facts.bench("before")`` reads ``orch_bench_before``)."""

    def __init__(self, name: str, type_: type):
        self.name, self.type = name, type_
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: "HostFacts | None", objtype: type | None = None) -> Any:
        if obj is None:
            return self
        if "*" in self.name:
            return lambda part: obj.read(self.name.replace("*", str(part)), self.type)
        return obj.read(self.name, self.type)

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.name)


class HostFacts:
    """The facts of one host, typed, over its variables (``ctx.facts``; see the module docstring)."""

    #: the unit's state, environment and parsed launch command (unit_facts)
    unit = Fact("orch_unit", UnitFacts)
    #: the inference engine the unit runs (unit_facts: recognised from its command line, or the
    #: inventory's ``orch_engine`` override; :attr:`engine` is its rules)
    engine_name = Fact("orch_engine", str)
    #: the unit's handle: name, manager and log targets; every systemctl/journalctl goes through it (unit_facts)
    systemd_unit = Fact("orch_systemd_unit", Unit)
    #: the multi-node server this host is a rank of (unit_facts; absent for a single-node unit)
    server_group = Fact("orch_server_group", ServerGroup)
    #: the Python that runs the unit (unit_facts)
    interpreter = Fact("orch_interpreter", str)
    #: the payload's probe of the host (probe)
    probe = Fact("orch_probe", ProbeFacts)
    #: the host's GPU vendor, chosen once from the device name the probe found (probe)
    gpu_vendor = Fact("orch_gpu_vendor", GpuVendor)
    #: the kernel log's GPU error lines and the management tool's state before anything stopped (gpu_health)
    gpu_health = Fact("orch_gpu_health", GpuHealth)
    #: what a tune would do (plan)
    plan = Fact("orch_plan", Plan)
    #: where the running server answered (plan)
    endpoint = Fact("orch_endpoint", Endpoint)
    #: the host's tuning key (config_source)
    tuning_key = Fact("orch_tuning_key", TuningKey)
    #: ``store``, ``tune``, ``shard`` or ``reuse`` (config_source)
    config_source = Fact("orch_config_source", str)
    #: the host's part in its group (config_source)
    group_role = Fact("orch_group_role", GroupRole)
    #: the tune's candidates compiled before the stop, or why not (prepare_tune)
    prepared = Fact("orch_prepared", PreparedTune)
    #: the files to install are the installed ones, and the last start loaded them (compare_installed)
    unchanged = Fact("orch_unchanged", bool)
    #: the paths the install wrote, ``list[str]`` (install)
    installed = Fact("orch_installed", list)
    #: the benchmark labelled ``label``: ``bench(label)`` (bench)
    bench = Fact("orch_bench_*", BenchResult)
    #: runs a dead controller left unfinished, the host's run records (recover_select)
    unfinished = Fact("orch_unfinished", list)
    #: every rank of this host's multi-node server is restarted by ``orch recover`` (recover_select)
    recover_restart = Fact("orch_recover_restart", bool)
    #: the host run record a rollback undoes (rollback_select)
    rollback_target = Fact("orch_rollback_target", dict)
    #: paths a rollback (or recover) put back, ``list[str]`` (rollback_restore, recover_restore)
    restored_paths = Fact("orch_restored_paths", list)
    #: paths a rollback (or recover) removed, ``list[str]`` (rollback_restore, recover_restore)
    deleted_paths = Fact("orch_deleted_paths", list)
    #: the runners ``orch tune --moe-runners`` starts, ``list[str]`` (runner_candidates)
    runner_candidates = Fact("orch_runner_candidates", list)
    #: the runner trial's table (runner_trial)
    runner_trial = Fact("orch_runner_trial", RunnerTrial)
    #: the Triton candidate's config files: current, from the store, or tuned (runner_triton_files)
    runner_triton = Fact("orch_runner_triton", RunnerTritonFiles)
    #: the trial applied another host's verdict, nothing left to measure here (runner_reference)
    runner_reused = Fact("orch_runner_reused", bool)

    def __init__(self, variables: Mapping[str, Any]):
        self._vars = variables

    @classmethod
    def declared(cls) -> dict[str, Fact]:
        """Attribute name -> :class:`Fact`, for every declared fact."""
        return {k: v for k, v in vars(cls).items() if isinstance(v, Fact)}

    @classmethod
    def declaration(cls, name: str) -> Fact | None:
        """The declared fact a variable ``name`` is (``orch_bench_after`` is ``orch_bench_*``), or None."""
        return next((f for f in cls.declared().values() if f.matches(name)), None)

    @classmethod
    def check(cls, facts: Mapping[str, Any]) -> None:
        """Raise :class:`FactError` for a fact in ``facts`` (as a task returns them) whose value is
        not of its declared type."""
        for name, value in facts.items():
            decl = cls.declaration(name)
            if decl is not None and not isinstance(value, decl.type):
                raise FactError(f"fact {name} must be {decl.type.__name__}, got {type(value).__name__}")

    def read(self, name: str, type_: type) -> Any:
        """The fact ``name`` (None when absent); :class:`FactError` when a value of another type
        holds the name (e.g. an inventory variable of that name)."""
        value = self._vars.get(name)
        if value is not None and not isinstance(value, type_):
            raise FactError(f"host variable {name} is a {type(value).__name__}, not the {type_.__name__} its task "
                            "sets: an inventory or play variable of that name hides the fact")
        return value

    @property
    def engine(self) -> Engine:
        """The rules of the engine the unit runs (:data:`remote.engines.ENGINES` by ``orch_engine``;
        without it, a playbook that does not read the unit, the default engine's): what every task
        asks instead of importing an engine's modules."""
        return engine_named(self.engine_name)

    @property
    def server(self) -> ServerArgs:
        """The unit's parsed launch command (``orch_unit.server``, :func:`server_of`)."""
        return server_of(self.unit, self.engine)

    def unit_handle(self, name: str | None = None) -> Unit:
        """The handle of the unit ``name`` (:class:`orchestrator.facts.systemd_unit.Unit`; None:
        the unit this play read): the one ``unit_facts`` set (``orch_systemd_unit``) when it names
        that unit; else (a playbook or a test that did not read it) one with the host's
        ``orch_systemd_scope`` and the unit facts' log files. The one way tasks and host helpers
        get at a unit, so none can leave out its manager or its log files."""
        handle = self.systemd_unit
        if handle is not None and (name is None or handle.name == name):
            return handle
        unit = self.unit
        if name is None:
            name = unit.unit if unit is not None else ""
        files = list(unit.log_files) if unit is not None and unit.unit == name else []
        return Unit(name, scope_of(self._vars), files)

    @property
    def vendor(self) -> GpuVendor:
        """The host's GPU vendor (:class:`remote.gpus.GpuVendor`): ``orch_gpu_vendor`` once the probe
        set it; before (or without) the probe, the vendor of the inventory's ``orch_device_name``,
        else :data:`remote.gpus.DEFAULT` (NVIDIA)."""
        found = self.gpu_vendor
        return found if found is not None else vendor_for(self._vars.get("orch_device_name"))

    @property
    def environment(self) -> dict[str, str]:
        """The server's environment (``orch_unit.environment``): the unit's as systemd gives it,
        or for a container unit the container's (``-e``, ``--env-file``); ``{}`` without unit
        facts."""
        return self.unit.environment if self.unit is not None else {}


def server_of(unit: UnitFacts | None, engine: Engine | None = None) -> ServerArgs:
    """The parsed launch command of ``unit``; without one (no unit facts: a playbook that does
    not read the unit), the defaults of ``engine`` (None: the unit's, else the default engine) for
    a server given no flags (``Engine.parse_server_args([])``), the one place they are applied."""
    if unit is not None and unit.server is not None:
        return unit.server
    return (engine or engine_named(unit.engine if unit is not None else None)).parse_server_args([])
