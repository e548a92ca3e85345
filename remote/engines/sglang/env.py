"""The environment variables SGLang reads that orch uses, declared once (standard library only).

- :data:`CONFIG_DIR_ENV`: ``SGLANG_MOE_CONFIG_DIR``, the folder SGLang's fused-MoE loader reads
  ``configs/triton_*/`` under instead of its package tree (``get_moe_configs`` in the loader
  module of :data:`remote.engines.sglang.lookup.RELEASE_RULES`; read by the releases whose rules
  say ``config_dir_env``, 0.5.3 and newer: :func:`remote.engines.sglang.lookup.config_dir_since`);
- :data:`CACHE_DIR_ENV`: ``SGLANG_CACHE_DIR``, the root of SGLang's caches (SGLang 0.5.23
  ``srt/environ.py``; FlashInfer's autotune cache lives under it:
  :func:`remote.engines.sglang.autotune.cache_root`);
- :data:`AUTOTUNE_CACHE_ENV`: ``SGLANG_FLASHINFER_AUTOTUNE_CACHE`` (reuse of that cache);
- :data:`USE_MODELSCOPE_ENV`: ``SGLANG_USE_MODELSCOPE`` (models from ModelScope's cache,
  :mod:`remote.engines.sglang.model_config`).

:data:`SERVER_ENV_KEYS` are the variables of a unit's environment that the server reads and orch
uses (the unit's value is compared with the running process's); :data:`PAYLOAD_ENV_KEYS` those
the payload gets too, which are all of them but :data:`CACHE_DIR_ENV`: the payload gets the cache
root as an argument (``probe --autotune-cache-root``, resolved as the server resolves it), and its
own imports of SGLang (the ``sglang`` tuner provider) must not write into the server's cache.
``tests/unit/remote/engines/sglang/test_env_oracle.py`` holds the names against the wheels.
"""

from __future__ import annotations

from ...gpus import VENDORS

CONFIG_DIR_ENV = "SGLANG_MOE_CONFIG_DIR"
CACHE_DIR_ENV = "SGLANG_CACHE_DIR"
AUTOTUNE_CACHE_ENV = "SGLANG_FLASHINFER_AUTOTUNE_CACHE"
USE_MODELSCOPE_ENV = "SGLANG_USE_MODELSCOPE"

#: variables of the unit's environment the server reads that orch uses: the model's config (Hugging
#: Face or ModelScope cache), the visible GPUs (each GPU vendor's variable, :mod:`remote.gpus`), the
#: config folder, the cache root, the Python path
SERVER_ENV_KEYS: tuple[str, ...] = ("HF_HOME", "HF_HUB_CACHE", *(v.visible_devices_env for v in VENDORS),
                                    CONFIG_DIR_ENV, CACHE_DIR_ENV, "PYTHONPATH", USE_MODELSCOPE_ENV,
                                    "MODELSCOPE_CACHE")
#: those the payload must see (module docstring: all but :data:`CACHE_DIR_ENV`)
PAYLOAD_ENV_KEYS: tuple[str, ...] = tuple(k for k in SERVER_ENV_KEYS if k != CACHE_DIR_ENV)
