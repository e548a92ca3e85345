"""The ``vllm`` provider on the CPU (TRITON_INTERPRET=1, tiny shapes): vLLM 0.34.0's own
``fused_experts_impl``, its Triton kernel and its config lookup, with the compiled ops of
``tests/vllm_standins.py`` (alignment, gated activation, top-k sum)."""

from __future__ import annotations

import os

# the interpreter before any Triton kernel is defined (vLLM's, and the stand-in activation)
os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import os

import pytest

from tests.vllm_releases import NEWEST, source_tree

SHAPE = dict(E=8, N=64, hidden=128, topk=2)
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 2}


@pytest.fixture(scope="module")
def provider():
    os.environ["TRITON_INTERPRET"] = "1"
    from tests import vllm_standins as vs
    from remote.engines.vllm.provider import VllmProvider

    vs.fused_moe_module(source_tree(NEWEST), cpu=True)
    prov = VllmProvider()
    yield prov
    prov.close()
    vs.uninstall()


@pytest.mark.parametrize("M", [1, 16])
def test_joint_and_whole_kernel_compute_the_moe(provider, M):
    """Forced (override_config) and file-read (VLLM_TUNED_CONFIG_FOLDER) runs agree with the
    float64 reference; the no-file run is vLLM's default config."""
    from remote.tuning.kernel.reference import fused_moe_reference, relative_error

    p = provider.make_problem(SHAPE, M, "float16", "cpu", 3)
    ref = fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids)
    assert relative_error(provider.gemm_fn(p, "joint", CFG)(), ref) < 1e-2
    assert provider.check(p, CFG) < 1e-2
    assert provider.check(p, None) < 1e-2


def test_the_file_the_whole_kernel_reads_is_vllms_name(provider, tmp_path):
    """full_fn writes a file under vLLM's own name into the folder it points vLLM at; vLLM loads it."""
    p = provider.make_problem(SHAPE, 4, "float16", "cpu", 5)
    provider.full_fn(p, CFG)()
    folder = os.environ["VLLM_TUNED_CONFIG_FOLDER"]
    name = provider.k.fm.get_config_file_name(8, 64, None, None)
    assert sorted(os.listdir(folder)) == [name]
    assert json.loads(open(os.path.join(folder, name)).read())["4"] == CFG
    assert provider.k.fm.get_moe_configs(8, 64, None) == {4: CFG}


def test_a_bad_kind_is_refused(provider):
    p = provider.make_problem(SHAPE, 1, "float16", "cpu", 0)
    with pytest.raises(ValueError, match="joint"):
        provider.gemm_fn(p, "up", CFG)
