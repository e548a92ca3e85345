"""Stand-in for ``sglang.srt.server_args`` (orch test bed): ``get_global_server_args()`` only,
imported by the config-lookup module of SGLang 0.5.5 ... 0.5.15 for one flag.

``enable_deterministic_inference`` (SGLang's ``--enable-deterministic-inference``) comes from
``$ORCH_STANDIN_DETERMINISTIC`` (default off); with it the real lookup logs its deterministic line
and uses the default config.
"""

from __future__ import annotations

import os
from types import SimpleNamespace


def get_global_server_args() -> SimpleNamespace:
    """The server arguments the lookup reads: ``enable_deterministic_inference`` (bool)."""
    flag = os.environ.get("ORCH_STANDIN_DETERMINISTIC", "") not in ("", "0", "false", "False")
    return SimpleNamespace(enable_deterministic_inference=flag)
