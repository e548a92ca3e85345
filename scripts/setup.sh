#!/usr/bin/env bash
# Set up orch on a fresh Debian 12 machine (run as root): system packages for the
# test bed, a virtual environment in .venv with orch, torch (CPU) and triton.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for bin in /usr/sbin/sshd /usr/bin/fuser /usr/bin/lsof /usr/sbin/ip /usr/bin/unshare /usr/bin/nsenter /usr/bin/chromium \
           /usr/bin/sudo /usr/sbin/visudo; do
  [ -x "$bin" ] || need_apt+=("$bin")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing system packages (missing: ${need_apt[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends openssh-server openssh-client iproute2 psmisc lsof util-linux procps chromium sudo >/dev/null
fi
[ -f tests/testbed/setup.sh ] && bash tests/testbed/setup.sh

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch 2.13.0 CPU: on this machine kind pip takes it from a file on disk (a bare
# 'torch' would pull a multi-GB CUDA build); triton runs kernels on CPU with TRITON_INTERPRET=1.
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e ".[test,report]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, triton, fabric, paramiko, yaml, jinja2, rich, httpx, numpy; print('setup: ok (torch', torch.__version__, 'triton', triton.__version__ + ')')"
