"""vLLM's cache root and its FlashInfer autotune folder as host state (standard library only).

vLLM 0.32.0-0.34.0: ``VLLM_CACHE_ROOT`` is ``os.path.expanduser($VLLM_CACHE_ROOT)``, else
``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm`` (``vllm/envs.py``, ``get_default_cache_root``);
FlashInfer's autotune results live under ``<root>/flashinfer_autotune_cache/`` unless
``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` names another folder
(``model_executor/warmup/flashinfer_autotune_cache.py`` ``flashinfer_autotune_root``).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Mapping

from .env import AUTOTUNE_DIR_ENV, CACHE_ROOT_ENV, XDG_CACHE_ENV

#: the folder under the cache root that holds FlashInfer's autotune cache
AUTOTUNE_FOLDER = "flashinfer_autotune_cache"


def _expand(path: str, home: str | None) -> str | None:
    if path == "~" or path.startswith("~/"):
        return None if home is None else posixpath.join(home, path[2:]) if path != "~" else home
    return path


def cache_root(environment: Mapping[str, str], workdir: str | None, home: str | None) -> str | None:
    """``VLLM_CACHE_ROOT`` as the server resolves it (module docstring): ``environment`` the
    server's, ``workdir`` its working directory (a relative value is joined to it; None: left as
    written), ``home`` its user's home. None when the answer needs ``home`` and it is None."""
    value = environment.get(CACHE_ROOT_ENV)
    if value:
        root = _expand(value, home)
    else:
        xdg = environment.get(XDG_CACHE_ENV)
        root = posixpath.join(xdg, "vllm") if xdg else (posixpath.join(home, ".cache", "vllm") if home else None)
    if root is None:
        return None
    if not root.startswith("/") and workdir:
        root = posixpath.join(workdir, root)
    return posixpath.normpath(root) if root.startswith("/") else root


def autotune_root(root: str) -> str:
    """``<root>/flashinfer_autotune_cache``: FlashInfer's autotune folder under the cache root
    (without ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``)."""
    return os.path.join(root, AUTOTUNE_FOLDER)


def autotune_dir(environment: Mapping[str, str], root: str | None, workdir: str | None,
                 home: str | None) -> str | None:
    """The folder that holds vLLM's own FlashInfer autotune files, as the server resolves it (vLLM
    0.33.0/0.34.0 ``flashinfer_autotune_cache.py`` ``flashinfer_autotune_root``, 0.32.0 the same code
    inline in ``resolve_flashinfer_autotune_file``): ``Path($VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR)
    .expanduser()`` when the variable is set and not empty (``~`` the server user's ``home``, a
    relative value the server's ``workdir``), else ``<root>/flashinfer_autotune_cache`` (``root``:
    :func:`cache_root`). Under it vLLM writes ``<FlashInfer workspace's parent name>/<its name>/
    <config hash>/autotune_configs[_dp<d>_rank<r>].json`` (the hash: ``compile_factors``/``compute_hash``
    of the whole vLLM config, which orch does not compute). None when the answer needs ``home`` or
    ``root`` and it is None.

    Not covered: from 0.33.0 a single-node, single-rank server without pipeline parallelism whose
    FlashInfer has the managed autotune store (``use_flashinfer_autotune_v2``) writes into
    FlashInfer's own store instead, under the override variable when set, else FlashInfer's default
    root (``resolve_flashinfer_autotune_v2_root`` returns None), which vLLM's code does not name."""
    value = environment.get(AUTOTUNE_DIR_ENV)
    if not value:
        return None if root is None else autotune_root(root)
    path = _expand(value, home)
    if path is None:
        return None
    if not path.startswith("/") and workdir:
        path = posixpath.join(workdir, path)
    return posixpath.normpath(path) if path.startswith("/") else path


def trial_key(server: Any) -> dict[str, Any]:
    """What, beyond the model, the GPU and the releases, changes the MoE kernels a vLLM server runs:
    ``--moe-backend``, ``--quantization``, ``--dtype``, expert parallelism and its all-to-all
    backend (``vllm/model_executor/layers/fused_moe/oracle/*.py`` read these)."""
    return {"moe_backend": server.moe_backend, "quantization": server.quantization, "dtype": server.dtype,
            "ep": server.ep, "all2all_backend": getattr(server, "all2all_backend", None)}


__all__ = ["AUTOTUNE_DIR_ENV", "AUTOTUNE_FOLDER", "autotune_dir", "autotune_root", "cache_root", "trial_key"]
