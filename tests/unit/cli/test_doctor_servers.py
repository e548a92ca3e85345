"""``orch doctor`` on the ranks of a multi-node server (orchestrator/cli/doctor.py add_servers):
each rank's row names its server and rank, and a server whose ranks are missing from the run or
disagree (GPU kinds, the files SGLang would load) is reported on every rank."""

from __future__ import annotations

from orchestrator.cli.doctor import add_servers, server_cell, verdict_reason
from orchestrator.facts.server_group import group_servers
from remote.engines.sglang.server_args import ServerArgs


def _servers(ranks: dict[str, int], nnodes: int = 2) -> dict:
    return group_servers({h: ("sglang-ds", ServerArgs("/py", [], nnodes=nnodes, node_rank=r, dist_init_addr="10.0.0.1:5000"),
                              None) for h, r in ranks.items()})


def _row(device: str = "NVIDIA_H200", up: str = "a" * 64, down: str = "b" * 64) -> dict:
    return {"verdict": "tuned", "why": "fine", "device_name": device,
            "files": {"up": {"name": "up.json", "sha256": up}, "down": {"name": "down.json", "sha256": down}}}


def test_ranks_that_agree_get_their_server_and_no_problem():
    rows = {"a": _row(), "b": _row(), "c": _row()}
    add_servers(rows, _servers({"a": 0, "b": 1}))
    assert rows["a"]["server"] == {"key": "sglang-ds@10.0.0.1:5000", "rank": 0, "nnodes": 2, "hosts": ["a", "b"],
                                   "problems": []}
    assert rows["b"]["server"]["rank"] == 1 and "server" not in rows["c"]
    assert server_cell(rows["b"]) == "rank 1 of 2\nsglang-ds@10.0.0.1:5000" and server_cell(rows["c"]) == ""
    assert verdict_reason(rows["a"]) == "fine"


def test_a_missing_rank_is_named():
    rows = {"a": _row()}
    add_servers(rows, _servers({"a": 0}))
    (problem,) = rows["a"]["server"]["problems"]
    assert "rank 1 of 2 is not a host of this run" in problem and "Nothing was stopped" not in problem
    assert rows["a"]["server"]["hosts"] == ["a", ""]


def test_different_files_and_gpu_kinds_are_reported_on_every_rank():
    rows = {"a": _row(), "b": _row(device="NVIDIA_H100_80GB_HBM3", down="c" * 64)}
    add_servers(rows, _servers({"a": 0, "b": 1}))
    problems = rows["a"]["server"]["problems"]
    assert problems == rows["b"]["server"]["problems"] and len(problems) == 2, problems
    assert "different kinds (a NVIDIA_H200, b NVIDIA_H100_80GB_HBM3)" in problems[0]
    assert "different down files (sha256 a bbbbbbbbbbbb, b cccccccccccc)" in problems[1]
    assert "· server sglang-ds@10.0.0.1:5000: the ranks load different down files" in verdict_reason(rows["b"])


def test_a_rank_not_diagnosed_is_not_compared():
    rows = {"a": _row(), "b": {"verdict": "unreachable", "error": "no route"}}
    add_servers(rows, _servers({"a": 0, "b": 1}))
    assert rows["a"]["server"]["problems"] == [] and rows["b"]["server"]["rank"] == 1
