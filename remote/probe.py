"""probe: GPUs, Triton, the engine's loader and config folders, model shape and exact file names.

Flags: ``--engine`` and the model flags of ``names`` (:func:`remote.engines.add_model_flags`;
``--model-config`` optional here, ``--device-name`` overrides the CUDA name and is required when
no CUDA GPU is visible and a model is given), ``--capability`` (override of GPU 0's compute
capability, ``9.0``), ``--moe-config-dir`` (the unit's config-dir variable, ``Engine.config_dir_env``:
SGLang's ``SGLANG_MOE_CONFIG_DIR``, if set), ``--autotune-cache-root`` (the server's cache root as
the server resolves it, ``Engine.autotune_cache_root``; default: the engine's default for this
user, SGLang's ``~/.cache/sglang``).
``--work-dir`` (the tuner's work folder: refused when its mount is ``noexec``, :func:`exec_problem`).
``--server-triton-cache`` (the server's Triton cache: read, never written or used, :func:`server_triton_cache`).

Result ``data``::

    gpus: [{index, name, device_name, capability "9.0", smem_per_block_optin (bytes),
            total_memory (bytes)}]          # [] without CUDA/torch
    device_name: "NVIDIA_H200" | null       # the engine's form; --device-name wins over GPU 0
    capability: "9.0" | null                # GPU 0's; --capability wins; else torch's, else the vendor tool's
    capability_source: "flag"|"torch"|"nvidia-smi"|null
    capability_tried: [str]                 # each source asked and what it answered
    mixed_gpus: bool                        # visible GPUs report different names
    torch_version, triton_version: str | null
    triton_folder: "triton_3_6_0"           # where orch installs (remote.engines.sglang.naming.triton_folder)
    engine_name: "sglang"                   # the engine whose rules answered (--engine)
    exact_folder: "triton_3_6_0"            # the folder the engine tries first (verbatim version)
    engine: {installed, version, package_dir, loader_module, layout "current"|"old"|null,
             loader_rules: {name_selectors, reads_down, config_dir_env, fallback,
                            fallback_versions}  (remote.engines.sglang.lookup.loader_rules),
             loader_rules_inferred: str | null  # why the rules are inferred (module unreadable,
                                                # remote.engines.sglang.lookup.inferred_rules), else null
             configs_root, configs_root_exists, shipped_configs_root,
             other_layout_configs_root, moe_config_dir}
    model: MoeShape.to_dict() + {tuner_unsupported, tuner_unsupported_by, checkpoint_quant_method,
           config_dtype, model_type} | null   # the last three: Engine.model_facts
    model_config_path
    triton_kernels: bool                    # the triton_kernels package is importable (gpt-oss's runner)
    flashinfer_version: str | null          # flashinfer.__version__ (the autotune cache's folder); null: none
    autotune_cache_root: str                # where FlashInfer autotune caches were looked for
    autotune_caches: [{version, sm, key, path, files: [rank_*.json names], runs: int}]
    server_triton_cache: remote.tuning.cache.server_cache_report(...) | null   # --server-triton-cache
                                            # <root>/flashinfer/autotune/<version>/sm<XY>/<key>/ present
    file_names: {up, down} | null           # named as this release names them (loader_rules)
    install_dir: "<configs_root>/<triton_folder>" | null
    install_dir_exists: bool
    existing: {up|down: {folders: [triton_* holding the file, newest first],
                         in_installed_folder: bool, would_load: path | null,
                         fallback_error: str | null,
                         read_by_engine: bool}}   # down: false when the release reads no _down file
    unparsable_folders: [triton_* names the engine's fallback sort cannot parse]
    tuner_provider: {auto: "sglang"|"builtin",  # the kernel `tune --provider auto` times here
                     reason: str | null}       # why auto falls back to builtin
    warnings: [str]

The engine part (``engine``, ``exact_folder``, ``file_names``, ``install_dir``, ``existing``,
``unparsable_folders``) is ``Engine.lookup``: the engine is located and its loader's search
replayed WITHOUT importing it (SGLang: :mod:`remote.engines.sglang.lookup`); the tuner's answers
(``model.tuner_unsupported`` for the provider ``auto`` resolves to, ``model.tuner_unsupported_by``
per provider, ``tuner_provider``) come from :mod:`remote.tuning.support`, which imports neither
torch nor the engine. torch and triton are imported only inside the functions that query them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
from typing import Any

from .gpus import local_vendor
from .engines import add_model_flags, device_name_arg, engine_named, shape_from_args
from .protocol import RESOLVED_PROVIDERS, PayloadError, log
from .tuning.support import resolve_provider_name, unsupported_reason


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``probe`` command."""
    add_model_flags(parser, "probe")
    parser.add_argument("--capability", default=None,
                        help="override GPU 0's CUDA compute capability (MAJOR.MINOR, e.g. 9.0)")
    parser.add_argument("--moe-config-dir", default=None,
                        help="the unit's config-dir variable (Engine.config_dir_env), if set")
    parser.add_argument("--autotune-cache-root", default=None,
                        help="the server's cache root, as the server resolves it (default: the engine's default "
                             "for this user)")
    parser.add_argument("--work-dir", default=None,
                        help="the tuner's work folder (its Triton cache and temp files): must allow exec")
    parser.add_argument("--server-triton-cache", default=None,
                        help="the server's Triton cache folder (its TRITON_CACHE_DIR, else ~/.triton/cache): read only")


def mount_of(path: str, mountinfo: str) -> dict | None:
    """The mount holding ``path`` (an absolute path that exists; symlinks resolved by the caller)
    in a ``/proc/self/mountinfo`` text (proc(5): mount point in field 5, per-mount options in
    field 6, then ``-``, fstype, source, super options): the one with the longest mount point
    that is ``path`` or a parent of it, the last mounted when several share it. Returns
    ``{"target", "options": [...], "fstype", "source"}`` or None. Pure."""
    best = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 6:
            continue
        target = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        if not (path == target or path.startswith(target.rstrip("/") + "/") or target == "/"):
            continue
        rest = right.split()
        cand = {"target": target, "options": fields[5].split(","), "fstype": rest[0] if rest else "",
                "source": rest[1] if len(rest) > 1 else ""}
        if best is None or len(target) >= len(best["target"]):
            best = cand
    return best


def exec_problem(path: str) -> str | None:
    """Why Triton could not load kernels it compiles under ``path`` (pytorch #123054: a ``noexec``
    mount makes the compiled ``.so`` fail to map), or None when its mount allows exec. ``path``
    (or its nearest existing parent) is looked up in ``/proc/self/mountinfo``, which is what
    ``findmnt --target`` reads."""
    probe_at = os.path.realpath(path)
    while not os.path.exists(probe_at) and probe_at != "/":
        probe_at = os.path.dirname(probe_at)
    try:
        with open("/proc/self/mountinfo") as f:
            info = f.read()
    except OSError as exc:
        return f"cannot read /proc/self/mountinfo to check {path}: {exc}"
    m = mount_of(probe_at, info)
    if m is None or "noexec" not in m["options"]:
        return None
    return (f"{path} is on a noexec mount ({m['target']}: {m['fstype']} {m['source']}, "
            f"{','.join(m['options'])}): Triton's compiled kernels (.so) cannot be loaded from there")


# --------------------------------------------------------------------------- GPUs / versions

def probe_gpus(engine=None) -> tuple[list[dict], str | None, list[str]]:
    """Visible CUDA GPUs via torch: ``(gpus, torch_version, warnings)``; ``[]`` without CUDA. Each
    GPU's ``device_name`` is its name as ``engine`` (None: the default engine) writes it in file names."""
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
                dev = device_name_arg(engine_named(getattr(engine, "name", None)), name)
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


def flashinfer_version() -> str | None:
    """``flashinfer.__version__`` (the folder name of SGLang's autotune cache,
    ``srt/model_executor/runner/flashinfer_autotune.py`` ``flashinfer_autotune_cache_path``), else
    the installed distribution's version; None when FlashInfer is not installed."""
    if importlib.util.find_spec("flashinfer") is None:
        return None
    try:
        import flashinfer  # noqa: PLC0415 (heavy, only here)
        return str(getattr(flashinfer, "__version__", "unknown"))
    except Exception:  # noqa: BLE001 - a broken install still has its metadata
        pass
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


#: most autotune cache folders listed
MAX_AUTOTUNE_CACHES = 200


def autotune_caches(root: str, warnings: list[str], engine: str | None = None) -> list[dict]:
    """The FlashInfer autotune cache folders under the cache root ``root`` (``<version>/sm<XY>/<key>/``
    under the engine's autotune folder, ``Engine.autotune_cache_dir``; ``engine``: its name, None:
    the default): ``{version, sm, key, path, files, runs}`` (``files``: its ``rank_*.json``;
    ``runs``: files under ``runs/``, fresh results of starts that do not reuse the cache). Reads
    names only."""
    base = engine_named(engine).autotune_cache_dir(root)
    found: list[dict] = []
    if not os.path.isdir(base):
        return found
    try:
        for version in sorted(os.listdir(base)):
            for sm in sorted(os.listdir(os.path.join(base, version))):
                if not sm.startswith("sm"):
                    continue
                for key in sorted(os.listdir(os.path.join(base, version, sm))):
                    path = os.path.join(base, version, sm, key)
                    if not os.path.isdir(path):
                        continue
                    names = os.listdir(path)
                    runs = os.path.join(path, "runs")
                    found.append({"version": version, "sm": sm, "key": key, "path": path,
                                  "files": sorted(n for n in names if n.startswith("rank_") and n.endswith(".json")),
                                  "runs": len(os.listdir(runs)) if os.path.isdir(runs) else 0})
                    if len(found) >= MAX_AUTOTUNE_CACHES:
                        warnings.append(f"more than {MAX_AUTOTUNE_CACHES} FlashInfer autotune caches under {base}; "
                                        "listed the first")
                        return found
    except OSError as exc:
        warnings.append(f"cannot list {base}: {exc}")
    return found


def checked_capability(text: str | None) -> str | None:
    """``--capability`` as ``MAJOR.MINOR`` (``9.0``, ``12.0``); None when not given. Raises
    PayloadError('bad_input') for anything else."""
    if text is None:
        return None
    parts = text.strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise PayloadError("bad_input", f"--capability {text!r}: expected a compute capability MAJOR.MINOR (e.g. 9.0)")
    return f"{int(parts[0])}.{int(parts[1])}"


def server_triton_cache(path: str | None, capability: str | None) -> dict | None:
    """What the server's Triton cache folder ``path`` holds that can break its kernels silently
    (``remote.tuning.cache.server_cache_report``: a shared filesystem, kernels of another GPU
    architecture, truncated files); None without a path. Read only: the tuner never uses it."""
    if not path:
        return None
    from .tuning.cache import server_cache_report  # noqa: PLC0415

    try:
        with open("/proc/self/mountinfo") as f:
            info = f.read()
    except OSError:
        info = ""
    real = os.path.realpath(path)
    return server_cache_report(path, capability, mount_of(real, info) if os.path.exists(real) else None)


# --------------------------------------------------------------------------- command

def run(args: argparse.Namespace) -> dict:
    """Probe the host; see the module docstring for ``data``. Raises PayloadError('runtime')
    when ``--work-dir`` is on a mount that does not allow exec (:func:`exec_problem`)."""
    if args.work_dir:
        why = exec_problem(args.work_dir)
        if why:
            raise PayloadError("runtime", why + "; set orch_state_dir to a folder on a local mount that allows "
                                                "exec (findmnt -T PATH shows its options)")
    warnings: list[str] = []
    engine = engine_named(args.engine)
    gpus, torch_ver, w = probe_gpus(engine)
    warnings += w
    tver = triton_version()

    names = {g["name"] for g in gpus}
    mixed = len(names) > 1
    if mixed:
        warnings.append(f"GPUs report different names {sorted(names)}; using GPU 0")
    if args.device_name:
        device_name = device_name_arg(engine, args.device_name)
        if gpus and gpus[0]["device_name"] and gpus[0]["device_name"] != device_name:
            warnings.append(f"--device-name {device_name} overrides GPU 0 name {gpus[0]['device_name']}")
    elif gpus:
        device_name = gpus[0]["device_name"]
        if device_name is None:
            raise PayloadError("bad_input", f"GPU 0 name {gpus[0]['name']!r} cannot be used in a file name")
    else:
        device_name = None
    capability = checked_capability(args.capability) or (gpus[0]["capability"] if gpus else None)
    if args.capability and gpus and gpus[0]["capability"] != capability:
        warnings.append(f"--capability {capability} overrides GPU 0's {gpus[0]['capability']}")
    source, tried = ("flag" if args.capability else "torch" if gpus else None), []
    if args.capability:
        tried.append(f"--capability {capability} (orch_gpu_capability)")
    else:
        tried.append(f"torch: GPU 0 is {gpus[0]['capability']}" if gpus else
                     "torch in the unit's environment: no CUDA device visible (a GPU in exclusive-process mode "
                     "held by the server, a visible-devices variable that hides it, or no driver)")
    if capability is None:
        # the vendor's management tool needs no compute context (issue 32 row 18): what it says of
        # the server's GPU 0
        vendor = local_vendor()
        capability, why = vendor.capability(None, 20.0, os.environ.get(vendor.visible_devices_env))
        source = vendor.smi if capability else None
        tried.append(f"{vendor.capability_query}: {capability} ({why})" if capability else why)

    model = shape = None
    model_path = None
    if args.model_config:
        if device_name is None:
            raise PayloadError("bad_input", "no CUDA GPU visible: --device-name is required to name config files")
        cap = tuple(int(x) for x in capability.split(".")) if capability else None
        shape, model_path = shape_from_args(args, capability=cap)
        model = shape.to_dict()
        auto_provider = resolve_provider_name("auto", engine.name)[0]
        model["tuner_unsupported_by"] = {prov: unsupported_reason(model, prov) for prov in RESOLVED_PROVIDERS}
        model["tuner_unsupported"] = model["tuner_unsupported_by"][auto_provider]
        model.update(engine.model_facts(model_path))
    found = engine.lookup(config_dir=args.moe_config_dir, triton_version=tver, device_name=device_name, shape=shape,
                          warnings=warnings)
    default_root = engine.autotune_cache_root({}, None, os.path.expanduser("~"))
    cache_root = args.autotune_cache_root or default_root
    caches = autotune_caches(cache_root, warnings, engine.name)
    auto, why = resolve_provider_name("auto", engine.name)
    tuner_provider = {"auto": auto, "reason": why}
    for msg in warnings:
        log(msg, level="warning")
    return {
        "gpus": gpus,
        "device_name": device_name,
        "capability": capability,
        "capability_source": source,
        "capability_tried": tried,
        "mixed_gpus": mixed,
        "torch_version": torch_ver,
        "triton_version": tver,
        "triton_folder": found["triton_folder"],
        "engine_name": engine.name,
        "exact_folder": found["exact_folder"],
        "engine": found["engine"],
        "model": model,
        "model_config_path": model_path,
        "file_names": found["file_names"],
        "install_dir": found["install_dir"],
        "install_dir_exists": found["install_dir_exists"],
        "existing": found["existing"],
        "unparsable_folders": found["unparsable_folders"],
        "tuner_provider": tuner_provider,
        "triton_kernels": importlib.util.find_spec("triton_kernels") is not None,
        "flashinfer_version": flashinfer_version(),
        "autotune_cache_root": cache_root,
        "autotune_caches": caches,
        "server_triton_cache": server_triton_cache(args.server_triton_cache, capability),
        "warnings": warnings,
    }
