"""Stand-in of SGLang 0.5.23's fused-MoE Triton config loader (orch test bed).

This file sits where SGLang 0.5.23 keeps its loader
(``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``, since
sglang PR #23019; the test bed's old-layout tree moves it to
``sglang/srt/layers/moe/fused_moe_triton/``), and its ``configs/triton_<X>_<Y>_<Z>/``
folder sits beside it, as in the wheel. The rules follow that module of the SGLang 0.5.23 wheel
(``tests/sglang_releases.py`` fetches it for the tests that compare the two):

- file name: ``get_config_file_name`` (SGLang 0.5.23);
- base folder: ``$SGLANG_MOE_CONFIG_DIR`` if set, else this module's folder;
- lookup order: the installed Triton's folder, then every ``configs/triton_*`` folder newest
  version first (a folder name that is not ``triton_<int>_<int>_<int>`` raises ValueError
  there, as in SGLang), then the default heuristic (``None`` is returned);
- a missing ``_down`` file reuses the up config (with the 0.5.23 warning);
- JSON: only integer keys (``int(k)`` raises ValueError otherwise); each entry must have the
  four tile fields (KeyError otherwise, where SGLang fails at kernel launch);
- the exact 0.5.23 log lines.

The GPU name comes from ``$ORCH_STANDIN_GPU_NAME`` (default ``NVIDIA H200``) instead of
``torch.cuda.get_device_name()``; the Triton version from ``$ORCH_STANDIN_TRITON_VERSION``
or else the installed ``triton.__version__``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any, Dict, List, Optional

logger = logging.getLogger(__name__)

DEFAULT_GPU_NAME = "NVIDIA H200"
REQUIRED_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
DEFAULT_CONFIG_HINT_URL = "https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton"

# Every lookup made in this process: dicts with keys "down_moe", "outcome"
# ("exact" | "fallback" | "reuse_up" | "default"), "path" (the file used or None) and
# "wanted" (the exact path in the installed Triton's folder). Read by the stand-in server.
LOOKUPS: List[Dict[str, Any]] = []


def get_device_name() -> str:
    """GPU name as ``torch.cuda.get_device_name()`` would give it (str, e.g. ``NVIDIA H200``).

    Stand-in: taken from ``$ORCH_STANDIN_GPU_NAME``, default ``NVIDIA H200``.
    """
    return os.environ.get("ORCH_STANDIN_GPU_NAME", DEFAULT_GPU_NAME)


def get_triton_version() -> str:
    """The Triton version string (e.g. ``3.6.0``): ``$ORCH_STANDIN_TRITON_VERSION`` or ``triton.__version__``."""
    env = os.environ.get("ORCH_STANDIN_TRITON_VERSION")
    if env:
        return env
    import triton  # the host's real Triton, like SGLang

    return triton.__version__


def get_config_file_name(
    E: int,
    N: int,
    dtype: Optional[str],
    block_shape: Optional[List[int]] = None,
    per_channel_quant: bool = False,
    down_moe: bool = False,
) -> str:
    """Config file name, SGLang 0.5.23 ``get_config_file_name``.

    ``E`` experts on this rank (int), ``N`` per-rank intermediate size (int), ``dtype`` the
    selector string (``fp8_w8a8``, ``int8_w8a8``, ``int4_w4a16``, ``int8_w8a16``, ``float32``)
    or None for bf16/fp16, ``block_shape`` ``[block_n, block_k]`` (omitted when any is 0).
    Example: ``E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json``.
    """
    device = get_device_name().replace(" ", "_")
    parts = [f"E={E}", f"N={N}", f"device_name={device}"]
    name = ",".join(parts)
    if dtype:
        name += f",dtype={dtype}"
    if block_shape and all(block_shape):
        name += f",block_shape={list(block_shape)}"
    if per_channel_quant:
        name += ",per_channel_quant=True"
    if down_moe:
        name += "_down"
    return name + ".json"


def config_base_dir() -> str:
    """Folder that holds ``configs/``: ``$SGLANG_MOE_CONFIG_DIR`` or this module's real folder."""
    return os.environ.get("SGLANG_MOE_CONFIG_DIR", os.path.dirname(os.path.realpath(__file__)))


def _read_config_file(path: str) -> Dict[int, Dict[str, Any]]:
    """Parse one config file: ``{int(M): config}``. Raises ValueError/KeyError/JSONDecodeError."""
    with open(path) as f:
        raw = json.load(f)
    configs = {int(key): value for key, value in raw.items()}
    for m, cfg in configs.items():
        for field in REQUIRED_FIELDS:
            if field not in cfg:
                raise KeyError(f"{field} missing for M={m} in {path}")
    return configs


def _version_key(version: str) -> tuple:
    return tuple(int(part) for part in version.split("."))


@functools.lru_cache(maxsize=None)
def get_moe_configs(
    E: int,
    N: int,
    dtype: Optional[str],
    block_n: int = 0,
    block_k: int = 0,
    per_channel_quant: bool = False,
    down_moe: bool = False,
) -> Optional[Dict[int, Any]]:
    """Tuned configs ``{M: config}`` for one GEMM, or None (use the default heuristic).

    Lookup order and log lines of SGLang 0.5.23 ``get_moe_configs`` (see module docstring).
    Results are cached per process (a restart is needed to see new files).
    Raises ValueError (non-integer key, or an unparsable ``triton_*`` folder name during the
    fallback), KeyError (missing field), json.JSONDecodeError (not JSON), FileNotFoundError
    (``configs/`` missing under the base folder during the fallback).
    """
    json_file_name = get_config_file_name(E, N, dtype, [block_n, block_k], per_channel_quant, down_moe=down_moe)
    base = config_base_dir()
    triton_version = get_triton_version()
    config_file_path = os.path.join(base, "configs", f"triton_{triton_version.replace('.', '_')}", json_file_name)
    if os.path.exists(config_file_path):
        logger.info(f"Using MoE kernel config from {config_file_path}.")
        configs = _read_config_file(config_file_path)
        LOOKUPS.append({"down_moe": down_moe, "outcome": "exact", "path": config_file_path, "wanted": config_file_path})
        return configs

    configs_root = os.path.join(base, "configs")
    versions = [d[len("triton_"):].replace("_", ".") for d in os.listdir(configs_root) if d.startswith("triton_")]
    for version in sorted(versions, key=_version_key, reverse=True):
        if version == triton_version:
            continue
        candidate = os.path.join(configs_root, f"triton_{version.replace('.', '_')}", json_file_name)
        if os.path.exists(candidate):
            logger.warning(
                f"Config file not found at {config_file_path}. Fallback to triton version {version} "
                f"and use MoE kernel config from {candidate}. Performance might be sub-optimal!"
            )
            configs = _read_config_file(candidate)
            LOOKUPS.append({"down_moe": down_moe, "outcome": "fallback", "path": candidate, "wanted": config_file_path})
            return configs

    if down_moe:
        up = get_moe_configs(E, N, dtype, block_n, block_k, per_channel_quant, False)
        if up is not None:
            logger.warning(
                "Down MoE config file not found at %s; reusing the tuned up-projection config without TMA. "
                "Performance might be sub-optimal.",
                config_file_path,
            )
            LOOKUPS.append({"down_moe": True, "outcome": "reuse_up", "path": None, "wanted": config_file_path})
            return up
    logger.warning(
        "Using default MoE kernel config. Performance might be sub-optimal! Config file not found at %s, "
        "you can create them with " + DEFAULT_CONFIG_HINT_URL,
        config_file_path,
    )
    LOOKUPS.append({"down_moe": down_moe, "outcome": "default", "path": None, "wanted": config_file_path})
    return None


def get_default_config(M: int, E: int, dtype: Optional[str], block_shape: Optional[List[int]] = None) -> Dict[str, int]:
    """Default tile config when no file is found (facts: bf16 64/64/32 G8, or 16/32/64 G1 when M <= E)."""
    if dtype == "fp8_w8a8":
        if block_shape:
            return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block_shape[0], "BLOCK_SIZE_K": block_shape[1],
                    "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}
        if M <= E:
            return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                    "num_warps": 4, "num_stages": 4}
        return {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                "num_warps": 8, "num_stages": 4}
    if M <= E:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
