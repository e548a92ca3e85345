"""The real config-lookup module of the SGLang release in this stand-in tree, and what it did.

``standin_tree.py`` copies the release's own module (``get_config_file_name``,
``get_moe_configs``, ``try_get_optimal_moe_config``) into the tree unchanged; this module
imports it and, for the stand-in server, records which files a lookup looked for and read. It
re-implements none of SGLang's rules: the lookup, the file names and the log lines are the
release's code.

Knobs: ``$ORCH_STANDIN_TRITON_VERSION`` replaces ``triton.__version__`` as the lookup module sees
it (default: the installed Triton's); ``$ORCH_STANDIN_GPU_NAME`` is the GPU name
(``sglang.srt.utils`` stand-in).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import os
import types
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

#: The lookup module's import name, newest layout first (0.5.11+, 0.5.2 ... 0.5.10, <= 0.5.1).
LOOKUP_MODULES = (
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config",
    "sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config",
    "sglang.srt.layers.moe.fused_moe_triton.fused_moe",
)


class _TritonAs(types.ModuleType):
    """The real ``triton`` module as seen by the lookup module, with another ``__version__``."""

    def __init__(self, real: types.ModuleType, version: str):
        super().__init__(real.__name__)
        self.__dict__["_real"] = real
        self.__version__ = version

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_real"], name)


def import_lookup_module(triton_version: Optional[str] = None) -> types.ModuleType:
    """Import this tree's config-lookup module (the first of :data:`LOOKUP_MODULES` present that
    defines ``get_moe_configs``).

    ``triton_version`` (else ``$ORCH_STANDIN_TRITON_VERSION``, if set) is the version the module
    sees as ``triton.__version__``. Raises ImportError when the tree has no lookup module.
    """
    mod = None
    for name in LOOKUP_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:
            found = False
        if found:
            cand = importlib.import_module(name)
            if hasattr(cand, "get_moe_configs"):
                mod = cand
                break
    if mod is None:
        raise ImportError("no SGLang config-lookup module (fused_moe_triton_config.py) in this sglang tree")
    version = triton_version or os.environ.get("ORCH_STANDIN_TRITON_VERSION")
    if version:
        real = mod.triton._real if isinstance(mod.triton, _TritonAs) else mod.triton
        mod.triton = _TritonAs(real, version)
    return mod


class Watch:
    """Paths the lookup module checked (``os.path.exists``) and read (``open``), in order (str)."""

    def __init__(self) -> None:
        self.checked: List[str] = []
        self.read: List[str] = []

    def first(self, seen: List[str], file_name: str) -> Optional[str]:
        """The first of ``seen`` whose base name is ``file_name``, or None."""
        return next((p for p in seen if os.path.basename(p) == file_name), None)

    def outcome(self, file_name: str) -> Dict[str, Any]:
        """What the lookup did for ``file_name``: ``wanted`` (the first path it checked: the
        installed Triton's folder), ``path`` (the file it read, or None) and ``outcome``
        (``exact``: read the wanted file; ``fallback``: read another folder's; ``none``: read none)."""
        wanted = self.first(self.checked, file_name)
        path = self.first(self.read, file_name)
        outcome = "none" if path is None else ("exact" if path == wanted else "fallback")
        return {"wanted": wanted, "path": path, "outcome": outcome}


class _PathWatch(types.ModuleType):
    def __init__(self, watch: Watch, hidden: frozenset = frozenset()):
        super().__init__("os.path")
        self.__dict__["_watch"] = watch
        self.__dict__["_hidden"] = hidden

    def exists(self, path: Any) -> bool:
        path = os.fspath(path)
        self.__dict__["_watch"].checked.append(path)
        return os.path.exists(path) and os.path.realpath(path) not in self.__dict__["_hidden"]

    def __getattr__(self, name: str) -> Any:
        return getattr(os.path, name)


class _OsWatch(types.ModuleType):
    def __init__(self, watch: Watch, hidden: frozenset = frozenset()):
        super().__init__("os")
        self.__dict__["path"] = _PathWatch(watch, hidden)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@contextmanager
def watching(mod: types.ModuleType, hidden: frozenset = frozenset()) -> Iterator[Watch]:
    """Record, while the block runs, the paths ``mod`` checks with ``os.path.exists`` and reads with
    ``open`` (its module globals ``os`` and ``open`` are wrapped, then restored). ``hidden``: real
    paths the module is told do not exist (the ``unreadable`` fault of the stand-in server)."""
    watch = Watch()

    def _open(path: Any, *args: Any, **kwargs: Any):
        watch.read.append(os.fspath(path))
        return builtins.open(path, *args, **kwargs)

    saved_os = mod.os
    mod.os = _OsWatch(watch, hidden)
    mod.open = _open
    try:
        yield watch
    finally:
        mod.os = saved_os
        del mod.open
