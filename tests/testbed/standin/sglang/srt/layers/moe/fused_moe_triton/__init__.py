"""Stand-in for the package ``sglang.srt.layers.moe.fused_moe_triton`` (orch test bed).

Up to SGLang 0.5.10 the config-lookup module lives here (``fused_moe_triton_config.py``, or
``fused_moe.py`` up to 0.5.1; copied from the release's wheel by ``standin_tree.py``), and its
``try_get_optimal_moe_config`` imports ``get_config`` from this package: the config forced by
``override_config``, None when nothing is forced (always, in the stand-in).
"""

from typing import Any, Dict, Optional


def get_config() -> Optional[Dict[str, Any]]:
    """The forced MoE config (SGLang's ``override_config``): None, nothing is forced."""
    return None
