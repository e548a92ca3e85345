"""What several task modules do with one host's context, shared so that tasks never import tasks.

Nothing here is a task (no ``@task``): these are functions of a
:class:`~orchestrator.engine.context.HostContext` that more than one task module calls, and they
import no task module (``tests/test_architecture.py`` checks both rules).

- :mod:`.endpoint`: where the unit's server answers, and asking it (plan, readiness, bench);
- :mod:`.devices`: the unit's GPU device files (reap, diagnose);
- :mod:`.records`: the host's run records and the lock's heartbeat (records, recover, rollback,
  diagnose);
- :mod:`.sharing`: tuned files shared with the host's group and the controller's store
  (config_source, tune).
"""
