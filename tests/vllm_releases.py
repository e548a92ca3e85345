"""Real vLLM releases as test oracles: fetch a release's source distribution once, keep its Python files.

orch mirrors vLLM's rules (config file names, where the loader looks, its log lines, the config
JSON it accepts, which MoE kernel a server runs, the kernel's API). Tests hold orch against the
code of the releases operators run: :func:`source_tree` gives the ``vllm`` package of a release
(its ``.py`` and ``.json`` files only, the shipped MoE configs among them) so a test can read
the module that release ships, or import it with stand-ins for what needs compiled parts
(``tests/vllm_standins.py``).

Why the source distribution: vLLM's wheel is about 400 MB (its CUDA kernels); the sdist is
40 to 50 MB and holds the same Python package. ``pip download --no-binary :all:`` of vLLM cannot
finish (preparing an sdist's metadata runs vLLM's ``setup.py``, which needs torch of one exact
version, setuptools-rust and CUDA), so pip is asked with ``--no-build-isolation
--check-build-dependencies --no-clean``: it downloads the sdist (checking its hash against the
index), unpacks it, refuses to build before any of vLLM's code runs, and leaves the unpacked
tree, from which the ``vllm/`` package's ``.py`` and ``.json`` files are copied. Where pip's
metadata step does succeed (a machine with vLLM's build dependencies), the saved ``.tar.gz`` is
read instead.

The cache outlives the test run: ``$ORCH_VLLM_CACHE``, else ``$XDG_CACHE_HOME/orch/vllm``, else
``~/.cache/orch/vllm``; each release is downloaded once and a line says what, why and how large.
A release that cannot be fetched is one error naming the release, the cache and pip's words, not
a skip: CI has network to the registry.

``python -m tests.vllm_releases [VERSION ...]`` fills the cache (default: :data:`ORACLE_RELEASES`)
and prints what it holds. The three releases download about 145 MB of sdists (kept: about 55 MB
of Python and JSON per release, 165 MB in all); copy the folder to an offline machine, or point
``$ORCH_VLLM_CACHE`` at a copy.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.waiting import STALL_S, Stalled, files_state, run_watched

#: Releases the oracle tests read: the newest and the two minors before it (the releases
#: operators run at the time of writing, 2026-12). docs/vllm.md lists the same (a test checks).
ORACLE_RELEASES = ("0.32.0", "0.33.0", "0.34.0")
#: The release the kernel provider and the CPU smoke of the H200 benchmark run when none is named.
NEWEST = ORACLE_RELEASES[-1]

#: The torch each vLLM wheel pins (its ``Requires-Dist``) and the Triton that torch requires (torch's
#: own ``Requires-Dist``), as the package registry's metadata said on 2026-12-03 (``pip install
#: --dry-run --no-deps --report``). vLLM itself names no Triton: it comes with torch.
TORCH_PINS = {"0.22.1": "2.11.0", "0.23.0": "2.11.0", "0.24.0": "2.11.0", "0.25.1": "2.11.0", "0.26.0": "2.11.0",
              "0.27.1": "2.13.0", "0.28.0": "2.13.0", "0.29.0": "2.13.0", "0.30.0": "2.13.0", "0.31.0": "2.13.0",
              "0.32.0": "2.13.0", "0.33.0": "2.14.0", "0.34.0": "2.14.0"}
TRITON_OF_TORCH = {"2.11.0": "3.6.0", "2.12.0": "3.7.0", "2.13.0": "3.7.1", "2.14.0": "3.8"}
#: The newest release whose Triton is the H200's (torch 2.11.0, Triton 3.6.0): what the H200 bench
#: runs. Triton 3.3.0 to 3.6.0 fail to compile vLLM's ``fused_moe_kernel`` for many configs on its
#: aligned path (M x top-k x 4 > E) in ``TritonGPURemoveLayoutConversions`` ("operand #0 does not
#: dominate this use", triton-lang/triton#9809 and #9928; vllm-project/vllm#39260), which 0.32.0+
#: never meet on the Triton they require. docs/benchmarks.md 4.6.
H200_RELEASE = "0.26.0"


def required_triton(release: str) -> str | None:
    """The Triton release ``release`` of vLLM runs with (``"3.6.0"``; ``"3.8"`` for ``~=3.8.0``), None
    for a release :data:`TORCH_PINS` does not list."""
    torch = TORCH_PINS.get(release)
    return TRITON_OF_TORCH.get(torch) if torch else None


def triton_matches(release: str, installed: str) -> bool:
    """Whether the installed Triton ``installed`` (``triton.__version__``) is the one vLLM ``release``
    requires (same major.minor, and the same patch where the pin names one)."""
    want = required_triton(release)
    if want is None:
        return False
    have = installed.split("+")[0].split(".")
    return have[:len(want.split("."))] == want.split(".")

#: Files of the package kept (the rest of the sdist: C++/CUDA sources, tests, docs, is not).
KEPT_SUFFIXES = (".py", ".json")
#: Files of the sdist's top folder kept too, under ``sdist/`` beside the package: the console script's
#: declaration (``[project.scripts]``) and the server image's build (stage ``vllm-openai``'s ``ENTRYPOINT``).
#: A cached release without them (an older cache) is fetched again.
SDIST_FILES = ("pyproject.toml", "docker/Dockerfile")


def cache_root() -> Path:
    """Folder holding the extracted sources (``src/<version>/vllm/...``)."""
    env = os.environ.get("ORCH_VLLM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "orch" / "vllm"


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Serialize fetches across processes (pytest-xdist workers, two test runs)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ReleaseUnavailable(RuntimeError):
    """The source of a vLLM release could not be downloaded (the message has pip's own words)."""


def unavailable_message(version: str, root: Path, why: str) -> str:
    """The one-line error for a release neither cached nor downloadable: the release, the cache
    folder, pip's last words and how to fill the cache for an offline machine."""
    return (f"vLLM {version}: its Python source is not in {root / 'src' / version} and `pip download --no-deps "
            f"--no-binary :all: vllm=={version}` could not fetch the sdist ({why}). The oracle tests read this "
            f"release's real code. Without access to the package registry, fill the cache on a machine that has "
            f"it (python -m tests.vllm_releases) and copy {root} here, or set ORCH_VLLM_CACHE to a copy")


def _pip_download(version: str, work: Path) -> tuple[Path, str]:
    """Download vLLM ``version``'s sdist with pip into ``work``; return the ``vllm`` package folder
    found (unpacked by pip, or extracted from the saved archive) and the sdist's size as pip
    printed it (e.g. ``50.9 MB``). Raises :class:`ReleaseUnavailable`."""
    tmp = work / "tmp"
    dl = work / "dl"
    tmp.mkdir(parents=True)
    dl.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
           "--check-build-dependencies", "--no-clean", "--disable-pip-version-check", "-v", "-d", str(dl),
           f"vllm=={version}"]
    try:
        # no wall time: pip's download and build grow its temp files; a stall of STALL_S is no answer
        proc = run_watched(cmd, env=env, progress=[lambda: files_state(tmp), lambda: files_state(dl)])
        out = proc.stdout + proc.stderr
    except Stalled:
        raise ReleaseUnavailable(unavailable_message(version, cache_root(), "no answer from the package "
                                                     f"registry for {STALL_S:g} s")) from None
    size = re.search(rf"Downloading\s+\S*vllm-{re.escape(version)}\.tar\.gz\s+\(([^)]+)\)", out)
    saved = sorted(dl.glob(f"vllm-{version}.tar.gz"))
    if saved:  # pip's metadata step succeeded on this machine: the archive was saved
        with tarfile.open(saved[0]) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and (
                ("/vllm/" in m.name and m.name.endswith(KEPT_SUFFIXES)) or m.name.split("/", 1)[-1] in SDIST_FILES)]
            tf.extractall(work / "x", members=members, filter="data")
        found = sorted((work / "x").glob("*/vllm/__init__.py"))
        return found[0].parent, size.group(1) if size else f"{saved[0].stat().st_size / 1e6:.1f} MB"
    found = sorted(tmp.glob("pip-*/vllm_*/vllm/__init__.py")) + sorted(tmp.glob("pip-*/*/vllm/__init__.py"))
    if not found or not size:
        lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("ERROR")] or \
            [ln.strip() for ln in out.splitlines() if ln.strip()] or ["pip printed nothing"]
        raise ReleaseUnavailable(unavailable_message(version, cache_root(), lines[-1][:300]))
    return found[0].parent, size.group(1)


def source_tree(version: str) -> Path:
    """Folder that contains the ``vllm`` package of release ``version`` (``.py``/``.json`` files only)
    and, under ``sdist/``, the sdist's :data:`SDIST_FILES`.

    Downloaded and extracted once into the cache (one line printed on stderr: what, why, the
    size); later calls only return the path. Raises :class:`ReleaseUnavailable`.
    """
    root = cache_root()
    dest = root / "src" / version
    done = dest / ".complete"

    def complete() -> bool:
        return done.exists() and all((dest / "sdist" / f).is_file() for f in SDIST_FILES)

    if complete():
        return dest
    with _locked(root):
        if complete():
            return dest
        work = Path(tempfile.mkdtemp(prefix=f"fetch-{version}-", dir=root))
        try:
            pkg, size = _pip_download(version, work)
            if dest.exists():
                shutil.rmtree(dest)
            kept = 0
            for path in pkg.rglob("*"):
                if path.is_file() and path.suffix in KEPT_SUFFIXES:
                    target = dest / "vllm" / path.relative_to(pkg)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
                    kept += path.stat().st_size
            for rel in SDIST_FILES:  # every release since 0.8 has both
                target = dest / "sdist" / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(pkg.parent / rel, target)
            done.write_text(f"vllm-{version}.tar.gz {size}; kept {kept} bytes of .py/.json and "
                            f"{', '.join(SDIST_FILES)}\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"tests.vllm_releases: downloaded vLLM {version}'s sdist (vllm-{version}.tar.gz, {size}) once, "
              f"for the oracle tests that read its code; kept its Python and JSON files ({kept / 1e6:.0f} MB) "
              f"in {dest}", file=sys.stderr)
    return dest


def module_path(version: str, rel: str) -> Path:
    """Path of file ``rel`` (e.g. ``vllm/envs.py``) in release ``version``'s tree; FileNotFoundError
    naming the release when that release has no such file."""
    path = source_tree(version) / rel
    if not path.is_file():
        raise FileNotFoundError(f"vLLM {version} has no {rel}")
    return path


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.vllm_releases [VERSION ...]``: fetch and extract the releases (see the
    module docstring); one line per release and the cache's size; 1 when one failed."""
    p = argparse.ArgumentParser(prog="python -m tests.vllm_releases",
                                description="fill the vLLM source cache the oracle tests read")
    p.add_argument("versions", nargs="*", metavar="VERSION", help="releases (default: every one the tests read)")
    args = p.parse_args(argv)
    failed = 0
    for version in args.versions or ORACLE_RELEASES:
        try:
            tree = source_tree(version)
        except ReleaseUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"ok  {version:<10} {(tree / '.complete').read_text().strip()}")
    root = cache_root()
    print(f"cache: {root} ({_size(root / 'src') / 1e6:.0f} MB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
