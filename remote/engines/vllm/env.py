"""The environment variables vLLM reads that orch uses, declared once (standard library only).

vLLM 0.32.0-0.34.0 ``vllm/envs.py``:

- :data:`CONFIG_DIR_ENV`: ``VLLM_TUNED_CONFIG_FOLDER``, the folder the fused-MoE loader tries
  before the package's ``configs/`` (``fused_moe.py`` ``get_moe_configs``);
- :data:`BATCH_INVARIANT_ENV`: ``VLLM_BATCH_INVARIANT`` (``1``: no config file is read);
- :data:`LOGGING_LEVEL_ENV`, :data:`CONFIGURE_LOGGING_ENV`: whether the lookup lines are printed;
- :data:`CACHE_ROOT_ENV`: ``VLLM_CACHE_ROOT`` (default ``$XDG_CACHE_HOME/vllm``, else
  ``~/.cache/vllm``); :data:`AUTOTUNE_DIR_ENV`: ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``
  (``model_executor/warmup/flashinfer_autotune_cache.py`` ``flashinfer_autotune_root``);
- :data:`USE_MODELSCOPE_ENV`: ``VLLM_USE_MODELSCOPE``.

:data:`SERVER_ENV_KEYS`: the variables of a unit's environment the server reads that orch uses
(the unit's value is compared with the running process's); :data:`PAYLOAD_ENV_KEYS`: those the
payload gets too (all but the cache variables: the payload's own imports must not write into the
server's cache).
"""

from __future__ import annotations

from ...gpus import VENDORS
from .lookup import (BATCH_INVARIANT_ENV, CONFIGURE_LOGGING_ENV, LOGGING_LEVEL_ENV,  # noqa: F401 - re-exported
                     TUNED_FOLDER_ENV)

CONFIG_DIR_ENV = TUNED_FOLDER_ENV
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
AUTOTUNE_DIR_ENV = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
USE_MODELSCOPE_ENV = "VLLM_USE_MODELSCOPE"
#: ``XDG_CACHE_HOME``: the parent of the default cache root (``envs.get_default_cache_root``)
XDG_CACHE_ENV = "XDG_CACHE_HOME"

#: variables of the unit's environment the server reads that orch uses
SERVER_ENV_KEYS: tuple[str, ...] = ("HF_HOME", "HF_HUB_CACHE", *(v.visible_devices_env for v in VENDORS),
                                    CONFIG_DIR_ENV, BATCH_INVARIANT_ENV, LOGGING_LEVEL_ENV, CONFIGURE_LOGGING_ENV,
                                    CACHE_ROOT_ENV, AUTOTUNE_DIR_ENV, XDG_CACHE_ENV, "PYTHONPATH",
                                    USE_MODELSCOPE_ENV, "MODELSCOPE_CACHE")
#: those the payload must see (module docstring)
PAYLOAD_ENV_KEYS: tuple[str, ...] = tuple(k for k in SERVER_ENV_KEYS
                                          if k not in (CACHE_ROOT_ENV, AUTOTUNE_DIR_ENV, XDG_CACHE_ENV))
