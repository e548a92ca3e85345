"""Stand-in SGLang trees that run a real release's config-lookup module.

``make_tree(dest, layout, release)`` copies ``tests/testbed/standin`` (the stand-in ``sglang``
package: server, model shape, and the small stand-ins for what the lookup module imports) to
``dest`` and adds the real config-lookup module of SGLang ``release``, unchanged, from the
release's wheel (``tests/sglang_releases.py`` fetches and caches it): the module that defines
``get_config_file_name`` / ``get_moe_configs``, at its own path in the release
(``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py`` since 0.5.11,
``sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py`` in 0.5.2 ... 0.5.10,
``sglang/srt/layers/moe/fused_moe_triton/fused_moe.py`` up to 0.5.1). The stand-in's example
``configs/triton_3_1_0/`` folder sits beside it, as the wheel's configs do; ``sglang.__version__``
and the ``sglang-<release>.dist-info`` metadata name the release. ``dest`` is then usable as
``PYTHONPATH``. The release's ``--config`` merger (``ConfigArgumentMerger``) is copied unchanged to
``sglang/_standin/release_config_parser.py`` (see :data:`CONFIG_PARSER_PATHS`).

Layouts: ``current`` (the loader folder ``moe_runner/triton_utils``, default release
:data:`DEFAULT_RELEASES` ``current``: 0.5.23) and ``old`` (``fused_moe_triton``, default release
0.5.8, a real release of that layout with the ``down_moe=False`` log line).

Command line: ``python -m tests.testbed.standin_tree [--layout old] [--release X] DEST``.
"""

from __future__ import annotations

import argparse
import ast
import shutil
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
CURRENT_LOADER_DIR = "sglang/srt/layers/moe/moe_runner/triton_utils"
OLD_LOADER_DIR = "sglang/srt/layers/moe/fused_moe_triton"
LAYOUTS = {"current": CURRENT_LOADER_DIR, "old": OLD_LOADER_DIR}
#: Where a release keeps its config-lookup module, newest layout first (the first that defines
#: ``get_moe_configs`` is it).
LOOKUP_MODULE_PATHS = (
    CURRENT_LOADER_DIR + "/fused_moe_triton_config.py",  # 0.5.11 and newer (sglang PR #23019)
    OLD_LOADER_DIR + "/fused_moe_triton_config.py",  # 0.5.2 ... 0.5.10
    OLD_LOADER_DIR + "/fused_moe.py",  # 0.5.1 and older (kernels and lookup in one module)
)
#: The release each layout runs unless one is named.
DEFAULT_RELEASES = {"current": "0.5.23", "old": "0.5.8"}
STANDIN_CONFIGS = CURRENT_LOADER_DIR + "/configs"  # the stand-in's example configs in the source tree
#: Where a release keeps the code that merges ``--config FILE.yaml`` into its flags
#: (``ConfigArgumentMerger``), newest first; the stand-in runs it from
#: :data:`STANDIN_CONFIG_PARSER` (its own path would clash with the stand-in's ``sglang/srt/utils.py``).
CONFIG_PARSER_PATHS = ("sglang/srt/utils/server_args_config_parser.py",  # 0.5.20 and newer
                       "sglang/srt/server_args_config_parser.py")        # 0.5.3 ... 0.5.16
STANDIN_CONFIG_PARSER = "sglang/_standin/release_config_parser.py"
#: The release's FlashInfer autotune module (0.5.16 and newer); the stand-in runs its
#: ``flashinfer_autotune_cache_path`` from :data:`STANDIN_AUTOTUNE` (``sglang._standin.runners``).
AUTOTUNE_PATH = "sglang/srt/model_executor/runner/flashinfer_autotune.py"
STANDIN_AUTOTUNE = "sglang/_standin/release_flashinfer_autotune.py"


def loader_dir(layout: str = "current") -> str:
    """Folder of the loader module relative to the tree root (str); KeyError for an unknown layout."""
    return LAYOUTS[layout]


def lookup_module_path(release: str) -> str:
    """Path (relative to the tree root, str) of release ``release``'s config-lookup module.

    Reads the release's source (fetched and cached by ``tests/sglang_releases.py``; raises its
    ``ReleaseUnavailable`` when the wheel cannot be fetched). Raises LookupError when no
    candidate of :data:`LOOKUP_MODULE_PATHS` defines ``get_moe_configs``.
    """
    from tests.sglang_releases import source_tree

    root = source_tree(release)
    for rel in LOOKUP_MODULE_PATHS:
        path = root / rel
        if path.is_file() and any(isinstance(n, ast.FunctionDef) and n.name == "get_moe_configs"
                                  for n in ast.parse(path.read_text()).body):
            return rel
    raise LookupError(f"SGLang {release}: no module of {LOOKUP_MODULE_PATHS} defines get_moe_configs")


def layout_of(release: str) -> str:
    """``current`` or ``old``: the layout of release ``release`` (where its lookup module sits)."""
    folder = lookup_module_path(release).rsplit("/", 1)[0]
    return next(k for k, v in LAYOUTS.items() if v == folder)


def make_tree(dest: Path | str, layout: str | None = "current", release: str | None = None,
              flashinfer_version: str | None = None) -> Path:
    """Build a stand-in tree at ``dest`` (created; must not exist or be empty).

    ``flashinfer_version``: also a stand-in ``flashinfer`` package (``__version__`` only, what
    SGLang's autotune cache path reads) at the tree's root; None: FlashInfer is not installed.

    ``release``: the SGLang release whose config-lookup module the tree runs (default: the
    layout's :data:`DEFAULT_RELEASES` entry). ``layout``: ``current`` | ``old``, or None to take
    the release's own. Returns the absolute folder of the lookup module in the copy (its
    ``configs/`` sits inside). Raises KeyError for an unknown layout, ValueError when ``layout``
    is not ``release``'s layout, FileExistsError if ``dest`` is a non-empty folder, and
    ``ReleaseUnavailable`` when the release cannot be fetched.
    """
    if layout is not None and layout not in LAYOUTS:
        raise KeyError(f"unknown layout {layout!r}; choose from {sorted(LAYOUTS)}")
    if release is None:
        release = DEFAULT_RELEASES[layout or "current"]
    module_rel = lookup_module_path(release)
    own = next(k for k, v in LAYOUTS.items() if module_rel.startswith(v + "/"))
    if layout is not None and layout != own:
        raise ValueError(f"SGLang {release} has the {own!r} layout ({module_rel}), not {layout!r}")
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for entry in STANDIN_DIR.iterdir():
        if entry.name == "__pycache__" or entry.name.endswith(".dist-info"):
            continue
        target = dest / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(entry, target)
    from tests.sglang_releases import source_tree

    shutil.copyfile(source_tree(release) / module_rel, dest / module_rel)
    parser_src = next((source_tree(release) / rel for rel in CONFIG_PARSER_PATHS
                       if (source_tree(release) / rel).is_file()), None)
    if parser_src is not None:  # releases before 0.5.3 have no --config: the stand-in then refuses it
        shutil.copyfile(parser_src, dest / STANDIN_CONFIG_PARSER)
    autotune_src = source_tree(release) / AUTOTUNE_PATH
    if autotune_src.is_file():
        shutil.copyfile(autotune_src, dest / STANDIN_AUTOTUNE)
    if flashinfer_version is not None:
        (dest / "flashinfer").mkdir()
        (dest / "flashinfer" / "__init__.py").write_text(
            '"""Stand-in FlashInfer (orch test bed): only the version SGLang\'s autotune cache path reads."""\n\n'
            f'__version__ = "{flashinfer_version}"\n')
    ldir = dest / LAYOUTS[own]
    if LAYOUTS[own] != CURRENT_LOADER_DIR:
        shutil.move(str(dest / STANDIN_CONFIGS), str(ldir / "configs"))
    (dest / "sglang" / "version.py").write_text(
        f'"""Version of the stand-in SGLang tree: the release whose config-lookup module it runs."""\n\n'
        f'__version__ = "{release}"\n')
    info = dest / f"sglang-{release}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {release}\n"
                                   f"Summary: orch test bed stand-in running SGLang {release}'s config lookup "
                                   "(not the real server).\n")
    (info / "top_level.txt").write_text("sglang\n")
    (info / "INSTALLER").write_text("orch-testbed\n")
    return ldir


def main(argv: list[str] | None = None) -> int:
    """CLI: build the tree and print the loader folder."""
    p = argparse.ArgumentParser(prog="python -m tests.testbed.standin_tree", description=__doc__.splitlines()[0])
    p.add_argument("--layout", choices=sorted(LAYOUTS), default=None)
    p.add_argument("--release", default=None, help="SGLang release whose lookup module to run")
    p.add_argument("dest")
    args = p.parse_args(argv)
    layout = args.layout if (args.layout or args.release) else "current"
    print(make_tree(args.dest, layout, args.release))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
