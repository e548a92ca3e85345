"""probe: GPUs, Triton, SGLang loader/config folders, model shape and exact file names.

Flags: the model flags of ``names`` (``--model-config`` optional here), ``--device-name``
(override of the CUDA name; required when no CUDA GPU is visible and a model is given),
``--moe-config-dir`` (the unit's ``SGLANG_MOE_CONFIG_DIR``, if set).

Result ``data``::

    gpus: [{index, name, device_name, capability "9.0", smem_per_block_optin (bytes),
            total_memory (bytes)}]          # [] without CUDA/torch
    device_name: "NVIDIA_H200" | null       # SGLang form; --device-name wins over GPU 0
    mixed_gpus: bool                        # visible GPUs report different names
    torch_version, triton_version: str | null
    triton_folder: "triton_3_6_0"           # where orch installs (remote.naming.triton_folder)
    sglang_exact_folder: "triton_3_6_0"     # the folder SGLang tries first (verbatim version)
    sglang: {installed, version, package_dir, loader_module, layout "current"|"old"|null,
             loader_rules: {name_selectors, reads_down, config_dir_env, fallback,
                            fallback_versions} | null  (see loader_rules),
             configs_root, configs_root_exists, shipped_configs_root,
             other_layout_configs_root, moe_config_dir}
    model: MoeShape.to_dict() | null,  model_config_path
    file_names: {up, down} | null           # named as this release names them (loader_rules)
    install_dir: "<configs_root>/<triton_folder>" | null
    install_dir_exists: bool
    existing: {up|down: {folders: [triton_* holding the file, newest first],
                         in_installed_folder: bool, sglang_would_load: path | null,
                         fallback_error: str | null,
                         read_by_sglang: bool}}   # down: false when the release reads no _down file
    unparsable_folders: [triton_* names SGLang's fallback sort cannot parse]
    warnings: [str]

SGLang is located WITHOUT importing it (its ``__init__`` is heavy and may touch the GPU):
``importlib.util.find_spec("sglang")`` only finds a top-level package's spec, it does
not execute it; the version comes from ``importlib.metadata``. The loader module is the one
that defines ``get_moe_configs``: ``moe_runner/triton_utils/fused_moe_triton_config.py`` (SGLang
0.5.11+), ``fused_moe_triton/fused_moe_triton_config.py`` (0.5.2 ... 0.5.10) or
``fused_moe_triton/fused_moe.py`` (0.5.1 and older); SGLang resolves
``os.path.realpath(__file__)``, so do we. How that release names and looks up files
(:func:`loader_rules`) is read from the module's source, never assumed from a version number;
docs/sglang-releases.md lists what each release does.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import Any

from .naming import sglang_version_dir, sort_triton_folders, triton_folder, unparsable_triton_folders
from .names import add_model_arguments, checked_device_name, shape_from_args
from .protocol import PayloadError, log
from .tune import unsupported_reason

#: Loader module locations inside the ``sglang`` package, newest first: (layout, path parts).
#: ``fused_moe.py`` (SGLang <= 0.5.1) counts only when it defines ``get_moe_configs`` (later
#: releases keep a kernels-only module of that name).
LOADER_LAYOUTS = (
    ("current", ("srt", "layers", "moe", "moe_runner", "triton_utils", "fused_moe_triton_config.py")),
    ("old", ("srt", "layers", "moe", "fused_moe_triton", "fused_moe_triton_config.py")),
    ("old", ("srt", "layers", "moe", "fused_moe_triton", "fused_moe.py")),
)
#: The rules of SGLang 0.5.23, assumed when a loader module's source cannot be read.
RULES_0_5_23 = {"name_selectors": ["dtype", "block_shape", "per_channel_quant", "down"], "reads_down": True,
                "config_dir_env": True, "fallback": "scan", "fallback_versions": None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``probe`` command."""
    add_model_arguments(parser, required=False)
    parser.add_argument("--device-name", default=None, help="override torch.cuda.get_device_name()")
    parser.add_argument("--moe-config-dir", default=None, help="the unit's SGLANG_MOE_CONFIG_DIR, if set")


# --------------------------------------------------------------------------- GPUs / versions

def probe_gpus() -> tuple[list[dict], str | None, list[str]]:
    """Visible CUDA GPUs via torch: ``(gpus, torch_version, warnings)``; ``[]`` without CUDA."""
    warnings: list[str] = []
    try:
        import torch  # noqa: PLC0415 (heavy, only here)
    except Exception as exc:  # torch absent or broken
        return [], None, [f"torch not importable: {type(exc).__name__}: {exc}"]
    gpus: list[dict] = []
    try:
        if not torch.cuda.is_available():
            return [], str(torch.__version__), warnings
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            name = torch.cuda.get_device_name(i)
            smem = getattr(props, "shared_memory_per_block_optin", None)
            if smem is None:
                smem = _triton_smem(i)
            major, minor = torch.cuda.get_device_capability(i)
            try:
                dev = checked_device_name(name)
            except PayloadError as exc:
                dev = None
                warnings.append(f"GPU {i}: {exc.msg}")
            gpus.append({
                "index": i,
                "name": name,
                "device_name": dev,
                "capability": f"{major}.{minor}",
                "smem_per_block_optin": int(smem) if smem is not None else None,
                "total_memory": int(props.total_memory),
            })
    except Exception as exc:  # driver trouble: report, do not crash the probe
        warnings.append(f"CUDA query failed: {type(exc).__name__}: {exc}")
    return gpus, str(torch.__version__), warnings


def _triton_smem(index: int) -> int | None:
    try:
        import triton  # noqa: PLC0415
        return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:
        return None


def triton_version() -> str | None:
    """``triton.__version__`` (what SGLang uses), else the installed distribution's version."""
    try:
        import triton  # noqa: PLC0415
        return str(triton.__version__)
    except Exception:
        pass
    for dist in ("triton", "pytorch-triton"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# --------------------------------------------------------------------------- SGLang

def _defines_get_moe_configs(path: Path) -> bool:
    try:
        return "def get_moe_configs(" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def loader_rules(source: str) -> dict[str, Any] | None:
    """How an SGLang release names and looks up fused-MoE config files, read from its loader
    module's ``source`` (the module defining ``get_config_file_name`` and ``get_moe_configs``).

    Returns None when either function is missing or the source does not parse, else::

        name_selectors: ["dtype", "block_shape", "per_channel_quant"?, "down"?]
            # the selectors of get_config_file_name: ,per_channel_quant=True since 0.5.4,
            # _down since 0.5.5 (a parameter per_channel_quant / down_moe)
        reads_down: bool          # get_moe_configs takes down_moe: the server reads _down files
                                  # (0.5.5+); otherwise the down GEMM always runs the up config
        config_dir_env: bool      # get_moe_configs reads SGLANG_MOE_CONFIG_DIR (0.5.3+)
        fallback: "scan" | "list" # scan: every configs/triton_* folder newest first (0.5.12+);
                                  # list: a fixed list of versions (older releases)
        fallback_versions: ["3.4.0", ...] | None   # the fixed list, in the order tried

    Raises nothing; the oracle tests (tests/test_sglang_oracle.py) check this against the real
    code of every covered release.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    name_fn, lookup_fn = funcs.get("get_config_file_name"), funcs.get("get_moe_configs")
    if name_fn is None or lookup_fn is None:
        return None
    name_params = {a.arg for a in name_fn.args.args + name_fn.args.kwonlyargs}
    lookup_params = {a.arg for a in lookup_fn.args.args + lookup_fn.args.kwonlyargs}
    selectors = ["dtype", "block_shape"]
    if "per_channel_quant" in name_params:
        selectors.append("per_channel_quant")
    if "down_moe" in name_params:
        selectors.append("down")
    fixed: list[str] | None = None
    scans = env = False
    for node in ast.walk(lookup_fn):
        if isinstance(node, ast.Constant) and node.value == "SGLANG_MOE_CONFIG_DIR":
            env = True
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and any(
                isinstance(t, ast.Name) and t.id == "supported_triton_versions" for t in node.targets):
            fixed = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "listdir"):
            scans = True
    if fixed is None and not scans:
        return None
    return {"name_selectors": selectors, "reads_down": "down_moe" in lookup_params, "config_dir_env": env,
            "fallback": "list" if fixed is not None else "scan", "fallback_versions": fixed}


def find_sglang(moe_config_dir: str | None = None) -> dict[str, Any]:
    """Locate SGLang's fused-MoE loader and config folders on disk without importing sglang.

    ``moe_config_dir``: the unit's ``SGLANG_MOE_CONFIG_DIR``; it replaces the base folder
    (configs_root = ``<dir>/configs``) in releases that read it (``loader_rules``
    ``config_dir_env``); older releases ignore it. Returns the ``sglang`` object described in
    the module docstring.
    """
    out: dict[str, Any] = {
        "installed": False, "version": None, "package_dir": None, "loader_module": None,
        "layout": None, "loader_rules": None, "configs_root": None, "configs_root_exists": False,
        "shipped_configs_root": None, "other_layout_configs_root": None,
        "moe_config_dir": moe_config_dir,
    }
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    pkg_dirs: list[str] = []
    if spec is not None:
        if spec.submodule_search_locations:
            pkg_dirs = [str(p) for p in spec.submodule_search_locations]
        elif spec.origin:
            pkg_dirs = [os.path.dirname(spec.origin)]
    if pkg_dirs:
        out["installed"] = True
        out["package_dir"] = pkg_dirs[0]
        try:
            out["version"] = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            out["version"] = None
        found: list[tuple[str, str]] = []
        for layout, parts in LOADER_LAYOUTS:
            for d in pkg_dirs:
                cand = Path(d).joinpath(*parts)
                if cand.is_file() and (parts[-1] != "fused_moe.py" or _defines_get_moe_configs(cand)):
                    found.append((layout, os.path.realpath(cand)))
                    break
        # the module that defines get_moe_configs; else the first config module on disk
        pick = next((f for f in found if _defines_get_moe_configs(Path(f[1]))), found[0] if found else None)
        if pick:
            out["layout"], out["loader_module"] = pick
            out["shipped_configs_root"] = os.path.join(os.path.dirname(pick[1]), "configs")
            try:
                out["loader_rules"] = loader_rules(Path(pick[1]).read_text(encoding="utf-8", errors="replace"))
            except OSError:
                out["loader_rules"] = None
        for layout, parts in LOADER_LAYOUTS:
            if layout == out["layout"]:
                continue
            other = Path(pkg_dirs[0]).joinpath(*parts[:-1], "configs")
            if other.is_dir():
                out["other_layout_configs_root"] = os.path.realpath(other)
    rules = out["loader_rules"] or RULES_0_5_23
    if moe_config_dir and rules["config_dir_env"]:
        out["configs_root"] = os.path.join(os.path.abspath(os.path.expanduser(moe_config_dir)), "configs")
    else:
        out["configs_root"] = out["shipped_configs_root"]
    if out["configs_root"]:
        out["configs_root_exists"] = os.path.isdir(out["configs_root"])
    return out


def simulate_lookup(configs_root: str, exact_folder: str, file_name: str,
                    rules: dict[str, Any] | None = None) -> dict[str, Any]:
    """What SGLang's ``get_moe_configs`` would do for ``file_name`` under ``configs_root``.

    ``exact_folder``: ``sglang_version_dir(triton.__version__)``; ``rules``: the release's
    :func:`loader_rules` (None: SGLang 0.5.23's). First ``<root>/<exact_folder>/<file>``; else
    the fallback: with ``fallback == "scan"`` every ``triton_*`` entry, newest version first,
    each tried as ``triton_`` + its version with ``.`` made ``_`` (as SGLang rebuilds the name);
    an unparsable entry makes the real loader raise ValueError, a missing root
    FileNotFoundError (both reported in ``fallback_error``). With ``fallback == "list"`` only
    the release's fixed versions, in its order (no listing, so no such errors).

    Returns ``{folders, sglang_would_load, fallback_error}``; ``folders`` lists every parsable
    ``triton_*`` folder holding the file, newest first (whether SGLang tries it or not).
    """
    rules = rules or RULES_0_5_23
    try:
        entries = os.listdir(configs_root)  # SGLang sorts this order stably: ties keep it
    except FileNotFoundError:
        entries = None
    except OSError as exc:
        return {"folders": [], "sglang_would_load": None, "fallback_error": f"cannot list {configs_root}: {exc}"}
    tri = [e for e in entries or [] if e.startswith("triton_")]
    folders = [f for f in sort_triton_folders(tri) if os.path.isfile(os.path.join(configs_root, f, file_name))]
    exact = os.path.join(configs_root, exact_folder, file_name)
    if os.path.isfile(exact):
        return {"folders": folders, "sglang_would_load": exact, "fallback_error": None}
    if rules["fallback"] == "list":
        tries = ["triton_" + v.replace(".", "_") for v in rules["fallback_versions"] or []]
    elif entries is None:
        return {"folders": [], "sglang_would_load": None,
                "fallback_error": f"{configs_root} does not exist: SGLang's fallback scan raises FileNotFoundError"}
    else:
        bad = unparsable_triton_folders(tri)
        if bad:
            return {"folders": folders, "sglang_would_load": None,
                    "fallback_error": f"unparsable folder(s) {bad}: SGLang's fallback sort raises ValueError"}
        tries = ["triton_" + f[len("triton_"):].replace(".", "_") for f in sort_triton_folders(tri)]
    hit = next((os.path.join(configs_root, f, file_name) for f in tries
                if os.path.isfile(os.path.join(configs_root, f, file_name))), None)
    return {"folders": folders, "sglang_would_load": hit, "fallback_error": None}


# --------------------------------------------------------------------------- command

def run(args: argparse.Namespace) -> dict:
    """Probe the host; see the module docstring for ``data``."""
    warnings: list[str] = []
    gpus, torch_ver, w = probe_gpus()
    warnings += w
    tver = triton_version()
    tfolder = triton_folder(tver) if tver else None
    exact_folder = sglang_version_dir(tver) if tver else None
    if tver and tfolder != exact_folder:
        warnings.append(
            f"Triton {tver}: SGLang looks first in {exact_folder}; orch installs into {tfolder}, which SGLang "
            f"reaches only through its fallback (log line 'Fallback to triton version ...')")

    names = {g["name"] for g in gpus}
    mixed = len(names) > 1
    if mixed:
        warnings.append(f"GPUs report different names {sorted(names)}; using GPU 0")
    if args.device_name:
        device_name = checked_device_name(args.device_name)
        if gpus and gpus[0]["device_name"] and gpus[0]["device_name"] != device_name:
            warnings.append(f"--device-name {device_name} overrides GPU 0 name {gpus[0]['device_name']}")
    elif gpus:
        device_name = gpus[0]["device_name"]
        if device_name is None:
            raise PayloadError("bad_input", f"GPU 0 name {gpus[0]['name']!r} cannot be used in a file name")
    else:
        device_name = None

    sg = find_sglang(args.moe_config_dir)
    if not sg["installed"]:
        warnings.append("sglang is not installed for this interpreter")
    elif not sg["loader_module"]:
        warnings.append(f"no SGLang MoE config loader (fused_moe_triton_config.py) found under {sg['package_dir']}")
    if sg["other_layout_configs_root"]:
        warnings.append(f"configs of another SGLang layout exist at {sg['other_layout_configs_root']} "
                        "(not read by this SGLang)")
    rules = sg["loader_rules"] or RULES_0_5_23
    if sg["loader_module"] and sg["loader_rules"] is None:
        warnings.append(f"cannot read SGLang's lookup rules from {sg['loader_module']}; assuming SGLang 0.5.23's")
    if args.moe_config_dir and not rules["config_dir_env"]:
        warnings.append(f"SGLANG_MOE_CONFIG_DIR is set, but SGLang {sg['version'] or '?'} does not read it: "
                        f"it loads configs from {sg['configs_root']}")

    model = file_names = None
    model_path = None
    if args.model_config:
        if device_name is None:
            raise PayloadError("bad_input", "no CUDA GPU visible: --device-name is required to name config files")
        cap = None
        if gpus:
            major, minor = (int(x) for x in gpus[0]["capability"].split("."))
            cap = (major, minor)
        shape, model_path = shape_from_args(args, capability=cap)
        model = shape.to_dict()
        model["tuner_unsupported"] = unsupported_reason(model)
        file_names = shape.file_names(device_name, per_channel_selector="per_channel_quant" in rules["name_selectors"])

    install_dir = os.path.join(sg["configs_root"], tfolder) if (sg["configs_root"] and tfolder) else None
    existing: dict[str, Any] | None = None
    unparsable: list[str] = []
    if sg["configs_root"] and sg["configs_root_exists"]:
        try:
            unparsable = unparsable_triton_folders(sorted(os.listdir(sg["configs_root"])))
        except OSError as exc:
            warnings.append(f"cannot list {sg['configs_root']}: {exc}")
        if unparsable and rules["fallback"] == "scan":
            warnings.append(f"unparsable folder(s) {unparsable} in {sg['configs_root']} break SGLang's fallback")
    if file_names and sg["configs_root"] and tfolder:
        existing = {}
        for kind, fname in file_names.items():
            sim = simulate_lookup(sg["configs_root"], exact_folder, fname, rules)
            sim["in_installed_folder"] = tfolder in sim["folders"]
            sim["read_by_sglang"] = kind == "up" or rules["reads_down"]
            if not sim["read_by_sglang"]:  # this release never looks for _down files
                sim["sglang_would_load"] = sim["fallback_error"] = None
            existing[kind] = sim
    for msg in warnings:
        log(msg, level="warning")
    return {
        "gpus": gpus,
        "device_name": device_name,
        "mixed_gpus": mixed,
        "torch_version": torch_ver,
        "triton_version": tver,
        "triton_folder": tfolder,
        "sglang_exact_folder": exact_folder,
        "sglang": sg,
        "model": model,
        "model_config_path": model_path,
        "file_names": file_names,
        "install_dir": install_dir,
        "install_dir_exists": bool(install_dir and os.path.isdir(install_dir)),
        "existing": existing,
        "unparsable_folders": unparsable,
        "warnings": warnings,
    }
