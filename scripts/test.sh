#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the whole suite, the
# network-namespace test bed included (needs root).
#
# The suite runs on ORCH_TEST_WORKERS pytest-xdist workers (default 6): the end-to-end tests
# mostly wait (servers starting, units stopping), so 6 workers suit a 2-core machine (8 overload
# it: commands then pass their timeouts). Tests that share a module's test bed stay on one worker
# (--dist loadgroup, tests/conftest.py). Extra arguments go to pytest: `-n 0` runs serially,
# `-m "not testbed"` is the quick tier. --durations=30 lists the slowest steps, to keep the suite inside CI's time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -ra --durations=30 -n "${ORCH_TEST_WORKERS:-6}" --dist loadgroup "$@" tests
