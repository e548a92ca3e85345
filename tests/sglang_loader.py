"""Import a real SGLang release's config-lookup module in this process, as an oracle for tests.

:func:`release_loader` builds a stand-in tree for the release (``tests/testbed/standin_tree.py``:
the release's own lookup module, unchanged, plus the small stand-ins for the ``sglang.*`` names
it imports: GPU name, Triton version, the deterministic-inference flag, and, for the old
``fused_moe.py`` module, placeholders of the kernels it imports), imports it under its real
module name and captures its logger. Nothing of the rule under test is re-implemented here.

The ``sglang`` modules are isolated: every ``sglang*`` entry of ``sys.modules`` is removed on
entry and on exit (and what was there before is put back), so several releases can be loaded
one after another in one test process.

:data:`ORACLE_RELEASES` is the list of releases the oracle tests cover; ``docs/sglang-releases.md``
has a table of the same releases (a test checks that they agree).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Iterator

from tests.testbed import standin_tree

#: Releases the oracle tests run: each is the first (as far as the releases read show) with a
#: change to the lookup rules, plus the releases named in issue 11 and the newest.
ORACLE_RELEASES = (
    "0.4.10.post2",  # fused_moe_triton/fused_moe.py; fixed fallback list 3.3.1, 3.2.0, 3.1.0
    "0.5.0rc2",  # the same rules; named in issue 11 (never reads _down files)
    "0.5.2",  # lookup moves to fused_moe_triton/fused_moe_triton_config.py
    "0.5.3",  # SGLANG_MOE_CONFIG_DIR; 3.4.0 joins the fallback list
    "0.5.4",  # ,per_channel_quant=True selector
    "0.5.5",  # _down files (missing: the default line for the _down path)
    "0.5.6",  # down missing: "Using MoE kernel config with down_moe=False ..."
    "0.5.8",  # the same; named in issue 11
    "0.5.11",  # lookup moves to moe_runner/triton_utils/ (fixed list still)
    "0.5.12",  # fallback scans every configs/triton_* folder, newest first
    "0.5.16",  # down missing: "Down MoE config file not found at ...; reusing ..."
    "0.5.23",  # the newest release read
)

_ENV_KEYS = ("ORCH_STANDIN_GPU_NAME", "ORCH_STANDIN_TRITON_VERSION", "ORCH_STANDIN_DETERMINISTIC",
             "SGLANG_MOE_CONFIG_DIR")


class _Capture(logging.Handler):
    def __init__(self, records: list):
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class ReleaseLoader:
    """A release's lookup module, imported from a stand-in tree.

    ``module``: the release's module (``get_config_file_name``, ``get_moe_configs``, ...);
    ``loader_dir``: its folder in the tree (``configs/`` beside it, as in the wheel);
    ``module_path``: its path relative to the tree root; ``records``: log records of its logger.
    """

    version: str
    module: ModuleType
    tree: Path
    loader_dir: Path
    module_path: str
    records: list = field(default_factory=list)

    @property
    def configs(self) -> Path:
        """The shipped configs root of the tree (``<loader_dir>/configs``)."""
        return self.loader_dir / "configs"

    def lines(self) -> list[str]:
        """Log messages (formatted, without any prefix) since the last :meth:`reset`."""
        return [r.getMessage() for r in self.records]

    def reset(self) -> None:
        """Forget the cached lookups (a server restart) and the captured log records."""
        self.module.get_moe_configs.cache_clear()
        self.records.clear()

    def set_triton(self, version: str) -> None:
        """Make the module see ``triton.__version__ == version`` (and forget cached lookups)."""
        from sglang._standin.lookup import import_lookup_module

        import_lookup_module(version)
        self.reset()


def _purge_sglang() -> dict:
    gone = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "sglang" or k.startswith("sglang.")}
    importlib.invalidate_caches()
    return gone


@contextmanager
def release_loader(version: str, workdir: Path, gpu_name: str = "NVIDIA H200",
                   triton_version: str = "3.6.0") -> Iterator[ReleaseLoader]:
    """Import SGLang ``version``'s lookup module from a new stand-in tree under ``workdir``.

    ``gpu_name``: what ``torch.cuda.get_device_name()`` would say; ``triton_version``: what the
    module sees as ``triton.__version__``. ``SGLANG_MOE_CONFIG_DIR`` is unset inside. The
    environment, ``sys.path`` and ``sys.modules`` are restored on exit. Raises
    ``ReleaseUnavailable`` when the release cannot be fetched (a failure, never a skip).
    """
    tree = Path(workdir) / f"sglang-{version}"
    ldir = standin_tree.make_tree(tree, None, version)
    saved_env = {k: os.environ.get(k) for k in _ENV_KEYS}
    saved_modules = _purge_sglang()
    sys.path.insert(0, str(tree))
    os.environ["ORCH_STANDIN_GPU_NAME"] = gpu_name
    for k in ("ORCH_STANDIN_TRITON_VERSION", "ORCH_STANDIN_DETERMINISTIC", "SGLANG_MOE_CONFIG_DIR"):
        os.environ.pop(k, None)
    logger = None
    handler = None
    old_level = None
    try:
        from sglang._standin.lookup import import_lookup_module

        mod = import_lookup_module(triton_version)
        records: list = []
        logger = logging.getLogger(mod.__name__)
        handler = _Capture(records)
        old_level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
        yield ReleaseLoader(version=version, module=mod, tree=tree, loader_dir=ldir,
                            module_path=standin_tree.lookup_module_path(version), records=records)
    finally:
        if logger is not None:
            logger.removeHandler(handler)
            logger.setLevel(old_level)
        sys.path.remove(str(tree))
        _purge_sglang()
        sys.modules.update(saved_modules)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
