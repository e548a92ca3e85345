"""known_hosts read as OpenSSH reads it (orchestrator/connection/known_hosts.py) and the host-key policy
built on it (KnownHostsPolicy in orchestrator/connection/ssh.py). Keys and hashed names come from the
real ``ssh-keygen`` (``-t ed25519``, ``-H``), so the formats are OpenSSH's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from orchestrator.connection.known_hosts import (CERT_ONLY, CHANGED, OTHER_TYPES, REVOKED, TRUSTED, UNKNOWN,
                                                 check_host_key, host_key_name, host_matches, known_key_types,
                                                 parse_known_hosts, read_known_hosts)
from orchestrator.connection.route import Endpoint
from orchestrator.connection.ssh import HostKeyRefused, KnownHostsPolicy, _key_algorithms


def _keypair(tmp: Path, name: str, kind: str = "ed25519") -> tuple[str, str, Path]:
    path = tmp / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    kt, b64 = path.with_suffix(".pub").read_text().split()[:2]
    return kt, b64, path


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    return {n: _keypair(tmp, n, kind) for n, kind in
            (("a", "ed25519"), ("b", "ed25519"), ("ca", "ed25519"), ("ec", "ecdsa"))}


def _hashed(tmp: Path, text: str) -> str:
    """``text`` (known_hosts lines) with every name hashed by ``ssh-keygen -H``."""
    f = tmp / "kh_hash"
    f.write_text(text)
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(f)], check=True, capture_output=True)
    return f.read_text()


def test_host_key_name_brackets_other_ports():
    assert host_key_name("10.0.0.1", 22) == "10.0.0.1"
    assert host_key_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_parse_skips_comments_bad_lines_and_unknown_markers(keys):
    kt, b64, _ = keys["a"]
    text = "\n".join([
        "# comment", "", f"host1,10.0.0.1 {kt} {b64} a comment with spaces",
        f"@cert-authority *.example.com {kt} {b64}", f"@revoked host2 {kt} {b64}",
        f"@bogus host3 {kt} {b64}", "host4 ssh-ed25519", f"host5 {kt} not*base64", f"\thost6\t{kt}\t{b64}"])
    lines = parse_known_hosts(text, "/kh")
    assert [(ln.lineno, ln.marker, ln.patterns) for ln in lines] == [
        (3, None, ("host1", "10.0.0.1")), (4, "cert-authority", ("*.example.com",)), (5, "revoked", ("host2",)),
        (9, None, ("host6",))]
    assert lines[0].where == "/kh:3" and lines[0].key_type == kt and lines[0].key_b64 == b64


@pytest.mark.parametrize("patterns, name, hit", [
    (["gpu1"], "gpu1", True),
    (["GPU1.Example.com"], "gpu1.example.COM", True),
    (["gpu1"], "gpu10", False),
    (["*.example.com"], "gpu1.example.com", True),
    (["*.example.com"], "example.com", False),
    (["10.0.0.?"], "10.0.0.7", True),
    (["10.0.0.?"], "10.0.0.17", False),
    (["!bad.example.com", "*.example.com"], "bad.example.com", False),
    (["*.example.com", "!bad.example.com"], "good.example.com", True),
    (["[10.0.0.1]:2222"], "[10.0.0.1]:2222", True),
    (["[10.0.0.1]:2222"], "10.0.0.1", False),
    (["10.0.0.1"], "[10.0.0.1]:2222", False),
    (["[10.0.0.*]:2222"], "[10.0.0.9]:2222", True),
    (["|1|notbase64|x"], "gpu1", False),
])
def test_host_patterns_as_openssh_matches_them(patterns, name, hit):
    assert host_matches(patterns, name) is hit


def test_hashed_names_from_ssh_keygen_match_only_their_host(tmp_path, keys):
    kt, b64, _ = keys["a"]
    text = _hashed(tmp_path, f"gpu1.example.com {kt} {b64}\n[10.0.0.1]:2222 {kt} {b64}\n")
    lines = parse_known_hosts(text, "/kh")
    assert all(p.startswith("|1|") for ln in lines for p in ln.patterns), text
    assert check_host_key(lines, "gpu1.example.com", kt, b64).status == TRUSTED
    assert check_host_key(lines, "[10.0.0.1]:2222", kt, b64).status == TRUSTED
    assert check_host_key(lines, "10.0.0.1", kt, b64).status == UNKNOWN  # port 22 is another name
    assert check_host_key(lines, "gpu2.example.com", kt, b64).status == UNKNOWN


def test_verdicts_in_openssh_order(keys):
    (kt, a, _), (_, b, _), (_, ca, _), (ekt, ec, _) = keys["a"], keys["b"], keys["ca"], keys["ec"]

    def verdict(text, key=a, kind=kt, name="gpu1"):
        return check_host_key(parse_known_hosts(text, "/kh"), name, kind, key)

    assert verdict(f"gpu1 {kt} {a}\n").status == TRUSTED
    assert verdict(f"gpu1 {kt} {b}\ngpu1 {kt} {a}\n").status == TRUSTED  # any listed key of the host
    v = verdict(f"gpu1 {kt} {b}\n")
    assert v.status == CHANGED and [ln.where for ln in v.lines] == ["/kh:1"]
    assert verdict(f"gpu2 {kt} {b}\n").status == UNKNOWN
    assert verdict(f"*.example.com {kt} {a}\n", name="gpu1.example.com").status == TRUSTED
    # a revoked key is refused even where a plain line lists it
    v = verdict(f"gpu1 {kt} {a}\n@revoked * {kt} {a}\n")
    assert v.status == REVOKED and v.lines[0].lineno == 2
    assert verdict(f"gpu1 {kt} {a}\n@revoked * {kt} {b}\n").status == TRUSTED
    # a host vouched for only by a CA: certificates cannot be checked
    v = verdict(f"@cert-authority *.example.com {kt} {ca}\n", name="gpu1.example.com")
    assert v.status == CERT_ONLY and v.lines[0].marker == "cert-authority"
    assert verdict(f"@cert-authority * {kt} {ca}\ngpu1 {kt} {a}\n").status == TRUSTED  # its own key listed too
    assert verdict(f"@cert-authority * {kt} {ca}\ngpu1 {kt} {b}\n").status == CHANGED
    # known with another key type only
    v = verdict(f"gpu1 {ekt} {ec}\n")
    assert v.status == OTHER_TYPES and v.lines[0].key_type == ekt


def test_known_key_types_leave_out_revoked_and_ca_lines(keys):
    (kt, a, _), (ekt, ec, _) = keys["a"], keys["ec"]
    lines = parse_known_hosts(f"gpu1 {ekt} {ec}\n@cert-authority * {kt} {a}\n@revoked gpu1 ssh-rsa {a}\n"
                              f"gpu1,gpu2 {kt} {a}\ngpu1 {ekt} {ec}\n", "/kh")
    assert known_key_types(lines, "gpu1") == [ekt, kt]
    assert known_key_types(lines, "gpu3") == []


def test_read_known_hosts_lists_missing_files(tmp_path, keys):
    kt, a, _ = keys["a"]
    (tmp_path / "one").write_text(f"gpu1 {kt} {a}\n")
    lines, absent = read_known_hosts([str(tmp_path / "one"), str(tmp_path / "two")])
    assert [ln.path for ln in lines] == [str(tmp_path / "one")]
    assert absent == [str(tmp_path / "two")]


# --- the policy: what orch does with each verdict -------------------------------------------

def _endpoint(tmp: Path, name="10.0.0.1", port=22, label="10.0.0.1:22") -> Endpoint:
    return Endpoint(host=name, port=port, user=None, key_files=(), look_for_keys=True, allow_agent=True,
                    key_name=host_key_name(name, port), user_known_hosts=(str(tmp / "user_kh"),),
                    global_known_hosts=(str(tmp / "global_kh"),), label=label)


def _pkey(entry) -> paramiko.PKey:
    kt, b64, path = entry
    return paramiko.PKey.from_path(path)


def test_policy_unknown_key_refused_naming_every_file_searched(tmp_path, keys):
    ep = _endpoint(tmp_path)
    with pytest.raises(HostKeyRefused) as err:
        KnownHostsPolicy(ep, "gpu-a").missing_host_key(None, "10.0.0.1", _pkey(keys["a"]))
    msg = str(err.value)
    assert msg.startswith("gpu-a: unknown host key for 10.0.0.1:22 (ssh-ed25519 SHA256:"), msg
    assert f"{tmp_path / 'user_kh'} (absent), {tmp_path / 'global_kh'} (absent)" in msg
    assert "--accept-new-host-keys" in msg
    assert not (tmp_path / "user_kh").exists()


def test_policy_trusts_the_global_file_and_writes_nothing(tmp_path, keys):
    kt, a, _ = keys["a"]
    (tmp_path / "global_kh").write_text(_hashed(tmp_path, f"10.0.0.1 {kt} {a}\n"))
    KnownHostsPolicy(_endpoint(tmp_path), "gpu-a", accept_new=True).missing_host_key(None, "x", _pkey(keys["a"]))
    assert not (tmp_path / "user_kh").exists()


def test_policy_accept_new_appends_once_to_the_user_file(tmp_path, keys):
    kt, a, _ = keys["a"]
    ep = _endpoint(tmp_path, port=2222, label="[10.0.0.1]:2222")
    policy = KnownHostsPolicy(ep, "gpu-a", accept_new=True)
    policy.missing_host_key(None, "x", _pkey(keys["a"]))
    policy.missing_host_key(None, "x", _pkey(keys["a"]))
    assert (tmp_path / "user_kh").read_text() == f"[10.0.0.1]:2222 {kt} {a}\n"


@pytest.mark.parametrize("known, words", [
    ("10.0.0.1 {kt} {b}\n", ["CHANGED", "remove its old entry from {user}"]),
    ("10.0.0.1 {kt} {a}\n@revoked * {kt} {a}\n", ["REVOKED at {user}:2"]),
    ("@cert-authority 10.0.0.* {kt} {ca}\n", ["@cert-authority line ({user}:1)",
                                             "host certificates are not supported", "{user}, {glob}"]),
    ("10.0.0.1 {ekt} {ec}\n", ["known_hosts lists only ecdsa-sha2-nistp256"]),
])
def test_policy_refuses_changed_revoked_ca_only_and_other_types_also_with_accept_new(tmp_path, keys, known, words):
    (kt, a, _), (_, b, _), (_, ca, _), (ekt, ec, _) = keys["a"], keys["b"], keys["ca"], keys["ec"]
    user = tmp_path / "user_kh"
    user.write_text(known.format(kt=kt, a=a, b=b, ca=ca, ekt=ekt, ec=ec))
    before = user.read_bytes()
    for accept_new in (False, True):
        with pytest.raises(HostKeyRefused) as err:
            KnownHostsPolicy(_endpoint(tmp_path), "gpu-a", accept_new).missing_host_key(None, "x", _pkey(keys["a"]))
        msg = str(err.value)
        for w in words:
            assert w.format(user=user, glob=f"{tmp_path / 'global_kh'} (absent)") in msg, (w, msg)
        assert "accept-new" not in msg  # adding the key by hand-wave would bypass what refused it
        assert user.read_bytes() == before


def test_known_key_types_become_paramikos_host_key_algorithms(tmp_path, keys):
    (kt, a, _), (ekt, ec, _) = keys["a"], keys["ec"]
    (tmp_path / "user_kh").write_text(f"10.0.0.1 {ekt} {ec}\n10.0.0.1 ssh-rsa {a}\n")
    disabled = _key_algorithms(_endpoint(tmp_path))["keys"]
    assert "ssh-ed25519" in disabled and ekt not in disabled
    assert not {"rsa-sha2-512", "rsa-sha2-256"} & set(disabled)  # an ssh-rsa line allows the SHA-2 signatures
    (tmp_path / "user_kh").write_text("")
    assert _key_algorithms(_endpoint(tmp_path)) == {}  # unknown host: Paramiko's own preference


def test_check_mode_accepts_a_new_key_for_the_run_and_writes_nothing(tmp_path, keys, monkeypatch):
    """`--check --accept-new-host-keys`: check mode changes nothing, the controller's files
    included. The new key is trusted for the rest of the run (a later login of the same process:
    a reconnect, another host behind the same jump host) and said in the policy's notes; no
    known_hosts file is created. A real run (``remember``) writes it and says where."""
    monkeypatch.setattr(KnownHostsPolicy, "_this_run", set())  # this test's process-wide trust only
    kt, a, _ = keys["a"]
    ep = _endpoint(tmp_path)
    policy = KnownHostsPolicy(ep, "gpu-a", accept_new=True, remember=False)
    policy.missing_host_key(None, "x", _pkey(keys["a"]))
    assert not (tmp_path / "user_kh").exists() and not (tmp_path / "global_kh").exists()
    (note,) = policy.notes
    assert note.startswith("check mode: accepted the new host key of 10.0.0.1:22 (ssh-ed25519 SHA256:")
    assert f"for this run only; {tmp_path / 'user_kh'} is not written" in note
    KnownHostsPolicy(ep, "gpu-a", accept_new=False).missing_host_key(None, "x", _pkey(keys["a"]))  # trusted now
    with pytest.raises(HostKeyRefused):  # another key of the same name is still unknown
        KnownHostsPolicy(ep, "gpu-a", accept_new=False).missing_host_key(None, "x", _pkey(keys["b"]))
    remembering = KnownHostsPolicy(_endpoint(tmp_path / "sub"), "gpu-a", accept_new=True)
    (tmp_path / "sub").mkdir()
    remembering.missing_host_key(None, "x", _pkey(keys["b"]))
    assert (tmp_path / "sub" / "user_kh").read_text() == f"10.0.0.1 {kt} {keys['b'][1]}\n"
    assert remembering.notes == [f"added the new host key of 10.0.0.1:22 (ssh-ed25519 "
                                 f"{_pkey(keys['b']).fingerprint}) to {tmp_path / 'sub' / 'user_kh'}"]
