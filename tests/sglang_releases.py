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
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "-q", "-d", str(wheels), f"sglang=={version}"],
                              capture_output=True, text=True, timeout=600)
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if proc.returncode != 0 or not found:
            raise ReleaseUnavailable(f"pip download sglang=={version} failed: "
                                     + (proc.stderr.strip().splitlines() or ["no wheel saved"])[-1])
        return found[0]


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
