"""Shared pytest fixtures: the network-namespace test bed (``tests/testbed``).

``testbed_factory``: a function ``make(n_hosts=2, host_options=None, **kw) -> TestBed`` that
creates a bed (already entered) under the test's ``tmp_path``; every bed made is torn down
after the test, also when it failed. Tests using it are skipped with a reason when the machine
cannot host a bed (not root, no ``ip netns``, no sshd, no ``unshare``/``nsenter``), except when
``CI`` or ``ORCH_TESTBED_REQUIRED`` is set in the environment: then they fail, because in CI the
bed must run (``tests/testbed/setup.sh`` installs what it needs).
Mark such tests ``@pytest.mark.testbed``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable, List, Optional

import pytest


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
