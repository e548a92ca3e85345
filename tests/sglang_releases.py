"""Real SGLang releases as test oracles: fetch a release's wheel once, extract its Python source.

orch mirrors SGLang's rules (config file names, the loader's folder search, its log lines, the
config JSON it accepts, the kernel's API). Tests hold orch against the code of the releases
operators run, not against a copy of the rules: :func:`source_tree` gives the unpacked ``sglang``
package of a release (``.py`` and ``.json`` files only; compiled extensions are left out) so a
test can read or import the exact module that release ships.

Wheels come from the package registry with ``pip download --no-deps sglang==VERSION`` and are
kept in a cache that outlives the test run (``$ORCH_SGLANG_CACHE``, else
``$XDG_CACHE_HOME/orch/sglang``, else ``~/.cache/orch/sglang``), so re-runs need no network.
A release that cannot be fetched is an error, not a skip: CI has network to the registry.

``python -m tests.sglang_releases [VERSION ...]`` fills the cache (default: every release the
tests and the demo read, :func:`needed_releases`) and prints what it holds: run it once on a
machine with network, then copy the cache folder to an offline machine (or point
``$ORCH_SGLANG_CACHE`` at a copy). About 90 MB of wheels are downloaded; with the sources the
tests unpack from them the folder grows to about 520 MB.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.waiting import STALL_S, Stalled, files_state, run_watched


def cache_root() -> Path:
    """Folder holding downloaded wheels (``wheels/``) and their extracted source (``src/<version>/``)."""
    env = os.environ.get("ORCH_SGLANG_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "orch" / "sglang"


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
    """The wheel of a release could not be downloaded (the message has pip's own words)."""


def wheel(version: str) -> Path:
    """Path of the wheel of ``sglang==version`` in the cache, downloading it when absent.

    Raises :class:`ReleaseUnavailable` when pip cannot fetch it.
    """
    root = cache_root()
    wheels = root / "wheels"
    with _locked(root):
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
        wheels.mkdir(parents=True, exist_ok=True)
        tmp = root / "tmp"
        tmp.mkdir(exist_ok=True)
        try:
            # no wall time: pip's download grows its temp files; a stall of STALL_S is no answer
            proc = run_watched([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                "-q", "-d", str(wheels), f"sglang=={version}"], env=dict(os.environ, TMPDIR=str(tmp)),
                               progress=[lambda: files_state(tmp), lambda: files_state(wheels)])
            why = (proc.stderr.strip().splitlines() or ["no wheel saved"])[-1] if proc.returncode else "no wheel saved"
        except Stalled:
            proc, why = None, f"no answer from the package registry for {STALL_S:g} s"
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if proc is None or proc.returncode != 0 or not found:
            raise ReleaseUnavailable(unavailable_message(version, wheels, why))
        return found[0]


def unavailable_message(version: str, wheels: Path, why: str) -> str:
    """The one-line error for a release whose wheel is neither cached nor downloadable: the
    release, the cache folder, pip's last words and how to fill the cache for an offline machine."""
    return (f"SGLang {version}: its wheel is not in {wheels} and `pip download --no-deps sglang=={version}` "
            f"failed ({why}). The test bed and the oracle tests read this release's real code. Without access "
            f"to the package registry, fill the cache on a machine that has it (python -m tests.sglang_releases) "
            f"and copy {wheels.parent} here, or set ORCH_SGLANG_CACHE to a copy")


def needed_releases() -> list[str]:
    """Every release the tests and the demo read: the oracle releases (:mod:`tests.sglang_loader`)
    and the test bed's stand-in layouts (:data:`tests.testbed.standin_tree.DEFAULT_RELEASES`)."""
    from tests.sglang_loader import ORACLE_RELEASES
    from tests.testbed.standin_tree import DEFAULT_RELEASES

    return list(dict.fromkeys([*ORACLE_RELEASES, *DEFAULT_RELEASES.values()]))


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.sglang_releases [VERSION ...]``: fetch and unpack the releases (see the
    module docstring); prints one line per release and the cache's size; 1 when one failed."""
    p = argparse.ArgumentParser(prog="python -m tests.sglang_releases",
                                description="fill the SGLang wheel cache the tests and the demo read")
    p.add_argument("versions", nargs="*", metavar="VERSION", help="releases (default: every one the tests read)")
    args = p.parse_args(argv)
    failed = 0
    for version in args.versions or needed_releases():
        try:
            whl = wheel(version)
            source_tree(version)
        except ReleaseUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"ok  {version:<14} {whl.name} ({whl.stat().st_size / 1e6:.1f} MB)")
    root = cache_root()
    print(f"cache: {root} ({_size(root / 'wheels') / 1e6:.0f} MB of wheels, {_size(root) / 1e6:.0f} MB in all)")
    return 1 if failed else 0


def source_tree(version: str) -> Path:
    """Folder that contains the ``sglang`` package of release ``version`` (its ``.py``/``.json`` files).

    Extracted once into the cache; later calls only return the path.
    """
    dest = cache_root() / "src" / version
    done = dest / ".complete"
    if done.exists():
        return dest
    whl = wheel(version)
    with _locked(cache_root()):
        if done.exists():
            return dest
        with zipfile.ZipFile(whl) as zf:
            for name in zf.namelist():
                if name.startswith("sglang/") and name.endswith((".py", ".json")):
                    zf.extract(name, dest)
        done.write_text(whl.name + "\n")
    return dest


if __name__ == "__main__":
    sys.exit(main())
