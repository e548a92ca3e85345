#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the whole suite, the
# network-namespace test bed included (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -ra "$@" tests
