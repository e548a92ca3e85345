"""Issue 13, case 10: host keys and login settings as OpenSSH (and so Ansible) find them.

One bed host whose sshd also listens on port 2222 and presents a real OpenSSH host certificate
(its key signed by the bed's CA with ``ssh-keygen -s -h``). orch runs with its own HOME and its
own /etc/ssh (private mount), and must:

* trust ``/etc/ssh/ssh_known_hosts`` besides the user's file, writing nothing;
* read hashed entries (``ssh-keygen -H``) and ``[host]:port`` entries;
* follow ~/.ssh/config: a ``Host`` alias with ``HostName``, ``User``, ``Port``, ``IdentityFile``;
  and use the ssh-agent's keys (a real ``ssh-agent``);
* refuse a host listed only under ``@cert-authority`` with a message that says host certificates
  are not supported, never suggesting ``--accept-new-host-keys`` (which would bypass the CA), also
  when that flag is given, writing nothing; OpenSSH itself accepts that certificate, so the
  certificate is real and the refusal is orch's decision;
* refuse a key marked ``@revoked`` even where a plain line lists it;
* name every file searched when it refuses an unknown key.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from tests.waiting import CEILING_S
from tests.e2e.ssh_fleet import check, etc_ssh, events, home, run_orch, sshd_log, write_inventory

pytestmark = pytest.mark.testbed


def _hashed(tmp_path, text: str) -> str:
    f = tmp_path / "to_hash"
    f.write_text(text)
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(f)], check=True, capture_output=True)
    out = f.read_text()
    assert "|1|" in out and not [x for x in out.splitlines() if x and not x.startswith("|1|")], out
    return out


def _bed(testbed_factory, tmp_path):
    """One host (sshd also on port 2222, presenting a CA-signed certificate too), its key, and an
    empty HOME and /etc/ssh for orch."""
    bed = testbed_factory(1, host_options={0: {"sshd_extra_ports": [2222], "host_certificate": True}})
    h = bed.hosts[0]
    h.wait_http("/health")
    kt, b64 = (h.hostdir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return bed, h, kt, b64, home(tmp_path, "home0"), etc_ssh(tmp_path, "etc0")


def test_global_known_hosts_trusted_hashed_entries_revoked_refused_files_named(testbed_factory, tmp_path):
    bed, h, kt, b64, empty, no_global = _bed(testbed_factory, tmp_path)
    # the bed's inventory, but known_hosts as OpenSSH finds them (no orch_known_hosts)
    inv = write_inventory(bed, tmp_path / "hosts.yaml", [h.name], orch_known_hosts=None)

    # unknown key: the refusal names every file searched, user files then global ones
    proc, r = check(inv, tmp_path / "s0", empty, no_global)
    assert proc.returncode == 1 and r["outcome"] == "unreachable", r
    searched = ", ".join([f"{empty}/.ssh/known_hosts (absent)", f"{empty}/.ssh/known_hosts2 (absent)",
                          "/etc/ssh/ssh_known_hosts (absent)", "/etc/ssh/ssh_known_hosts2 (absent)"])
    assert f"unknown host key for {h.address}:22 ({kt} SHA256:" in r["cause"] and searched in r["cause"], r

    # /etc/ssh/ssh_known_hosts (hashed) is trusted; the user's file is neither needed nor written
    glob = etc_ssh(tmp_path, "etc1", known_hosts="# fleet keys\n" + _hashed(tmp_path, f"{h.address} {kt} {b64}\n"))
    proc, r = check(inv, tmp_path / "s1", empty, glob, "--accept-new-host-keys")
    assert proc.returncode == 0 and r["outcome"] == "check", (r, proc.stderr[-3000:])
    assert not (empty / ".ssh" / "known_hosts").exists()

    # @revoked: refused although a plain line lists the same key, also with --accept-new-host-keys
    revoked = tmp_path / "kh_revoked"
    revoked.write_text(f"{h.address} {kt} {b64}\n@revoked * {kt} {b64}\n")
    inv_rev = write_inventory(bed, tmp_path / "rev.yaml", [h.name], orch_known_hosts=str(revoked))
    proc, r = check(inv_rev, tmp_path / "s5", empty, no_global, "--accept-new-host-keys")
    assert proc.returncode == 1 and r["outcome"] == "unreachable", r
    assert f"is REVOKED at {revoked}:2" in r["cause"], r
    assert h.unit_state() == "active"


def test_ssh_config_alias_user_port_identity_file(testbed_factory, tmp_path):
    bed, h, kt, b64, _, no_global = _bed(testbed_factory, tmp_path)
    # ~/.ssh/config: alias -> HostName, User (the non-root login, with become), Port 2222, IdentityFile;
    # the user's known_hosts holds only a hashed [host]:2222 entry, so port 22 would be refused
    alias_home = home(tmp_path, "home1", ssh_config=(
        f"Host gpu-alias\n    HostName {h.address}\n    User {bed.login_user}\n    Port 2222\n"
        f"    IdentityFile {bed.key_path}\n"),
        files={"known_hosts": _hashed(tmp_path, f"[{h.address}]:2222 {kt} {b64}\n")})
    inv_alias = write_inventory(bed, tmp_path / "alias.yaml", [h.name], orch_known_hosts=None,
                                host_vars={"ansible_host": "gpu-alias", "ansible_user": None, "ansible_port": None,
                                           "ansible_ssh_private_key_file": None},
                                ansible_become=True, ansible_become_password=bed.become_password, orch_bench=False)
    # a full tune: its readiness check reaches the server at the alias's HostName too
    proc, res = run_orch("tune", str(inv_alias), "--service", "sglang-qwen", state=tmp_path / "s2",
                         home_dir=alias_home, etc=no_global)
    assert proc.returncode == 0 and res["hosts"][h.name]["outcome"] == "completed", proc.stderr[-3000:]
    assert h.unit_state() == "active"
    assert f"Accepted publickey for {bed.login_user} from" in sshd_log(h)
    connected = [e for e in events(res) if e["event"] == "task" and e["module"] == "connect"]
    assert connected and connected[0]["data"]["user"] == bed.login_user, connected
    # the same key listed for port 22 only does not vouch for port 2222 (and shows where orch went)
    (alias_home / ".ssh" / "known_hosts").write_text(f"{h.address} {kt} {b64}\n")
    proc, r = check(inv_alias, tmp_path / "s2b", alias_home, no_global)
    assert r["outcome"] == "unreachable" and f"unknown host key for {h.address}:2222 " in r["cause"], r
    assert f"[{h.address}]:2222 is not in {alias_home}/.ssh/known_hosts," in r["cause"], r


def test_ssh_agent_keys_used(testbed_factory, tmp_path):
    bed, h, kt, b64, _, no_global = _bed(testbed_factory, tmp_path)
    # keys of the ssh-agent (a real ssh-agent holding the bed's key; no key file anywhere)
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.run(["ssh-agent", "-a", sock, "-s"], check=True, capture_output=True, text=True).stdout
    agent_pid = int(re.search(r"SSH_AGENT_PID=(\d+)", agent).group(1))
    try:
        subprocess.run(["ssh-add", "-q", str(bed.key_path)], check=True, capture_output=True,
                       env=dict(os.environ, SSH_AUTH_SOCK=sock))
        agent_home = home(tmp_path, "home2", files={"known_hosts": f"{h.address} {kt} {b64}\n"})
        inv_agent = write_inventory(bed, tmp_path / "agent.yaml", [h.name], orch_known_hosts=None,
                                    host_vars={"ansible_ssh_private_key_file": None})
        proc, r = check(inv_agent, tmp_path / "s3", agent_home, no_global, agent_sock=sock)
        assert proc.returncode == 0 and r["outcome"] == "check", (r, proc.stderr[-3000:])
        proc, r = check(inv_agent, tmp_path / "s3b", agent_home, no_global)  # no agent: no key at all
        assert r["outcome"] == "unreachable" and "authentication failed as root" in r["cause"], r
    finally:
        os.kill(agent_pid, signal.SIGTERM)


def test_cert_authority_host_refused_as_unsupported_never_bypassed(testbed_factory, tmp_path):
    bed, h, _, _, empty, no_global = _bed(testbed_factory, tmp_path)
    # @cert-authority: OpenSSH verifies the certificate (so it is a real one) ...
    ca_file = tmp_path / "kh_ca"
    ca_file.write_text(f"@cert-authority {h.address},[{h.address}]:2222 {bed.host_ca_public()}\n")
    ssh = subprocess.run(["ssh", "-i", str(bed.key_path), "-o", f"UserKnownHostsFile={ca_file}",
                          "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                          "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"root@{h.address}", "echo via-cert"],
                         capture_output=True, text=True, timeout=CEILING_S)  # a hang guard only
    assert ssh.returncode == 0 and ssh.stdout.strip() == "via-cert", ssh.stderr
    # ... orch cannot, and says so; the flag that would bypass the CA changes nothing
    inv_ca = write_inventory(bed, tmp_path / "ca.yaml", [h.name], orch_known_hosts=str(ca_file))
    before = ca_file.read_bytes()
    for flags in ((), ("--accept-new-host-keys",)):
        proc, r = check(inv_ca, tmp_path / f"s4{len(flags)}", empty, no_global, *flags)
        assert proc.returncode == 1 and r["outcome"] == "unreachable", r
        cause = r["cause"]
        assert "host certificates are not supported" in cause and f"@cert-authority line ({ca_file}:1)" in cause, cause
        assert "accept-new" not in cause, cause
        assert ca_file.read_bytes() == before
