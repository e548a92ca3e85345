"""Copies of the stand-in SGLang tree, in the current or the older module layout.

``make_tree(dest, layout)`` copies ``tests/testbed/standin`` (the ``sglang`` package and its
``sglang-0.5.23.dist-info``) to ``dest``. With ``layout="old"`` the loader module and its
``configs/`` folder move from ``sglang/srt/layers/moe/moe_runner/triton_utils/`` (SGLang 0.5.23,
since PR #23019) to ``sglang/srt/layers/moe/fused_moe_triton/`` (older releases), as the
facts file describes. ``dest`` is then usable as ``PYTHONPATH``.

Command line: ``python -m tests.testbed.standin_tree [--layout old] DEST``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
CURRENT_LOADER_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils"
OLD_LOADER_DIR = "sglang/srt/layers/moe/fused_moe_triton"
LOADER_FILE = "fused_moe_triton_config.py"
LAYOUTS = {"current": CURRENT_LOADER_DIR, "old": OLD_LOADER_DIR}


def loader_dir(layout: str = "current") -> str:
    """Folder of the loader module relative to the tree root (str); KeyError for an unknown layout."""
    return LAYOUTS[layout]


def make_tree(dest: Path | str, layout: str = "current") -> Path:
    """Copy the stand-in tree to ``dest`` (created; must not exist or be empty) in ``layout``.

    Returns the absolute folder of the loader module in the copy (its ``configs/`` sits inside).
    Raises KeyError for an unknown layout, FileExistsError if ``dest`` is a non-empty folder.
    """
    if layout not in LAYOUTS:
        raise KeyError(f"unknown layout {layout!r}; choose from {sorted(LAYOUTS)}")
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for entry in STANDIN_DIR.iterdir():
        if entry.name == "__pycache__":
            continue
        target = dest / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(entry, target)
    if layout == "old":
        new = dest / CURRENT_LOADER_DIR
        old = dest / OLD_LOADER_DIR
        old.mkdir(parents=True)
        (old / "__init__.py").write_text('"""Stand-in package, older SGLang layout (orch test bed)."""\n')
        shutil.move(str(new / LOADER_FILE), str(old / LOADER_FILE))
        shutil.move(str(new / "configs"), str(old / "configs"))
        shutil.rmtree(dest / "sglang/srt/layers/moe/moe_runner")
    return dest / LAYOUTS[layout]


def main(argv: list[str] | None = None) -> int:
    """CLI: copy the tree and print the loader folder."""
    p = argparse.ArgumentParser(prog="python -m tests.testbed.standin_tree", description=__doc__.splitlines()[0])
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="current")
    p.add_argument("dest")
    args = p.parse_args(argv)
    print(make_tree(args.dest, args.layout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
