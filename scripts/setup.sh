#!/usr/bin/env bash
# Set up orch on a fresh Debian 12 machine (run as root), in three steps, each printed with what
# it installs, why, and how long it took:
#   1. system packages for the test bed, the demo and the tests (tests/testbed/setup.sh: each
#      group with why; apt's output goes to .setup/apt.log, the packages it installed are
#      recorded in .setup/installed-packages; podman's systemd units its install enabled are
#      disabled again and named). orch itself needs none of them on a controller;
#   2. a virtual environment in .venv;
#   3. Python packages into it: torch (CPU build), then orch (editable) with its dependencies and
#      the test tools (pip's output goes to .setup/pip.log).
# Idempotent: a second run only checks (pip still looks, a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf 'setup: [%s] %s\n' "$1" "$2"; }
took() { printf 'setup:       done in %d s\n' "$(( SECONDS - $1 ))"; }
t0=$SECONDS
mkdir -p .setup

t=$SECONDS
step 1/3 "system packages (apt) for the test bed, the demo and the tests:"
sh tests/testbed/setup.sh | sed 's/^/setup:       /'
took "$t"

t=$SECONDS
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  step 2/3 "virtual environment: creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
else
  step 2/3 "virtual environment: .venv exists ($(.venv/bin/python --version 2>&1))"
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
took "$t"

t=$SECONDS
# torch 2.13.0 CPU: on this machine kind pip takes it from a file on disk (a bare
# 'torch' would pull a multi-GB CUDA build); triton runs kernels on CPU with TRITON_INTERPRET=1.
pip_quiet() {  # pip's own output to .setup/pip.log, one line per file it downloaded; its last lines if it fails
  local from
  touch .setup/pip.log
  from=$(wc -l <.setup/pip.log)
  if ! .venv/bin/python -m pip install --progress-bar off "$@" >>.setup/pip.log 2>&1; then
    echo "setup: pip install $* failed; the last lines of .setup/pip.log:" >&2
    tail -n 15 .setup/pip.log >&2
    exit 1
  fi
  # "Downloading markupsafe-3.0.4-cp311-...whl (22 kB)" -> "downloaded markupsafe 3.0.4 (22 kB)"
  tail -n +"$(( from + 1 ))" .setup/pip.log \
    | sed -n 's/^ *Downloading \([^ ]*\) (\(.*\))$/\1 \2/p' \
    | while read -r file size unit; do
        base=${file##*/}; name=${base%%-*}; rest=${base#*-}; version=${rest%%-*}
        version=${version%.tar.gz}; version=${version%.zip}
        echo "setup:       downloaded $name $version ($size $unit)"
      done
}
step 3/3 "Python packages into .venv (pip's output: .setup/pip.log):"
echo "setup:       torch 2.13.0, CPU build (the largest; the tuner runs on the CPU)"
pip_quiet "torch==2.13.0"
echo "setup:       orch (editable) and its dependencies: fabric, paramiko, invoke,"
echo "setup:       PyYAML, Jinja2, rich, httpx, tenacity, matplotlib (HTML report);"
echo "setup:       test tools: pytest, pytest-xdist, docker-systemctl-replacement,"
echo "setup:       numpy, triton"
pip_quiet -e ".[test]"
took "$t"
.venv/bin/python -c "import torch, triton, fabric, paramiko, yaml, jinja2, rich, httpx, tenacity, numpy, matplotlib; print('setup: ok (torch', torch.__version__, 'triton', triton.__version__ + ') in', $(( SECONDS - t0 )), 's')"
