"""Stand-in for ``sglang.srt.utils`` (orch test bed): only the names that SGLang's fused-MoE
config-lookup module imports from it, in the releases orch supports (docs/sglang-releases.md).

The real config-lookup module of a release (copied from its wheel into the stand-in tree by
``tests/testbed/standin_tree.py``) runs unchanged on top of these:

- ``get_device_name()``: ``torch.cuda.get_device_name()`` in SGLang; here ``$ORCH_STANDIN_GPU_NAME``
  (default ``NVIDIA H200``), read at each call;
- ``is_hip()``, ``is_cuda()``, ``is_cpu()``, ``cpu_has_amx_support()``: all False. The lookup does not
  depend on them; False keeps the old module ``fused_moe.py`` (SGLang <= 0.5.1, which also holds the
  kernels) from importing ``sgl_kernel``/``vllm``/``aiter``, which the stand-in does not have;
- ``get_bool_env_var``, ``ceil_div``, ``next_power_of_2``, ``direct_register_custom_op``: used by
  ``fused_moe.py`` at import only; the kernels they serve never run in the stand-in.

Importing it also gives ``logging.Logger`` the ``warning_once`` method that a real SGLang process has
because it imports ``transformers`` (``transformers/utils/logging.py`` adds it: one warning per
distinct call, cached); SGLang 0.5.16+'s ``try_get_optimal_moe_config`` calls it on an up/down pair
that disagrees on BLOCK_SIZE_M.
"""

from __future__ import annotations

import functools
import logging
import os


@functools.lru_cache(None)
def _warning_once(self, *args, **kwargs):
    self.warning(*args, **kwargs)


if not hasattr(logging.Logger, "warning_once"):
    logging.Logger.warning_once = _warning_once

DEFAULT_GPU_NAME = "NVIDIA H200"


def get_device_name(device_id: int = 0) -> str:
    """The GPU name as ``torch.cuda.get_device_name()`` gives it (e.g. ``NVIDIA H200``): ``$ORCH_STANDIN_GPU_NAME``."""
    return os.environ.get("ORCH_STANDIN_GPU_NAME", DEFAULT_GPU_NAME)


def is_hip() -> bool:
    """False: the stand-in GPU is not a ROCm device."""
    return False


def is_cuda() -> bool:
    """False: the stand-in has no CUDA kernels (``sgl_kernel``); the config lookup does not use it."""
    return False


def is_cpu() -> bool:
    """False (SGLang's CPU backend is not simulated)."""
    return False


def cpu_has_amx_support() -> bool:
    """False (SGLang's CPU backend is not simulated)."""
    return False


def get_bool_env_var(name: str, default: str = "false") -> bool:
    """True when ``$name`` (or ``default``) is ``true`` or ``1``, case-insensitive."""
    return os.getenv(name, default).strip().lower() in ("true", "1")


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n`` <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def direct_register_custom_op(*args, **kwargs) -> None:
    """No-op: the stand-in registers no torch custom ops (its kernels never run)."""
    return None
