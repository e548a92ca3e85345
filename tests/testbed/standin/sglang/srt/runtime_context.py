"""Stand-in for ``sglang.srt.runtime_context`` (orch test bed): the accessors that SGLang's
config-lookup module imports from it, ``get_server_args()`` (0.5.16) and ``get_exec()`` (0.5.20,
0.5.23: ``get_exec().deterministic.enable_deterministic_inference``). Both report the one flag
the lookup reads; see ``sglang.srt.server_args``.
"""

from __future__ import annotations

from types import SimpleNamespace

from sglang.srt.server_args import get_global_server_args


def get_server_args() -> SimpleNamespace:
    """The server arguments the lookup reads (``enable_deterministic_inference``)."""
    return get_global_server_args()


def get_exec() -> SimpleNamespace:
    """The execution context the lookup reads: ``.deterministic.enable_deterministic_inference``."""
    return SimpleNamespace(deterministic=get_global_server_args())
