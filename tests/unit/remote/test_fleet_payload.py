"""Payload rules for real fleets (issue 13): the unit's port (``port``), other units' processes
(``reap``), one host per state folder (``lock``), models in the ModelScope cache (``sglang.model_config``).

``port`` runs against real processes listening on a free loopback port: one runs the unit's
launch command line (a leftover of the unit), one does not (foreign)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.host import lock, port, reap
from remote.protocol import PayloadError
from remote.engines.sglang.model_config import modelscope_candidates, resolve_model_config_path, use_modelscope
from tests.waiting import CEILING_S

LISTEN = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
print("ready", flush=True)
time.sleep(300)
"""

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 81234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 81235 1 0000000000000000 100 0 0 10 0
   2: 0100007F:7530 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 81299 1 0000000000000000 20 4 30 10 -1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 90001 1 0000000000000000 100 0 0 10 0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listener():
    """Start ``python -c LISTEN PORT [-m sglang.launch_server ARGS]``: its argv is what ``port``
    matches against the unit's launch arguments. Every process is killed at teardown."""
    procs = []

    def start(port_no: int, as_unit: list[str] | None) -> subprocess.Popen:
        argv = [sys.executable, "-c", LISTEN, str(port_no)] + (["-m", "sglang.launch_server", *as_unit] if as_unit else [])
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_listening_inodes_reads_only_listen_rows_of_the_port():
    assert port.listening_inodes(TCP, 30000) == {81234}
    assert port.listening_inodes(TCP, 30001) == {81235}
    assert port.listening_inodes(TCP6, 30000) == {90001}
    assert port.listening_inodes("", 30000) == set()


@pytest.mark.parametrize("argv, cgroup, expected", [
    (["/py", "-m", "sglang.launch_server", "--port", "30000"], "0::/", "command line"),
    (["/other/python3", "-m", "sglang.launch_server", "--port", "30000"], "0::/", "command line"),
    (["/py", "-m", "sglang.launch_server", "--port", "30001"], "0::/", None),
    (["nginx: worker"], "0::/system.slice/sglang-qwen.service", "cgroup"),
    (["nginx: worker"], "0::/system.slice/nginx.service", None),
])
def test_unit_process_by_cgroup_or_command_line(argv, cgroup, expected):
    assert port.is_unit_process(argv, cgroup, "sglang-qwen.service", ["--port", "30000"]) == expected


def test_leftover_of_the_unit_is_ended(listener):
    p_no = free_port()
    args = ["--model-path", "/m", "--port", str(p_no)]
    proc = listener(p_no, args)
    before = port.free_port(p_no, "sglang-qwen.service", args)
    assert [h["pid"] for h in before["holders"]] == [proc.pid] and before["holders"][0]["owner"]
    res = port.free_port(p_no, "sglang-qwen.service", args, free=True, term_timeout=5)
    assert res["free"] and res["killed"][0]["pid"] == proc.pid and res["killed"][0]["signal"] == "SIGTERM"
    assert proc.wait(timeout=CEILING_S) is not None


def test_foreign_holder_fails_naming_it_and_nothing_is_signalled(listener):
    p_no = free_port()
    proc = listener(p_no, None)
    with pytest.raises(PayloadError) as ei:
        port.free_port(p_no, "sglang-qwen.service", ["--port", str(p_no)], free=True)
    assert ei.value.kind == "runtime" and str(proc.pid) in ei.value.msg and "not the unit's" in ei.value.msg
    time.sleep(0.2)
    assert proc.poll() is None, "a foreign holder must not be signalled"


def test_mark_main_tells_a_copy_of_the_servers_socket_from_a_second_server():
    """A re-parented fork holding only the main server's socket is marked ``main_socket``; a
    process with a listening socket of its own (a leaked server) is not."""
    tree = {100: [100, 1], 101: [101, 100, 1], 200: [200, 1], 300: [300, 1]}
    found = [{"pid": 100, "inodes": [7]}, {"pid": 101, "inodes": [7]},
             {"pid": 200, "inodes": [7]}, {"pid": 300, "inodes": [9]}]
    port.mark_main(found, 100, lambda pid: tree[pid])
    assert [(h["pid"], h["main"], h["main_socket"]) for h in found] == [
        (100, True, True), (101, True, True), (200, False, True), (300, False, False)]
    none = [{"pid": 200, "inodes": [7]}]
    port.mark_main(none, 100, lambda pid: tree[pid])  # the main server holds nothing: no copy to share
    assert none[0]["main_socket"] is False


def test_port_command_line():
    p_no = free_port()
    out = subprocess.run([sys.executable, "-m", "remote", "port", "--port", str(p_no)], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[3])
    assert json.loads(out.stdout.splitlines()[-1])["data"] == {"port": p_no, "holders": [], "killed": [], "free": True}


@pytest.mark.parametrize("text, expected", [
    ("0::/system.slice/sglang-b.service\n", "sglang-b.service"),
    ("0::/system.slice/sglang-a.service\n", None),
    ("0::/user.slice/user-0.slice/session-4.scope\n", None),
    ("0::/\n", None),
    ("12:memory:/system.slice/docker.service\n1:name=systemd:/system.slice/sglang-b.service\n", "sglang-b.service"),
    ("0::/system.slice/system-sglang.slice/sglang@b.service\n", "sglang@b.service"),
])
def test_processes_of_other_units_are_recognised(text, expected):
    assert reap.other_unit(text, "sglang-a.service") == expected


# --------------------------------------------------------------------------- one host per state folder


@pytest.fixture
def two_hosts(monkeypatch):
    """Switch this process between two host identities sharing one state folder."""
    who = {"id": {"hostname": "gpu-a", "machine_id": "0123abcd"}}
    monkeypatch.setattr(lock, "host_identity", lambda: dict(who["id"]))

    def be(hostname, machine_id="0123abcd"):  # clones keep the machine id
        who["id"] = {"hostname": hostname, "machine_id": machine_id}
    return be


def test_second_host_is_refused_naming_the_owner(tmp_path, two_hosts):
    sd = str(tmp_path / "state")
    lock.acquire(sd, "run-1", "ctl pid 1")
    owner = json.load(open(os.path.join(sd, "host.json")))
    assert owner["hostname"] == "gpu-a" and owner["machine_id"] == "0123abcd"
    two_hosts("gpu-b")
    for op in (lambda: lock.acquire(sd, "run-1", "ctl pid 1"), lambda: lock.release(sd, "run-1"),
               lambda: lock.heartbeat(sd, "run-1"), lambda: lock.break_lock(sd, force=True)):
        with pytest.raises(PayloadError) as ei:
            op()
        assert ei.value.kind == "locked" and "'gpu-a'" in ei.value.msg and sd in ei.value.msg
    two_hosts("gpu-a")
    assert lock.acquire(sd, "run-1", "ctl pid 1")["reentrant"]  # the owner is untouched
    assert lock.release(sd, "run-1")["released"]


def test_same_name_other_machine_id_is_another_host(tmp_path, two_hosts):
    sd = str(tmp_path / "state")
    lock.acquire(sd, "run-1", "ctl")
    lock.release(sd, "run-1")
    two_hosts("gpu-a", "ffff0000")
    with pytest.raises(PayloadError, match="machine-id ffff0000"):
        lock.acquire(sd, "run-2", "ctl")


def test_folder_of_an_older_orch_is_adopted(tmp_path, two_hosts):
    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    assert lock.acquire(str(sd), "run-1", "ctl")["acquired"]
    assert json.load(open(sd / "host.json"))["hostname"] == "gpu-a"


def test_real_identity_has_this_hosts_name():
    me = lock.host_identity()
    assert me["hostname"] == socket.gethostname() and isinstance(me["machine_id"], str)


# --------------------------------------------------------------------------- ModelScope


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder / "config.json"


def test_modelscope_cache_as_sglang_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("SGLANG_USE_MODELSCOPE", "True")
    cfg = _model(tmp_path / "ms" / "models" / "Qwen" / "Qwen3-30B-A3B")
    assert use_modelscope() and resolve_model_config_path("Qwen/Qwen3-30B-A3B") == cfg
    dl = _model(tmp_path / "dl" / "Qwen" / "Qwen3-8B")
    assert resolve_model_config_path("Qwen/Qwen3-8B", download_dir=str(tmp_path / "dl")) == dl
    masked = _model(tmp_path / "ms" / "models" / "Qwen" / "Qwen2___5-7B")  # modelscope's download folder
    assert resolve_model_config_path("Qwen/Qwen2.5-7B") == masked


def test_modelscope_miss_names_every_path_tried(tmp_path, monkeypatch):
    monkeypatch.delenv("MODELSCOPE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(PayloadError) as ei:
        resolve_model_config_path("Qwen/Qwen3.5-9B", download_dir="/data/dl", modelscope=True)
    msg = ei.value.msg
    root = tmp_path / "home" / ".cache" / "modelscope" / "hub" / "models"
    for p in (root / "Qwen/Qwen3.5-9B/config.json", Path("/data/dl/Qwen/Qwen3.5-9B/config.json"),
              root / "Qwen/Qwen3___5-9B/config.json"):
        assert str(p) in msg
    assert ei.value.kind == "not_found" and "orch does not download" in msg
    assert [str(c) for c in modelscope_candidates("a/b")] == [str(root / "a/b")]


@pytest.mark.parametrize("value, expected", [("true", True), ("1", True), ("YES", True), ("y", True),
                                             ("false", False), ("0", False), ("", False)])
def test_use_modelscope_follows_sglang_envbool(value, expected):
    assert use_modelscope({"SGLANG_USE_MODELSCOPE": value}) is expected
    assert use_modelscope({}) is False
