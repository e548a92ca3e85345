"""The suite runs on pytest-xdist workers (scripts/test.sh): tests that share a module-scoped test
bed or another costly module fixture (tests/conftest.py ``MODULE_SHARED``) must land on one worker,
so each is built once."""

from __future__ import annotations

import sys

from tests.conftest import BED_FIXTURES, REPO
from tests.waiting import run_watched


def test_tests_sharing_a_module_bed_run_on_one_worker(tmp_path):
    log = tmp_path / "workers.log"
    (tmp_path / "test_beds.py").write_text(
        "import os\n"
        "import pytest\n"
        "@pytest.fixture(scope='module')\n"
        "def bed():\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write('built ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "    return 1\n"
        + "".join(f"def test_shares_{i}(bed):\n"
                  f"    with open({str(log)!r}, 'a') as f:\n"
                  f"        f.write('used ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n" for i in range(6))
        + "".join(f"def test_alone_{i}():\n    pass\n" for i in range(6)))
    r = run_watched([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "-n", "3", "--dist", "loadgroup", "--rootdir", str(tmp_path), "-c", "/dev/null",
                        str(tmp_path / "test_beds.py")], cwd=REPO)
    assert r.returncode == 0 and "12 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    lines = log.read_text().split()
    built = [w for k, w in zip(lines[::2], lines[1::2]) if k == "built"]
    used = {w for k, w in zip(lines[::2], lines[1::2]) if k == "used"}
    assert len(built) == 1 and used == set(built), lines


def test_every_test_that_builds_a_bed_is_left_out_of_the_quick_tier():
    """``-m "not testbed"`` (the README's quick tier) selects no test that asks for a bed fixture,
    marked by hand or not."""
    r = run_watched([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                        "-m", "not testbed", "tests/e2e"], cwd=REPO)
    assert r.returncode in (0, 5), r.stdout[-3000:] + r.stderr[-3000:]
    selected = [ln for ln in r.stdout.splitlines() if "::" in ln]
    import ast
    bed_tests = set()
    for path in (REPO / "tests" / "e2e").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                args = {a.arg for a in node.args.args}
                if args & BED_FIXTURES:
                    bed_tests.add(f"{path.name}::{node.name}")
    assert bed_tests, "no test bed tests found"
    leaked = [ln for ln in selected if ln.split("/")[-1].split("[")[0] in bed_tests]
    assert leaked == [], leaked
    assert selected, "the quick tier should keep the in-process e2e tests (bad input parsing etc.)"
