"""The real SGLang releases are the judge of ``remote.engines.sglang.bypass`` (issue 32 row 13): the
flags with which a server never reads the Triton MoE config files.

* ``--enable-deterministic-inference``: the release's own ``get_moe_configs`` runs unchanged (the
  stand-in tree of ``tests/sglang_loader.py``, whose only stand-in here is the flag itself) with the
  exact file in place; it returns no config exactly in the releases ``files_bypassed`` names.
* KTransformers: the release registers exactly the weight-path flags ``KT_FLAGS`` gives it (read
  with :mod:`ast`, as ``test_server_args_oracle.py`` reads every option), and its code hands the MoE
  to the method the rule names: ``KTEPWrapperMethod`` (GPU weights for ``num_gpu_experts`` only,
  wired into ``FusedMoE`` when ``create_kt_config_from_server_args`` returns a config) or
  ``CompressedTensorsWNA16AMXEPMoEMethod`` (chosen when ``SGLANG_KT_MOE_AMX_WEIGHT_PATH`` is set).
"""

from __future__ import annotations

import ast
import json

import pytest

from remote.engines.sglang import naming
from remote.engines.sglang.bypass import KT_FLAGS, files_bypassed, flag_value
from remote.engines.sglang.lookup import version_key
from tests.sglang_loader import ORACLE_RELEASES, release_loader
from tests.sglang_releases import source_tree
from tests.unit.remote.engines.sglang.test_server_args_oracle import release_options

TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_deterministic_inference_bypasses_the_files_exactly_where_the_release_does(version, tmp_path, monkeypatch):
    with release_loader(version, tmp_path, triton_version="3.6.0") as rel:
        name = rel.module.get_config_file_name(8, 64, None)
        folder = rel.configs / naming.sglang_version_dir("3.6.0")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps({"1": TILE}))
        monkeypatch.setenv("ORCH_STANDIN_DETERMINISTIC", "1")
        read = rel.module.get_moe_configs(8, 64, None) is not None
    bypassed = files_bypassed([], True, version) is not None
    assert bypassed == (not read), version
    assert files_bypassed([], False, version) is None


def _kt_flags_of(version: str) -> set[str]:
    return {o for o in release_options(version) if o in KT_FLAGS}


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_kt_flags_are_the_releases(version):
    want = {o for o, (since, until, _) in KT_FLAGS.items()
            if version_key(since) <= version_key(version) and (until is None or version_key(version) <= version_key(until))}
    assert _kt_flags_of(version) == want, version


def _function(tree: ast.AST, cls: str, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    return None


@pytest.mark.parametrize("version", [v for v in ORACLE_RELEASES if "--kt-weight-path" in _kt_flags_of(v)])
def test_kt_weight_path_wraps_the_moe_with_gpu_weights_for_num_gpu_experts_only(version):
    moe = source_tree(version) / "sglang" / "srt" / "layers" / "moe"
    wrapper = ast.parse((moe / "kt_ep_wrapper.py").read_text())
    create = _function(wrapper, "KTEPWrapperMethod", "create_weights")
    calls = [c for c in ast.walk(create) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "create_weights"]
    assert calls and all(any(k.arg == "num_experts" and ast.unparse(k.value) == "self.num_gpu_experts"
                             for k in c.keywords) for c in calls)
    apply = ast.unparse(_function(wrapper, "KTEPWrapperMethod", "apply"))
    assert "mask_cpu_expert_ids" in apply and "self.gpu_method.apply" in apply
    layer = (moe / "fused_moe_triton" / "layer.py").read_text()
    assert "KTEPWrapperMethod(" in layer and "create_kt_config_from_server_args(" in layer


@pytest.mark.parametrize("version", [v for v in ORACLE_RELEASES if "--kt-amx-weight-path" in _kt_flags_of(v)])
def test_kt_amx_weight_path_selects_the_amx_method(version):
    srt = source_tree(version) / "sglang" / "srt"
    text = (srt / "layers" / "quantization" / "compressed_tensors" / "compressed_tensors_moe.py").read_text()
    method = ast.unparse(_function(ast.parse(text), "CompressedTensorsMoEMethod", "get_moe_method"))
    assert "SGLANG_KT_MOE_AMX_WEIGHT_PATH.is_set()" in method and "CompressedTensorsWNA16AMXEPMoEMethod(" in method
    assert "self.marlin_method" in text  # the GPU's experts run on Marlin, not the Triton files
    assert "_handle_ktransformers_configs" in (srt / "server_args.py").read_text()


def test_reason_names_the_flag_and_the_code():
    why = files_bypassed(["--model-path", "m", "--kt-weight-path", "/w", "--kt-num-gpu-experts", "8"], False, "0.5.23")
    assert "--kt-weight-path" in why and "KTEPWrapperMethod" in why and "--kt-num-gpu-experts 8" in why
    assert "--enable-deterministic-inference" in files_bypassed([], True, None)
    assert files_bypassed([], True, "0.5.4") is None
    assert flag_value(["--kt-weight-path=/a", "--kt-weight-path", "/b"], "--kt-weight-path") == "/b"
    assert flag_value(["--kt-weight-path"], "--kt-weight-path") is None
