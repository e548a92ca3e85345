#!/usr/bin/env bash
# The README's main job on the bundled example hosts: set up (idempotent), start two
# example SGLang hosts on this machine (network namespaces with sshd, systemd units and
# the stand-in server), then run `orch tune` on them. `bash scripts/demo.sh down` removes them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "down" ]; then
  exec .venv/bin/python -m tests.testbed down --inventory inventories/testbed.yaml
fi
bash scripts/setup.sh
.venv/bin/python -m tests.testbed up --hosts 2 --inventory inventories/testbed.yaml
.venv/bin/orch tune inventories/testbed.yaml --service sglang-qwen "$@"
