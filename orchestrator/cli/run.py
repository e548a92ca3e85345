"""The one way every ``orch`` command runs a playbook: :func:`run_playbook`.

It loads the inventory and the playbook (checked against the tasks' declarations before any
host is contacted), opens the controller's run record, installs the signal handlers (SIGINT,
SIGTERM, SIGHUP: finish the current step, then run every rescue step, so no unit is left
stopped; a second signal only says so), runs each play over the hosts it selects with the
batching options, and writes the recap.
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from remote.protocol import is_run_id

from ..engine.batching import SerialError, check_max_fail_percentage, check_order, parse_serial_flag
from ..engine.context import RunOptions
from ..engine.playbook import Play, Task, builtin_playbook, load_playbook
from ..engine.results import HostRecap
from ..engine.runner import Engine
from ..errors import UsageError
from ..facts.server_group import ServerGroup, group_servers
from ..facts.unit import ServerArgs, UnitFacts
from ..fleet import ServerBarrier
from ..inventory import effective_vars, load_inventory
from ..records import RunRecord, default_state_dir, new_run_id
from ..records.layout import HOSTS, RECAP, RESULT, RUN
from ..tasks import RENAMED, TASKS
from ..ui import Reporter, make_console, print_wrapped


@dataclass
class Batching:
    """How hosts are batched (Ansible's play keywords, as command-line flags): ``serial`` (a number,
    a percentage or a list, text as given), ``forks`` (hosts in parallel within a batch),
    ``max_fail_percentage``, ``any_errors_fatal``, ``order``. None: the play's own value."""

    serial: str | None = None
    forks: int = 5
    max_fail_percentage: float | None = None
    any_errors_fatal: bool | None = None
    order: str | None = None


@dataclass
class RunResult:
    """What a playbook run left: ``recaps`` (host name -> :class:`HostRecap`, inventory order),
    ``record`` (the controller's run record, still open: callers add files, then close it),
    ``cancelled`` (an operator interrupt arrived)."""

    recaps: dict[str, HostRecap]
    record: RunRecord
    cancelled: bool = False
    options: RunOptions | None = field(default=None, repr=False)

    @property
    def failed(self) -> bool:
        """True when a host failed, was unreachable, or was never started."""
        return any(r.is_failure or r.outcome == "not started" for r in self.recaps.values())


def check_batching(b: Batching) -> Batching:
    """The flags of ``b`` checked before anything runs, each error a :class:`UsageError` naming its
    flag: ``--serial`` by :func:`~orchestrator.engine.batching.parse_serial_flag` (``1``, ``25%``,
    ``1,5,25%``; no 0 and no percentage above 100), ``--forks`` at least 1, ``--max-fail-percentage``
    0-100, ``--order`` one of Ansible's orders. Returns ``b``."""
    checks = (("--serial", b.serial, parse_serial_flag), ("--max-fail-percentage", b.max_fail_percentage,
              check_max_fail_percentage), ("--order", b.order, check_order))
    for flag, value, check in checks:
        if value is None:
            continue
        try:
            check(value)
        except SerialError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    if isinstance(b.forks, bool) or not isinstance(b.forks, int) or b.forks < 1:
        raise UsageError(f"--forks: hosts worked on at once must be at least 1, got {b.forks!r}")
    return b


def check_run_id(flag: str, value: str | None) -> str | None:
    """``value`` of ``flag`` (``--run-id``, ``--to``) when it is None or a run id
    (:func:`remote.protocol.is_run_id`: it names a folder of the run records); UsageError otherwise."""
    if value is not None and not is_run_id(value):
        raise UsageError(f"{flag}: {value!r} is not a run id (letters, digits, '_', '.', '-'; "
                         "'orch runs' lists them)")
    return value


def open_record(state_dir: Path, run_id: str) -> RunRecord:
    """The run's :class:`RunRecord` under ``state_dir``; a folder that cannot be made there is a
    :class:`UsageError` naming ``--state-dir``."""
    try:
        return RunRecord(state_dir, run_id)
    except OSError as exc:
        raise UsageError(f"--state-dir {state_dir}: cannot make the run record there "
                         f"({exc.strerror or exc}: {exc.filename or state_dir})") from None


def host_variables(service: str | None):
    """The variables of each host as the playbooks see them: its effective inventory variables
    and ``service`` (the unit: ``--service`` when given, else the host's ``orch_service``)."""
    def hostvars(host) -> dict[str, Any]:
        v = effective_vars(host)
        v["service"] = service or v.get("orch_service")
        return v
    return hostvars


def _install_signal_handlers(cancel: threading.Event, console: Console) -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, _frame):
        if cancel.is_set():
            console.print("[red]interrupted again: still restoring hosts, please wait[/]")
            return
        cancel.set()
        console.print(f"[yellow]{signal.Signals(signum).name}: finishing the current step, then restoring every "
                      "host that was changed[/]")

    # a dropped terminal (SIGHUP) must not leave units stopped either
    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


class _Quiet:
    """A reporter that shows nothing (the discovery pass of :func:`find_servers`: the play that
    follows reports the same steps)."""

    def task_result(self, host, task, result) -> None:
        pass

    def progress(self, *args, **fields) -> None:
        pass

    def line(self, text) -> None:
        pass


def find_servers(hosts: list, hostvars, options: RunOptions, emit,
                 forks: int = 5) -> tuple[dict[str, ServerGroup], dict[str, HostRecap]]:
    """Read every host's unit (Connect and Read the unit, read-only) and gather the ranks of
    multi-node servers among ``hosts`` (the run's hosts, after ``--limit``):
    :func:`orchestrator.facts.server_group.group_servers`. Returns (host name -> its server, the
    pass's own recaps: a host interrupted during the pass keeps its failure); a
    host whose unit cannot be read is left out (the play that follows fails it at the same step,
    and the ranks of its server then miss it: refused). Records one ``multi_node_servers`` event
    (the pass's own task events are not recorded: the play repeats those steps). Changes nothing
    on any host. Each host's connection is left open in ``options.connections`` for the play
    that follows (its ``connect`` task takes it over), so a run logs in once per host."""
    play = Play("find multi-node servers", "all",
                [Task("Connect", "connect", {}), Task("Read the unit", "unit_facts", {"name": "{{ service }}"})])
    units: dict[str, tuple[str, ServerArgs, None]] = {}
    broken: dict[str, BaseException] = {}

    def capture(event: str, **fields) -> None:
        data = fields.get("data") or {}
        if event == "task" and fields.get("module") == "unit_facts" and isinstance(data.get("server"), dict):
            try:
                # the unit's engine's own server record (UnitFacts.from_dict reads it by the engine it names)
                units[fields["host"]] = (data.get("unit") or "", UnitFacts.from_dict(data).server, None)
            except Exception as exc:  # noqa: BLE001 - raised after the pass: the engine turns it into a quiet host failure
                err = RuntimeError(f"internal error: {fields['host']}'s unit record does not read back "
                                   f"({type(exc).__name__}: {exc})")
                err.__cause__ = exc
                broken[fields["host"]] = err

    # its connections stay open for the play (options.connections): a run logs in once per host
    quiet = RunOptions(run_id=options.run_id, run_dir=options.run_dir, check=True,
                       accept_new_host_keys=options.accept_new_host_keys,
                       remember_host_keys=options.remember_host_keys, extra=dict(options.extra),
                       cancel=options.cancel, state_dir=options.state_dir, connections=options.connections,
                       keep_connections=True)
    recaps = Engine(TASKS, quiet, _Quiet(), capture).run_play(play, hosts, hostvars, forks=forks)
    if broken:
        # a unit record this pass cannot read is orch's own fault, not the host's: grouping without it
        # would silently tune a multi-node server one rank at a time. The hosts' tasks run in parallel
        # (forks), so the error named is the first in the run's host order, not the first to finish.
        raise next(broken[h.name] for h in hosts if h.name in broken)
    found = group_servers({h.name: units[h.name] for h in hosts if h.name in units})
    if found:
        emit("multi_node_servers", servers={n: g.to_dict() for n, g in found.items()})
    return found, recaps


def run_playbook(playbook: str | Path, inventory: str | Path, *, limit: str | None = None,
                 service: str | None = None, extra: dict[str, Any] | None = None, check: bool = False,
                 batching: Batching | None = None, state_dir: Path | None = None,
                 accept_new_host_keys: bool = False, leave_stopped: bool = False, retune: bool = False,
                 fleet: Any = None, run_id: str | None = None, verbose: bool = False,
                 console: Console | None = None, label: str | None = None,
                 multi_node: bool = False, read_only: bool | None = None,
                 remember_host_keys: bool | None = None) -> RunResult:
    """Run a playbook over the inventory's hosts that ``limit`` selects.

    ``playbook``: a bundled playbook's name (``tune``, ``doctor``, ...) or a path. ``extra``:
    variables for every host (above the inventory's); ``service``: the unit (default: each host's
    ``orch_service``). ``fleet``: the tune-once-per-group coordinator, told about batches and
    hosts (:class:`orchestrator.fleet.GroupCoordinator`). ``multi_node``: find the ranks of
    multi-node servers before the play (:func:`find_servers`; always with ``fleet``), so
    ``orch rollback``, ``recover`` and ``doctor`` batch and coordinate them as ``orch tune`` does.
    ``read_only`` (default ``check``): the run changes no host by design (``run.json``
    ``read_only``; ``orch bench`` too: it only loads the server), so ``orch report latest`` passes
    over it. ``remember_host_keys`` (default: not ``check``): write the keys
    ``--accept-new-host-keys`` accepts into known_hosts; a ``--check`` run writes none (it trusts
    them for the run), while ``orch doctor`` and ``orch runs``, read-only on the hosts, remember them.
    Returns a :class:`RunResult`; the
    record holds ``run.json``, ``events.jsonl``, ``recap.json`` and each host's ``result.json``.
    Raises :class:`~orchestrator.inventory.InventoryError` /
    :class:`~orchestrator.engine.playbook.PlaybookError` / :class:`UsageError` for bad input
    (:func:`check_batching`, :func:`check_run_id`, ``fleet.check_hosts``, :func:`open_record`),
    before any host is contacted. The inventory's warnings are printed before the run.
    """
    batching = check_batching(batching or Batching())
    check_run_id("--run-id", run_id)
    console = console or make_console(stderr=True)
    is_path = isinstance(playbook, Path) or "/" in str(playbook) or str(playbook).endswith((".yaml", ".yml"))
    name = label or (Path(playbook).stem if is_path else str(playbook))
    pb_path = Path(playbook) if is_path else builtin_playbook(str(playbook))
    inv = load_inventory(inventory)
    hosts = inv.select(limit)
    plays = load_playbook(pb_path, TASKS, RENAMED)
    if fleet is not None:
        fleet.check_hosts([h.name for h in hosts])
    run_id = run_id or new_run_id(name)
    state_dir = Path(state_dir or default_state_dir())
    record = open_record(state_dir, run_id)
    options = RunOptions(run_id=run_id, run_dir=record.dir, check=check, accept_new_host_keys=accept_new_host_keys,
                         remember_host_keys=(not check) if remember_host_keys is None else remember_host_keys,
                         leave_stopped=leave_stopped, echo_output=verbose, extra=dict(extra or {}),
                         state_dir=state_dir, retune=retune, fleet=fleet, hooks=[fleet] if fleet is not None else [])
    # read_only: a run that changes no host by design (doctor, runs, bench, --check); `orch report
    # latest` and the run listing pass over such runs (orchestrator.report.is_read_only)
    read_only = check if read_only is None else read_only
    record.write_json(RUN, {"run_id": run_id, "command": sys.argv, "inventory": str(inventory),
                            "playbook": str(pb_path), "name": name, "check": check, "read_only": read_only,
                            "hosts": [h.name for h in hosts]})
    old = _install_signal_handlers(options.cancel, console)
    recaps: dict[str, HostRecap] = {}
    interrupted: dict[str, HostRecap] = {}  # hosts the operator interrupted in the servers' discovery
    hostvars = host_variables(service)
    try:
        with Reporter(console, verbose=verbose) as reporter:
            for warning in inv.warnings:
                print_wrapped(console, f"warning: {warning}")
            console.print(f"orch {name} run [bold]{run_id}[/] on {len(hosts)} host(s)"
                          + (" [cyan](check mode)[/]" if check else ""))
            if fleet is not None or multi_node:  # the ranks of a multi-node server are one unit of work
                options.servers, found = find_servers(hosts, hostvars, options, record.emit, batching.forks)
                if options.cancel.is_set():  # interrupted while reading the units: nothing was changed
                    for r in found.values():
                        if not r.is_failure:
                            r.outcome, r.cause = "failed", "interrupted by the operator"
                    interrupted = found
                if options.servers:
                    options.barrier = ServerBarrier()
                    options.barrier.set_servers({n: g.members for n, g in options.servers.items() if not g.refusal})
                    options.hooks.append(options.barrier)
                    if fleet is not None:
                        fleet.prefer = {g.rank0 for g in options.servers.values() if g.rank0}
            engine = Engine(TASKS, options, reporter, record.emit)
            for play in plays:
                wanted = {h.name for h in inv.select(play.hosts)}
                play_hosts = [h for h in hosts if h.name in wanted]
                recaps.update(engine.run_play(play, play_hosts, hostvars, serial=batching.serial,
                                              forks=batching.forks, max_fail_percentage=batching.max_fail_percentage,
                                              any_errors_fatal=batching.any_errors_fatal, order=batching.order,
                                              servers={n: g.key for n, g in options.servers.items()}))
        recaps.update(interrupted)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for conn in list(options.connections.values()):  # the discovery pass's, not taken by the play
            try:
                conn.close()
            except Exception:  # closing a dead link must not mask the run's outcome
                pass
        options.connections.clear()
    result = {n: recap_dict(r) for n, r in recaps.items()}
    record.write_json(RECAP, result)
    for n in recaps:
        record.write_json(f"{HOSTS}/{n}/{RESULT}", result[n])
    return RunResult(recaps, record, options.cancel.is_set(), options)


def recap_dict(r: HostRecap) -> dict[str, Any]:
    """A host's recap as JSON (``recap.json``, ``--json``)."""
    return {"outcome": r.outcome, "cause": r.cause, "ok": r.ok, "changed": r.changed, "failed": r.failed,
            "unreachable": r.unreachable, "skipped": r.skipped, "rescued": r.rescued, "summary": r.summary.to_dict()}
