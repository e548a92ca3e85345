"""The start-up autotune cache of one unit's server, from its facts: where the cache lies (for the
probe, ``orch doctor`` and the runner trial's backup: one answer) and its state (for ``orch
doctor``). The rules are the engine's (``Engine.autotune_cache_root``, ``Engine.autotune_cache_dir``,
``Engine.autotune_state``; SGLang's: :mod:`remote.engines.sglang.autotune`, SGLang 0.5.23
``srt/environ.py`` and ``srt/model_executor/runner/flashinfer_autotune.py``); this module only
reads what they need from the host: the server's environment, its working directory and, when
the engine's default needs it, its user's home."""

from __future__ import annotations

from remote.engines import AutotuneState, Engine, MoeLogReport, MoeRunner, probe_view

from ..facts.hostfiles import user_home
from ..facts.probe import ProbeFacts
from ..facts.systemd_unit import Unit, scope_of
from ..facts.unit import ServerArgs, UnitFacts


def workdir_of(unit: UnitFacts | None) -> str:
    """The server's working directory: the folder a launch wrapper runs it in (``env -C``, ``conda
    run --cwd``, ...), else the unit's ``WorkingDirectory=``, else ``/`` (systemd's default for a
    system unit)."""
    if unit is None:
        return "/"
    cwd = (unit.launch.cwd if unit.launch is not None else None) or unit.working_directory
    return cwd if cwd and cwd.startswith("/") else "/"


def service_home(ctx, unit: Unit | str | None = None) -> str:
    """The home of the user the unit's server runs as: ``HOME`` of the server's environment, else
    (a user unit) the user manager's ``HOME`` (``systemctl --user show-environment``), else the home
    of the unit's ``User=`` (``orch_unit.user``, else ``systemctl show -p User``; ``getent passwd``;
    systemd gives a ``User=`` service that ``HOME``), root's ``/root`` for a unit without ``User=``
    (what Python's ``os.path.expanduser`` gives the server then). ``unit``: the unit's name (None:
    ``orch_unit``'s)."""
    env = ctx.facts.environment
    if env.get("HOME"):
        return env["HOME"]
    facts = getattr(ctx.facts, "unit", None)
    if isinstance(unit, Unit):
        handle = unit
    else:
        name = unit or (facts.unit if facts is not None else str(ctx.vars.get("orch_service") or ""))
        handle = Unit(name, scope_of(ctx.vars))
    if handle.user_scope:
        home = handle.manager_environment(ctx.connection).get("HOME", "")
        if home:
            return home
    if facts is not None and facts.unit == handle.name:
        user = facts.user or "root"
    else:
        user = handle.show(ctx.connection, "User").get("User", "").strip() or "root"
    return user_home(ctx.connection, user)


def autotune_cache_root(ctx, engine: Engine | None = None, unit: Unit | str | None = None) -> str | None:
    """The root of the server's caches as the server resolves it (``Engine.autotune_cache_root``:
    SGLang's ``$SGLANG_CACHE_DIR`` as written, relative to the server's working directory
    :func:`workdir_of`, else ``~/.cache/sglang`` of :func:`service_home`): the one answer of the
    probe (``orch doctor``) and the runner trial's backup. ``engine``: None, the unit's; ``unit``:
    the unit's name (None: ``orch_unit``'s)."""
    engine = engine or ctx.facts.engine
    env = ctx.facts.environment
    workdir = workdir_of(getattr(ctx.facts, "unit", None))
    return (engine.autotune_cache_root(env, workdir, None)
            or engine.autotune_cache_root(env, workdir, service_home(ctx, unit)))


def autotune_state(engine: Engine, unit: UnitFacts, server: ServerArgs, probe: ProbeFacts, runner: MoeRunner,
                   log: MoeLogReport | None) -> AutotuneState | None:
    """The unit's autotune state (``Engine.autotune_state``), or None when its MoE runner does not
    autotune: from its server arguments, the probe (whose ``autotune_cache_root`` the probe task
    set by :func:`autotune_cache_root`), its environment and the last start's parsed ``log``."""
    return engine.autotune_state(server, probe_view(probe), runner, unit.environment, log)
