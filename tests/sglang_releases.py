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
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.waiting import STALL_S, files_state


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


#: why a wheel is downloaded, said on the line that announces it
WHY = ("the test bed's stand-in SGLang and the oracle tests run this release's own code; downloaded once, "
       "kept for later runs")


def wheel(version: str) -> Path:
    """Path of the wheel of ``sglang==version`` in the cache, downloading it when absent.

    A download is announced by one line on stderr: what (the release and the wheel's file), why
    (:data:`WHY`), where to and its size (pip's own figure as the download starts, else the
    file's once saved). Raises :class:`ReleaseUnavailable` when pip cannot fetch it.
    """
    root = cache_root()
    wheels = root / "wheels"
    with _locked(root):
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
        wheels.mkdir(parents=True, exist_ok=True)
        said, out = _pip_download(version, wheels)
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if out.returncode != 0 or not found:
            why = out.why or (out.lines[-1] if out.returncode and out.lines else "no wheel saved")
            raise ReleaseUnavailable(unavailable_message(version, wheels, why))
        if not said:
            print(download_line(version, found[0].name, f"{found[0].stat().st_size / 1e6:.1f} MB", wheels),
                  file=sys.stderr, flush=True)
        return found[0]


def download_line(version: str, name: str, size: str, wheels: Path) -> str:
    """The one line that announces the download of a release's wheel: what, why, where, size."""
    return f"download: SGLang {version} ({name}, {size}) into {wheels}: {WHY}"


class _Pip:
    """What ``pip download`` left: its exit status, its output lines, why it failed (or "")."""

    def __init__(self):
        self.returncode, self.lines, self.why = 0, [], ""


def _pip_download(version: str, wheels: Path) -> tuple[bool, _Pip]:
    """Run ``pip download --no-deps sglang==version`` into ``wheels``, printing the download's one
    line (:func:`download_line`) as soon as pip names the file and its size. No wall time: while
    pip's temp files or the wheel folder grow it is working; :data:`tests.waiting.STALL_S` of no
    change ends it (a registry that never answers). Returns (whether the line was printed, pip's result)."""
    import re
    import threading
    import time

    out = _Pip()
    tmp = wheels.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                             "--progress-bar", "off", "-d", str(wheels), f"sglang=={version}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)))
    stalled = threading.Event()

    def watch():
        seen, moved = (files_state(tmp), files_state(wheels), len(out.lines)), time.monotonic()
        while proc.poll() is None:
            time.sleep(1)
            now = (files_state(tmp), files_state(wheels), len(out.lines))
            if now != seen:
                seen, moved = now, time.monotonic()
            elif time.monotonic() - moved > STALL_S:
                stalled.set()
                proc.kill()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    said = False
    try:
        for line in proc.stdout:
            out.lines.append(line.rstrip())
            m = re.match(r"\s*Downloading (\S+\.whl) \(([^)]+)\)", line)
            if m and not said:
                print(download_line(version, m.group(1).rsplit("/", 1)[-1], m.group(2), wheels), file=sys.stderr,
                      flush=True)
                said = True
        out.returncode = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    if stalled.is_set():
        out.why = f"no answer from the package registry for {STALL_S:g} s"
    else:
        errors = [ln for ln in out.lines if ln.startswith("ERROR")]
        out.why = errors[-1] if errors and out.returncode else ""
    return said, out


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
