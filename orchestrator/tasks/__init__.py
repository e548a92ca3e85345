"""The task modules the playbook engine runs, declared with ``@task``
(:mod:`orchestrator.engine.task`); importing this package registers them all in :data:`TASKS`.

Grouped by what they act on: :mod:`.connect`; :mod:`.systemd` (``unit_facts``, ``service``);
:mod:`.payload` (``payload``, ``stop_payload``); :mod:`.records` (``lock``, ``run_state``,
``runs``, ``check_unfinished``); :mod:`.probe` (``probe``, ``plan``); :mod:`.config_source`;
:mod:`.tune`; :mod:`.deadman` (the host's own guard, armed before the stop); :mod:`.gpu_health` (the kernel log's Xid lines, nvidia-smi under a deadline); :mod:`.install` (``install``, ``compare_installed``, ``restore``); :mod:`.reap`; :mod:`.readiness`
(``wait_ready``, ``verify_log``); :mod:`.bench`; :mod:`.rollback`; :mod:`.recover`;
:mod:`.diagnose`; :mod:`.runner_trial` (``runner_candidates``, ``runner_trial``,
``daemon_reload``, ``verify_runner``, ``autotune_cache``). A task that drives one payload command has that command's name.
"""

from __future__ import annotations

from ..engine.task import REGISTRY
from . import (bench, config_source, connect, deadman, diagnose, gpu_health, install, payload, probe,  # noqa: F401
               readiness, reap, records, recover, rollback, runner_trial, systemd, tune)

#: name -> TaskSpec of every bundled task
TASKS = REGISTRY

#: task names of earlier releases -> their name now ("" when removed), for a copied playbook's error
RENAMED = {"gpu_reap": "reap", "install_configs": "install", "restore_configs": "restore", "history": "runs",
           "host_state": "run_state",
           "cleanup": ""}
