"""Where orch connects, as whom, with which keys, through which jump hosts, trusting which known_hosts
files (orchestrator/connection/route.py): inventory variables over ~/.ssh/config, as OpenSSH would.
The ssh_config is parsed by Paramiko's SSHConfig, as Fabric loads it."""

from __future__ import annotations

import os

import paramiko
import pytest

from orchestrator.connection.route import (DEFAULT_GLOBAL_KNOWN_HOSTS, DEFAULT_USER_KNOWN_HOSTS, RouteError,
                                           resolve_route)

HOME = os.path.expanduser("~")

CONFIG = """
Host gpu-alias
    HostName 10.1.0.5
    User ops
    Port 2222
    IdentityFile ~/.ssh/gpu_key
Host pinned
    HostName 10.1.0.6
    HostKeyAlias gpu-pinned
    IdentitiesOnly yes
    UserKnownHostsFile ~/.ssh/fleet_hosts ~/.ssh/more_hosts
    GlobalKnownHostsFile /etc/ssh/fleet_global
Host noagent
    IdentityAgent none
Host behind-*
    ProxyJump bastion
Host bastion
    HostName 10.9.0.1
    User jump
    Port 2200
    IdentityFile ~/.ssh/bastion_key
Host inner
    ProxyJump outer
Host outer
    HostName 10.9.0.2
    ProxyJump none
Host loop-a
    ProxyJump loop-b
Host loop-b
    ProxyJump loop-a
Host viacommand
    ProxyCommand ssh -W %h:%p bastion
Host commandnone
    ProxyCommand none
"""


def route(name, cfg=CONFIG, **hv):
    return resolve_route(name, hv, paramiko.SSHConfig.from_text(cfg))


def test_ssh_config_alias_user_port_identity_file():
    t = route("gpu-alias").target
    assert (t.host, t.port, t.user) == ("10.1.0.5", 2222, "ops")
    assert t.key_files == (f"{HOME}/.ssh/gpu_key",) and not t.look_for_keys and t.allow_agent
    assert t.key_name == "[10.1.0.5]:2222" and t.label == "10.1.0.5:2222"
    assert t.user_known_hosts == tuple(os.path.expanduser(p) for p in DEFAULT_USER_KNOWN_HOSTS)
    assert t.global_known_hosts == DEFAULT_GLOBAL_KNOWN_HOSTS


def test_inventory_values_win_over_ssh_config_as_on_the_ssh_command_line():
    t = route("gpu-alias", ansible_port=22, ansible_user="root", ansible_ssh_private_key_file="/k/inv").target
    assert (t.host, t.port, t.user) == ("10.1.0.5", 22, "root")
    assert t.key_files == ("/k/inv", f"{HOME}/.ssh/gpu_key")  # -i first, then IdentityFile
    assert t.key_name == "10.1.0.5"
    t = route("gpu-x", ansible_host="gpu-alias").target  # ansible_host is the name looked up
    assert (t.host, t.port) == ("10.1.0.5", 2222)


def test_no_setting_anywhere_means_port_22_default_keys_and_the_agent():
    t = route("10.2.0.1").target
    assert (t.host, t.port, t.user) == ("10.2.0.1", 22, None)
    assert t.key_files == () and t.look_for_keys and t.allow_agent


def test_known_hosts_files_host_key_alias_identities_only():
    t = route("pinned").target
    assert t.key_name == "gpu-pinned"
    assert t.user_known_hosts == (f"{HOME}/.ssh/fleet_hosts", f"{HOME}/.ssh/more_hosts")
    assert t.global_known_hosts == ("/etc/ssh/fleet_global",)
    assert not t.allow_agent  # IdentitiesOnly: only the files named
    t = route("pinned", orch_known_hosts="/srv/kh").target
    assert t.user_known_hosts == ("/srv/kh",) and t.known_hosts_files == ("/srv/kh", "/etc/ssh/fleet_global")
    assert not route("noagent").target.allow_agent


def test_proxy_jump_from_ssh_config_hop_resolved_by_its_own_entry():
    r = route("behind-1")
    assert r.jump_source == "~/.ssh/config"
    (hop,) = r.hops
    assert (hop.host, hop.port, hop.user) == ("10.9.0.1", 2200, "jump")
    assert hop.key_files == (f"{HOME}/.ssh/bastion_key",)
    assert hop.key_name == "[10.9.0.1]:2200" and hop.label == "jump host bastion (10.9.0.1:2200)"
    assert r.target.host == "behind-1"


def test_common_args_jump_overrides_ssh_config_and_none_disables_it():
    r = route("behind-1", ansible_ssh_common_args="-J ops@10.9.0.7:22")
    assert r.jump_source == "ansible_ssh_common_args"
    assert [(h.host, h.port, h.user) for h in r.hops] == [("10.9.0.7", 22, "ops")]
    r = route("behind-1", ansible_ssh_common_args="-o ProxyJump=none")
    assert r.hops == () and r.jump_source is None
    # the inventory's -i is for the destination only; a jump host named by its alias gets its own entry
    r = route("10.2.0.1", ansible_ssh_common_args="-o ProxyJump=bastion", ansible_ssh_private_key_file="/k/inv")
    assert r.hops[0].key_files == (f"{HOME}/.ssh/bastion_key",) and r.target.key_files == ("/k/inv",)


def test_orch_jump_host_wins_and_its_key_applies_to_its_hops_only():
    r = route("behind-1", orch_jump_host="a@10.9.1.1,b@10.9.1.2:2201", orch_jump_private_key_file="/k/jump")
    assert r.jump_source == "orch_jump_host"
    assert [(h.host, h.port, h.user, h.key_files) for h in r.hops] == [
        ("10.9.1.1", 22, "a", ("/k/jump",)), ("10.9.1.2", 2201, "b", ("/k/jump",))]
    assert r.target.key_files == ()
    with pytest.raises(RouteError) as err:
        route("h", orch_jump_host="a@x", ansible_ssh_common_args="-J b@y")
    assert "both orch_jump_host (a@x) and ansible_ssh_common_args (b@y)" in str(err.value)


def test_first_hops_own_proxy_jump_followed_and_self_reference_ends():
    r = route("h", orch_jump_host="inner")
    assert [h.host for h in r.hops] == ["10.9.0.2", "inner"]
    # "Host * / ProxyJump bastion": the bastion itself is reached directly
    cfg = "Host *\n    ProxyJump jumpbox\nHost jumpbox\n    HostName 10.9.0.3\n"
    r = route("gpu9", cfg=cfg)
    assert [h.host for h in r.hops] == ["10.9.0.3"]
    assert route("jumpbox", cfg=cfg).hops == ()
    with pytest.raises(RouteError) as err:
        route("h", orch_jump_host="loop-a")
    assert "ProxyJump in ~/.ssh/config loops" in str(err.value)


def test_proxy_command_refused_by_name():
    with pytest.raises(RouteError) as err:
        route("viacommand")
    assert "ProxyCommand for viacommand" in str(err.value) and "use ProxyJump" in str(err.value)
    assert route("commandnone").hops == ()
    assert route("viacommand", orch_jump_host="10.9.0.9").hops[0].host == "10.9.0.9"  # the inventory wins


def test_bad_proxy_jump_in_ssh_config_names_its_source():
    with pytest.raises(RouteError) as err:
        route("x", cfg="Host x\n    ProxyJump a:99999\n")
    assert "~/.ssh/config: bad port '99999'" in str(err.value)
