"""SGLang's defaults and backend rules that the controller and the payload both follow (stdlib only).

One copy of each: the ``tune`` command's default ``--batch-sizes`` and the controller's split of
batch sizes over a group (``config_source``) use :data:`DEFAULT_BATCH_SIZES`; the controller's
``plan`` and ``doctor`` decide with :data:`TRITON_BACKENDS` and :data:`NON_TRITON_QUANT` whether
a server reads Triton MoE config files at all.
"""

from __future__ import annotations

#: SGLang's default tuning batch sizes M, in tokens (``benchmark/kernels/fused_moe_triton``,
#: ``common_utils.py`` ``get_default_batch_sizes()``).
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048,
                                        3072, 4096)

#: ``--moe-runner-backend`` values whose MoE reads the Triton config files (SGLang 0.5.23: the
#: ``triton`` runner, and ``auto`` when it resolves to it); every other backend ignores them.
TRITON_BACKENDS: frozenset[str] = frozenset({"triton", "auto"})

#: ``--quantization`` values whose MoE does not run through the Triton ``fused_moe`` path on
#: NVIDIA by default (backend ``auto``): installing Triton configs changes nothing for them.
NON_TRITON_QUANT: frozenset[str] = frozenset({"mxfp4", "modelopt_fp4", "w4afp8", "modelopt_fp8"})
