"""The stand-in SGLang's runner table and autotune (``tests/testbed/standin/sglang/_standin/runners.py``)
held against SGLang 0.5.23's own code.

Every row of ``AUTO_RULES`` is run through the wheel's server-argument resolution (the override
functions of ``arg_groups/``, executed from the wheel as ``test_runner_oracle.py`` does): the
backend it ends with, the ``--quantization`` it declares and the line it logs must be the row's;
one step off each row (another GPU generation, an explicit backend) must leave the stand-in and
the wheel agreeing too. The stand-in's autotune file lies where the wheel's own
``flashinfer_autotune_cache_path`` puts it (it runs that function from the tree) and where orch
looks (``remote.engines.sglang.autotune``), for the bed's B200 DeepSeek-V3 host.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

import pytest

from remote.engines.sglang import autotune as orch_autotune
from tests.paths import DATA
from tests.testbed import standin_tree
from tests.unit.remote.engines.sglang.test_runner_oracle import ARCHS, FAMILY_FN, View, hf_config, wheel  # noqa: F401
from tests.unit.remote.engines.sglang import test_runner_oracle as oracle


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The stand-in's ``runners`` module, imported from a tree built for SGLang 0.5.23."""
    root = tmp_path_factory.mktemp("standin")
    standin_tree.make_tree(root / "site", None, "0.5.23", "0.6.9")
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.") or k == "flashinfer"}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(root / "site"))
    try:
        yield importlib.import_module("sglang._standin.runners"), root
    finally:
        sys.path.remove(str(root / "site"))
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.") or k == "flashinfer"]:
            del sys.modules[k]
        sys.modules.update(saved)


def wheel_resolution(fns, state, ds_archs, arch, flag, ckpt, capability, backend, caplog):
    """``(backend, quantization, lines logged)`` of the wheel's resolution (``test_runner_oracle``'s passes)."""
    state["platform"] = oracle.Platform(int(capability.split(".")[0]))
    hf = hf_config(arch, ckpt)
    declared: dict = {}

    def view():
        fields = dict(moe_runner_backend=backend, quantization=flag, moe_a2a_backend="none", ep_size=1,
                      device="cuda", attention_backend="fa3", dtype="auto", model_path="/m",
                      fp8_gemm_runner_backend="auto", _quantization_explicitly_unset=False)
        fields.update(declared)
        return View(**fields, _model_config=type("MC", (), {"hf_config": hf, "quantization": flag or ckpt,
                                                             "nvfp4_moe_meta": None})())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sglang-0.5.23-oracle"):
        if arch in FAMILY_FN:
            declared.update(fns[FAMILY_FN[arch]](view(), hf))
        if arch in ds_archs:
            declared.update(fns["_deepseek_moe_quant_resolution"](view()))
        declared.update(fns["_moe_runner_backend_quant_constraints"](view()))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Use ")]
    return declared.get("moe_runner_backend", backend), declared.get("quantization", flag), lines


def cases(runners):
    for archs, quants, majors, _target, _line, _declares in runners.AUTO_RULES:
        for arch in archs:
            for quant in quants:
                for major in sorted(set(majors) | {9, 10, 12}):
                    for backend in ("auto", "triton"):
                        yield arch, quant, f"{major}.0", backend


def test_every_row_is_what_the_wheel_resolves(standin, wheel, monkeypatch, caplog):
    runners, _root = standin
    fns, state, ds_archs = wheel
    seen = 0
    for arch, quant, cap, backend in cases(runners):
        for flag, ckpt in ((None, quant), (quant, quant)):
            monkeypatch.setenv("ORCH_STANDIN_GPU_CAPABILITY", cap)
            config = {"architectures": [arch], "quantization_config": {"quant_method": ckpt} if ckpt else None}
            mine = runners.resolve(backend, flag, config)
            theirs = wheel_resolution(fns, state, ds_archs, arch, flag, ckpt, cap, backend, caplog)
            assert mine[:2] == theirs[:2], (arch, flag, ckpt, cap, backend)
            assert ([mine[2]] if mine[2] else []) == theirs[2], (arch, flag, ckpt, cap, backend)
            seen += 1
    assert seen > 50


def test_autotune_file_is_where_the_wheel_and_orch_put_it(standin, tmp_path, monkeypatch):
    runners, _root = standin
    cfg = json.loads((DATA / "models" / "DeepSeek-V3.json").read_text())
    cfg["model_type"] = "deepseek_v3"
    monkeypatch.setenv("ORCH_STANDIN_GPU_CAPABILITY", "10.0")
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    args = argparse.Namespace(model_path="/models/tiny-moe", quantization_resolved="fp8", tp_size=8, pp_size=1,
                              attn_dp_size=1, ep_size=1, dtype="auto", disable_flashinfer_autotune=False)
    written = runners.autotune(args, "flashinfer_trtllm", cfg, [])
    key = orch_autotune.cache_key(model_path="/models/tiny-moe", dtype="torch.bfloat16", quantization="fp8",
                                  backend="flashinfer_trtllm", tp=8, config_class="DeepseekV3Config")
    assert written == f"{orch_autotune.cache_dir(str(tmp_path), '0.6.9', '10.0', key)}/rank_tp0_pp0_dp0.json"
    args.disable_flashinfer_autotune = True
    assert runners.autotune(args, "flashinfer_trtllm", cfg, []) is None
    args.disable_flashinfer_autotune = False
    monkeypatch.setenv("SGLANG_FLASHINFER_AUTOTUNE_CACHE", "0")
    fresh = runners.autotune(args, "flashinfer_trtllm", cfg, [])
    assert "/runs/rank_tp0_pp0_dp0." in fresh and orch_autotune.key_of_path(fresh)[2] == key
    assert runners.autotune(args, "triton", cfg, []) is None
