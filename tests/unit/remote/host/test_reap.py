"""reap: real processes holding a temp 'device' file (fd and mmap), protected ones survive.

The 'device' is a regular file named ``nvidia0`` in a temp folder; ``reap`` gets its glob.
Each helper process prints ``ready`` once it holds the file; the test waits for that line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from remote.host import reap as rp
from remote.protocol import PayloadError
from tests.paths import REPO
from tests.waiting import CEILING_S, run_watched, wait_process

ROOT = str(REPO)
PY = os.path.realpath(sys.executable)  # the base interpreter (helpers use only the stdlib)

HOLD_FD = """
import sys, time
f = open(sys.argv[1], 'rb')
print('ready', flush=True)
time.sleep(300)
"""
HOLD_MMAP = """
import ctypes, mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)                     # only the mapping holds the file now (Python's mmap would keep a dup fd)
print('ready', flush=True)
time.sleep(300)
"""
IGNORE_TERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
f = open(sys.argv[1], 'rb')
print('ready', flush=True)
time.sleep(300)
"""
NOT_HOLDING = """
import time
print('ready', flush=True)
time.sleep(300)
"""


@pytest.fixture
def bed(tmp_path):
    """A temp device file and a spawner whose processes are all killed at teardown."""
    dev = tmp_path / "nvidia0"
    dev.write_bytes(b"\0" * 8192)
    procs: list[subprocess.Popen] = []

    def spawn(code: str, argv0: str | None = None, exe: str = PY) -> subprocess.Popen:
        # argv0: like ``exec -a NAME``; the executable stays the real interpreter
        p = subprocess.Popen([argv0 or exe, "-c", code, str(dev)], executable=exe,
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    class Bed:
        pass

    b = Bed()
    b.dev, b.glob, b.spawn, b.tmp = dev, str(tmp_path / "nvidia*"), spawn, tmp_path
    yield b
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=CEILING_S)
        p.stdout.close()


@pytest.fixture
def protected_pair(bed, tmp_path):
    """Three protected look-alikes: nvidia-persistenced by argv[0] only (``exec -a``), by a
    symlink named so, and nv-hostengine by /proc/PID/exe only (a copy of the interpreter under
    that name, started with argv[0] ``python3``)."""
    link_dir = tmp_path / "bin"
    link_dir.mkdir()
    link = link_dir / "nvidia-persistenced"
    os.symlink(PY, link)
    copy = link_dir / "nv-hostengine"
    shutil.copy2(PY, copy)
    a = bed.spawn(HOLD_FD, argv0="nvidia-persistenced")          # exec -a style: argv[0] only
    b = bed.spawn(HOLD_FD, exe=str(link))                        # symlink: argv[0] path basename
    c = bed.spawn(HOLD_FD, argv0="python3", exe=str(copy))       # exe basename only
    assert rp.exe_name(c.pid) == "nv-hostengine" and rp.cmdline(c.pid)[0] == "python3"
    assert rp.exe_name(a.pid) == os.path.basename(PY)
    return a, b, c


def alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def test_scan_finds_fd_and_mmap_holders_only(bed):
    fd = bed.spawn(HOLD_FD)
    mm = bed.spawn(HOLD_MMAP)
    other = bed.spawn(NOT_HOLDING)
    found = rp.scan(rp.Devices([bed.glob]))
    assert found[fd.pid]["via"] == ["fd"]
    assert found[mm.pid]["via"] == ["maps"]
    assert other.pid not in found
    assert str(bed.dev) in found[mm.pid]["devices"]


def test_check_mode_kills_nothing(bed, protected_pair):
    fd = bed.spawn(HOLD_FD)
    ign = bed.spawn(IGNORE_TERM)
    res = rp.reap([bed.glob], set(rp.DEFAULT_PROTECTED.split(",")), term_timeout=1, kill_timeout=5,
                  check=True, use_nvidia_smi="no")
    assert {w["pid"] for w in res["would_kill"]} == {fd.pid, ign.pid}
    assert {p["pid"] for p in res["protected"]} == {p.pid for p in protected_pair}
    assert res["killed"] == []
    assert all(alive(p) for p in (fd, ign, *protected_pair))


def test_reap_term_then_kill_protected_survive(bed, protected_pair):
    fd = bed.spawn(HOLD_FD)
    mm = bed.spawn(HOLD_MMAP)
    ign = bed.spawn(IGNORE_TERM)
    bystander = bed.spawn(NOT_HOLDING)
    res = rp.reap([bed.glob], set(rp.DEFAULT_PROTECTED.split(",")), term_timeout=1.0, kill_timeout=10,
                  use_nvidia_smi="no")
    by = {k["pid"]: k for k in res["killed"]}
    assert set(by) == {fd.pid, mm.pid, ign.pid}
    assert by[fd.pid]["signal"] == "SIGTERM" and by[mm.pid]["signal"] == "SIGTERM"
    assert by[ign.pid]["signal"] == "SIGKILL"
    assert all(k["exited"] for k in res["killed"])
    assert by[ign.pid]["cmdline"].startswith(PY)
    assert fd.wait(timeout=CEILING_S) == -signal.SIGTERM and ign.wait(timeout=CEILING_S) == -signal.SIGKILL
    assert all(alive(p) for p in protected_pair) and alive(bystander)
    assert res["remaining"] == []
    assert {p["pid"] for p in res["protected"]} == {p.pid for p in protected_pair}


def test_only_pids_restricts_targets(bed):
    a = bed.spawn(HOLD_FD)
    b = bed.spawn(HOLD_FD)
    res = rp.reap([bed.glob], set(), term_timeout=5, kill_timeout=5, only_pids={a.pid}, use_nvidia_smi="no")
    assert [k["pid"] for k in res["killed"]] == [a.pid]
    assert [o["pid"] for o in res["others"]] == [b.pid]
    assert a.wait(timeout=CEILING_S) == -signal.SIGTERM and alive(b)


def test_holder_we_may_not_kill_is_an_error(bed):
    victim = bed.spawn(HOLD_FD)
    with open(bed.dev, "rb"):                       # this very process (the payload) holds it too
        with pytest.raises(PayloadError) as ei:
            rp.reap([bed.glob], set(), term_timeout=5, kill_timeout=5, use_nvidia_smi="no")
    assert ei.value.kind == "runtime" and str(os.getpid()) in ei.value.msg
    detail = ei.value.detail
    assert [s["pid"] for s in detail["skipped"]] == [os.getpid()]
    assert [r["pid"] for r in detail["remaining"]] == [os.getpid()]
    assert [k["pid"] for k in detail["killed"]] == [victim.pid]
    assert victim.wait(timeout=CEILING_S) == -signal.SIGTERM


def test_nvidia_smi_pids_verified_ghosts_not_killed(bed):
    holder = bed.spawn(HOLD_FD)
    other = bed.spawn(NOT_HOLDING)
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait(timeout=CEILING_S)
    smi = bed.tmp / "nvidia-smi"
    lines = [f"{holder.pid}, python, 1000", f"{gone.pid}, /usr/bin/python3, 80000",
             f"{other.pid}, python, 500"]
    smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    os.chmod(smi, stat.S_IRWXU)
    res = rp.reap([bed.glob], set(), check=True, use_nvidia_smi="yes", nvidia_smi=str(smi))
    assert res["nvidia_smi"] == "used"
    ghosts = {g["pid"]: g for g in res["ghosts"]}
    assert set(ghosts) == {gone.pid, other.pid}
    assert ghosts[gone.pid]["used_memory_mib"] == 80000 and "no such process" in ghosts[gone.pid]["why"]
    assert [w["pid"] for w in res["would_kill"]] == [holder.pid]
    assert res["would_kill"][0]["via"] == ["fd", "nvidia-smi"]
    assert alive(other)
    with pytest.raises(PayloadError) as ei:
        rp.reap([bed.glob], set(), check=True, use_nvidia_smi="yes", nvidia_smi=str(bed.tmp / "absent"))
    assert ei.value.kind == "not_found"


def test_cli_check(bed, protected_pair):
    h = bed.spawn(HOLD_FD)
    cp = run_watched([sys.executable, "-m", "remote", "reap", "--check", "--devices", bed.glob,
                         "--use-nvidia-smi", "no"], cwd=ROOT)
    last = json.loads(cp.stdout.splitlines()[-1])
    assert cp.returncode == 0 and last["type"] == "result"
    assert [w["pid"] for w in last["data"]["would_kill"]] == [h.pid]
    assert len(last["data"]["protected"]) == 3 and alive(h)


def test_reaper_never_signals_a_process_whose_pid_was_reused():
    from remote.host.reap import proc_stat, signal_if_same

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = proc_stat(child.pid)[2]
        # the start time recorded at the scan differs: the PID now names another process
        assert signal_if_same(child.pid, start + 1, signal.SIGKILL) is False
        assert child.poll() is None, "a reused PID must never be signalled"
        assert signal_if_same(child.pid, start, signal.SIGTERM) is True
        assert wait_process(child, "the child's end by SIGTERM") == -signal.SIGTERM
        # gone (reaped): nothing is sent
        assert signal_if_same(child.pid, start, signal.SIGTERM) is False
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
