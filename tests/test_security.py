"""Security (issue 7): host keys, secrets in records, payload integrity, permissions.

Run against a test-bed host over real SSH (Paramiko) in check mode, which connects, reads
the unit, pushes and verifies the payload and probes, so every check below goes through
the same code as a real run.
"""

from __future__ import annotations

import json
import secrets
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.payload_bundle import build_bundle
from tests.e2e_helpers import inventory, orch, recap

pytestmark = pytest.mark.testbed


def _check(inv, state, *flags):
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", *flags, state_dir=state)
    return proc, recap(proc)


def test_host_keys_unknown_refused_accept_new_adds_only_new_changed_always_refused(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    real_line = next(x for x in bed.known_hosts_path.read_text().splitlines() if x.split()[0] == h.address)
    kh = tmp_path / "known_hosts"

    # unknown key: refused, nothing written
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_known_hosts=str(kh))
    proc, res = _check(inv, tmp_path / "s1")
    assert proc.returncode == 1
    r = res["hosts"][h.name]
    assert r["outcome"] == "unreachable" and "unknown host key" in r["cause"] and str(kh) in r["cause"], r
    assert not kh.exists()

    # --accept-new-host-keys: exactly the host's real key is added, then it is trusted without the flag
    proc, res = _check(inv, tmp_path / "s2", "--accept-new-host-keys")
    assert proc.returncode == 0 and res["hosts"][h.name]["outcome"] == "check", proc.stderr[-3000:]
    lines = kh.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split() == real_line.split(), (lines, real_line)
    proc, res = _check(inv, tmp_path / "s3")
    assert proc.returncode == 0
    assert kh.read_text().splitlines() == lines, "a known key is never written again"

    # changed key: always refused with a clear message, also with --accept-new-host-keys; file untouched
    other = tmp_path / "otherkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = other.with_suffix(".pub").read_text().split()
    kh.write_text(f"{h.address} {pub[0]} {pub[1]}\n# an operator's comment\n")
    before = kh.read_bytes()
    for flags in ((), ("--accept-new-host-keys",)):
        proc, res = _check(inv, tmp_path / f"s4{len(flags)}", *flags)
        assert proc.returncode == 1
        r = res["hosts"][h.name]
        assert r["outcome"] == "unreachable" and "CHANGED" in r["cause"] and str(kh) in r["cause"], r
        assert kh.read_bytes() == before
    assert h.unit_state() == "active"


def test_secrets_never_recorded_and_run_folders_private(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    secret = "S3cr3t-" + secrets.token_hex(8)
    state = tmp_path / "state"
    # become with a password: the bed has no sudo, so the run may fail at the first root step;
    # either way the password must appear nowhere
    inv = inventory(bed, tmp_path / "hosts.yaml", ansible_become=True, ansible_become_password=secret)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", "-v", state_dir=state)
    res = recap(proc)
    assert res["hosts"][h.name]["outcome"] in ("check", "failed"), res
    assert secret not in proc.stdout and secret not in proc.stderr
    # a real (non-check) run without become: its host record and controller record
    inv = inventory(bed, tmp_path / "hosts.yaml", ansible_become_password=secret, orch_bench=False)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = recap(proc)["run_id"]
    assert secret not in proc.stdout and secret not in proc.stderr
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in files)
    for p in files:
        assert secret.encode() not in p.read_bytes(), p
    host_hits = h.sh(f"grep -rl {secret} /var/lib/orch /tmp /root", check=False).stdout.strip()
    assert not host_hits, host_hits
    # run folders: 0700 on the controller and on the host
    run_dir = state / "runs" / run_id
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for path in ("/var/lib/orch", f"/var/lib/orch/runs/{run_id}", "/var/lib/orch/payload"):
        mode = h.sh(f"stat -c %a {path}").stdout.strip()
        assert mode == "700", (path, mode)
    assert h.sh(f"stat -c %U /var/lib/orch/runs/{run_id}").stdout.strip() == "root"


def test_payload_verified_by_checksum_before_it_runs(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml")
    root = f"/var/lib/orch/payload/{build_bundle().short}"

    def rollback(state):  # a real run that pushes the payload and changes nothing (no run to undo)
        proc = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
        assert proc.returncode == 0, proc.stderr[-3000:]
        res = recap(proc)
        return [json.loads(x) for x in (Path(res["run_dir"]) / "events.jsonl").read_text().splitlines()]

    events = rollback(tmp_path / "s1")
    assert not [e for e in events if e["event"] == "payload_tampered"]
    assert h.sh(f"test -f {root}/.verified", check=False).returncode == 0
    tree = h.file_tree_hash(root)
    assert not [p for p in tree if "__pycache__" in p], "running the payload adds nothing to its tree"
    # tamper: change one file and add one
    h.sh(f"echo 'import os; os.system(\"touch /tmp/orch-tampered\")' >> {root}/remote/names.py; "
         f"echo x > {root}/remote/evil.py")
    events = rollback(tmp_path / "s2")
    tampered = [e for e in events if e["event"] == "payload_tampered"]
    assert tampered and {"remote/names.py", "remote/evil.py"} <= set(tampered[0]["files"]), tampered
    assert h.file_tree_hash(root) == tree, "the payload was pushed again from the verified bundle"
    assert h.sh("test -e /tmp/orch-tampered", check=False).returncode != 0
