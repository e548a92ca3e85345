"""``tests/testbed/setup.sh`` (run by ``scripts/setup.sh``) says what it installs and why, keeps
apt's output out of the terminal, records what it installed for ``demo.sh down``, and disables
again the systemd units podman's package enabled. apt-get, dpkg-query and systemctl are stand-ins
on PATH here (the machine's packages are left alone); the script's other tools are the machine's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.paths import REPO

STUBS = {
    # the packages named in $MISSING are not installed; podman's file list names its units
    "dpkg-query": """#!/bin/sh
if [ "$1" = "-L" ]; then
  printf '%s\\n' /usr/bin/podman /lib/systemd/system/podman.service /lib/systemd/system/podman.socket \\
    /lib/systemd/system/podman-auto-update.timer /lib/systemd/system/podman-kube@.service
  exit 0
fi
pkg=$3
case " $MISSING " in *" $pkg "*) exit 1 ;; esac
printf 'install ok installed'
""",
    "apt-get": """#!/bin/sh
echo "apt-get $*" >>"$CALLS"
i=0; while [ $i -lt 60 ]; do echo "Get:$i http://deb.debian.org/debian bookworm/main amd64 APT-NOISE"; i=$((i+1)); done
case "$1" in install)
  echo "18 newly installed, 0 to remove and 0 not upgraded."
  echo "Need to get 75.3 MB of archives."
  echo "After this operation, 300 MB of additional disk space will be used." ;;
esac
""",
    "systemctl": """#!/bin/sh
echo "systemctl $*" >>"$CALLS"
case "$1 $2" in
  "is-enabled podman.socket"|"is-enabled podman-auto-update.timer") echo enabled ;;
  is-enabled*) echo disabled ;;
esac
""",
}


def _run(tmp_path: Path, missing: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls, setup = tmp_path / "calls", tmp_path / "setup"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", MISSING=missing, CALLS=str(calls),
               ORCH_SETUP_DIR=str(setup))
    proc = subprocess.run(["sh", str(REPO / "tests" / "testbed" / "setup.sh")], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc, calls, setup


def test_groups_with_why_apt_to_a_log_podman_units_disabled_and_named(tmp_path):
    proc, calls, setup = _run(tmp_path, "numactl podman crun")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "APT-NOISE" not in out + proc.stderr  # apt's output: in the log only
    assert (setup / "apt.log").read_text().count("APT-NOISE") == 120
    lines = out.splitlines()
    # 80 columns with setup's prefix, the test's long temporary folder aside (.setup/ in a checkout)
    wide = [ln for ln in lines if len(ln.replace(str(setup), ".setup")) > 67]
    assert not wide, wide
    assert "podman crun fuse-overlayfs (to install: podman crun)" in lines
    assert "  container hosts run the stand-in in a podman container" in lines
    assert "numactl (to install: numactl)" in lines and "chromium (present)" in lines
    assert "installing with apt-get: numactl podman crun" in lines and f"  (apt's output: {setup / 'apt.log'})" in lines
    assert "  18 packages with their dependencies," in lines and "  downloaded: 75.3 MB; on disk: 300 MB" in lines
    assert (setup / "installed-packages").read_text().split() == ["numactl", "podman", "crun"]
    # the units podman's install enabled are named and disabled; the others are left alone
    assert "podman's package enabled podman.socket podman-auto-update.timer:" in lines
    said = calls.read_text().splitlines()
    assert any(c.startswith("systemctl disable") and c.endswith("podman.socket podman-auto-update.timer")
               for c in said), said
    assert "apt-get install -y -q --no-install-recommends numactl podman crun" in said


def test_nothing_missing_installs_nothing_and_disables_nothing(tmp_path):
    proc, calls, setup = _run(tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stdout and "(present)" in proc.stdout
    assert not calls.exists() and not (setup / "installed-packages").exists()
    assert proc.stdout.splitlines()[-1] == "test bed prerequisites present"
