"""What makes a server's Triton MoE config files moot or dangerous, as ``plan`` and ``orch doctor``
see it (issue 32 rows 12, 13, 14). SGLang's rules live in :mod:`remote.engines.sglang`
(:mod:`~remote.engines.sglang.bypass`, :mod:`~remote.engines.sglang.config_root`,
:mod:`~remote.engines.sglang.pairs`); this module applies them to the unit's facts, the probe and
the files on the host (read-only):

- :func:`bypass_reason`: flags with which SGLang never reads the files (deterministic inference,
  KTransformers): ``plan`` skips the host, doctor says ``not-applicable``;
- :func:`root_hazards`: unparsable ``triton_*`` entries of the configs root (``will-crash`` /
  ``not-loaded``) and an empty or relative ``SGLANG_MOE_CONFIG_DIR``; ``plan`` refuses to install
  into such a root (:func:`plan_refusal`), doctor names each with its path;
- :func:`pair_mismatch`: an installed up/``_down`` pair that disagrees on BLOCK_SIZE_M (doctor warns);
- :func:`server_triton_cache_dir` and :func:`triton_cache_note`: the server's own Triton cache shared
  between hosts, holding kernels of another GPU architecture or truncated files (issue 32 row 16;
  doctor warns; ``orch tune`` never reads it: its tuner compiles into a fresh cache of its own,
  ``remote.tuning.cache``).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from remote.engines.sglang.bypass import files_bypassed
from remote.engines.sglang.config_root import entry_states, relative_config_dir
from remote.engines.sglang.pairs import block_m_mismatches, describe

from ..facts.files import read_config


def bypass_reason(unit, probe) -> str | None:
    """Why the server of ``unit`` (:class:`orchestrator.facts.unit.UnitFacts`) never reads the Triton
    MoE config files under the SGLang the ``probe`` found
    (:func:`remote.engines.sglang.bypass.files_bypassed`), or None."""
    server = unit.server if unit is not None else None
    if server is None:
        return None
    version = probe.engine.version if probe is not None else None
    return files_bypassed(list(server.launch_args or []), bool(getattr(server, "enable_deterministic_inference", False)), version)


@dataclass
class RootHazards:
    """``entries``: the unparsable ``triton_*`` entries of the probed configs root, each
    ``{"path", "state", "why"}`` (``state`` ``will-crash`` or ``not-loaded``:
    :func:`remote.engines.sglang.config_root.entry_states`); ``config_dir``: an empty or relative
    ``SGLANG_MOE_CONFIG_DIR`` (:func:`remote.engines.sglang.config_root.relative_config_dir`) with
    ``exists`` (whether the folder SGLang then reads is there on the host; None: not checked, a
    container's) and ``state`` (``will-crash`` when it is not, else ``not-loaded``: orch's probe
    and SGLang's own folder are not what the server reads), or None."""

    entries: list[dict] = field(default_factory=list)
    config_dir: dict | None = None

    @property
    def will_crash(self) -> list[str]:
        """The reasons a start or a lookup of this server dies, one per hazard."""
        out = [f"{e['path']}: {e['why']}" for e in self.entries if e["state"] == "will-crash"]
        if self.config_dir and self.config_dir.get("state") == "will-crash":
            out.append(f"{self.config_dir['configs_root']} does not exist: {self.config_dir['why']}")
        return out

    def notes(self) -> list[str]:
        """One line per hazard, with its state and path."""
        out = [f"{e['state']}: {e['path']}: {e['why']}" for e in self.entries]
        if self.config_dir:
            out.append(f"{self.config_dir.get('state') or 'not-loaded'}: {self.config_dir['configs_root']}: "
                       f"{self.config_dir['why']}")
        return out


def root_hazards(connection, unit, probe) -> RootHazards:
    """The :class:`RootHazards` of the server (``unit``: its facts; ``probe``: ``orch_probe``); reads
    only whether the folder an empty or relative ``SGLANG_MOE_CONFIG_DIR`` points at exists
    (``test -d``, on the host; not for a container unit, whose working directory is the image's)."""
    sg = probe.engine if probe is not None else None
    rules = (sg.loader_rules if sg is not None else None) or {}
    out = RootHazards()
    if sg is not None and sg.configs_root and probe.unparsable_folders:
        misses = {}
        for role, name in (probe.file_names or {}).items():
            ex = probe.existing_file(role)
            exact = posixpath.join(sg.configs_root, probe.exact_folder or "", name)
            misses[role] = ex.read_by_engine and ex.would_load != exact
        out.entries = entry_states(sg.configs_root, list(probe.unparsable_folders), misses, rules)
    env = unit.environment if unit is not None else {}
    found = relative_config_dir(env, rules, unit.working_directory if unit is not None else None)
    if found is not None:
        exists = None
        if unit.container is None:
            res = connection.run(["test", "-d", found["configs_root"]], check=False, become=True, timeout=30)
            exists = res.ok
        found["exists"] = exists
        found["state"] = "will-crash" if exists is False else "not-loaded"
        out.config_dir = found
    return out


def plan_refusal(hazards: RootHazards, install_dir: str, probed_root: str | None) -> str | None:
    """Why ``plan`` refuses to install into ``install_dir`` (None: it does not): an empty or relative
    ``SGLANG_MOE_CONFIG_DIR`` (orch cannot tell the server's folder the way SGLang does), or an
    unparsable ``triton_*`` entry in the root it would install under (``probed_root``: the probed
    configs root; the entries are known only for it). Every reason ends in "nothing was stopped"."""
    if hazards.config_dir is not None:
        return hazards.config_dir["why"] + "; nothing was stopped"
    if hazards.entries and probed_root and posixpath.dirname(install_dir) == probed_root:
        bad = "; ".join(f"{e['path']} ({e['state']}: {e['why']})" for e in hazards.entries)
        return (f"the configs root {probed_root} holds an entry SGLang's version sort cannot parse: {bad}. orch does "
                "not install into such a root: move it out of the folder or rename it so that it does not start with "
                "triton_ (e.g. backup-triton_3_6_0); nothing was stopped")
    return None


def pair_mismatch(connection, up_path: str | None, down_path: str | None, sglang_version: str | None) -> str | None:
    """The warning for an installed up/``_down`` pair (paths on the host; None: absent) that disagrees
    on BLOCK_SIZE_M at some batch size (:func:`remote.engines.sglang.pairs.block_m_mismatches`, in the
    words of the release's rule), or None (they agree, a file is missing or unreadable)."""
    if not up_path or not down_path:
        return None
    up, down = read_config(connection, up_path), read_config(connection, down_path)
    if not isinstance(up, dict) or not isinstance(down, dict):
        return None
    found = block_m_mismatches(up, down)
    return describe(found, sglang_version) if found else None



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
