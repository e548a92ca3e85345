"""``remote.bench.common.run_client``: an engine's own benchmark client (``sglang.bench_serving``,
``vllm bench serve``) ends with the payload that started it, so a cancelled run or a lost link stops
the load on the server. Each case starts a payload process that runs a client which records its pid
and sleeps; the payload is then ended as orch or the host would end it, and the client must go too
(before, it ran on in a session of its own until its level's timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from remote.bench.common import run_client
from tests.waiting import files_state, process_ended, wait_until

ROOT = Path(__file__).resolve().parents[4]

PAYLOAD = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, sys.argv[1])
    from remote.bench.common import run_client
    # the payload's own dispositions, whatever the test run inherited (nohup, a background job)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    pidfile = sys.argv[2]
    # the client starts a child of its own (as a client's workers would) and records both pids
    client = [sys.executable, "-c",
              "import os, subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
              "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {c.pid}'); "
              "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(3600)", pidfile]
    rc, out = run_client(client, 3600, 2000)
    print("client ended", rc, flush=True)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has ended; only its parent (init here, once the payload is gone) can reap it
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int, int]:
    pidfile = tmp_path / "client.pid"
    payload = subprocess.Popen([sys.executable, "-c", PAYLOAD, str(ROOT), str(pidfile)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(pidfile.exists, "the client wrote its pid", alive=process_ended(payload),
               progress=[lambda: files_state(tmp_path)])
    client, child = (int(x) for x in pidfile.read_text().split())
    return payload, client, child


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_an_ending_signal_to_the_payload_kills_the_clients_whole_group(tmp_path, sig):
    payload, client, child = _start(tmp_path)
    try:
        assert _alive(client) and _alive(child)
        payload.send_signal(sig)
        payload.wait()
        # the client's own child too: only the group kill of the handler reaches it (the kernel's
        # parent-death signal goes to the direct child alone)
        wait_until(lambda: not _alive(client) and not _alive(child),
                   f"the client's group ended after {signal.Signals(sig).name} to the payload",
                   progress=[lambda: (_alive(client), _alive(child))])
        # then the payload ended by the signal as it would have without a client (SIGINT: Python's
        # default handler's KeyboardInterrupt, uncaught, ends the process by SIGINT too)
        assert payload.returncode == -sig, payload.returncode
    finally:
        for pid in (client, child):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        payload.kill()


def test_the_client_dies_with_a_payload_killed_by_sigkill(tmp_path):
    payload, client, child = _start(tmp_path)
    try:
        payload.kill()
        payload.wait()
        wait_until(lambda: not _alive(client), "the client ended after SIGKILL to the payload",
                   progress=[lambda: _alive(client)])
    finally:
        for pid in (client, child):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_signal_the_payload_ignores_stays_ignored():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        rc, _ = run_client([sys.executable, "-c", "import os, signal; os.kill(os.getppid(), signal.SIGHUP)"], 600, 10)
        assert rc == 0 and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_client_that_outlives_its_timeout_is_killed_with_its_group(tmp_path):
    child = tmp_path / "child.pid"
    cmd = [sys.executable, "-c", "import os, subprocess, sys, time; "
           "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
           "print('started', flush=True); "
           f"open({str(child)!r} + '.tmp', 'w').write(str(p.pid)); os.rename({str(child)!r} + '.tmp', {str(child)!r}); "
           "time.sleep(3600)"]
    # the timeout doubles until the client got as far as starting its child (a busy machine is slower)
    timeout = 1.0
    while True:
        rc, out = run_client(cmd, timeout, 100)
        assert rc is None
        if child.exists():
            break
        timeout *= 2
    assert "started" in out
    grandchild = int(child.read_text())
    wait_until(lambda: not _alive(grandchild), "the client's own child ended with its group",
               progress=[lambda: _alive(grandchild)])


def test_a_finished_client_gives_its_status_and_the_tail_of_its_output():
    rc, out = run_client([sys.executable, "-c", "import sys; print('x' * 50 + 'end'); sys.exit(3)"], 600, 10)
    assert rc == 3 and out == "xxxxxxend\n"


def test_the_payloads_signal_handlers_are_back_after_the_client():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    run_client([sys.executable, "-c", "pass"], 600, 10)
    assert {s: signal.getsignal(s) for s in before} == before
