"""ProxyJump specs and ansible_ssh_common_args (orchestrator/inventory/ssh_args.py): what orch reads,
and that every other option is refused by name, never ignored."""

from __future__ import annotations

import pytest

from orchestrator.inventory.ssh_args import JumpHop, SSHArgsError, parse_proxy_jump, parse_ssh_common_args


@pytest.mark.parametrize("spec, hops", [
    ("bastion", (JumpHop("bastion"),)),
    ("ops@login1.example.com:2222", (JumpHop("login1.example.com", "ops", 2222),)),
    ("ops@login", (JumpHop("login", "ops"),)),
    ("ssh://ops@login:22", (JumpHop("login", "ops", 22),)),
    ("10.0.0.1,ops@10.0.0.2:2200", (JumpHop("10.0.0.1"), JumpHop("10.0.0.2", "ops", 2200))),
    ("[fd00::1]:2222", (JumpHop("fd00::1", None, 2222),)),
    ("ops@[fd00::1]", (JumpHop("fd00::1", "ops"),)),
    ("none", ()),
    ("NONE", ()),
])
def test_proxy_jump_specs(spec, hops):
    assert parse_proxy_jump(spec) == hops


def test_jump_hop_prints_back_as_a_spec():
    assert [str(h) for h in parse_proxy_jump("ops@login:2222,[fd00::1]:22,b")] == \
        ["ops@login:2222", "[fd00::1]:22", "b"]


@pytest.mark.parametrize("spec, words", [
    ("", "non-empty"),
    ("login:0", "bad port '0'"),
    ("login:70000", "bad port '70000'"),
    ("login:ssh", "bad port 'ssh'"),
    ("a,,b", "empty jump host"),
    ("login;touch /tmp/x", "bad host name"),
    ("$(id)@login", "bad user name"),
    ("lo gin", "bad host name"),
    ("[not-v6]:22", "bad bracketed address"),
    ("-oProxyCommand=x", "bad host name"),
])
def test_bad_proxy_jump_specs_refused_by_what_is_wrong(spec, words):
    with pytest.raises(SSHArgsError) as err:
        parse_proxy_jump(spec)
    assert words in str(err.value)


@pytest.mark.parametrize("args, spec", [
    ("-J ops@bastion:2222", "ops@bastion:2222"),
    ("-Jops@bastion", "ops@bastion"),
    ("-o ProxyJump=ops@bastion", "ops@bastion"),
    ("-oProxyJump=ops@bastion", "ops@bastion"),
    ("-o proxyjump=a,b", "a,b"),
    ("-o 'ProxyJump ops@bastion'", "ops@bastion"),
    ("-o ProxyJump=none", "none"),
    ("", None),
    ("   ", None),
])
def test_common_args_jump_host_read(args, spec):
    assert parse_ssh_common_args(args) == spec


@pytest.mark.parametrize("args, words", [
    ("-o StrictHostKeyChecking=no", ["unsupported option -o StrictHostKeyChecking", "--accept-new-host-keys"]),
    ("-o UserKnownHostsFile=/dev/null", ["-o UserKnownHostsFile", "orch_known_hosts"]),
    ('-o ProxyCommand="ssh -W %h:%p bastion"', ["-o ProxyCommand", "ProxyJump only"]),
    ("-o Port=2222", ["-o Port", "ansible_port"]),
    ("-o ControlMaster=auto", ["-o ControlMaster", "only the jump host"]),
    ("-J a -o ServerAliveInterval=5", ["-o ServerAliveInterval"]),
    ("-C", ["unsupported '-C'"]),
    ("bastion", ["unsupported 'bastion'"]),
    ("-J a -J b", ["given twice"]),
    ("-J a -o ProxyJump=b", ["given twice"]),
    ("-J", ["-J needs a value"]),
    ("-o ProxyJump", ["is not 'Option=value'"]),
    ("-o 'ProxyJump=a", ["cannot split"]),
    ("-J 'a;b'", ["bad host name"]),
])
def test_common_args_other_options_refused_by_name(args, words):
    with pytest.raises(SSHArgsError) as err:
        parse_ssh_common_args(args)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
