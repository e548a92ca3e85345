"""The stand-in's meeting of the ranks (tests/testbed/standin/sglang/_standin/dist.py), over real
TCP on the loopback: a rank >= 1 waits for rank 0, rank 0 for every rank, and rank 0's shutdown
reaches the others."""

from __future__ import annotations

import importlib.util
import socket
import threading
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "testbed" / "standin" / "sglang" / "_standin" / "dist.py"
_spec = importlib.util.spec_from_file_location("standin_dist", _PATH)
dist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dist)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_1_started_first_waits_for_rank_0_then_both_meet_and_shutdown_reaches_rank_1():
    addr = f"127.0.0.1:{_port()}"
    r1, r0 = dist.Ranks(1, 2, addr, 20), dist.Ranks(0, 2, addr, 20)
    met = threading.Event()
    t = threading.Thread(target=lambda: (r1.meet(), met.set()), daemon=True)
    t.start()
    assert not met.wait(1.5)  # no rank 0 yet: rank 1 keeps trying
    r0.meet()
    assert met.wait(10)
    stopped = threading.Event()
    r1.watch(stopped.set)
    r0.shutdown()
    assert stopped.wait(10) and r1.stopping
    r0.close()
    r1.close()


def test_a_rank_that_never_comes_times_out_like_torch():
    addr = f"127.0.0.1:{_port()}"
    with pytest.raises(dist.DistError, match="1/2 clients joined"):
        dist.Ranks(0, 2, addr, 1).meet()
    with pytest.raises(dist.DistError, match="timed out"):
        dist.Ranks(1, 2, f"127.0.0.1:{_port()}", 1).meet()
