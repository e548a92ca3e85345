"""Stand-in vLLM trees: the stand-in server plus the real release's files its lookup runs.

``make_tree(dest, release)`` builds, at ``dest`` (usable as ``PYTHONPATH`` and as
``ORCH_STANDIN_VLLM_SRC``):

- ``vllm/``: the stand-in entry points (``tests/testbed/standin_vllm/vllm``:
  ``python -m vllm.entrypoints.openai.api_server`` and the console script's
  ``vllm.entrypoints.cli.main``), a stand-in ``vllm/__init__.py`` and ``vllm/version.py`` naming the
  release, and, unchanged from the release's source (``tests/vllm_releases.py``), every module
  ``tests/vllm_standins.py`` runs for real (:data:`tests.vllm_standins.REAL_MODULES` and
  ``REAL_PACKAGES``), the fused-MoE package's ``__init__.py`` (its ``override_config``), its
  ``oracle/unquantized.py`` (the backend priority list) and its shipped ``configs/`` folder, at their
  own paths: the lookup's ``configs/`` is the tree's, as in an installed vLLM;
- ``vllm-<release>.dist-info/METADATA``, as pip leaves it;
- ``_vllm_standin/`` (the server) and ``tests/vllm_standins.py``, ``tests/sglang_standins.py`` (the
  stand-ins the server installs), so the tree runs without the repo (a container);
- ``bin/vllm``: vLLM's console script as pip writes it (shebang ``python``: the caller's
  ``python`` argument).

Command line: ``python -m tests.testbed.vllm_tree [--release X] [--python P] DEST``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "standin_vllm"
REPO = Path(__file__).resolve().parents[2]
FUSED_MOE = "vllm/model_executor/layers/fused_moe"
#: the console script's path in a tree
SCRIPT = "bin/vllm"


def make_tree(dest: Path | str, release: str | None = None, python: str = "python3") -> Path:
    """Build the tree (module docstring) at ``dest`` (created; must be absent or empty). Returns
    the absolute path of the tree's shipped ``configs/`` folder. Raises FileExistsError for a
    non-empty ``dest`` and ``ReleaseUnavailable`` when the release's source cannot be fetched."""
    from tests import vllm_standins as vs
    from tests.vllm_releases import NEWEST, source_tree

    release = release or NEWEST
    src = source_tree(release)
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    shutil.copytree(STANDIN, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    files = [Path(*m.split(".")).with_suffix(".py") for m in vs.REAL_MODULES if m != "vllm.version"]
    files += [Path(FUSED_MOE) / "__init__.py", Path(FUSED_MOE) / "oracle" / "unquantized.py"]
    for rel in files:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dest / rel)
    for pkg in vs.REAL_PACKAGES:
        rel = Path(*pkg.split("."))
        shutil.copytree(src / rel, dest / rel, dirs_exist_ok=True)
    shutil.copytree(src / FUSED_MOE / "configs", dest / FUSED_MOE / "configs")
    parts = release.split(".")
    (dest / "vllm" / "version.py").write_text(
        f'"""Stand-in: the release the tree runs (vLLM\'s own reads a generated _version module)."""\n'
        f"__version__ = {release!r}\n__version_tuple__ = {tuple(int(p) for p in parts if p.isdigit())!r}\n")
    (dest / "vllm" / "__init__.py").write_text(
        '"""Stand-in ``vllm`` package of the test bed: entry points only; the server runs the release\'s '
        'modules (tests/testbed/vllm_tree.py)."""\n' + f"__version__ = {release!r}\n")
    dist = dest / f"vllm-{release}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n")
    (dist / "entry_points.txt").write_text("[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n")
    (dest / "tests").mkdir()
    (dest / "tests" / "__init__.py").write_text('"""The stand-ins the stand-in vLLM server installs."""\n')
    for name in ("vllm_standins.py", "sglang_standins.py"):
        shutil.copyfile(REPO / "tests" / name, dest / "tests" / name)
    script = dest / SCRIPT
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!{python}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                      "from vllm.entrypoints.cli.main import main\n"
                      "if __name__ == '__main__':\n"
                      "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                      "    sys.exit(main())\n")
    script.chmod(0o755)
    return dest / FUSED_MOE / "configs"


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.testbed.vllm_tree [--release X] [--python P] DEST``."""
    p = argparse.ArgumentParser(prog="python -m tests.testbed.vllm_tree")
    p.add_argument("dest")
    p.add_argument("--release")
    p.add_argument("--python", default="python3")
    a = p.parse_args(argv)
    print(make_tree(a.dest, a.release, a.python))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
