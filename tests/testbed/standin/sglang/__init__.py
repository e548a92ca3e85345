"""Stand-in for the ``sglang`` package (version 0.5.23), used only by orch's test bed.

It reproduces what orch depends on: the module layout of the fused-MoE config loader,
the config lookup and its log lines, ``python -m sglang.launch_server`` and the HTTP API
(``/v1/models``, ``/health``, ``/generate``, ``/v1/completions``, ...). It has no model.
"""

from sglang.version import __version__

__all__ = ["__version__"]
