"""Where SGLang's fused-MoE config loader looks, read from disk without importing sglang.

:func:`find_sglang` locates the loader module and the ``configs/`` folder it reads (or the
unit's ``SGLANG_MOE_CONFIG_DIR``); :func:`loader_rules` reads how that release names and looks
up files from the module's own source; :func:`simulate_lookup` replays the loader's search for
one file name under those rules (SGLang 0.5.23: exact ``configs/<triton folder>/<file>`` first,
else every ``triton_*`` folder newest first; older releases: a fixed list of versions).

SGLang is located WITHOUT importing it (its ``__init__`` is heavy and may touch the GPU):
``importlib.util.find_spec("sglang")`` only finds a top-level package's spec, it does
not execute it; the version comes from ``importlib.metadata``. The loader module is the one
that defines ``get_moe_configs``: ``moe_runner/triton_utils/fused_moe_triton_config.py`` (SGLang
0.5.11+), ``fused_moe_triton/fused_moe_triton_config.py`` (0.5.2 ... 0.5.10) or
``fused_moe_triton/fused_moe.py`` (0.5.1 and older); SGLang resolves
``os.path.realpath(__file__)``, so do we. docs/sglang-releases.md lists what each release does.

When the loader module's source cannot be read as a release's (a patched or vendored SGLang),
:func:`inferred_rules` takes what the tree itself shows: which loader module it has and its
version (``importlib.metadata``), mapped to the rules of the nearest covered release at or below
that version with that module (:data:`RELEASE_RULES`, the table of docs/sglang-releases.md; the
oracle tests check each row against the release's own loader), and says so (``loader_rules_inferred``).
Standard library only.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from .env import CONFIG_DIR_ENV
from .naming import sglang_version_dir, sort_triton_folders, triton_folder, unparsable_triton_folders

#: Loader module locations inside the ``sglang`` package, newest first: (layout, path parts).
#: ``fused_moe.py`` (SGLang <= 0.5.1) counts only when it defines ``get_moe_configs`` (later
#: releases keep a kernels-only module of that name).
LOADER_LAYOUTS = (
    ("current", ("srt", "layers", "moe", "moe_runner", "triton_utils", "fused_moe_triton_config.py")),
    ("old", ("srt", "layers", "moe", "fused_moe_triton", "fused_moe_triton_config.py")),
    ("old", ("srt", "layers", "moe", "fused_moe_triton", "fused_moe.py")),
)


def _rules(selectors: str, reads_down: bool, env: bool, fallback: str) -> dict[str, Any]:
    """One row of :data:`RELEASE_RULES` as :func:`loader_rules` returns it (``fallback``: ``scan``
    or the fixed versions, space separated)."""
    return {"name_selectors": selectors.split(), "reads_down": reads_down, "config_dir_env": env,
            "fallback": "scan" if fallback == "scan" else "list",
            "fallback_versions": None if fallback == "scan" else fallback.split()}


_FUSED_MOE = "fused_moe_triton/fused_moe.py"
_OLD_CONFIG = "fused_moe_triton/fused_moe_triton_config.py"
_CURRENT_CONFIG = "moe_runner/triton_utils/fused_moe_triton_config.py"
_OLD_LIST, _LIST = "3.3.1 3.2.0 3.1.0", "3.4.0 3.3.1 3.2.0 3.1.0"
#: Every covered release (tests/sglang_loader.py ``ORACLE_RELEASES``), oldest first: its loader
#: module (under ``sglang/srt/layers/moe/``) and its rules, as :func:`loader_rules` reads them from
#: that module (docs/sglang-releases.md "Supported releases"; checked by the oracle tests).
RELEASE_RULES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("0.4.10.post2", _FUSED_MOE, _rules("dtype block_shape", False, False, _OLD_LIST)),
    ("0.5.0rc2", _FUSED_MOE, _rules("dtype block_shape", False, False, _OLD_LIST)),
    ("0.5.2", _OLD_CONFIG, _rules("dtype block_shape", False, False, _OLD_LIST)),
    ("0.5.3", _OLD_CONFIG, _rules("dtype block_shape", False, True, _LIST)),
    ("0.5.4", _OLD_CONFIG, _rules("dtype block_shape per_channel_quant", False, True, _LIST)),
    ("0.5.5", _OLD_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, _LIST)),
    ("0.5.6", _OLD_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, _LIST)),
    ("0.5.8", _OLD_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, _LIST)),
    ("0.5.11", _CURRENT_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, _LIST)),
    ("0.5.12", _CURRENT_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, "scan")),
    ("0.5.16", _CURRENT_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, "scan")),
    ("0.5.23", _CURRENT_CONFIG, _rules("dtype block_shape per_channel_quant down", True, True, "scan")),
)


def version_key(version: str) -> tuple:
    """A sort key for an SGLang version string (``0.5.23``, ``0.5.0rc2``, ``0.4.10.post2``,
    ``0.5.9.dev0+g1a2b``): the numbers of its release, then pre-releases (``rc``, ``a``, ``b``,
    ``dev``) before the release and ``post`` after it. ValueError when it starts with no number."""
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", version.strip())
    if not m:
        raise ValueError(f"not a version: {version!r}")
    rest = m.group(2).lower()
    rank = 1 if rest.startswith((".post", "post", "-post")) else -1 if re.match(r"[.-]?(rc|a|b|dev)", rest) else 0
    return tuple(int(x) for x in m.group(1).split(".")), rank


def inferred_rules(module: str | None, version: str | None) -> tuple[dict[str, Any], str]:
    """The rules of the covered release nearest at or below ``version`` among those whose loader
    module is ``module`` (relative to ``sglang/srt/layers/moe/``; None: any), and the reason as one
    sentence. Without a usable version, the oldest such release (the fewest files read); a version
    older than them all also gives the oldest. Never raises."""
    rows = [r for r in RELEASE_RULES if module is None or r[1] == module] or list(RELEASE_RULES)
    try:
        key = version_key(version) if version else None
    except ValueError:
        key = None
    below = [r for r in rows if key is not None and version_key(r[0]) <= key]
    release, _module, rules = below[-1] if below else rows[0]
    shows = " and ".join(x for x in (f"its loader {module}" if module else None,
                                     f"version {version}" if version else None) if x) or "nothing"
    return dict(rules), (f"using the rules of SGLang {release}, the nearest covered release at or below what the "
                         f"tree shows ({shows})")


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

    Raises nothing; the oracle tests (tests/unit/remote/engines/sglang/test_oracle.py) check this against the real
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
        if isinstance(node, ast.Constant) and node.value == CONFIG_DIR_ENV:
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
    ``config_dir_env``); older releases ignore it. ``loader_rules``: the rules read from the loader
    module (:func:`loader_rules`), else those :func:`inferred_rules` gives, with the reason in
    ``loader_rules_inferred`` (None when read). Returns the ``sglang`` object described in the
    probe's docstring (``remote.probe``).
    """
    out: dict[str, Any] = {
        "installed": False, "version": None, "package_dir": None, "loader_module": None,
        "layout": None, "loader_rules": None, "loader_rules_inferred": None, "configs_root": None,
        "configs_root_exists": False, "shipped_configs_root": None, "other_layout_configs_root": None,
        "moe_config_dir": moe_config_dir,
    }
    pkg_dirs = sglang_package_dirs()
    module_key = None
    if pkg_dirs:
        out["installed"] = True
        out["package_dir"] = pkg_dirs[0]
        try:
            out["version"] = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            out["version"] = None
        found: list[tuple[str, str, tuple[str, ...]]] = []
        for layout, parts in LOADER_LAYOUTS:
            for d in pkg_dirs:
                cand = Path(d).joinpath(*parts)
                if cand.is_file() and (parts[-1] != "fused_moe.py" or _defines_get_moe_configs(cand)):
                    found.append((layout, os.path.realpath(cand), parts))
                    break
        # the module that defines get_moe_configs; else the first config module on disk
        pick = next((f for f in found if _defines_get_moe_configs(Path(f[1]))), found[0] if found else None)
        if pick:
            out["layout"], out["loader_module"], parts = pick
            module_key = "/".join(parts[3:])
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
    if out["loader_rules"] is None and pkg_dirs:
        out["loader_rules"], out["loader_rules_inferred"] = inferred_rules(module_key, out["version"])
    elif out["loader_rules"] is None:  # nothing to read the rules from: files named as the newest release does
        out["loader_rules"] = dict(RELEASE_RULES[-1][2])
        out["loader_rules_inferred"] = f"SGLang is not installed: names as SGLang {RELEASE_RULES[-1][0]} gives them"
    if moe_config_dir and out["loader_rules"]["config_dir_env"]:
        out["configs_root"] = os.path.join(os.path.abspath(os.path.expanduser(moe_config_dir)), "configs")
    else:
        out["configs_root"] = out["shipped_configs_root"]
    if out["configs_root"]:
        out["configs_root_exists"] = os.path.isdir(out["configs_root"])
    return out


def simulate_lookup(configs_root: str, exact_folder: str, file_name: str, rules: dict[str, Any]) -> dict[str, Any]:
    """What SGLang's ``get_moe_configs`` would do for ``file_name`` under ``configs_root``.

    ``exact_folder``: ``sglang_version_dir(triton.__version__)``; ``rules``: the release's
    :func:`loader_rules` (or :func:`inferred_rules`). First ``<root>/<exact_folder>/<file>``; else
    the fallback: with ``fallback == "scan"`` every ``triton_*`` entry, newest version first,
    each tried as ``triton_`` + its version with ``.`` made ``_`` (as SGLang rebuilds the name);
    an unparsable entry makes the real loader raise ValueError, a missing root
    FileNotFoundError (both reported in ``fallback_error``). With ``fallback == "list"`` only
    the release's fixed versions, in its order (no listing, so no such errors).

    Returns ``{folders, would_load, fallback_error}``; ``folders`` lists every parsable
    ``triton_*`` folder holding the file, newest first (whether SGLang tries it or not).
    """
    try:
        entries = os.listdir(configs_root)  # SGLang sorts this order stably: ties keep it
    except FileNotFoundError:
        entries = None
    except OSError as exc:
        return {"folders": [], "would_load": None, "fallback_error": f"cannot list {configs_root}: {exc}"}
    tri = [e for e in entries or [] if e.startswith("triton_")]
    folders = [f for f in sort_triton_folders(tri) if os.path.isfile(os.path.join(configs_root, f, file_name))]
    exact = os.path.join(configs_root, exact_folder, file_name)
    if os.path.isfile(exact):
        return {"folders": folders, "would_load": exact, "fallback_error": None}
    if rules["fallback"] == "list":
        tries = ["triton_" + v.replace(".", "_") for v in rules["fallback_versions"] or []]
    elif entries is None:
        return {"folders": [], "would_load": None,
                "fallback_error": f"{configs_root} does not exist: SGLang's fallback scan raises FileNotFoundError"}
    else:
        bad = unparsable_triton_folders(tri)
        if bad:
            return {"folders": folders, "would_load": None,
                    "fallback_error": f"unparsable folder(s) {bad}: SGLang's fallback sort raises ValueError"}
        tries = ["triton_" + f[len("triton_"):].replace(".", "_") for f in sort_triton_folders(tri)]
    hit = next((os.path.join(configs_root, f, file_name) for f in tries
                if os.path.isfile(os.path.join(configs_root, f, file_name))), None)
    return {"folders": folders, "would_load": hit, "fallback_error": None}


def config_dir_since() -> str:
    """The oldest covered release whose loader reads ``SGLANG_MOE_CONFIG_DIR`` (its
    :data:`RELEASE_RULES` row says ``config_dir_env``)."""
    return next(release for release, _module, rules in RELEASE_RULES if rules["config_dir_env"])


def config_dir_note() -> str:
    """``SGLang 0.5.3+ reads SGLANG_MOE_CONFIG_DIR``: for a message that asks to set it."""
    return f"SGLang {config_dir_since()}+ reads {CONFIG_DIR_ENV}"


def lookup_facts(*, config_dir: str | None, triton_version: str | None, device_name: str | None, shape: Any | None,
                 warnings: list[str]) -> dict[str, Any]:
    """What the SGLang on this host reads, for the payload's ``probe`` (``remote.probe``).

    ``config_dir``: the unit's ``SGLANG_MOE_CONFIG_DIR``; ``triton_version``: the host's
    ``triton.__version__`` (None: no Triton); ``device_name``: SGLang's form of the GPU's name;
    ``shape``: the model's :class:`~remote.engines.sglang.shape.MoeShape` (None: no model).
    Returns ``triton_folder`` (where orch installs, :func:`remote.engines.sglang.naming.triton_folder`),
    ``exact_folder`` (the folder SGLang tries first), ``engine`` (:func:`find_sglang`), ``file_names``
    (named as this release names them), ``install_dir`` and ``install_dir_exists``, ``existing``
    (role -> :func:`simulate_lookup` with ``in_installed_folder`` and ``read_by_engine``: False for
    a ``_down`` file of a release that reads none) and ``unparsable_folders``; appends to
    ``warnings`` what the operator should read."""
    tfolder = triton_folder(triton_version) if triton_version else None
    exact_folder = sglang_version_dir(triton_version) if triton_version else None
    if triton_version and tfolder != exact_folder:
        warnings.append(
            f"Triton {triton_version}: SGLang looks first in {exact_folder}; orch installs into {tfolder}, which SGLang "
            f"reaches only through its fallback (log line 'Fallback to triton version ...')")
    sg = find_sglang(config_dir)
    if not sg["installed"]:
        warnings.append("sglang is not installed for this interpreter")
    elif not sg["loader_module"]:
        warnings.append(f"no SGLang MoE config loader (fused_moe_triton_config.py) found under {sg['package_dir']}")
    if sg["other_layout_configs_root"]:
        warnings.append(f"configs of another SGLang layout exist at {sg['other_layout_configs_root']} "
                        "(not read by this SGLang)")
    rules = sg["loader_rules"]
    if sg["loader_rules_inferred"] and sg["installed"]:
        warnings.append(f"cannot read SGLang's lookup rules from {sg['loader_module'] or 'any loader module'}; "
                        f"{sg['loader_rules_inferred']}: orch proves only the lookups the server's log shows")
    if config_dir and not rules["config_dir_env"]:
        warnings.append(f"{CONFIG_DIR_ENV} is set, but SGLang {sg['version'] or '?'} does not read it: "
                        f"it loads configs from {sg['configs_root']}")
    file_names = None
    if shape is not None and device_name is not None:
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
            sim["read_by_engine"] = kind == "up" or rules["reads_down"]
            if not sim["read_by_engine"]:  # this release never looks for _down files
                sim["would_load"] = sim["fallback_error"] = None
            existing[kind] = sim
    return {"triton_folder": tfolder, "exact_folder": exact_folder, "engine": sg, "file_names": file_names,
            "install_dir": install_dir, "install_dir_exists": bool(install_dir and os.path.isdir(install_dir)),
            "existing": existing, "unparsable_folders": unparsable}
