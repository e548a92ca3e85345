"""Issue 13, case 9: a GPU host reachable only through a bastion (login node).

The bed's ``gpu-a`` admits SSH logins only from the ``bastion`` (``ssh_only_via``: a private link
between the two namespaces, and ``AllowUsers root@<bastion's link address> ...`` in gpu-a's
sshd), so the controller's direct path is refused by gpu-a itself, and a login that reached it
must have come through the bastion. The three ways to name the jump host work (``ProxyJump`` in
~/.ssh/config, ``ansible_ssh_common_args: -o ProxyJump=...``, the ``orch_jump_host`` variable with
its own user/key/port), each hop's key is checked like the host's (an unknown or changed bastion
key is refused; ``--accept-new-host-keys`` adds both real keys), and an option orch does not read in
``ansible_ssh_common_args`` is refused by name before anything connects.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.ssh_fleet import check, etc_ssh, events, home, run_orch, sshd_log, write_inventory

pytestmark = pytest.mark.testbed

OPTIONS = {"bastion": {"start_unit": False, "strays": False},
           "gpu-a": {"ssh_only_via": "bastion"}}


def _accepted(h, user="root") -> list[str]:
    """Source addresses of the accepted logins in the host's sshd log, in order."""
    return re.findall(rf"Accepted publickey for {user} from (\S+) port", sshd_log(h))


# a tune logs in to each host once: the read-only pass that finds multi-node servers' ranks
# (orchestrator/cli/run.py find_servers) leaves its connection open and the play takes it over
# (RunOptions.connections); before, the play logged in a second time
LOGINS_PER_RUN = 1
# ... but the bastion once: orch logs in to a jump host once per process and every pass (and every
# host behind it) opens its channel over that login (orchestrator/connection/ssh.py _SharedHop)
BASTION_LOGINS_PER_RUN = 1


def _key_line(bed, h) -> str:
    return next(x for x in bed.known_hosts_path.read_text().splitlines() if x.split()[0] == h.address)


def test_bastion_jump_host_three_ways_keys_checked_on_every_hop(testbed_factory, tmp_path):
    bed = testbed_factory(2, names=["bastion", "gpu-a"], host_options=OPTIONS)
    bastion, gpu = bed.hosts
    gpu.wait_http("/health")
    key = bed.key_path
    etc = etc_ssh(tmp_path, "etc")  # no /etc/ssh/ssh_known_hosts: only the files named below count
    empty_home = home(tmp_path, "home0")

    # the direct path: gpu-a itself refuses the controller (the login does not come from the bastion)
    inv = write_inventory(bed, tmp_path / "direct.yaml", ["gpu-a"])
    proc, r = check(inv, tmp_path / "s0", empty_home, etc)
    assert proc.returncode == 1 and r["outcome"] == "unreachable", (r, proc.stderr[-3000:])
    assert "authentication failed as root" in r["cause"], r
    assert f"User root from {gpu.address.rsplit('.', 1)[0]}.1 not allowed because not listed in AllowUsers" \
        in sshd_log(gpu)
    assert _accepted(gpu) == []

    # 1. ProxyJump in ~/.ssh/config; the bastion's user, address and key from its own Host entry
    h1 = home(tmp_path, "home1", ssh_config=(
        f"Host {gpu.address}\n    ProxyJump jumpbox\n"
        f"Host jumpbox\n    HostName {bastion.address}\n    User root\n    IdentityFile {key}\n"))
    proc, r = check(inv, tmp_path / "s1", h1, etc)
    assert proc.returncode == 0 and r["outcome"] == "check", (r, proc.stderr[-3000:])
    assert _accepted(gpu) == [gpu.link_peer] * LOGINS_PER_RUN, sshd_log(gpu)  # it came through the bastion's link
    assert _accepted(bastion) == [f"{bastion.address.rsplit('.', 1)[0]}.1"] * BASTION_LOGINS_PER_RUN, \
        sshd_log(bastion)

    # 2. ansible_ssh_common_args -o ProxyJump (Ansible's own way); the hop logs in with ~/.ssh/id_ed25519
    h2 = home(tmp_path, "home2", files={"id_ed25519": key})
    inv2 = write_inventory(bed, tmp_path / "common.yaml", ["gpu-a"],
                           ansible_ssh_common_args=f"-o ProxyJump=root@{bastion.address}")
    proc, r = check(inv2, tmp_path / "s2", h2, etc)
    assert proc.returncode == 0 and r["outcome"] == "check", (r, proc.stderr[-3000:])
    assert _accepted(gpu) == [gpu.link_peer] * (2 * LOGINS_PER_RUN)

    # 3. orch_jump_host with its own user, port and key; a full tune (payload up, tuned files down)
    inv3 = write_inventory(bed, tmp_path / "var.yaml", ["gpu-a"], orch_jump_host=f"root@{bastion.address}:22",
                           orch_jump_private_key_file=str(key), orch_bench=False)
    proc, res = run_orch("tune", str(inv3), "--service", "sglang-qwen", state=tmp_path / "s3", home_dir=empty_home,
                         etc=etc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert res["hosts"]["gpu-a"]["outcome"] == "completed", res["hosts"]["gpu-a"]
    assert gpu.unit_state() == "active"
    tuned = list((Path(res["run_dir"]) / "hosts" / "gpu-a" / "configs").glob("E=8,N=64,*.json"))
    assert len(tuned) == 2 and all(json.loads(p.read_text()) for p in tuned), tuned
    assert set(_accepted(gpu)) == {gpu.link_peer}
    assert any(e["event"] == "task" and e["module"] == "connect" and e["status"] == "ok" for e in events(res))

    # the bastion's key is checked like the host's: unknown -> refused, naming the hop and the files
    only_gpu = tmp_path / "kh_gpu_only"
    only_gpu.write_text(_key_line(bed, gpu) + "\n")
    before = len(_accepted(gpu))
    proc, r = check(write_inventory(bed, tmp_path / "unknown.yaml", ["gpu-a"], orch_known_hosts=str(only_gpu)),
                    tmp_path / "s4", h1, etc)
    assert proc.returncode == 1 and r["outcome"] == "unreachable", r
    cause = r["cause"]
    assert f"unknown host key for jump host jumpbox ({bastion.address}:22)" in cause, cause
    assert f"{only_gpu}, /etc/ssh/ssh_known_hosts (absent), /etc/ssh/ssh_known_hosts2 (absent)" in cause, cause
    assert len(_accepted(gpu)) == before, "nothing reached gpu-a"
    assert only_gpu.read_text() == _key_line(bed, gpu) + "\n"

    # changed bastion key: refused, also with --accept-new-host-keys, file untouched
    other = tmp_path / "otherkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = other.with_suffix(".pub").read_text().split()
    changed = tmp_path / "kh_changed"
    changed.write_text(f"{_key_line(bed, gpu)}\n{bastion.address} {pub[0]} {pub[1]}\n")
    inv5 = write_inventory(bed, tmp_path / "changed.yaml", ["gpu-a"], orch_known_hosts=str(changed))
    for flags in ((), ("--accept-new-host-keys",)):
        proc, r = check(inv5, tmp_path / f"s5{len(flags)}", h1, etc, *flags)
        assert proc.returncode == 1 and r["outcome"] == "unreachable", r
        assert f"host key for jump host jumpbox ({bastion.address}:22) CHANGED" in r["cause"], r
    assert changed.read_text() == f"{_key_line(bed, gpu)}\n{bastion.address} {pub[0]} {pub[1]}\n"
    assert len(_accepted(gpu)) == before

    # --check --accept-new-host-keys: both hops are reached, their keys trusted for that run only
    # (check mode writes nothing, known_hosts included); `orch runs --accept-new-host-keys` adds
    # both real keys, trusted afterwards without the flag
    fresh = tmp_path / "kh_fresh"
    inv6 = write_inventory(bed, tmp_path / "fresh.yaml", ["gpu-a"], orch_known_hosts=str(fresh))
    proc, r = check(inv6, tmp_path / "s6", h1, etc, "--accept-new-host-keys")
    assert proc.returncode == 0 and r["outcome"] == "check", (r, proc.stderr[-3000:])
    assert not fresh.exists()
    said = " ".join(proc.stderr.split())
    assert said.count("check mode: accepted the new host key of") == 2, proc.stderr[-3000:]
    proc, _res = run_orch("runs", str(inv6), "--accept-new-host-keys", state=tmp_path / "s6r", home_dir=h1, etc=etc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(fresh.read_text().splitlines()) == sorted([_key_line(bed, bastion), _key_line(bed, gpu)])
    proc, r = check(inv6, tmp_path / "s7", h1, etc)
    assert proc.returncode == 0 and len(fresh.read_text().splitlines()) == 2

    # an option orch does not read is refused by name, before anything connects
    seen = (sshd_log(bastion), sshd_log(gpu))
    inv8 = write_inventory(bed, tmp_path / "bad.yaml", ["gpu-a"],
                           ansible_ssh_common_args=f"-J root@{bastion.address} -o StrictHostKeyChecking=no")
    proc, res = run_orch("tune", str(inv8), "--service", "sglang-qwen", "--check", state=tmp_path / "s8",
                         home_dir=h1, etc=etc)
    assert proc.returncode == 2 and res is None, (proc.returncode, proc.stdout[-2000:])
    assert "ansible_ssh_common_args: unsupported option -o StrictHostKeyChecking" in proc.stderr, proc.stderr[-2000:]
    assert f"{inv8}:" in proc.stderr
    assert (sshd_log(bastion), sshd_log(gpu)) == seen
    assert gpu.unit_state() == "active"


# Issue 21 row 9 (paramiko #664, #528, fabric #1992): many hosts behind one bastion at once. The
# bastion's sshd drops every unauthenticated connection past 2 (MaxStartups 2:100:2; OpenSSH's
# default 10:30:100 starts dropping at 10), so one bastion login per host, all at once (--forks),
# gets most of them "Error reading SSH protocol banner". orch logs in to the bastion once and
# opens every host's channel over that login.
BEHIND = 6
CROWD = {"bastion": {"start_unit": False, "strays": False, "sshd_max_startups": "2:100:2"},
         **{f"gpu-{i}": {"ssh_only_via": "bastion", "start_unit": False, "strays": False} for i in range(BEHIND)}}


def test_many_hosts_through_one_bastion_with_small_max_startups(testbed_factory, tmp_path):
    names = ["bastion"] + [f"gpu-{i}" for i in range(BEHIND)]
    bed = testbed_factory(len(names), names=names, host_options=CROWD)
    bastion, gpus = bed.hosts[0], bed.hosts[1:]
    etc = etc_ssh(tmp_path, "etc")
    inv = write_inventory(bed, tmp_path / "crowd.yaml", names[1:], orch_jump_host=f"root@{bastion.address}",
                          orch_jump_private_key_file=str(bed.key_path))
    proc, res = run_orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--forks", str(BEHIND),
                         state=tmp_path / "s", home_dir=home(tmp_path, "home"), etc=etc)
    hosts = (res or {}).get("hosts") or {}
    assert sorted(hosts) == names[1:], (proc.returncode, proc.stderr[-3000:])
    assert {n: r["outcome"] for n, r in hosts.items()} == {n: "check" for n in names[1:]}, \
        ({n: r.get("cause") for n, r in hosts.items()}, sshd_log(bastion))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for g in gpus:  # each host was logged in to, through the bastion's link, once per run
        assert _accepted(g) == [g.link_peer] * LOGINS_PER_RUN, (g.name, sshd_log(g))
    log = sshd_log(bastion)
    assert _accepted(bastion) == [f"{bastion.address.rsplit('.', 1)[0]}.1"] * BASTION_LOGINS_PER_RUN, log
    assert "past MaxStartups" not in log, log
