"""Gathering the ranks of a multi-node server among the run's hosts (orchestrator/facts/server_group.py)."""

from orchestrator.facts.server_group import ServerGroup, group_servers, server_key
from remote.engines.sglang.server_args import ServerArgs

ADDR = "10.0.0.1:5000"


def args(rank, nnodes=2, addr=ADDR):
    return ServerArgs("/opt/venv/bin/python", [], nnodes=nnodes, node_rank=rank, dist_init_addr=addr)


def test_single_node_is_no_server_group():
    assert server_key("sglang", ServerArgs("/py", [])) is None
    assert group_servers({"a": ("sglang", ServerArgs("/py", []), "NVIDIA_H200")}) == {}


def test_two_ranks_form_one_server_in_rank_order():
    got = group_servers({"n1": ("sglang-ds", args(1), "NVIDIA_H200"), "n0": ("sglang-ds", args(0), "NVIDIA_H200"),
                         "solo": ("sglang", ServerArgs("/py", []), "NVIDIA_H200")})
    assert set(got) == {"n0", "n1"}
    g = got["n1"]
    assert isinstance(g, ServerGroup) and g.refusal is None
    assert g.key == f"sglang-ds@{ADDR}" and g.hosts == ["n0", "n1"] and g.rank0 == "n0" and g.rank == 1
    assert got["n0"].rank == 0 and got["n0"].members == ["n0", "n1"]


def test_missing_rank_is_named_on_every_present_rank():
    got = group_servers({"n0": ("sglang-ds", args(0, nnodes=3), None), "n2": ("sglang-ds", args(2, nnodes=3), None)})
    for g in got.values():
        assert g.refusal and "rank 1 of 3 is not a host of this run" in g.refusal
        assert "Nothing was stopped" in g.refusal
    assert got["n0"].hosts == ["n0", "", "n2"] and got["n0"].rank0 == "n0"


def test_other_address_is_another_server():
    got = group_servers({"a": ("sglang-ds", args(0), None), "b": ("sglang-ds", args(1, addr="10.0.0.9:5000"), None)})
    assert got["a"].key != got["b"].key
    assert "rank 1 of 2" in got["a"].refusal and "rank 0 of 2" in got["b"].refusal


def test_duplicate_rank_disagreeing_nnodes_and_no_address_are_refused():
    dup = group_servers({"a": ("u", args(0), None), "b": ("u", args(0), None)})
    assert "a and b are both --node-rank 0" in dup["a"].refusal
    nn = group_servers({"a": ("u", args(0, nnodes=2), None), "b": ("u", args(1, nnodes=3), None)})
    assert "disagree on --nnodes" in nn["b"].refusal
    noaddr = group_servers({"a": ("u", args(0, addr=None), None), "b": ("u", args(1, addr=None), None)})
    assert "--dist-init-addr is not given" in noaddr["a"].refusal


def test_gpus_of_another_kind_are_refused():
    got = group_servers({"a": ("u", args(0), "NVIDIA_H200"), "b": ("u", args(1), "NVIDIA_H100_80GB_HBM3")})
    assert "different kinds" in got["a"].refusal and "NVIDIA_H100_80GB_HBM3" in got["a"].refusal
    same = group_servers({"a": ("u", args(0), "NVIDIA_H200"), "b": ("u", args(1), None)})
    assert same["a"].refusal is None  # an unknown device name is not a mismatch (the probe tells later)
