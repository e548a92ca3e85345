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
from dataclasses import dataclass, field
from typing import Any


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
    """Thread-safe meeting point of the hosts of one batch (see module docstring)."""

    def __init__(self, shard_tuning: bool = False, tune_on: str | None = None):
        self.shard_tuning = shard_tuning
        self.tune_on = tune_on
        self._cv = threading.Condition()
        self._batch: list[str] = []
        self._keys: dict[str, str | None] = {}
        self._states: dict[str, _KeyState] = {}

    def start_batch(self, hosts: list[str]) -> None:
        """Called by the engine when a batch starts (inventory order)."""
        with self._cv:
            self._batch = list(hosts)
            self._keys = {}
            self._cv.notify_all()

    def report_key(self, host: str, key_hash: str) -> None:
        with self._cv:
            self._keys[host] = key_hash
            self._cv.notify_all()

    def host_done(self, host: str) -> None:
        """The host's play ended (any outcome); the barrier stops waiting for it."""
        with self._cv:
            self._keys.setdefault(host, None)
            self._cv.notify_all()

    def assign(self, host: str, batch_sizes: list[int], timeout: float = 3600) -> Role:
        """Wait for every host of the batch to report, then return ``host``'s :class:`Role`."""
        with self._cv:
            if not self._cv.wait_for(lambda: all(h in self._keys for h in self._batch), timeout=timeout):
                missing = [h for h in self._batch if h not in self._keys]
                raise TimeoutError(f"hosts {missing} did not finish probing within {timeout:.0f} s")
            mine = self._keys[host]
            members = [h for h in self._batch if self._keys.get(h) == mine]
            st = self._states.setdefault(mine, _KeyState())
            if self.shard_tuning and len(members) > 1 and len(batch_sizes) > 1:
                n = min(len(members), len(batch_sizes))
                st.n_shards = n
                idx = members.index(host)
                if idx >= n:
                    return Role("reuse", mine, members, tuner=members[0])
                # round-robin keeps small and large M spread across hosts
                return Role("shard", mine, members, batch_sizes=batch_sizes[idx::n], shard_index=idx)
            tuner = self.tune_on if self.tune_on in members else members[0]
            return Role("tune" if host == tuner else "reuse", mine, members, tuner=tuner)

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
