"""Multi-node servers: which inventory hosts are the ranks of one SGLang server.

An SGLang server spread over several hosts is started on each with the same model and
``--nnodes N``, its own ``--node-rank R`` (0..N-1) and the same ``--dist-init-addr HOST:PORT``
(the address of rank 0, where ``torch.distributed`` meets; SGLang 0.5.23
srt/arg_groups/fields/parallel.py, srt/distributed/bootstrap.py, srt/entrypoints/engine.py
``_launch_subprocesses``). Only rank 0 runs the
tokenizer and the HTTP API; a rank >= 1 waits for its schedulers and then answers only
``/health``, ``/health_generate`` and ``/ping`` (``launch_dummy_health_check_server``,
srt/utils/common.py), and on SIGTERM it waits for rank 0's shutdown broadcast instead of exiting.
So the ranks are one unit of work: orch stops, installs, starts and rolls back all of them
together (docs/multi-node.md).

:func:`server_key` says which server a host's unit belongs to; :func:`group_servers` gathers the
hosts of a run into :class:`ServerGroup` facts, with the reason a server must be refused before
anything changes (a rank missing from the run, two hosts claiming one rank, ranks whose GPUs are
of another kind). Pure functions; no host is contacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from remote.engines import ServerArgs

from .schema import Record


@dataclass(slots=True)
class ServerGroup(Record):
    """One server's ranks as orch found them among the run's hosts (``orch_server_group``).

    ``key``: ``"<unit>@<dist_init_addr>"`` (one server); ``unit``, ``dist_init_addr`` and
    ``nnodes`` as the units give them; ``hosts``: inventory host names by rank (index = node
    rank; ``""`` for a rank no host of the run is); ``rank``: this host's ``--node-rank``;
    ``refusal``: why the whole server is refused before any change (None when it may be tuned).
    """

    key: str
    unit: str
    dist_init_addr: str
    nnodes: int
    hosts: list[str] = field(default_factory=list)
    rank: int = 0
    refusal: str | None = None

    @property
    def rank0(self) -> str:
        """The host of rank 0 (``""`` when missing): it tunes, answers HTTP and is benchmarked."""
        return self.hosts[0] if self.hosts else ""

    @property
    def members(self) -> list[str]:
        """The hosts present, in rank order."""
        return [h for h in self.hosts if h]


def server_key(unit: str, server: ServerArgs) -> str | None:
    """The server a host's unit is a rank of, or None for a single-node server (``--nnodes``
    1 or absent). ``unit``: the systemd unit name; ``server``: its parsed launch command.

    Hosts of one server run the same unit with the same ``--dist-init-addr`` (SGLang 0.5.23
    srt/arg_groups/fields/parallel.py ``dist_init_addr``; its alias ``--nccl-init-addr``). A multi-node unit
    without ``--dist-init-addr`` is keyed ``<unit>@?`` and refused by :func:`group_servers`."""
    if int(server.nnodes or 1) <= 1:
        return None
    return f"{unit}@{server.dist_init_addr or '?'}"


def group_servers(hosts: Mapping[str, tuple[str, ServerArgs, str | None]]) -> dict[str, ServerGroup]:
    """Gather the run's multi-node hosts into servers.

    ``hosts``: inventory host name -> (unit name, parsed server arguments, GPU device name in
    SGLang's file-name form or None when not known yet), for the hosts of the run (after
    ``--limit``), in inventory order. Returns host name -> its :class:`ServerGroup`, for the
    hosts whose unit is multi-node only. Every host of a server gets the same ``refusal``:

    - ``--dist-init-addr`` missing (SGLang needs it to join the nodes);
    - the hosts disagree on ``--nnodes``;
    - a ``--node-rank`` outside 0..N-1, or claimed by two hosts;
    - a rank that no host of the run is (named: "rank 1 of sglang-ds@10.0.0.1:5000");
    - GPUs of different kinds (one tune must fit every rank: SGLang looks up
      ``device_name=...`` in the file name on each node).

    Never raises for bad input: the refusal says it."""
    by_key: dict[str, list[tuple[str, str, ServerArgs, str | None]]] = {}
    for name, (unit, server, device) in hosts.items():
        key = server_key(unit, server)
        if key is not None:
            by_key.setdefault(key, []).append((name, unit, server, device))
    out: dict[str, ServerGroup] = {}
    for key, members in by_key.items():
        unit, first = members[0][1], members[0][2]
        sizes = sorted({int(s.nnodes or 1) for _, _, s, _ in members})
        nnodes = sizes[-1]
        slots = [""] * nnodes
        problems: list[str] = []
        if not first.dist_init_addr:
            problems.append("--dist-init-addr is not given (the server needs rank 0's address to join the nodes)")
        if len(sizes) > 1:
            said = ", ".join(f"{n} --nnodes {int(s.nnodes or 1)}" for n, _, s, _ in members)
            problems.append(f"the hosts disagree on --nnodes ({said})")
        for name, _, server, _ in members:
            rank = int(server.node_rank or 0)
            if not 0 <= rank < nnodes:
                problems.append(f"{name} has --node-rank {rank}, outside 0..{nnodes - 1}")
            elif slots[rank]:
                problems.append(f"{slots[rank]} and {name} are both --node-rank {rank}")
            else:
                slots[rank] = name
        missing = [r for r, h in enumerate(slots) if not h]
        if missing and not any("outside" in p or "both" in p for p in problems):
            ranks = ", ".join(str(r) for r in missing)
            problems.append(f"rank{'s' if len(missing) > 1 else ''} {ranks} of {nnodes} {'are' if len(missing) > 1 else 'is'} "
                            "not a host of this run (add the host to the inventory, or widen --limit: every rank "
                            "is stopped and started together)")
        devices = {d for _, _, _, d in members if d}
        if len(devices) > 1:
            said = ", ".join(f"{n} {d}" for n, _, _, d in members if d)
            problems.append(f"the ranks' GPUs are of different kinds ({said}): one tune cannot fit every rank")
        refusal = None
        if problems:
            refusal = (f"multi-node server {key} (--nnodes {nnodes}): " + "; ".join(problems)
                       + ". Nothing was stopped on any of its ranks")
        for name, _, server, _ in members:
            out[name] = ServerGroup(key, unit, first.dist_init_addr or "", nnodes, list(slots),
                                    int(server.node_rank or 0), refusal)
    return out
