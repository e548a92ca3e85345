"""The stand-in's meeting of the ranks of a multi-node server (``--nnodes N > 1``), standing in for
what SGLang 0.5.23 does through ``torch.distributed`` (no torch process group is made here).

What SGLang does, read in the release's code:

- ``srt/distributed/bootstrap.py`` ``_init_parallel_groups``: every rank calls
  ``init_distributed_environment`` with ``--dist-init-addr`` as the ``tcp://`` init method and
  ``timeout=--dist-timeout`` (torch's default when the flag is not given). Rank 0 serves the store
  there; the other ranks connect to it and keep trying until that timeout. No rank loads its model
  (and so reads no MoE config, which CUDA-graph capture does) before every rank has joined.
- ``srt/entrypoints/engine.py`` ``_launch_subprocesses``: a rank >= 1 starts its health server
  (``launch_dummy_health_check_server``) only once its schedulers are ready, i.e. after the ranks
  met; before that its port is not bound. Once running, its SIGTERM handler only logs "waiting for
  the rank-0 ShutdownReq broadcast" and the process keeps running: rank 0's shutdown stops every TP
  rank (``srt/managers/scheduler.py`` ``handle_shutdown``), after which the rank's process returns.
- A scheduler whose peer went away mid-run fails its next collective (its idle loop broadcasts
  every request from TP rank 0 over the CPU group): ``run_scheduler_process`` logs
  ``Scheduler hit an exception`` and sends SIGQUIT to its parent, whose handler kills the whole
  process tree (``kill_process_tree``): the server exits, on rank 0 as on the others.

The stand-in's form of it, over real TCP at ``--dist-init-addr`` (the test bed links the hosts of
a server, ``cluster_with``): rank 0 listens on that port and waits for the ``N - 1`` other ranks to
connect and say their rank; then it answers each ``joined``. A rank >= 1 connects (retrying every
0.5 s) and waits for ``joined``. Either side gives up after ``--dist-timeout`` s (default 1800, as
torch's default process-group timeout), failing the start like torch does. After the meeting,
:meth:`Ranks.watch` reads the connections: ``shutdown`` from rank 0 (its SIGTERM) makes a rank
>= 1 stop cleanly; a connection that closes without it is the peer gone (crashed or killed), and
the stand-in then exits as SGLang does (the scheduler's exception, then SIGKILL of its own process).

Start-up faults (issue 32 row 9), read at each start from ``faults`` (the JSON object a test writes
to ``$ORCH_STANDIN_STATE_DIR/dist-faults.json``, see ``server.py``):

- ``"listen_delay_s": S`` (rank 0): the store listens S seconds after the start, as a real rank 0
  reaches ``init_process_group`` only after its imports and device set-up;
- ``"join": "fail_fast"`` (a rank >= 1): a refused connection fails the start at once, with
  torch's ``DistNetworkError`` text, instead of retrying until ``--dist-timeout`` (torch releases
  and set-ups differ here; sglang #3099): a rank started before rank 0's store listens dies;
- ``"eaddrinuse_once": true`` (rank 0): the store's bind fails once with torch's ``EADDRINUSE``
  error (another process took the port a moment before: sglang #37215); the knob is then removed,
  so the next start binds.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Callable, List, Optional

logger = logging.getLogger("sglang.srt.managers.scheduler")

#: torch.distributed's default process-group timeout (seconds), used when --dist-timeout is not given
DEFAULT_TIMEOUT_S = 1800.0
RETRY_S = 0.5


class DistError(RuntimeError):
    """The ranks did not meet within the timeout (the start fails, as torch's error fails SGLang's)."""


def split_addr(addr: str) -> tuple:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> ``(host, port)``. ValueError when it has no port."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--dist-init-addr {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _readline(sock: socket.socket, deadline: float) -> Optional[str]:
    """One ``\\n``-ended line from ``sock`` (None at EOF); DistError past ``deadline``."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistError("timed out waiting for the other ranks")
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(1)
        except socket.timeout:
            continue
        if not chunk:
            return None
        buf += chunk
    return buf.decode().strip()


class Ranks:
    """This rank's connections to the others after the meeting (rank 0: one per other rank; a
    rank >= 1: the one to rank 0)."""

    def __init__(self, rank: int, nnodes: int, addr: str, timeout: Optional[float], faults: Optional[dict] = None):
        self.rank, self.nnodes, self.addr = rank, nnodes, addr
        self.faults = dict(faults or {})
        self.timeout = float(timeout) if timeout else DEFAULT_TIMEOUT_S
        self.conns: List[socket.socket] = []
        self.listener: Optional[socket.socket] = None
        self.stopping = False  # this rank's own shutdown: a closing peer is expected then

    def meet(self) -> None:
        """Wait for every rank (see the module docstring). Raises :class:`DistError` on timeout."""
        host, port = split_addr(self.addr)
        deadline = time.monotonic() + self.timeout
        logger.info(f"(stand-in) node_rank {self.rank} of {self.nnodes}: joining the other ranks at {self.addr}")
        if self.rank == 0:
            self._serve(port, deadline)
        else:
            self._join(host, port, deadline)
        logger.info(f"(stand-in) node_rank {self.rank}: all {self.nnodes} ranks joined")

    def _serve(self, port: int, deadline: float) -> None:
        delay = float(self.faults.get("listen_delay_s") or 0)
        if delay:
            time.sleep(delay)  # the stand-in's own start-up work before init_process_group
        if self.faults.get("eaddrinuse_once"):
            raise DistError(f"The server socket has failed to listen on any local network address. port: {port}, "
                            "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", port))
        self.listener.listen(16)
        joined = {}
        while len(joined) < self.nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistError(f"Timed out after {self.timeout:.0f} seconds waiting for clients. "
                                f"{len(joined) + 1}/{self.nnodes} clients joined.")
            self.listener.settimeout(min(left, 1.0))
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            try:
                line = _readline(conn, time.monotonic() + 10)
            except (DistError, OSError):
                line = None
            if not line or not line.startswith("rank "):
                conn.close()
                continue
            old = joined.pop(line, None)  # a rank that came again: its earlier connection is gone
            if old is not None:
                old.close()
            joined[line] = conn
        self.conns = list(joined.values())
        for c in self.conns:
            c.sendall(b"joined\n")

    def _join(self, host: str, port: int, deadline: float) -> None:
        while True:
            try:
                conn = socket.create_connection((host, port), timeout=2)
                conn.sendall(f"rank {self.rank}\n".encode())
                line = _readline(conn, deadline)
                if line == "joined":
                    self.conns = [conn]
                    return
                conn.close()  # rank 0 went away before every rank joined: try again
            except ConnectionRefusedError as exc:
                if self.faults.get("join") == "fail_fast":
                    raise DistError(f"torch.distributed.DistNetworkError: The client socket has failed to connect to "
                                    f"[{host}]:{port} (errno: 111 - Connection refused): rank 0's store is not "
                                    "listening (stand-in: this rank started before rank 0)") from exc
            except OSError:
                pass
            if time.monotonic() + RETRY_S > deadline:
                raise DistError(f"The client socket has timed out after {self.timeout * 1000:.0f}ms while trying "
                                f"to connect to ({host}, {port}).")
            time.sleep(RETRY_S)

    def watch(self, on_shutdown: Callable[[], None]) -> None:
        """Read every connection in a thread: ``shutdown`` (at a rank >= 1) calls ``on_shutdown``;
        a connection closed while this rank is not stopping is a peer gone, and the process exits
        as SGLang's does then (see the module docstring)."""
        for conn in self.conns:
            threading.Thread(target=self._read, args=(conn, on_shutdown), daemon=True).start()

    def _read(self, conn: socket.socket, on_shutdown: Callable[[], None]) -> None:
        while True:
            try:
                line = _readline(conn, float("inf"))
            except OSError:
                line = None
            if line == "shutdown" and self.rank > 0:
                logger.info("(stand-in) ShutdownReq from rank 0: the schedulers exit")
                self.stopping = True
                on_shutdown()
                return
            if line is None:
                if self.stopping:
                    return
                logger.error("Scheduler hit an exception: Traceback (most recent call last):\n"
                             "RuntimeError: [gloo] Connection closed by peer (stand-in: another rank of this "
                             "server went away)")
                logging.getLogger("sglang.srt.entrypoints.engine").error(
                    "Received sigquit from a child process. It usually means the child failed.")
                for h in logging.getLogger().handlers:
                    h.flush()
                os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree includes the parent
                return

    def shutdown(self) -> None:
        """Rank 0's SIGTERM: broadcast ``shutdown`` to every other rank, then close."""
        self.stopping = True
        for conn in self.conns:
            try:
                conn.sendall(b"shutdown\n")
            except OSError:
                pass

    def close(self) -> None:
        """Close the connections and the listener (the process is ending)."""
        self.stopping = True
        for s in self.conns + ([self.listener] if self.listener else []):
            try:
                s.close()
            except OSError:
                pass
