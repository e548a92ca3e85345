"""A host that accepts TCP but never sends an SSH banner (a hung sshd, another service on port
22): the operator gets one line saying so, never Paramiko's tracebacks (its transport thread logs
two of them, about 40 lines, while the connect fails); the run's ``debug.log`` keeps them. The
silent server is a socket on loopback that accepts and says nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.paths import REPO


@pytest.fixture
def silent_port():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])  # kept open, never written to
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for s in held:
        s.close()
    srv.close()


def test_no_banner_is_one_line_and_the_traceback_goes_to_the_debug_log(tmp_path, silent_port):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  hosts:\n    mute:\n      ansible_host: 127.0.0.1\n"
                   f"      ansible_port: {silent_port}\n      ansible_user: root\n      orch_connect_timeout: 1\n")
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "doctor", str(inv), "--service", "sglang-qwen",
                           "--state-dir", str(state)], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="200", HOME=str(tmp_path)))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "paramiko" not in out and "No existing session" not in out, out
    line = f"mute: 127.0.0.1:{silent_port}: the server accepted the TCP connection but sent no SSH banner within 1 s"
    assert line in proc.stderr.replace("\n", " "), proc.stderr
    assert len(proc.stderr.splitlines()) <= 3, proc.stderr  # the header, the Connect line, a blank
    (run,) = (state / "runs").iterdir()
    log = (run / "debug.log").read_text()
    assert "Traceback" in log and "Error reading SSH protocol banner" in log
