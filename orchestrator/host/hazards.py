"""What makes a server's Triton MoE config files moot or dangerous, as ``plan`` and ``orch doctor``
see it (issue 32 rows 12, 13, 14, 16). The engine's rules are reached through its
:class:`~remote.engines.Engine` (``ctx.facts.engine``); this module reads the host through fact
helpers (read-only) and hands the engine what it decides from:

- :func:`bypass_reason`: flags with which the server never reads the files, whatever its MoE runner
  (``Engine.files_bypassed``): ``plan`` skips the host, doctor says ``not-applicable``;
- :func:`root_hazards`: entries of the configs root the engine's lookup cannot parse (``will-crash``
  / ``not-loaded``) and an empty or relative config-dir variable (``Engine.root_hazards``, a
  :class:`~remote.engines.RootHazards`); ``plan`` refuses to install into such a root
  (:func:`plan_refusal`), doctor names each with its path;
- :func:`pair_mismatch`: an installed up/``_down`` pair the engine cannot run as measured
  (``Engine.pair_mismatch``; doctor warns);
- :func:`server_triton_cache_dir` and :func:`triton_cache_note`: the server's own Triton cache shared
  between hosts, holding kernels of another GPU architecture or truncated files (issue 32 row 16;
  doctor warns; ``orch tune`` never reads it: its tuner compiles into a fresh cache of its own,
  ``remote.tuning.cache``).
"""

from __future__ import annotations

import posixpath

from remote.engines import Engine, RootHazards

from ..facts.files import read_config
from ..facts.hostfiles import is_folder

__all__ = ["RootHazards", "bypass_reason", "pair_mismatch", "plan_refusal", "root_hazards",
           "server_triton_cache_dir", "triton_cache_note"]


def bypass_reason(engine: Engine, unit, probe) -> str | None:
    """Why the server of ``unit`` (:class:`orchestrator.facts.unit.UnitFacts`; None: not read) never
    reads the Triton MoE config files under the engine release the ``probe`` (``orch_probe``) found
    (``Engine.files_bypassed``), or None."""
    server = unit.server if unit is not None else None
    if server is None:
        return None
    version = probe.engine.version if probe is not None else None
    return engine.files_bypassed(server, version)


def root_hazards(connection, engine: Engine, unit, probe) -> RootHazards:
    """The :class:`~remote.engines.RootHazards` of the server (``unit``: its facts; ``probe``:
    ``orch_probe``) by ``engine``'s rules (``Engine.root_hazards``). Reads only whether the folder an
    empty or relative config-dir variable points at exists (:func:`orchestrator.facts.hostfiles.is_folder`,
    on the host; not for a container unit, whose working directory is the image's)."""
    sg = probe.engine if probe is not None else None
    unparsable = list(probe.unparsable_folders or []) if sg is not None and sg.configs_root else []
    misses = {}
    if unparsable:
        # a role misses when the server would load its file from anywhere but the exact folder
        for role, name in (probe.file_names or {}).items():
            ex = probe.existing_file(role)
            exact = posixpath.join(sg.configs_root, probe.exact_folder or "", name)
            misses[role] = ex.read_by_engine and ex.would_load != exact
    on_host = unit is not None and unit.container is None
    return engine.root_hazards(
        configs_root=sg.configs_root if sg is not None else None, unparsable=unparsable, misses=misses,
        loader_rules=(sg.loader_rules if sg is not None else None) or {},
        environment=unit.environment if unit is not None else {},
        working_directory=unit.working_directory if unit is not None else None,
        folder_exists=(lambda path: is_folder(connection, path)) if on_host else (lambda path: None))


def plan_refusal(hazards: RootHazards, install_dir: str, probed_root: str | None) -> str | None:
    """Why ``plan`` refuses to install into ``install_dir`` (None: it does not): an empty or relative
    config-dir variable (orch cannot tell the server's folder the way the engine does), or an
    unparsable entry in the root it would install under (``probed_root``: the probed configs root;
    the entries are known only for it; the engine's words, ``RootHazards.install_refusal``). Every
    reason ends in "nothing was stopped"."""
    if hazards.config_dir is not None:
        return hazards.config_dir["why"] + "; nothing was stopped"
    if hazards.entries and probed_root and posixpath.dirname(install_dir) == probed_root:
        return hazards.install_refusal
    return None


def pair_mismatch(connection, engine: Engine, up_path: str | None, down_path: str | None,
                  version: str | None) -> str | None:
    """The warning for an installed up/``_down`` pair (paths on the host; None: absent) that the
    engine release ``version`` cannot run as measured (``Engine.pair_mismatch``), or None (they
    agree, a file is missing or unreadable)."""
    if not up_path or not down_path:
        return None
    up, down = read_config(connection, up_path), read_config(connection, down_path)
    if not isinstance(up, dict) or not isinstance(down, dict):
        return None
    return engine.pair_mismatch(up, down, version)


def server_triton_cache_dir(unit) -> str | None:
    """The server's Triton cache folder as Triton finds it (``triton/knobs.py`` ``cache_knobs``:
    ``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``, ``TRITON_HOME`` defaulting to the
    home folder) in the unit's environment; the home is the environment's ``HOME``, else ``/root``
    (a system unit without ``User=`` runs as root and systemd sets no ``HOME``). None for a
    container unit (the folder is the image's) or without unit facts."""
    if unit is None or unit.container is not None:
        return None
    env = unit.environment
    if env.get("TRITON_CACHE_DIR"):
        return env["TRITON_CACHE_DIR"]
    home = env.get("TRITON_HOME") or env.get("HOME") or "/root"
    return posixpath.join(home, ".triton", "cache")


def triton_cache_note(report: dict | None) -> str | None:
    """The doctor's warning for the server's Triton cache (``report``: the probe's
    ``server_triton_cache``, ``remote.tuning.cache.server_cache_report``), or None when nothing in it
    can break a kernel. It says that orch tune reused nothing from it."""
    if not report or not report.get("exists"):
        return None
    found = []
    if report.get("shared"):
        found.append(f"it is on {report.get('fstype')}, shared with other hosts (and their GPUs and Triton)")
    if report.get("other_arch"):
        archs = ", ".join(f"sm{a} x{n}" for a, n in (report.get("archs") or {}).items())
        found.append(f"{report['other_arch']} kernel(s) compiled for another GPU architecture ({archs}): copied "
                     "from another GPU, a cached kernel can be reused wrong and miscompute silently (vllm #41871)")
    if report.get("truncated_count"):
        found.append(f"{report['truncated_count']} truncated or unreadable file(s), e.g. "
                     f"{', '.join(report.get('truncated') or [])[:300]} (a reboot mid-write, triton #10107)")
    if not found:
        return None
    return (f"the server's Triton cache {report['path']}: " + "; ".join(found)
            + ". Clear it (or give the unit its own TRITON_CACHE_DIR on a local disk) and restart. orch tune reused "
              "nothing from it: its tuner compiles into a fresh cache of its own")
