#!/usr/bin/env bash
# Set up orch on a fresh Debian 12 machine (run as root), in three steps, each printed with what
# it installs and how long it took:
#   1. system packages: openssh (the test bed's hosts run their own sshd), iproute2/util-linux
#      (network namespaces), psmisc/lsof/procps, chromium (the HTML report's screenshot test) and
#      sudo (the test bed's non-root login `orchop` uses it: become);
#   2. a virtual environment in .venv;
#   3. Python packages into it: torch (CPU build), then orch (editable) with its dependencies and
#      the test tools.
# Idempotent: a second run only checks (pip still looks, a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf 'setup: [%s] %s\n' "$1" "$2"; }
took() { printf 'setup:       done in %d s\n' "$(( SECONDS - $1 ))"; }
t0=$SECONDS

t=$SECONDS
need_apt=()
for bin in /usr/sbin/sshd /usr/bin/fuser /usr/bin/lsof /usr/sbin/ip /usr/bin/unshare /usr/bin/nsenter /usr/bin/chromium \
           /usr/bin/sudo /usr/sbin/visudo; do
  [ -x "$bin" ] || need_apt+=("$bin")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  step 1/3 "system packages: installing openssh-server openssh-client iproute2 psmisc lsof util-linux procps chromium sudo with apt (missing: ${need_apt[*]}; chromium is the largest, a few minutes on a fresh machine)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends openssh-server openssh-client iproute2 psmisc lsof util-linux procps chromium sudo >/dev/null
else
  step 1/3 "system packages: present (openssh, iproute2, util-linux, psmisc, lsof, procps, chromium, sudo)"
fi
[ -f tests/testbed/setup.sh ] && sh tests/testbed/setup.sh | sed 's/^/setup:       /'
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
step 3/3 "Python packages: torch 2.13.0 (CPU build, the largest)"
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
step 3/3 "Python packages: orch (editable) with fabric, paramiko, invoke, PyYAML, Jinja2, rich, httpx, tenacity, matplotlib; test tools pytest, pytest-xdist, docker-systemctl-replacement, numpy, triton"
.venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
took "$t"
.venv/bin/python -c "import torch, triton, fabric, paramiko, yaml, jinja2, rich, httpx, tenacity, numpy, matplotlib; print('setup: ok (torch', torch.__version__, 'triton', triton.__version__ + ') in', $(( SECONDS - t0 )), 's')"
