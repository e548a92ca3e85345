"""Issue 13, case 11: a hardened sshd without the SFTP subsystem (no ``Subsystem sftp`` line).

orch copies files over the exec channel instead (``cat > FILE`` with the bytes on stdin, ``cat FILE``
back, both checked with sha256sum), keeping the become staging (``mktemp -d`` of the login user,
``sudo install``) and the payload's checksum check. A full tune as the non-root login pushes the
payload and the install request up and fetches the tuned files down that way. When a copy fails
while the link is fine (here: the host's /tmp is full), the host is reported failed with the
real reason, not unreachable, and nothing was stopped.
"""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from tests.e2e.helpers import flat, inventory, orch, recap
from tests.testbed.bed import SUDO_LOG
from tests.waiting import CEILING_S

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


def _login_inventory(bed, path, **group_vars):
    return inventory(bed, path, host_vars={h.name: {"ansible_user": bed.login_user} for h in bed.hosts},
                     ansible_become=True, ansible_become_password=bed.become_password, **group_vars)


def _no_sftp_proven(bed, h):
    """OpenSSH's sftp client is refused by the host's sshd (the subsystem is not configured)."""
    proc = subprocess.run(["sftp", "-b", "-", "-i", str(bed.key_path), "-o", f"UserKnownHostsFile={bed.known_hosts_path}",
                           "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                           "-o", "BatchMode=yes", f"root@{h.address}"], input="pwd\n", capture_output=True, text=True,
                          timeout=CEILING_S)  # a hang guard only
    assert proc.returncode != 0 and "subsystem request failed" in proc.stderr, (proc.returncode, proc.stderr)
    assert "Subsystem" not in h.sh("cat /run/orchtb/sshd_config").stdout


def test_tune_without_sftp_copies_over_the_exec_channel(testbed_factory, tmp_path):
    bed = testbed_factory(1, host_options={0: {"sftp": False}})
    h = bed.hosts[0]
    h.wait_http("/health")
    _no_sftp_proven(bed, h)
    state = tmp_path / "state"
    inv = _login_inventory(bed, tmp_path / "hosts.yaml", orch_bench=False)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "-v", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
    assert "no SFTP on this host" in flat(proc.stderr) and "copying files over the exec channel" in flat(proc.stderr)

    # installed, loaded, and the tuned files came back whole (what the host has, byte for byte)
    fetched = state / "runs" / res["run_id"] / "hosts" / h.name / "configs"
    for name in (UP, DOWN):
        on_host = h.sh(f"cat {shlex.quote(h.triton_dir + '/' + name)}").stdout
        assert json.loads(on_host) and (fetched / name).read_text() == on_host, name
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
    assert h.unit_state() == "active"
    # the become staging was used both ways, and nothing staged is left
    commands = [x.split("COMMAND=", 1)[1] for x in h.sh(f"cat {SUDO_LOG}").stdout.splitlines() if "COMMAND=" in x]
    assert any(c.startswith("/usr/bin/install -m 0600 -T -- /tmp/orch-xfer.") and c.endswith(".tar.gz")
               for c in commands), commands
    assert any(c.startswith("/usr/bin/install -m 0644 -T -- /var/lib/orch/work/") and UP in c for c in commands)
    assert not [p for p in h.sh("ls -A /tmp").stdout.split() if p.startswith("orch-xfer.")]


def test_copy_failure_without_sftp_is_a_failed_host_with_the_reason_nothing_stopped(testbed_factory, tmp_path):
    bed = testbed_factory(1, host_options={0: {"sftp": False}})
    h = bed.hosts[0]
    h.wait_http("/health")
    pid = h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip()
    configs = h.file_tree_hash(h.config_dir)
    # the host's /tmp (where the login user stages uploads) is a 64 KiB tmpfs: the payload does not fit
    h.sh("mount -t tmpfs -o size=64k,mode=1777 orchtb-full-tmp /tmp")
    try:
        inv = _login_inventory(bed, tmp_path / "hosts.yaml")
        proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
        assert proc.returncode == 1, proc.stderr[-4000:]
        r = recap(proc)["hosts"][h.name]
        assert r["outcome"] == "failed", r
        assert "over the exec channel failed" in r["cause"] and "No space left on device" in r["cause"], r
        assert "unreachable" not in r["cause"].lower()
        assert not [p for p in h.sh("ls -A /tmp").stdout.split() if p.startswith("orch-xfer.")]
    finally:
        h.sh("umount /tmp")
    assert h.unit_state() == "active"
    assert h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip() == pid, "the unit was never stopped"
    assert h.file_tree_hash(h.config_dir) == configs
    assert "systemctl stop" not in h.sh(f"cat {SUDO_LOG}").stdout
