"""Tests use only what the repo holds (plus fetched SGLang wheels).

Two checks: at run time, the audit hook of ``tests/conftest.py`` (:class:`tests.conftest.ReadGuard`)
makes every test that opens a file outside the allowed roots error; these tests prove it sees
such reads. Statically, no file of ``tests/`` (code, comments, docstrings, READMEs) names a path
of the machine the suite was written on, such as a ``/work/...`` checkout or a ``shared/`` folder
beside it.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import READ_GUARD, REPO, ReadGuard, allowed_read_roots
from tests.sglang_releases import cache_root
from tests.waiting import run_watched

TEXT_SUFFIXES = {".py", ".md", ".sh", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".j2"}
# an absolute /work/ path (not ".../orch/work/", a host path); a shared/ folder next to a checkout
OUTSIDE_PATH = re.compile(r"(?<![\w.~/-])/work/|\.\./shared\b|/shared/(facts|design|models|inputs)\b")


def test_no_test_file_names_a_path_outside_the_repo():
    """Recorded data (``tests/data/**/*.json*``) keeps the paths of the run that made it; it is
    never opened by path, and the audit hook would catch it if it were."""
    hits = []
    for path in sorted((REPO / "tests").rglob("*")):
        if path.suffix not in TEXT_SUFFIXES or not path.is_file() or "__pycache__" in path.parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE_PATH.search(line) and path.name != "test_self_contained.py":
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not hits, "paths outside the repo:\n" + "\n".join(hits)


def test_the_scan_catches_what_it_looks_for():
    for bad in ("see /work/shared/facts/x.md", "Path('../shared/models')", "'/work/main/tests'",
                "/data/shared/models/x.json"):
        assert OUTSIDE_PATH.search(bad), bad
    for fine in ("/var/lib/orch/work/e7f/E=8.json", "tests/data/models/README.md", "shared_experts", "~/work/x"):
        assert not OUTSIDE_PATH.search(fine), fine


def test_guard_records_reads_outside_its_roots(tmp_path):
    """Called as the audit hook is: a read outside the roots is recorded (open for reading,
    os.open, listdir, scandir); writes, missing files, descriptors and reads inside are not."""
    inside, outside = tmp_path / "repo", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (inside / "a").write_text("x")
    (outside / "b").write_text("y")
    guard = ReadGuard([str(inside)])
    guard("open", (str(inside / "a"), "r", 0))
    guard("open", (str(outside / "b"), "w", 0))
    guard("open", (str(outside / "missing"), "r", 0))
    guard("open", (3, "r", 0))
    guard("compile", (b"", str(outside / "b")))
    assert guard.outside == []
    guard("open", (outside / "b", "rb", 0))
    guard("open", (str(outside / "b").encode(), None, 0))  # os.open, O_RDONLY
    guard("os.listdir", (str(outside),))
    guard("os.scandir", (str(outside),))
    assert [(e, p) for _, e, p in guard.outside] == [("open", str(outside / "b"))] * 2 + [
        ("os.listdir", str(outside)), ("os.scandir", str(outside))]


def test_the_installed_hook_sees_a_real_read(tmp_path):
    """The conftest's hook is installed: with its roots narrowed to the repo for a moment, reading
    a file in tmp_path (and listing the folder) is recorded."""
    (tmp_path / "f").write_text("outside")
    saved, start = READ_GUARD.roots, len(READ_GUARD.outside)
    READ_GUARD.roots = (str(REPO) + "/",)
    try:
        (tmp_path / "f").read_text()
        sorted(tmp_path.iterdir())
    finally:
        READ_GUARD.roots = saved
        seen = READ_GUARD.outside[start:]
        del READ_GUARD.outside[start:]
    assert {(e, p) for _, e, p in seen} >= {("open", str(tmp_path / "f")), ("os.listdir", str(tmp_path))} or \
        {(e, p) for _, e, p in seen} >= {("open", str(tmp_path / "f")), ("os.scandir", str(tmp_path))}, seen


def test_allowed_roots_are_the_documented_ones():
    roots = set(allowed_read_roots())
    assert {str(REPO), sys.prefix, sys.base_prefix, "/tmp", "/proc", "/sys", "/dev", "/etc", "/run", "/var",
            str(cache_root())} <= roots
    assert not any(r in ("/", "/root", "/home", "/work") for r in roots)


def test_a_test_that_reads_outside_errors(tmp_path):
    """End to end: a test that lists ``/`` (outside every root) errors at teardown, naming it,
    while its neighbour that reads only repo files passes."""
    (tmp_path / "test_reads.py").write_text(
        "import os\n"
        "def test_lists_the_root_folder():\n"
        "    os.listdir('/')\n"
        "def test_reads_the_readme():\n"
        f"    open({str(REPO / 'README.md')!r}).read()\n")
    r = run_watched([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "test_reads.py")], cwd=REPO)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 passed, 1 error" in r.stdout, r.stdout[-3000:]
    assert "ERROR" in r.stdout and "test_lists_the_root_folder" in r.stdout.split("short test summary")[-1]
    assert "the test read outside the repo" in r.stdout and "os.listdir /\n" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_read_outside_any_test_fails_the_run(tmp_path, workers):
    """A read at import (collection, outside any test) fails the whole run, also when xdist
    workers collect (they hand what they saw to the controller), though every test passes."""
    (tmp_path / "test_import_reads.py").write_text(
        "import os\n"
        "os.listdir('/')\n"
        "def test_one():\n"
        "    pass\n"
        "def test_two():\n"
        "    pass\n")
    r = run_watched([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        *workers, "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "test_import_reads.py")], cwd=REPO)
    assert "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.returncode == 1 and "reads outside the repo (outside any test): os.listdir /" in r.stdout, \
        r.stdout[-3000:] + r.stderr[-3000:]


def test_matplotlib_font_scan_is_exempt(tmp_path):
    """Reads whose caller is matplotlib's font manager (its scan of the machine's font folders)
    are not recorded; the same read from anywhere else is."""
    (tmp_path / "font.ttf").write_text("x")
    guard = ReadGuard([str(tmp_path / "repo")])
    scope = {"__name__": "matplotlib.font_manager", "guard": guard, "path": str(tmp_path / "font.ttf")}
    exec("def scan():\n    guard('open', (path, 'rb', 0))\n", scope)
    scope["scan"]()
    assert guard.outside == []
    guard("open", (str(tmp_path / "font.ttf"), "rb", 0))
    assert [p for _, _, p in guard.outside] == [str(tmp_path / "font.ttf")]
