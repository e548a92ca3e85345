"""Shared pytest fixtures: the network-namespace test bed (``tests/testbed``).

``testbed_factory``: a function ``make(n_hosts=2, host_options=None, **kw) -> TestBed`` that
creates a bed (already entered) under the test's ``tmp_path``; every bed made is torn down
after the test, also when it failed. Tests using it are skipped with a reason when the machine
cannot host a bed (not root, no ``ip netns``, no sshd, no ``unshare``/``nsenter``), except when
``CI`` or ``ORCH_TESTBED_REQUIRED`` is set in the environment: then they fail, because in CI the
bed must run (``tests/testbed/setup.sh`` installs what it needs).
Mark such tests ``@pytest.mark.testbed``.

Self-contained tests: :class:`ReadGuard`, installed with ``sys.addaudithook`` when this file is
loaded, records every file or folder the test process opens for reading outside the repo, its
virtual environment, the Python installation, ``/tmp``, ``/proc``, ``/sys``, ``/dev``, ``/etc``,
``/run``, ``/var``, ``/usr/share`` (the system's data: fonts matplotlib scans) and the cache of
fetched SGLang wheels (``tests/sglang_releases.py`` ``cache_root()``). A test that read such a
file errors at teardown naming it; reads outside any test (collection, module fixtures) fail the
session. Subprocesses (``orch`` runs, bed hosts) are not watched. ``MPLCONFIGDIR`` points at a
folder made for the session, so no ``matplotlibrc`` or font cache of the user's home is read.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]


class ReadGuard:
    """Audit hook (``sys.addaudithook``) that records reads outside ``roots``.

    Watched events: ``open`` (``open()``, ``io.open``, ``os.open``) for reading (mode with ``r``
    or ``+``; ``os.open`` flags other than ``O_WRONLY``) and ``os.listdir``/``os.scandir``. A path
    is outside when its absolute form (``os.path.abspath``, symlinks not followed) is under none of
    ``roots``; only paths that exist are recorded (a lookup of a missing file reads nothing).
    Reads made by a module of ``EXEMPT_MODULES`` are not recorded: matplotlib's font manager
    lists the machine's font folders (``/usr/local/share/fonts``, ``~/.fonts``) to choose a font;
    what the tests check of a plot does not depend on it.
    ``outside`` is the list of ``(test id or None, event, path)`` in order. Never raises.
    """

    EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
    EXEMPT_MODULES = frozenset({"matplotlib.font_manager"})

    def __init__(self, roots: Iterable[str]):
        self.roots = tuple(sorted({os.path.abspath(r).rstrip("/") + "/" for r in roots if r}))
        self.outside: List[tuple] = []
        self.current: Optional[str] = None  # the running test's node id
        self._local = threading.local()

    def allowed(self, path: str) -> bool:
        """True when ``path`` (absolute) is one of ``roots`` or under one."""
        return (path.rstrip("/") + "/").startswith(self.roots)

    def __call__(self, event: str, args: tuple) -> None:
        if event not in self.EVENTS or getattr(self._local, "busy", False):
            return
        self._local.busy = True
        try:
            path = args[0] if args else "."
            if path is None:
                path = "."
            if isinstance(path, int):
                return  # an already open descriptor
            if event == "open":
                mode, flags = (args + (None, 0))[1:3]
                if isinstance(mode, str):
                    if "r" not in mode and "+" not in mode:
                        return
                elif isinstance(flags, int) and flags & os.O_ACCMODE == os.O_WRONLY:
                    return
            path = os.fsdecode(os.fspath(path))
            full = os.path.abspath(path)
            if not self.allowed(full) and os.path.exists(full) and not self._exempt_caller():
                self.outside.append((self.current, event, full))
        except Exception:  # noqa: BLE001 - an audit hook must never break the operation it watches
            pass
        finally:
            self._local.busy = False


    def _exempt_caller(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_globals.get("__name__") in self.EXEMPT_MODULES:
                return True
            frame = frame.f_back
        return False


def allowed_read_roots() -> List[str]:
    """Where tests may read: the repo, the venv and the Python installation, the system's
    own trees (/tmp, /proc, /sys, /dev, /etc, /run, /var), the temp folder and the cache of
    fetched SGLang wheels."""
    from tests.sglang_releases import cache_root
    from tests.vllm_releases import cache_root as vllm_cache_root

    roots = [str(vllm_cache_root()), str(REPO), sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, "/tmp", "/proc",
             "/sys", "/dev", "/etc", "/run", "/var", "/usr/share", tempfile.gettempdir(), str(cache_root())]
    roots += site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return roots + [os.path.realpath(r) for r in roots]


READ_GUARD = ReadGuard(allowed_read_roots())
sys.addaudithook(READ_GUARD)
# matplotlib (the report's plots, in this process and in `orch` subprocesses) reads its rc file and
# font cache from here instead of ~/.config/matplotlib or ~/.cache/matplotlib
_MPLCONFIGDIR = tempfile.TemporaryDirectory(prefix="orch-tests-mpl-")
os.environ["MPLCONFIGDIR"] = _MPLCONFIGDIR.name


@pytest.fixture(autouse=True)
def _reads_stay_in_the_repo(request):
    """Error (at teardown) when the test read a file outside the allowed roots (see :class:`ReadGuard`)."""
    READ_GUARD.current = request.node.nodeid
    start = len(READ_GUARD.outside)
    yield
    READ_GUARD.current = None
    found = sorted({f"{event} {path}" for _, event, path in READ_GUARD.outside[start:]})
    del READ_GUARD.outside[start:]
    if found:
        pytest.fail("the test read outside the repo (tests use only what the repo holds, plus fetched SGLang "
                    "wheels):\n  " + "\n  ".join(found[:20]), pytrace=False)


#: module-scoped fixtures that build a test bed: under pytest-xdist (``--dist loadgroup``) the tests
#: that use one run on one worker, so each bed is built once, not once per worker
MODULE_BEDS = frozenset({"doctored", "step_bed", "bed"})
#: every costly module-scoped fixture grouped that way: the beds and the tune run that
#: tests/unit/remote/tuning/test_command.py reads (about 25 s of the Triton interpreter)
MODULE_SHARED = MODULE_BEDS | {"first_run"}
#: the fixtures that make a test a ``testbed`` test
BED_FIXTURES = MODULE_BEDS | {"testbed_factory"}


def _scope(item, name: str) -> Optional[str]:
    """Scope of the fixture ``name`` as ``item`` sees it (the closest definition), or None."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).get(name)
    return defs[-1].scope if defs else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Mark every test that builds a test bed (``testbed_factory`` or a :data:`MODULE_BEDS` fixture)
    ``testbed``, so ``-m "not testbed"`` (the quick tier) never makes one, and group the tests that
    share a costly module-scoped fixture (:data:`MODULE_SHARED`) for xdist (first: ``-m``
    deselection and the xdist worker's own hook of this name come after)."""
    for item in items:
        names = {n for n in getattr(item, "fixturenames", ()) if n == "testbed_factory" or _scope(item, n) == "module"}
        if names & BED_FIXTURES and item.get_closest_marker("testbed") is None:
            item.add_marker(pytest.mark.testbed)
        shared = MODULE_SHARED & names
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{min(shared)}"))


_WORKER_OUTSIDE: List[str] = []  # the controller's collection of what xdist workers found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when something outside any test (collection, module fixtures) read outside the
    repo. An xdist worker hands its findings to the controller (``workeroutput``), which fails the run."""
    found = sorted({f"{event} {path}" for _, event, path in READ_GUARD.outside})
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["orch_reads_outside"] = found
        return
    found = sorted(set(found) | set(_WORKER_OUTSIDE))
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("reads outside the repo (outside any test): " + ", ".join(found[:20]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: collect a finished worker's reads outside any test."""
    _WORKER_OUTSIDE.extend(getattr(node, "workeroutput", {}).get("orch_reads_outside", ()))


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``testbed`` marker (also declared in pyproject.toml)."""
    config.addinivalue_line("markers", "testbed: needs the network-namespace test bed (root, sshd, iproute2)")


def testbed_unavailable_reason() -> Optional[str]:
    """Why a test bed cannot be made here (str), or None when it can."""
    if os.geteuid() != 0:
        return "the test bed needs root (network namespaces, mounts)"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", "sudo", "visudo", "useradd", "chpasswd"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (run tests/testbed/setup.sh)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "/usr/sbin/sshd is missing (run tests/testbed/setup.sh)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` unavailable: {probe.stderr.strip()}"
    return None


def _require_testbed() -> None:
    reason = testbed_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI") or os.environ.get("ORCH_TESTBED_REQUIRED"):
        pytest.fail(f"test bed required in CI but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture
def testbed_factory(tmp_path) -> Callable[..., "object"]:
    """Factory of entered ``tests.testbed.bed.TestBed`` objects, all destroyed at teardown."""
    _require_testbed()
    from tests.testbed.bed import TestBed

    made: List[TestBed] = []

    def make(n_hosts: int = 2, host_options=None, **kw) -> TestBed:
        workdir = kw.pop("workdir", None) or (tmp_path / f"bed{len(made)}")
        bed = TestBed(n_hosts=n_hosts, host_options=host_options, workdir=workdir, **kw)
        made.append(bed)
        bed.__enter__()
        return bed

    yield make
    for bed in reversed(made):
        bed.destroy()
