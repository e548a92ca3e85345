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


def trial_key(server: Any) -> dict[str, Any]:
    """What, beyond the model, the GPU and the releases, changes the MoE kernels a vLLM server runs:
    ``--moe-backend``, ``--quantization``, ``--dtype``, expert parallelism and its all-to-all
    backend (``vllm/model_executor/layers/fused_moe/oracle/*.py`` read these)."""
    return {"moe_backend": server.moe_backend, "quantization": server.quantization, "dtype": server.dtype,
            "ep": server.ep, "all2all_backend": getattr(server, "all2all_backend", None)}


__all__ = ["AUTOTUNE_DIR_ENV", "AUTOTUNE_FOLDER", "autotune_root", "cache_root", "trial_key"]
