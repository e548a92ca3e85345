"""Run one bundled playbook over an inventory: the shared body of ``orch bench``, ``doctor`` and ``runs``."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def run_bundled(name: str, inventory: str, *, limit: str | None = None, extra: dict | None = None,
                check: bool = False, state_dir: Path | None = None, accept_new_host_keys: bool = False,
                forks: int = 5, verbose: bool = False):
    """Run ``playbooks/<name>.yaml`` over the hosts ``limit`` selects; return ``(recaps, record)``.

    ``recaps`` maps host name to :class:`orchestrator.engine.results.HostRecap`; ``record`` is the
    run's :class:`orchestrator.records.RunRecord`, still open so callers can add files, then
    close it. Raises ``InventoryError``/``PlaybookError`` on bad input.
    """
    from .engine.context import RunOptions
    from .engine.playbook import builtin_playbook, load_playbook
    from .engine.runner import Engine
    from .inventory import effective_vars, load_inventory
    from .records import RunRecord, default_state_dir, new_run_id
    from .tasks import MODULES
    from .ui import Reporter

    hosts = load_inventory(inventory).select(limit)
    state_dir = Path(state_dir or default_state_dir())
    record = RunRecord(state_dir, new_run_id(name))
    opts = RunOptions(run_id=record.run_id, run_dir=record.dir, check=check, accept_new_host_keys=accept_new_host_keys,
                      echo_output=verbose, extra=dict(extra or {}), state_dir=state_dir)
    plays = load_playbook(builtin_playbook(name), set(MODULES))
    with Reporter(Console(stderr=True, highlight=False), verbose=verbose) as rep:
        recaps = Engine(MODULES, opts, rep, record.emit).run_play(plays[0], hosts, effective_vars, forks=forks)
    return recaps, record
