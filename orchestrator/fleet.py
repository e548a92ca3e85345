"""Coordination of hosts that share a tuning key within one run.

Each host of a batch reports its tuning key after probing (``report_key``) or that it
ended (``host_done``). ``assign`` blocks until every host of the batch has done one or
the other, then gives each host its role for its key:

- ``tune``: this host tunes the whole batch-size list (the first host of the group in
  inventory order, or ``--tune-on HOST``);
- ``shard``: with ``--shard-tuning``, every host of the group tunes a slice of the
  batch sizes; the slices are merged when all are published;
- ``reuse``: another host tunes; this one waits for the result (its service keeps
  serving meanwhile) and installs it.

Results are exchanged in memory (``publish``/``wait_result``) and persisted in the
:class:`orchestrator.store.ConfigStore` by the task code.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError, internal_error


@dataclass
class Role:
    """A host's part for its key: ``kind`` (tune|shard|reuse), ``batch_sizes`` to tune
    (shards), ``members`` (hosts of the group in this batch), ``tuner`` (host that tunes)."""

    kind: str
    key_hash: str
    members: list[str]
    tuner: str | None = None
    batch_sizes: list[int] | None = None
    shard_index: int = 0


@dataclass
class _KeyState:
    result: dict | None = None
    error: str | None = None
    shards: dict[int, dict] = field(default_factory=dict)
    n_shards: int = 1
    done: threading.Event = field(default_factory=threading.Event)


class GroupCoordinator:
    """Thread-safe meeting point of the hosts of one batch (see module docstring).

    Only hosts that have started (``host_started``; ``--forks`` may hold others back) are
    waited for; the tuner (or the shards) of a key is chosen once, among the hosts present
    when the first of them asks, and hosts that start later reuse its result. A tuner or
    shard that ends without publishing (``host_done``) publishes an error, so no host waits
    for a result that will never come.
    """

    def __init__(self, shard_tuning: bool = False, tune_on: str | None = None):
        self.shard_tuning = shard_tuning
        self.tune_on = tune_on
        #: hosts that tune for their group before the others (rank 0 of a multi-node server)
        self.prefer: set[str] = set()
        self._cv = threading.Condition()
        self._batch: list[str] = []
        self._started: set[str] = set()
        self._keys: dict[str, str | None] = {}
        self._states: dict[str, _KeyState] = {}
        self._roles: dict[str, dict[str, Role]] = {}

    def check_hosts(self, hosts: list[str]) -> None:
        """Before the run: ``--tune-on`` must name one of the run's ``hosts`` (else it would be
        silently ignored). Raises :class:`~orchestrator.errors.UsageError`."""
        if self.tune_on is not None and self.tune_on not in hosts:
            shown = ", ".join(hosts[:5]) + (f", ... ({len(hosts)} in all)" if len(hosts) > 5 else "")
            raise UsageError(f"--tune-on {self.tune_on!r}: not a host of this run ({shown or 'none'})")

    def start_batch(self, hosts: list[str]) -> None:
        """Called by the engine when a batch starts (inventory order); forgets the last batch."""
        with self._cv:
            self._batch = list(hosts)
            self._started = set()
            self._keys = {}
            self._states = {}
            self._roles = {}
            self._cv.notify_all()

    def host_started(self, host: str) -> None:
        """Called by the engine when a host's play starts running."""
        with self._cv:
            self._started.add(host)
            self._cv.notify_all()

    def report_key(self, host: str, key_hash: str) -> None:
        with self._cv:
            self._keys[host] = key_hash
            self._cv.notify_all()

    def host_done(self, host: str) -> None:
        """The host's play ended (any outcome): stop waiting for it; fail what it owed."""
        with self._cv:
            self._keys.setdefault(host, None)
            for kh, roles in self._roles.items():
                role = roles.get(host)
                st = self._states.get(kh)
                if role is None or st is None or st.done.is_set() or role.kind not in ("tune", "shard"):
                    continue
                if role.kind == "shard" and role.shard_index in st.shards:
                    continue
                st.error = st.error or f"{host} ended before publishing its tuning result"
                st.done.set()
            self._cv.notify_all()

    def assign(self, host: str, batch_sizes: list[int], timeout: float = 3600,
               cancel: threading.Event | None = None) -> Role:
        """Wait for every started host of the batch to report, then return ``host``'s :class:`Role`."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._started.add(host)
            while not all(h in self._keys for h in self._started):
                if cancel is not None and cancel.is_set():
                    raise TimeoutError("interrupted while waiting for the other hosts to probe")
                if time.monotonic() > deadline:
                    missing = sorted(h for h in self._started if h not in self._keys)
                    raise TimeoutError(f"hosts {missing} did not finish probing within {timeout:.0f} s")
                self._cv.wait(timeout=1.0)
            mine = self._keys[host]
            roles = self._roles.get(mine)
            if roles is None:
                members = [h for h in self._batch if self._keys.get(h) == mine]
                roles = self._roles[mine] = self._decide(mine, members, batch_sizes)
            if host not in roles:  # started after the roles were decided: reuse
                first = next(iter(roles.values()))
                roles[host] = Role("reuse", mine, first.members + [host], tuner=first.tuner)
            return roles[host]

    def _decide(self, kh: str, members: list[str], batch_sizes: list[int]) -> dict[str, Role]:
        st = self._states.setdefault(kh, _KeyState())
        if self.shard_tuning and len(members) > 1 and len(batch_sizes) > 1:
            n = min(len(members), len(batch_sizes))
            st.n_shards = n
            out = {}
            for idx, h in enumerate(members):
                if idx < n:  # round-robin keeps small and large M spread across hosts
                    out[h] = Role("shard", kh, members, tuner=members[0], batch_sizes=batch_sizes[idx::n],
                                  shard_index=idx)
                else:
                    out[h] = Role("reuse", kh, members, tuner=members[0])
            return out
        preferred = [h for h in members if h in self.prefer]
        tuner = self.tune_on if self.tune_on in members else (preferred or members)[0]
        return {h: Role("tune" if h == tuner else "reuse", kh, members, tuner=tuner) for h in members}

    def publish(self, key_hash: str, result: dict | None, error: str | None = None, shard: int | None = None,
                merge=None) -> None:
        """Publish a tuner's result (or a shard's, merged with ``merge(list_of_results)`` when complete)."""
        with self._cv:
            st = self._states.setdefault(key_hash, _KeyState())
            if error:
                st.error = st.error or error
                st.done.set()
            elif shard is None:
                st.result = result
                st.done.set()
            else:
                st.shards[shard] = result
                if len(st.shards) == st.n_shards:
                    st.result = merge([st.shards[i] for i in sorted(st.shards)]) if merge else result
                    st.done.set()
            self._cv.notify_all()

    def wait_result(self, key_hash: str, cancel: threading.Event | None = None, timeout: float = 7 * 86400) -> dict:
        """Block until the key's result is published; raise RuntimeError with the tuner's error."""
        st = self._states.setdefault(key_hash, _KeyState())
        waited = 0.0
        while not st.done.wait(1.0):
            waited += 1.0
            if cancel is not None and cancel.is_set():
                raise RuntimeError("interrupted while waiting for another host's tuning")
            if waited > timeout:
                raise RuntimeError("timed out waiting for another host's tuning")
        if st.error:
            raise RuntimeError(st.error)
        return st.result  # type: ignore[return-value]

    @staticmethod
    def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
        """Union of shard results ``{"configs": {role: {M: cfg}}, "report": {...}}`` (keys sorted by M)."""
        out: dict[str, Any] = {"configs": {}, "reports": []}
        for r in results:
            for role, cfg in (r.get("configs") or {}).items():
                out["configs"].setdefault(role, {}).update(cfg)
            out["reports"].append(r.get("report"))
        for role in out["configs"]:
            out["configs"][role] = dict(sorted(out["configs"][role].items(), key=lambda kv: int(kv[0])))
        return out


@internal_error("raised by ServerBarrier.wait; the task that waits turns it into its TaskFailed")
class BarrierBroken(RuntimeError):
    """A rank of the same server failed or ended before a meeting point; ``str()`` names it."""


class ServerBarrier:
    """Meeting points of the hosts of one multi-node server (its ranks) within a batch.

    ``set_servers({host: [hosts of its server]})`` says which hosts meet (a host absent meets no
    one). ``wait(host, phase)`` returns once every other rank of ``host``'s server has reached
    ``phase`` too ("all ranks stopped before any starts"). ``strict`` waits raise
    :class:`BarrierBroken` as soon as a rank has failed (``fail``) or ended its play without
    reaching ``phase`` (``host_done``): a failure on one rank fails the server, and each rank's
    rescue rolls it back. A non-strict wait (the rollback's "all restored before any starts")
    waits only for the ranks whose play still runs. The engine calls ``start_batch`` and
    ``host_done`` (it is one of ``RunOptions.hooks``); thread-safe.
    """

    def __init__(self):
        self._cv = threading.Condition()
        self._servers: dict[str, list[str]] = {}
        self._arrived: dict[str, set[str]] = {}
        self._failed: dict[str, str] = {}
        self._done: set[str] = set()
        self._values: dict[str, dict[str, object]] = {}

    def set_servers(self, servers: dict[str, list[str]]) -> None:
        """``servers``: host name -> the host names of its server (itself included)."""
        with self._cv:
            self._servers = {h: list(m) for h, m in servers.items()}
            self._cv.notify_all()

    def start_batch(self, hosts: list[str]) -> None:
        """Engine hook: a batch starts; forget the last batch's meetings."""
        with self._cv:
            self._arrived, self._failed, self._done, self._values = {}, {}, set(), {}
            self._cv.notify_all()

    def host_started(self, host: str) -> None:
        """Engine hook (nothing to do)."""

    def host_done(self, host: str) -> None:
        """Engine hook: ``host``'s play ended (any outcome); strict waits for it stop waiting."""
        with self._cv:
            self._done.add(host)
            self._cv.notify_all()

    def host_failed(self, host: str, cause: str) -> None:
        """Engine hook: a task of ``host`` failed (before its block's rescue): :meth:`fail`."""
        self.fail(host, cause)

    def fail(self, host: str, cause: str) -> None:
        """``host`` failed (``cause``): the strict waits of its server's other ranks raise."""
        with self._cv:
            self._failed.setdefault(host, cause)
            self._cv.notify_all()

    def failed_peer(self, host: str) -> str | None:
        """``"<host> failed: <cause>"`` for a failed rank of ``host``'s server, else None."""
        with self._cv:
            bad = [f"{p} failed: {self._failed[p]}" for p in self.peers(host) if p in self._failed]
        return f"another rank of this server: {bad[0]}" if bad else None

    def shared(self, host: str, phase: str) -> dict[str, object]:
        """What each rank of ``host``'s server that reached ``phase`` brought to it (host name ->
        its ``value``, ``host`` itself included): after a strict :meth:`wait`, every rank's."""
        with self._cv:
            got = self._values.get(phase, {})
            return {h: got[h] for h in [host, *self.peers(host)] if h in got}

    def peers(self, host: str) -> list[str]:
        """The other ranks of ``host``'s server ([] for a single-node host)."""
        return [h for h in self._servers.get(host, []) if h != host]

    def wait(self, host: str, phase: str, strict: bool = True, timeout: float = 3600,
             cancel: threading.Event | None = None, among: list[str] | None = None,
             value: object = None) -> list[str]:
        """Block until every other rank of ``host``'s server (only those in ``among`` when given:
        ``[]`` only records the arrival) has reached ``phase`` (seconds ``timeout``). ``value``
        (any object) is what this rank brings to the meeting, read by :meth:`shared`. Returns the
        ranks met. Raises :class:`BarrierBroken` (strict: a rank failed or ended first; either:
        timeout or ``cancel``)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._arrived.setdefault(phase, set()).add(host)
            self._values.setdefault(phase, {})[host] = value
            self._cv.notify_all()
            while True:
                peers = [p for p in self.peers(host) if among is None or p in among]
                if strict:
                    bad = [f"{p} failed: {self._failed[p]}" for p in peers if p in self._failed]
                    bad += [f"{p} ended before '{phase}'" for p in peers
                            if p in self._done and p not in self._arrived[phase] and p not in self._failed]
                    if bad:
                        raise BarrierBroken(f"another rank of this server: {'; '.join(bad)}")
                waiting = [p for p in peers if p not in self._arrived[phase] and (strict or p not in self._done)]
                if not waiting:
                    return peers
                if cancel is not None and cancel.is_set():
                    raise BarrierBroken(f"interrupted while waiting for {', '.join(waiting)} to reach '{phase}'")
                if time.monotonic() > deadline:
                    raise BarrierBroken(f"{', '.join(waiting)} did not reach '{phase}' within {timeout:.0f} s")
                self._cv.wait(timeout=1.0)
