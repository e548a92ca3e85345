"""What in a server's MoE configs root makes SGLang crash or read elsewhere (issue 32 row 12).

Both rules are SGLang 0.5.23's ``get_moe_configs``
(``srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``):

1. On a miss (no exact ``configs/triton_X_Y_Z/<file>``), releases that scan (0.5.12+, loader rule
   ``fallback == "scan"``) list **every** entry of ``configs/`` whose name starts with ``triton_``
   (folders and plain files alike: ``os.listdir``) and sort them by
   ``tuple(int(x) for x in v.split("."))``: one name that is not three integers
   (``triton_3_6_0.bak``, ``triton_old``) raises ValueError, so the lookup, and the server with it,
   dies. With the exact file present no listing happens: such an entry is never read, and the next
   miss (a new model or TP, a Triton upgrade, a rollback that removes the file) crashes.
   Releases with a fixed fallback list never list the root: there the entry is only never read.
2. ``config_dir = os.environ.get("SGLANG_MOE_CONFIG_DIR", <the loader's folder>)``: a variable that
   is set but empty is ``""`` (not the default), so the root is ``configs`` relative to the server's
   working directory; a relative value resolves the same way (no ``~`` expansion either). On a
   miss ``os.listdir`` of that ``configs`` raises FileNotFoundError when it does not exist.
   Releases that read the variable: loader rule ``config_dir_env`` (0.5.3+).

``tests/unit/remote/engines/sglang/test_config_root_oracle.py`` runs the real loaders of every covered
release against both. :func:`root_hazards` applies both to one server (``Engine.root_hazards``).
Standard library only.
"""

from __future__ import annotations

import posixpath
from typing import Any, Callable, Mapping

from ..records import RootHazards

ENV = "SGLANG_MOE_CONFIG_DIR"


def entry_states(configs_root: str, unparsable: list[str], misses: dict[str, bool],
                 rules: dict) -> list[dict]:
    """The state of each unparsable ``triton_*`` entry of ``configs_root`` (``remote.engines.sglang.naming.unparsable_triton_folders``),
    rule 1 of the module docstring: ``{"path", "state", "why"}`` with ``state`` ``will-crash`` (this
    release lists the root, ``rules["fallback"] == "scan"``, and a lookup the server makes misses:
    ``misses`` role -> the server finds no exact file for it) or ``not-loaded`` (never read: the exact
    files are there, or this release never lists the root). Pure."""
    scans = rules.get("fallback") == "scan"
    missed = sorted(r for r, m in misses.items() if m)
    out = []
    for name in unparsable:
        path = posixpath.join(configs_root, name)
        if scans and missed:
            why = (f"SGLang lists {configs_root} on a miss ({', '.join(missed)} file not in its Triton folder) and "
                   f"its version sort raises ValueError on {name!r}: the server dies at its first MoE lookup")
            out.append({"path": path, "state": "will-crash", "why": why})
        elif scans:
            why = (f"never read; the exact files are there, but the next miss (another model or TP, a Triton upgrade, "
                   f"a rollback that removes a file) makes SGLang's version sort raise ValueError on {name!r}")
            out.append({"path": path, "state": "not-loaded", "why": why})
        else:
            out.append({"path": path, "state": "not-loaded",
                        "why": "never read: this SGLang tries a fixed list of Triton folders, it does not list the root"})
    return out


def relative_config_dir(environment: dict[str, str], rules: dict, working_directory: str | None) -> dict | None:
    """Rule 2 of the module docstring: ``{"value", "configs_root", "why"}`` when the server's
    ``SGLANG_MOE_CONFIG_DIR`` (``environment``: what the server gets) is set but empty or not an
    absolute path and this release reads it (``rules["config_dir_env"]``); ``configs_root`` is where
    SGLang then looks, resolved against ``working_directory`` (the unit's ``WorkingDirectory=``;
    None or empty: ``/``, systemd's default for system units). None otherwise. Pure."""
    if ENV not in environment or not rules.get("config_dir_env"):
        return None
    value = environment[ENV]
    if value.startswith("/"):
        return None
    cwd = working_directory if (working_directory or "").startswith("/") else "/"
    root = posixpath.normpath(posixpath.join(cwd, value, "configs"))
    what = "set but empty" if value == "" else f"the relative path {value!r}"
    why = (f"{ENV} is {what}: SGLang takes it as the folder (os.environ.get returns it, not the default) and looks "
           f"for configs/triton_X_Y_Z relative to the server's working directory ({cwd}), i.e. {root}; on a miss "
           "it lists that folder (FileNotFoundError when it does not exist). Set an absolute path, or remove the "
           "variable to use SGLang's own folder")
    return {"value": value, "configs_root": root, "why": why}


def install_refusal(configs_root: str, entries: list[dict]) -> str:
    """Why orch does not install into ``configs_root`` while it holds the unparsable ``entries``
    (:func:`entry_states`): one sentence naming each entry with its state, how to clear it (an
    entry whose name does not start with ``triton_`` is not listed by rule 1), and that nothing
    was stopped. Pure."""
    bad = "; ".join(f"{e['path']} ({e['state']}: {e['why']})" for e in entries)
    return (f"the configs root {configs_root} holds an entry SGLang's version sort cannot parse: {bad}. orch does "
            "not install into such a root: move it out of the folder or rename it so that it does not start with "
            "triton_ (e.g. backup-triton_3_6_0); nothing was stopped")


def root_hazards(*, configs_root: str | None, unparsable: list[str], misses: Mapping[str, bool],
                 loader_rules: Mapping[str, Any], environment: Mapping[str, str], working_directory: str | None,
                 folder_exists: Callable[[str], bool | None]) -> RootHazards:
    """Both rules of the module docstring for one server, as a
    :class:`~remote.engines.records.RootHazards` (``Engine.root_hazards`` documents the arguments):
    the unparsable entries of ``configs_root`` (:func:`entry_states`, with :func:`install_refusal`)
    and an empty or relative ``SGLANG_MOE_CONFIG_DIR`` (:func:`relative_config_dir`), whose state is
    ``will-crash`` when ``folder_exists`` says the folder SGLang then reads is missing (on a miss
    ``os.listdir`` of it raises FileNotFoundError), else ``not-loaded``."""
    rules = dict(loader_rules or {})
    out = RootHazards()
    if configs_root and unparsable:
        out.entries = entry_states(configs_root, list(unparsable), dict(misses), rules)
        out.install_refusal = install_refusal(configs_root, out.entries)
    found = relative_config_dir(dict(environment), rules, working_directory)
    if found is not None:
        exists = folder_exists(found["configs_root"])
        found["exists"] = exists
        found["state"] = "will-crash" if exists is False else "not-loaded"
        out.config_dir = found
    return out
