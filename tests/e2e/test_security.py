"""Security (issue 7): host keys, secrets in records, payload integrity, permissions, least privilege.

Run against test-bed hosts over real SSH (Paramiko), mostly in check mode, which connects, reads
the unit, pushes and verifies the payload and probes, so every check below goes through
the same code as a real run. The least-privilege tests log in as the bed's non-root user
(``orchop``), which may use sudo with its password; sudo logs every command it runs for that user
to ``/var/log/sudo-orchop.log`` on the host.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import stat
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.payload.bundle import build_bundle
from tests.e2e.helpers import flat, inventory, orch, recap
from tests.testbed.bed import SUDO_LOG
from tests.paths import REPO
from tests.waiting import CEILING_S, process_ended, wait_until

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

    # --check --accept-new-host-keys: the host is reached with its key trusted for that run only;
    # check mode writes nothing, known_hosts included, and says so
    proc, res = _check(inv, tmp_path / "s2", "--accept-new-host-keys")
    assert proc.returncode == 0 and res["hosts"][h.name]["outcome"] == "check", proc.stderr[-3000:]
    assert not kh.exists()
    assert not (tmp_path / "s2" / "store").exists(), "check mode stores no config"
    assert [p.name for p in (tmp_path / "s2" / "runs").iterdir()] == [res["run_id"]]  # its record (documented)
    assert f"check mode: accepted the new host key of {h.address}:22" in flat(proc.stderr), proc.stderr[-3000:]
    assert f"for this run only; {kh} is not written" in flat(proc.stderr)
    # `orch runs --accept-new-host-keys` (read-only on the hosts, no check mode) remembers it:
    # exactly the host's real key is added, then it is trusted without the flag
    runs = orch("runs", str(inv), "--accept-new-host-keys", "--json", state_dir=tmp_path / "s2r")
    assert runs.returncode == 0, runs.stderr[-3000:]
    assert f"added the new host key of {h.address}:22" in flat(runs.stderr)
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
    # files written on the host from here on are searched for the secret (root's home is this
    # machine's /root, with gigabytes of caches no run touches: only what changed is read)
    h.sh("touch /tmp/.secret-scan-start")
    # root login with become and a password (sudo asks root for none); the password must appear nowhere
    inv = inventory(bed, tmp_path / "hosts.yaml", ansible_become=True, ansible_become_password=secret)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", "-v", state_dir=state)
    res = recap(proc)
    assert res["hosts"][h.name]["outcome"] == "check", res
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
    host_hits = h.sh(f"grep -rl {secret} /var/lib/orch /tmp; find /root -xdev -type f -newer "
                     f"/tmp/.secret-scan-start -exec grep -l {secret} {{}} +", check=False).stdout.strip()
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


# --- least privilege: a non-root login, sudo only for the steps that need root -------------------------

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


def _login_inventory(bed, path: Path, **host_vars) -> Path:
    """The bed's inventory with every host reached as the non-root login user (``orchop``)."""
    hv = dict({"ansible_user": bed.login_user}, **host_vars)
    return inventory(bed, path, host_vars={h.name: hv for h in bed.hosts})


def _sudo_commands(h) -> tuple[list[str], list[str]]:
    """(lines of the host's sudo log, the COMMAND= of each); ([], []) when sudo never ran."""
    lines = h.sh(f"cat {SUDO_LOG}", check=False).stdout.splitlines()
    return lines, [x.split("COMMAND=", 1)[1] for x in lines if "COMMAND=" in x]


def _untouched(h) -> dict:
    """What a refused run must not change: configs, orch state, unit files and state, main PID, temp files."""
    return {
        "configs": h.file_tree_hash(h.config_dir),
        "orch": h.sh("ls -A /var/lib/orch").stdout.split(),
        "units": h.file_tree_hash("/etc/systemd/system"),
        "active": h.unit_state(),
        "pid": h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip(),
        "tmp": sorted(p for p in h.sh("ls -A /tmp").stdout.split() if p.startswith("orch")),
    }


def _nowhere(secret: str, proc, state: Path, h, login_user: str) -> None:
    """``secret`` is in no output, no file of the controller state dir, and no file under the host's
    /var/log, /var/lib/orch, /tmp or the login user's home."""
    assert secret not in proc.stdout and secret not in proc.stderr
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in files)
    for p in files:
        assert secret.encode() not in p.read_bytes(), p
    hits = h.sh(f"grep -rlF -e {shlex.quote(secret)} /var/log /var/lib/orch /tmp /home/{login_user}", check=False)
    assert hits.returncode == 1 and not hits.stdout, (hits.returncode, hits.stdout, hits.stderr)


def test_tune_as_non_root_user_uses_sudo_only_for_root_steps(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    password = bed.become_password
    state = tmp_path / "state"
    inv = _login_inventory(bed, tmp_path / "hosts.yaml", ansible_become=True, ansible_become_password=password)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "-v", state_dir=state)
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = recap(proc)
    run_id = res["run_id"]
    assert res["hosts"][h.name]["outcome"] == "completed", res["hosts"][h.name]
    events = [json.loads(x) for x in (state / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    connected = next(e for e in events if e["event"] == "task" and e["module"] == "connect")
    assert connected["data"]["user"] == bed.login_user and connected["data"]["become_user"] == "root", connected

    # the job was done: new files installed (root-owned, world-readable), loaded, unit active, run recorded
    for name in (UP, DOWN):
        path = shlex.quote(f"{h.triton_dir}/{name}")
        assert json.loads(h.sh(f"cat {path}").stdout)
        assert h.sh(f"stat -c '%U %a' {path}").stdout.split() == ["root", "644"]
    assert h.unit_state() == "active"
    assert f"Using MoE kernel config from {h.triton_dir}/{UP}." in h.unit_log()
    record = json.loads(h.sh(f"cat /var/lib/orch/runs/{run_id}/state.json").stdout)
    assert record["state"] == "completed"
    assert h.sh(f"stat -c '%U %a' /var/lib/orch /var/lib/orch/runs/{run_id}").stdout.split() == \
        ["root", "700", "root", "700"]
    assert h.sh("test -e /var/lib/orch/lock.json", check=False).returncode != 0
    assert (state / "runs" / run_id / "hosts" / h.name / "configs" / UP).exists(), "tuned file fetched via sudo"

    # sudo ran exactly the steps that need root, for orchop, as root, with the right password
    lines, commands = _sudo_commands(h)
    assert lines and all(f" : {bed.login_user} : " in x and "USER=root" in x for x in lines), lines
    assert not [x for x in lines if "incorrect password" in x]

    def ran(pred) -> bool:
        return any(pred(c) for c in commands)

    assert f"/usr/bin/systemctl stop {h.unit}" in commands
    assert f"/usr/bin/systemctl restart {h.unit}" in commands
    assert ran(lambda c: c.startswith("/usr/bin/install -m 0600 -T -- /tmp/orch-xfer.") and c.endswith(".tar.gz"))
    assert ran(lambda c: c.startswith("/usr/bin/install -m 0600 -T -- /tmp/orch-xfer.")
               and " /var/lib/orch/payload/requests/install-" in c)
    assert ran(lambda c: c.startswith("/usr/bin/install -m 0644 -T -- /var/lib/orch/work/") and UP in c)
    for step in ("version", "probe", "lock acquire", "reap", "tune", "install --request", "lock release"):
        assert ran(lambda c: f" -m remote {step}" in c), step
    # reading the server's unit needs no root: it ran as orchop, never through sudo (the state of
    # the transient units root started, the tuner's orch-tune-RUN, the prepare step's
    # orch-prepare-RUN and the host's dead-man orch-deadman-RUN, is read through sudo)
    assert not ran(lambda c: c.startswith("/usr/bin/systemctl ") and c.split()[1] in ("show", "cat", "is-active")
                   and "orch-tune-" not in c and "orch-prepare-" not in c and "orch-deadman-" not in c), \
        commands
    assert ran(lambda c: " -m remote prepare" in c), "the prepare step ran through sudo, as the tune does"
    assert any(e["event"] == "task" and e["module"] == "unit_facts" and e["status"] == "ok" for e in events)
    # no staged copy left behind; the password appears nowhere
    assert not [p for p in h.sh("ls -A /tmp").stdout.split() if p.startswith("orch-xfer.")]
    _nowhere(password, proc, state, h, bed.login_user)


def test_non_root_user_without_become_refused_clearly_nothing_changed(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    before = _untouched(h)
    inv = _login_inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stderr[-4000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed", r
    cause = r["cause"]
    assert len(cause.splitlines()) == 1, cause
    for part in (h.name, f"logged in as {bed.login_user}, not root", "ansible_become is not set",
                 "permission denied for /var/lib/orch"):
        assert part in cause, (part, cause)
    assert _untouched(h) == before  # no lock, no run record, no file, unit and PID as they were
    assert _sudo_commands(h) == ([], [])


def test_wrong_or_missing_become_password_refused_clearly_nothing_changed(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    h.wait_http("/health")
    before = _untouched(h)
    wrong = "Wr0ng-" + secrets.token_hex(8)
    state = tmp_path / "s1"
    inv = _login_inventory(bed, tmp_path / "hosts.yaml", ansible_become=True, ansible_become_password=wrong)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "-v", state_dir=state)
    assert proc.returncode == 1, proc.stderr[-4000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed", r
    assert r["cause"] == f"Connect: {h.name}: sudo: incorrect become password for {bed.login_user} on {h.name}"
    assert _untouched(h) == before
    lines, _ = _sudo_commands(h)
    assert lines and all("incorrect password attempt" in x for x in lines), lines  # nothing ran as root
    _nowhere(wrong, proc, state, h, bed.login_user)

    # become without any password: the cause names the missing variable; sudo runs with -n, so it
    # refuses at once and no failed authentication is counted (pam_faillock would lock the account)
    inv = _login_inventory(bed, tmp_path / "hosts2.yaml", ansible_become=True)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "s2")
    assert proc.returncode == 1, proc.stderr[-4000:]
    cause = recap(proc)["hosts"][h.name]["cause"]
    assert f"sudo: {bed.login_user} on {h.name} needs a password" in cause
    assert "ansible_become_password is not set" in cause
    assert _untouched(h) == before
    added = _sudo_commands(h)[0][len(lines):]
    assert added and all("a password is required" in x for x in added), added


def _transport(bed, h, user: str, **host_vars):
    """An open connection to ``h`` (orch's own ``connect``) logged in as ``user``."""
    from orchestrator.connection import connect

    hv = {"ansible_host": h.address, "ansible_port": h.port, "ansible_user": user,
          "ansible_ssh_private_key_file": str(bed.key_path), "orch_known_hosts": str(bed.known_hosts_path),
          **host_vars}
    return connect(h.name, hv)


#: a command (run through sudo) whose output imitates sudo: its prompt, then, a moment later, the
#: words sudo says after a refused password; then it prints whatever reaches its stdin
_IMITATOR = ["sh", "-c", "printf '[sudo] password: \\n'; sleep 1; echo 'Sorry, try again.'; "
             "echo \"stdin:[$(timeout 3 head -n 1)]\"; echo end"]


def test_become_answers_only_sudos_own_prompt_and_quotes_the_become_user(testbed_factory, tmp_path):
    """The password goes to sudo's stdin only when sudo itself asks: a command whose output looks like
    sudo's prompt (a unit log read through sudo) gets nothing, and its "Sorry, try again." fails nothing.
    ``ansible_become_user`` reaches the host's shell quoted."""
    from orchestrator.connection import CommandFailed

    bed = testbed_factory(1)
    h = bed.hosts[0]
    password = bed.become_password
    lines_before = len(_sudo_commands(h)[0])
    # orchop: sudo asks (and is answered once); root login: sudo never asks, so nothing is sent at all
    for user in (bed.login_user, "root"):
        t = _transport(bed, h, user, ansible_become=True, ansible_become_password=password)
        try:
            res = t.run(_IMITATOR, become=True, timeout=CEILING_S)
            assert res.stdout.splitlines() == ["[sudo] password: ", "Sorry, try again.", "stdin:[]", "end"], \
                (user, res.stdout)
            assert password not in res.stdout + res.stderr
            assert "password:" not in res.stderr, res.stderr  # sudo's own prompt is not output
            assert t.run(["id", "-un"], become=True, timeout=CEILING_S).stdout.strip() == "root"
        finally:
            t.close()
    added = _sudo_commands(h)[0][lines_before:]
    assert len(added) == 2 and not [x for x in added if "incorrect password" in x], added

    # a become user with shell syntax is one argument to sudo, never a command of its own
    mark = h.local_path("/tmp/orch-injected")
    t = _transport(bed, h, bed.login_user, ansible_become=True, ansible_become_password=password,
                   ansible_become_user="root; touch /tmp/orch-injected; echo INJECTED")
    try:
        with pytest.raises(CommandFailed) as err:
            t.run(["id", "-un"], become=True, timeout=CEILING_S)
    finally:
        t.close()
    assert "unknown user" in err.value.result.stderr and "INJECTED" not in err.value.result.stdout, err.value
    assert not mark.exists()


def test_local_transport_become_answers_only_sudos_own_prompt(tmp_path):
    """``ansible_connection: local`` with ``become``: the same sudo call as over SSH (this machine's sudo,
    as root: it never asks), so an imitated prompt gets no password and fails nothing; become user quoted."""
    import os
    import shutil

    from orchestrator.connection import CommandFailed, connect

    if os.geteuid() != 0 or not shutil.which("sudo"):
        pytest.skip("needs root and sudo on this machine")
    secret = "S3cr3t-" + secrets.token_hex(8)
    t = connect("local", {"ansible_connection": "local", "ansible_become": True, "ansible_become_password": secret})
    res = t.run(_IMITATOR, become=True, timeout=CEILING_S)
    assert res.stdout.splitlines() == ["[sudo] password: ", "Sorry, try again.", "stdin:[]", "end"], res.stdout
    mark = tmp_path / "injected"
    t = connect("local", {"ansible_connection": "local", "ansible_become": True,
                          "ansible_become_user": f"root; touch {mark}"})
    with pytest.raises(CommandFailed):
        t.run(["id", "-un"], become=True, timeout=CEILING_S)
    assert not mark.exists()


def test_local_transport_command_survives_the_terminals_ctrl_c(tmp_path):
    """``ansible_connection: local``: a terminal's Ctrl-C goes to orch's whole process group.
    orch handles it (cancel flag, rescue); the command it is running (an install, a restore)
    must not die of it, or a second Ctrl-C would cut the rescue short."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "ctl.py"
    started = tmp_path / "started"
    go = tmp_path / "go"
    # the command runs until the test lets it go, after the Ctrl-C: it is running when the signal comes
    child = [sys.executable, "-c",
             f"import pathlib, time; pathlib.Path({str(started)!r}).touch()\n"
             f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.02)\nprint('finished')"]
    script.write_text(
        "import signal, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import pathlib\n"
        f"signal.signal(signal.SIGINT, lambda *a: (print('controller got SIGINT', flush=True), "
        f"pathlib.Path({str(tmp_path / 'got')!r}).touch()))\n"
        "from orchestrator.connection import connect\n"
        "t = connect('local', {'ansible_connection': 'local'})\n"
        f"r = t.run({child!r}, check=False, timeout={CEILING_S!r})\n"
        "print('exit', r.exited, r.stdout.strip(), flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group, like orch in a terminal
    try:
        wait_until(started.exists, "the command's start", alive=process_ended(proc), poll=0.02)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        wait_until((tmp_path / "got").exists, "the controller's SIGINT handler", alive=process_ended(proc), poll=0.02)
        go.touch()
        out, _ = proc.communicate(timeout=CEILING_S)  # a hang guard only
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "controller got SIGINT" in out
    assert "exit 0 finished" in out, out
