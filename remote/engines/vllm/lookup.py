"""Where vLLM reads fused-MoE config files, what it accepts in them and what it logs (stdlib only).

Rules of vLLM 0.32.0, 0.33.0, 0.34.0 (``vllm/model_executor/layers/fused_moe/fused_moe.py``
``get_moe_configs``, ``try_get_optimal_moe_config``, ``invoke_fused_moe_triton_kernel``;
``vllm/envs.py``; ``vllm/logger.py``):

* folders, in order: ``$VLLM_TUNED_CONFIG_FOLDER/<name>`` (when the variable is set: it wins),
  then ``<package>/model_executor/layers/fused_moe/configs/<name>``; the first file that exists
  is read; no Triton-version folders, no fallback scan;
* ``VLLM_BATCH_INVARIANT=1``: no file is read at all (``get_moe_configs`` returns None first);
* the file: a JSON object; a ``"triton_version"`` key is removed, every other key goes through
  ``int(key)``; the entry of the key closest to M (``min(keys, key=abs(k - M))``) is used for
  both GEMMs (0.34.0's ``_down.json``: see :mod:`remote.engines.vllm.naming`);
* an entry is passed to the kernel launch as keyword arguments after ``SPLIT_K`` is set to 1 and
  ``BLOCK_SIZE_K`` popped (clipped to the quantization block in fp8 block mode); 0.34.0 also pops
  ``USE_TMA`` (default on for fp8 block weights on SM90/SM100); in 0.32.0/0.33.0 a ``USE_TMA`` key
  reaches the launch as an unknown keyword (Triton refuses it), so orch writes it for 0.34.0+ only;
* log lines (vLLM's logger, ``info_once``/``warning_once`` with scope ``global``: the first rank
  only): ``Using configuration from <path> for MoE layer.`` at INFO and
  ``Using default MoE config. Performance might be sub-optimal! Config file not found at <paths>``
  (paths joined with ``", "``) at WARNING; 0.34.0 logs no default line for a missing
  ``_down.json``. ``VLLM_LOGGING_LEVEL`` (default ``INFO``) must be INFO or lower for the loaded
  line; ``VLLM_CONFIGURE_LOGGING=0`` leaves vLLM's logger unconfigured (no lines at all).
  vLLM's line prefix: ``(<process> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:line] message``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ...protocol import PayloadError

#: The environment variable whose folder vLLM reads first (``vllm/envs.py``).
TUNED_FOLDER_ENV = "VLLM_TUNED_CONFIG_FOLDER"
#: The package folder of the shipped configs, relative to the ``vllm`` package.
PACKAGE_CONFIGS = "model_executor/layers/fused_moe/configs"
#: The variable that turns the file lookup off (``get_moe_configs``: batch-invariant mode).
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
#: The log level variable and its default (``vllm/envs.py``).
LOGGING_LEVEL_ENV, LOGGING_LEVEL_DEFAULT = "VLLM_LOGGING_LEVEL", "INFO"
#: ``0`` here: vLLM configures no log handler (``vllm/logger.py``), so no line is printed.
CONFIGURE_LOGGING_ENV = "VLLM_CONFIGURE_LOGGING"

LOADED_FORMAT = "Using configuration from %s for MoE layer."
DEFAULT_FORMAT = "Using default MoE config. Performance might be sub-optimal! Config file not found at %s"
LOADED_RE = re.compile(r"Using configuration from (?P<path>.+?) for MoE layer\.")
DEFAULT_RE = re.compile(r"Using default MoE config\. Performance might be sub-optimal! "
                        r"Config file not found at (?P<paths>.+?)\s*$")
_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


def search_paths(name: str, package_dir: str, tuned_folder: str | None = None) -> list[str]:
    """The paths vLLM tries for config file ``name``, in order (``get_moe_configs``).

    ``package_dir``: the installed ``vllm`` package folder; ``tuned_folder``: the unit's
    ``VLLM_TUNED_CONFIG_FOLDER`` (None when unset; an empty string is a set folder, as
    ``os.getenv`` returns it, and joins to a relative path)."""
    paths = []
    if tuned_folder is not None:
        paths.append(os.path.join(tuned_folder, name))
    paths.append(os.path.join(package_dir, PACKAGE_CONFIGS, name))
    return paths


def resolve(name: str, package_dir: str, tuned_folder: str | None = None,
            batch_invariant: bool = False) -> dict:
    """What vLLM would load for ``name`` on this disk: ``{"path": str | None, "tried": [...],
    "source": "tuned_folder" | "package" | None, "why": str}``. ``batch_invariant``: the unit
    sets ``VLLM_BATCH_INVARIANT=1`` (nothing is read)."""
    tried = search_paths(name, package_dir, tuned_folder)
    if batch_invariant:
        return {"path": None, "tried": [], "source": None,
                "why": f"{BATCH_INVARIANT_ENV}=1: vLLM uses its default config and reads no file"}
    for i, p in enumerate(tried):
        if os.path.exists(p):
            src = "tuned_folder" if tuned_folder is not None and i == 0 else "package"
            return {"path": p, "tried": tried[: i + 1], "source": src, "why": f"first existing of {len(tried)}"}
    return {"path": None, "tried": tried, "source": None, "why": "no file: vLLM's default config"}


def logs_loaded_line(level: str | None = None, configure_logging: str | None = None) -> bool:
    """Whether vLLM prints the INFO line of a loaded file with ``VLLM_LOGGING_LEVEL=level``
    (None: the default INFO) and ``VLLM_CONFIGURE_LOGGING=configure_logging`` (None: 1)."""
    if configure_logging is not None and configure_logging.strip() == "0":
        return False
    lvl = (level or LOGGING_LEVEL_DEFAULT).upper()
    return _LEVELS.get(lvl, 20) <= _LEVELS["INFO"]


def parse_line(line: str) -> dict | None:
    """``{"kind": "loaded", "path"}`` or ``{"kind": "default", "paths": [...]}`` for one of vLLM's
    two lookup lines (anything may precede the message: vLLM's prefix, systemd's), else None."""
    m = LOADED_RE.search(line)
    if m:
        return {"kind": "loaded", "path": m["path"]}
    m = DEFAULT_RE.search(line)
    if m:
        return {"kind": "default", "paths": m["paths"].split(", ")}
    return None


#: Entry fields the Triton kernel takes (constexprs and launch options); SPLIT_K is overwritten to 1
#: by ``invoke_fused_moe_triton_kernel`` but not by ``invoke_fused_moe_wna16_triton_kernel``, whose
#: ``fused_moe_kernel_gptq_awq`` requires it as a keyword (a WNA16 entry without it fails the launch).
REQUIRED_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
OPTIONAL_FIELDS = ("num_warps", "num_stages", "num_ctas", "SPLIT_K", "waves_per_eu", "matrix_instr_nonkdim",
                   "kpack")


#: Entry fields vLLM files carry beyond the shared ones (``Engine.config_extra_fields``)
EXTRA_FIELDS = ("SPLIT_K",)
#: What every entry of a weight-only group file (int4_w4a16/int8_w8a16 with ``[0, group]``) must add
WNA16_ENTRY = {"SPLIT_K": 1}


def validate(obj: Any, source: str, release: str = "0.34.0") -> dict[str, dict]:
    """Check a config as vLLM ``release`` reads it; return ``{str(M): entry}`` ascending, without
    ``triton_version``. Raises PayloadError ``bad_input`` naming ``source`` and the key/field: a
    key other than ``triton_version`` that is not a positive integer, an entry missing a field
    of :data:`REQUIRED_FIELDS`, a non-int field, or ``USE_TMA`` before 0.34.0 (Triton would refuse
    the unknown keyword)."""
    from .naming import release_at_least

    if not isinstance(obj, dict) or not obj:
        raise PayloadError("bad_input", f"{source}: a vLLM MoE config is a non-empty JSON object")
    tma_ok = release_at_least(release, "0.34.0")
    out: dict[int, dict] = {}
    for key, val in obj.items():
        if key == "triton_version":
            continue
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) > 0):
            raise PayloadError("bad_input", f"{source}: key {key!r} is not a positive batch size (vLLM does int(key))")
        if not isinstance(val, dict):
            raise PayloadError("bad_input", f"{source}: key {key!r}: value must be an object")
        for f in REQUIRED_FIELDS:
            if f not in val:
                raise PayloadError("bad_input", f"{source}: key {key!r}: missing field {f}")
        for f, v in val.items():
            if f == "USE_TMA":
                if not tma_ok:
                    raise PayloadError("bad_input", f"{source}: key {key!r}: USE_TMA is read from 0.34.0 on; vLLM "
                                                    f"{release} passes it to the kernel as an unknown keyword")
                if not isinstance(v, bool):
                    raise PayloadError("bad_input", f"{source}: key {key!r}: USE_TMA must be true/false")
            elif f in REQUIRED_FIELDS or f in OPTIONAL_FIELDS:
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise PayloadError("bad_input", f"{source}: key {key!r}: field {f} must be a non-negative int")
            else:
                raise PayloadError("bad_input", f"{source}: key {key!r}: unknown field {f!r}")
        out[int(key)] = dict(val)
    if not out:
        raise PayloadError("bad_input", f"{source}: no batch sizes")
    return {str(m): out[m] for m in sorted(out)}


def dumps(cfg: dict, triton_version: str | None = None) -> str:
    """What orch writes for vLLM: the entries ascending (validated with
    :func:`remote.engines.triton_moe.configfile.dumps_config`: the four tile fields plus
    ``num_warps``/``num_stages``), with ``"triton_version"`` first when given, as vLLM's own
    tuner (``benchmarks/kernels/benchmark_moe.py``) records it and its loader drops it."""
    from ..triton_moe.configfile import dumps_config

    body = json.loads(dumps_config(cfg, extra_fields=EXTRA_FIELDS))
    out = ({"triton_version": triton_version} if triton_version else {}) | body
    return json.dumps(out, indent=4) + "\n"


def closest_entry(cfg: dict, M: int) -> dict:
    """The entry vLLM uses at batch size ``M`` (``min(keys, key=lambda x: abs(x - M))``, the first
    key on a tie, keys in file order: as ``_get_configured_moe_config``)."""
    keys = [int(k) for k in cfg if k != "triton_version"]
    best = min(keys, key=lambda x: abs(x - M))
    return cfg[str(best)] if str(best) in cfg else cfg[best]


# --------------------------------------------------------------------------- the probe's view


def package_dirs() -> list[str]:
    """The folders of the ``vllm`` package this interpreter would import, found without importing it
    (``importlib.util.find_spec`` of a top-level package runs none of its code); [] when not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return [os.path.realpath(d) for d in (spec.submodule_search_locations or [])]


#: the loader module, relative to the package (``get_moe_configs``)
LOADER_MODULE = "model_executor/layers/fused_moe/fused_moe.py"


def find_vllm(tuned_folder: str | None) -> dict[str, Any]:
    """Where this host's vLLM is and where it reads config files, without importing it: the probe's
    ``engine`` object (``remote.probe``): ``installed``, ``version`` (the distribution's metadata),
    ``package_dir``, ``loader_module``, ``layout`` (None: vLLM has one), ``loader_rules``
    (``name_selectors``, ``reads_down``, ``config_dir_env``, ``fallback``: ``"none"``,
    ``fallback_versions``), ``configs_root`` (the folder read first: ``VLLM_TUNED_CONFIG_FOLDER``
    when the unit sets it, else the shipped ``configs/``), ``configs_root_exists``,
    ``shipped_configs_root``, ``other_layout_configs_root`` (None), ``moe_config_dir``."""
    import importlib.metadata

    from .naming import DOWN_FILE_RELEASES, release_at_least

    out: dict[str, Any] = {"installed": False, "version": None, "package_dir": None, "loader_module": None,
                           "layout": None, "loader_rules": None, "loader_rules_inferred": None,
                           "configs_root": None, "configs_root_exists": False, "shipped_configs_root": None,
                           "other_layout_configs_root": None, "moe_config_dir": tuned_folder}
    dirs = package_dirs()
    if dirs:
        out["installed"] = True
        out["package_dir"] = dirs[0]
        try:
            out["version"] = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            out["version"] = None
        loader = os.path.join(dirs[0], LOADER_MODULE)
        out["loader_module"] = loader if os.path.isfile(loader) else None
        out["shipped_configs_root"] = os.path.join(dirs[0], PACKAGE_CONFIGS)
    version = out["version"]
    try:
        reads_down = bool(version) and release_at_least(version, DOWN_FILE_RELEASES[0])
    except PayloadError:
        reads_down = False
    out["loader_rules"] = {"name_selectors": ["dtype", "block_shape"], "reads_down": reads_down,
                           "config_dir_env": TUNED_FOLDER_ENV, "fallback": "none", "fallback_versions": []}
    if not version:
        out["loader_rules_inferred"] = "vLLM's release is unknown: names as 0.32.0-0.33.0 give them (no _down file)"
    root = tuned_folder if tuned_folder else out["shipped_configs_root"]
    if root:
        out["configs_root"] = os.path.abspath(os.path.expanduser(root))
        out["configs_root_exists"] = os.path.isdir(out["configs_root"])
    return out


def config_dir_note() -> str:
    """Which vLLM releases read ``VLLM_TUNED_CONFIG_FOLDER`` (all of 0.32.0-0.34.0, and before)."""
    return f"vLLM reads {TUNED_FOLDER_ENV} before its shipped configs/ folder (get_moe_configs)"


def lookup_facts(*, config_dir: str | None, triton_version: str | None, device_name: str | None, shape: Any | None,
                 warnings: list[str]) -> dict[str, Any]:
    """What the vLLM on this host reads, for the payload's ``probe`` (``remote.probe``), in the form
    every engine answers: ``triton_folder`` and ``exact_folder`` None (vLLM keeps no folder per
    Triton release), ``engine`` (:func:`find_vllm`), ``file_names`` (``up``: the one file both GEMMs
    read; ``down``: the ``_down.json`` name, with ``existing.down.read_by_engine`` False but for
    0.34.0's fp8 block [128,128] case), ``install_dir`` (``VLLM_TUNED_CONFIG_FOLDER`` when the unit
    sets it, else the shipped ``configs/``: orch's controller points the unit at a folder of its
    own instead of writing into the package), ``existing`` (role -> ``folders``, ``would_load``,
    ``in_installed_folder``, ``read_by_engine``) and ``unparsable_folders`` ([]).
    ``triton_version`` is not read: vLLM's lookup does not depend on it."""
    from .naming import reads_down_file

    found = find_vllm(config_dir)
    if not found["installed"]:
        warnings.append("vllm is not installed for this interpreter")
    elif not found["loader_module"]:
        warnings.append(f"no vLLM fused-MoE loader ({LOADER_MODULE}) under {found['package_dir']}")
    if config_dir is not None and not config_dir.startswith("/"):
        warnings.append(f"{TUNED_FOLDER_ENV}={config_dir!r} is relative: vLLM joins it to the server's working "
                        "directory")
    file_names = None
    if shape is not None and device_name is not None:
        file_names = shape.file_names(device_name)
    install_dir = found["configs_root"]
    existing: dict[str, Any] | None = None
    if file_names:
        # every role is answered, whether vLLM is found here or not: which roles it reads is its
        # release's rule (a probe that finds no package still must not ask for a _down file)
        existing = {}
        tuned = found["configs_root"] if config_dir else None
        for role, name in file_names.items():
            tried = search_paths(name, found["package_dir"], tuned) if found["package_dir"] else (
                [os.path.join(tuned, name)] if tuned else [])
            res = resolve(name, found["package_dir"], tuned,
                          batch_invariant=os.environ.get(BATCH_INVARIANT_ENV, "").strip() == "1") \
                if found["package_dir"] else {"path": next((p for p in tried if os.path.exists(p)), None)}
            folders = [os.path.dirname(p) for p in tried if os.path.exists(p)]
            read = role == "up" or reads_down_file(found["version"] or "0", shape.dtype_selector, shape.block_shape)
            existing[role] = {"folders": folders, "would_load": res["path"] if read else None,
                              "fallback_error": None,
                              "in_installed_folder": bool(install_dir) and os.path.exists(os.path.join(install_dir, name)),
                              "read_by_engine": read}
    return {"triton_folder": None, "exact_folder": None, "engine": found, "file_names": file_names,
            "install_dir": install_dir, "install_dir_exists": bool(install_dir and os.path.isdir(install_dir)),
            "existing": existing, "unparsable_folders": []}


def root_hazards(environment: Any, working_directory: str | None, folder_exists: Any):
    """The :class:`~remote.engines.records.RootHazards` of a vLLM server: no ``entries`` (vLLM's
    lookup joins a name to each folder and never lists one, ``get_moe_configs``); ``config_dir`` when
    the server's ``VLLM_TUNED_CONFIG_FOLDER`` is set but empty or relative: vLLM joins it to its working
    directory (``working_directory``, else ``/``, systemd's default) and finds no file where orch's
    probe looked, so the tuned files are ``not-loaded`` (never a crash: a missing folder is a
    missing file)."""
    from ..records import RootHazards

    value = environment.get(TUNED_FOLDER_ENV)
    if value is None or value.startswith("/"):
        return RootHazards()
    root = os.path.normpath(os.path.join(working_directory or "/", value))
    why = (f"{TUNED_FOLDER_ENV}={value!r} is {'empty' if not value else 'relative'}: vLLM reads it from the "
           f"server's working directory ({root}), not where orch looks")
    return RootHazards(config_dir={"value": value, "configs_root": root, "why": why, "exists": folder_exists(root),
                                   "state": "not-loaded"})
