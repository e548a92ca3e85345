"""SGLang's defaults that the controller and the payload both follow (stdlib only).

One copy: the ``tune`` command's default ``--batch-sizes`` and the controller's split of batch
sizes over a group (``config_source``) use :data:`DEFAULT_BATCH_SIZES`. Whether a server reads the
Triton MoE config files at all is not a default but a rule of its MoE runner:
:func:`remote.engines.sglang.runner.moe_runner`.
"""

from __future__ import annotations

#: SGLang's default tuning batch sizes M, in tokens (``benchmark/kernels/fused_moe_triton``,
#: ``common_utils.py`` ``get_default_batch_sizes()``).
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048,
                                        3072, 4096)
