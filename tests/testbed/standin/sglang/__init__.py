"""Stand-in for the ``sglang`` package, used only by orch's test bed.

A tree built by ``tests/testbed/standin_tree.py`` holds the real config-lookup module of one
SGLang release (its file names, folder search and log lines, unchanged) beside this stand-in of
what orch needs around it: ``python -m sglang.launch_server`` and the HTTP API (``/v1/models``,
``/health``, ``/generate``, ``/v1/completions``, ...), and the few ``sglang.srt`` names the
lookup module imports. It has no model. ``sglang.version`` names the release.
"""

from sglang.version import __version__

__all__ = ["__version__"]
