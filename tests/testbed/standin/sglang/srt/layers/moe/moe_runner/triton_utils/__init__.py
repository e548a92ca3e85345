"""Stand-in for the package ``sglang.srt.layers.moe.moe_runner.triton_utils`` (orch test bed).

Since SGLang 0.5.11 the config-lookup module lives here (``fused_moe_triton_config.py``, copied
from the release's wheel by ``standin_tree.py``), and its ``try_get_optimal_moe_config`` imports
``get_config`` from this package: the config forced by ``override_config``, None when nothing is
forced (always, in the stand-in).
"""

from typing import Any, Dict, Optional


def get_config() -> Optional[Dict[str, Any]]:
    """The forced MoE config (SGLang's ``override_config``): None, nothing is forced."""
    return None
