"""Task modules the playbook engine runs, by name.

Each module is ``fn(ctx, **args) -> TaskResult`` (see :mod:`orchestrator.engine.results`);
``fn.check_safe = True`` marks the read-only ones that also run in check mode (the
others are reported as skipped there). They raise ``TaskFailed`` to fail a host.
"""

from __future__ import annotations

from .benchmark import bench
from .config_install import install_configs, restore_configs
from .config_source import config_source
from .connect import connect
from .gpu_reaper import gpu_reap
from .doctor import diagnose
from .history import history
from .hoststate import host_state, lock
from .payload import cleanup, push, stop_payload
from .probe import plan, probe
from .readiness import verify_log, wait_ready
from .recover import check_unfinished, recover_mark, recover_restore, recover_select
from .rollback import rollback_restore, rollback_select
from .service import service, unit_facts
from .tuning import tune

MODULES = {
    "connect": connect,
    "unit_facts": unit_facts,
    "payload": push,
    "cleanup": cleanup,
    "lock": lock,
    "host_state": host_state,
    "probe": probe,
    "plan": plan,
    "bench": bench,
    "service": service,
    "gpu_reap": gpu_reap,
    "tune": tune,
    "install_configs": install_configs,
    "restore_configs": restore_configs,
    "wait_ready": wait_ready,
    "verify_log": verify_log,
    "rollback_select": rollback_select,
    "rollback_restore": rollback_restore,
    "history": history,
    "diagnose": diagnose,
    "config_source": config_source,
    "check_unfinished": check_unfinished,
    "recover_select": recover_select,
    "recover_restore": recover_restore,
    "recover_mark": recover_mark,
    "stop_payload": stop_payload,
}
