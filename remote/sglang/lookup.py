"""Where SGLang's fused-MoE config loader looks, read from disk without importing sglang.

:func:`find_sglang` locates the loader module and the ``configs/`` folder it reads (or the
unit's ``SGLANG_MOE_CONFIG_DIR``); :func:`simulate_lookup` replays the loader's search for one
file name. Both follow SGLang 0.5.23 ``fused_moe_triton_config.py`` (``get_moe_configs``):
exact ``configs/<triton folder>/<file>`` first, else every ``triton_*`` folder newest first.

SGLang is located WITHOUT importing it (its ``__init__`` is heavy and may touch the GPU):
``importlib.util.find_spec("sglang")`` only finds a top-level package's spec, it does
not execute it; the version comes from ``importlib.metadata``. Loader paths are those of
SGLang 0.5.23 (``moe_runner/triton_utils/``, since sglang PR #23019) and older releases
(``fused_moe_triton/``); SGLang resolves ``os.path.realpath(__file__)``, so do we.
Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import Any

from .naming import sort_triton_folders, unparsable_triton_folders

#: Loader module locations inside the ``sglang`` package, newest layout first.
LOADER_LAYOUTS = (
    ("current", ("srt", "layers", "moe", "moe_runner", "triton_utils", "fused_moe_triton_config.py")),
    ("old", ("srt", "layers", "moe", "fused_moe_triton", "fused_moe_triton_config.py")),
)


def sglang_package_dirs() -> list[str]:
    """Folders of the ``sglang`` package this interpreter would import, ``[]`` when absent.

    ``importlib.util.find_spec("sglang")`` finds a top-level package's spec without executing
    it. A namespace package may have several folders; the first is the one imported first.
    """
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [str(p) for p in spec.submodule_search_locations]
    return [os.path.dirname(spec.origin)] if spec.origin else []


def sglang_module_file(module: str) -> str | None:
    """The source file of the dotted ``sglang.*`` ``module`` (``<dir>/__init__.py`` of a package,
    else ``<name>.py``) in the installed ``sglang`` package, found on disk without importing
    anything; None when it is not there. Raises ValueError when ``module`` is not under ``sglang``.
    """
    parts = module.split(".")
    if parts[0] != "sglang":
        raise ValueError(f"{module!r} is not an sglang module")
    for d in sglang_package_dirs():
        base = Path(d).joinpath(*parts[1:])
        for cand in (base / "__init__.py", base.with_name(base.name + ".py")):
            if cand.is_file():
                return str(cand)
    return None


def find_sglang(moe_config_dir: str | None = None) -> dict[str, Any]:
    """Locate SGLang's fused-MoE loader and config folders on disk without importing sglang.

    ``moe_config_dir``: the unit's ``SGLANG_MOE_CONFIG_DIR``; it replaces the base folder
    (configs_root = ``<dir>/configs``). Returns the ``sglang`` object described in the
    module docstring.
    """
    out: dict[str, Any] = {
        "installed": False, "version": None, "package_dir": None, "loader_module": None,
        "layout": None, "configs_root": None, "configs_root_exists": False,
        "shipped_configs_root": None, "other_layout_configs_root": None,
        "moe_config_dir": moe_config_dir,
    }
    pkg_dirs = sglang_package_dirs()
    if pkg_dirs:
        out["installed"] = True
        out["package_dir"] = pkg_dirs[0]
        try:
            out["version"] = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            out["version"] = None
        found: dict[str, str] = {}
        for layout, parts in LOADER_LAYOUTS:
            for d in pkg_dirs:
                cand = Path(d).joinpath(*parts)
                if cand.is_file():
                    found.setdefault(layout, os.path.realpath(cand))
        for layout, _ in LOADER_LAYOUTS:
            if layout in found:
                out["layout"] = layout
                out["loader_module"] = found[layout]
                out["shipped_configs_root"] = os.path.join(os.path.dirname(found[layout]), "configs")
                break
        for layout, parts in LOADER_LAYOUTS:
            if layout == out["layout"]:
                continue
            other = Path(pkg_dirs[0]).joinpath(*parts[:-1], "configs")
            if other.is_dir():
                out["other_layout_configs_root"] = os.path.realpath(other)
    if moe_config_dir:
        out["configs_root"] = os.path.join(os.path.abspath(os.path.expanduser(moe_config_dir)), "configs")
    else:
        out["configs_root"] = out["shipped_configs_root"]
    if out["configs_root"]:
        out["configs_root_exists"] = os.path.isdir(out["configs_root"])
    return out


def simulate_lookup(configs_root: str, exact_folder: str, file_name: str) -> dict[str, Any]:
    """What SGLang 0.5.23 ``get_moe_configs`` would do for ``file_name`` under ``configs_root``.

    Exact ``<root>/<exact_folder>/<file>`` first; else every ``triton_*`` entry, newest
    first (an unparsable entry makes the real loader raise ValueError, a missing root
    FileNotFoundError; both reported in ``fallback_error``). Returns
    ``{folders, sglang_would_load, fallback_error}``; ``folders`` lists every parsable
    ``triton_*`` folder holding the file, newest first.
    """
    try:
        entries = sorted(os.listdir(configs_root))
    except FileNotFoundError:
        entries = None
    except OSError as exc:
        return {"folders": [], "sglang_would_load": None, "fallback_error": f"cannot list {configs_root}: {exc}"}
    if entries is None:
        return {"folders": [], "sglang_would_load": None,
                "fallback_error": f"{configs_root} does not exist: SGLang's fallback scan raises FileNotFoundError"}
    tri = [e for e in entries if e.startswith("triton_")]
    ordered = sort_triton_folders(tri)
    folders = [f for f in ordered if os.path.isfile(os.path.join(configs_root, f, file_name))]
    bad = unparsable_triton_folders(tri)
    exact = os.path.join(configs_root, exact_folder, file_name)
    if os.path.isfile(exact):
        return {"folders": folders, "sglang_would_load": exact, "fallback_error": None}
    if bad:
        return {"folders": folders, "sglang_would_load": None,
                "fallback_error": f"unparsable folder(s) {bad}: SGLang's fallback sort raises ValueError"}
    return {"folders": folders,
            "sglang_would_load": os.path.join(configs_root, folders[0], file_name) if folders else None,
            "fallback_error": None}
