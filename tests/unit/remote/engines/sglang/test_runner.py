"""Which MoE runner a server uses (``remote.engines.sglang.runner.moe_runner``), without the wheels.

The table of docs/sglang-releases.md is recomputed cell by cell; the cases below pin what the rules
say where SGLang surprises (an explicit FlashInfer backend that still runs Triton), where orch must
answer "unknown" instead of guessing, and how the last start's log wins over the derived answer.
The rules themselves are held against SGLang 0.5.23's code in ``test_runner_oracle.py``.
"""

from __future__ import annotations

import json

import pytest

from remote.engines.sglang.moe_log import parse_moe_log
from remote.engines.sglang.runner import checkpoint_quant_method, moe_runner, probe_inputs
from tests.paths import REPO

DOC = REPO / "docs" / "sglang-releases.md"
FAMILY = {"other (Mixtral, ...)": "MixtralForCausalLM", "DeepSeek family": "DeepseekV3ForCausalLM",
          "Qwen3-MoE family": "Qwen3MoeForCausalLM", "GLM-4 MoE": "Glm4MoeForCausalLM",
          "Llama 4": "Llama4ForConditionalGeneration", "gpt-oss": "GptOssForCausalLM",
          "gpt-oss, `triton_kernels` installed": "GptOssForCausalLM"}
#: weights column -> (--quantization, checkpoint method, MoeShape.dtype_selector, MoeShape.weight_dtype)
WEIGHTS = {
    "bf16": (None, None, None, "bfloat16"),
    "fp8 checkpoint (block or per-tensor)": (None, "fp8", "fp8_w8a8", "fp8_e4m3"),
    "`--quantization fp8` (online, per-tensor)": ("fp8", None, "fp8_w8a8", "fp8_e4m3"),
    "ModelOpt FP8, `--quantization modelopt_fp8`": ("modelopt_fp8", "modelopt_fp8", "fp8_w8a8", "fp8_e4m3"),
    "ModelOpt FP8, no flag": (None, "modelopt_fp8", "fp8_w8a8", "fp8_e4m3"),
    "ModelOpt NVFP4, `--quantization modelopt_fp4`": ("modelopt_fp4", "modelopt_fp4", None, None),
    "ModelOpt NVFP4, no flag": (None, "modelopt_fp4", None, None),
    "MXFP4 checkpoint": (None, "mxfp4", None, "mxfp4"),
    "MXFP8, `--quantization mxfp8`": ("mxfp8", "mxfp8", None, None),
    "MXFP8, no flag": (None, "mxfp8", None, None),
    "`--quantization w8a8_int8`": ("w8a8_int8", "w8a8_int8", "int8_w8a8", "int8"),
    "`--quantization w8a8_fp8`": ("w8a8_fp8", "w8a8_fp8", "fp8_w8a8", "fp8_e4m3"),
    "GPTQ/AWQ, `--quantization moe_wna16`": ("moe_wna16", "gptq", "int4_w4a16", "int4"),
    "GPTQ/AWQ, no flag": (None, "gptq", None, "int4"),
    "compressed-tensors W8A8 fp8": (None, "compressed-tensors", "fp8_w8a8", "fp8_e4m3"),
    "compressed-tensors W8A8 int8": (None, "compressed-tensors", "int8_w8a8", "int8"),
    "compressed-tensors W8A16 int8": (None, "compressed-tensors", "int8_w8a16", "int8"),
}
GPUS = {"sm80": "8.0", "sm90": "9.0", "sm100": "10.0", "sm120": "12.0"}


def doc_rows() -> list[dict[str, str]]:
    section = DOC.read_text().split("## The MoE runner", 1)[1]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in rows[2:]]


def test_doc_table_is_what_the_rules_say():
    rows = doc_rows()
    assert len(rows) > 30 and {r["weights"] for r in rows} <= set(WEIGHTS)
    for row in rows:
        flag, ckpt, selector, weight = WEIGHTS[row["weights"]]
        for gpu, cap in GPUS.items():
            r = moe_runner(quantization=flag, architecture=FAMILY[row["family"]], checkpoint_quant=ckpt,
                           dtype_selector=selector, weight_dtype=weight, capability=cap,
                           triton_kernels="installed" in row["family"])
            assert (r.runner or "unknown") == row[gpu], (row, gpu, r.reason)
            assert r.reads_triton_configs is (None if r.runner is None else r.runner == "triton")


def test_doc_table_rows_of_a_family_differ_from_other_architectures():
    rows = doc_rows()
    other = {r["weights"]: [r[g] for g in GPUS] for r in rows if r["family"].startswith("other")}
    assert set(other) == set(WEIGHTS)
    for r in rows:
        if not r["family"].startswith(("other", "gpt-oss, ")):
            assert [r[g] for g in GPUS] != other[r["weights"]], r


@pytest.mark.parametrize("kw, runner, rule", [
    # an explicit FlashInfer backend that an fp8 layer cannot run: Fp8MoEMethod falls back to Triton
    (dict(backend="flashinfer_cutlass", checkpoint_quant="fp8"), "triton", "Fp8MoEMethod.create_moe_runner"),
    # W8A8 int8 builds MoeRunner(TRITON) whatever the backend says
    (dict(backend="deep_gemm", quantization="w8a8_int8", checkpoint_quant="w8a8_int8"), "triton", "w8a8_int8.py"),
    (dict(backend="flashinfer_cutlass"), "flashinfer_cutlass", "--moe-runner-backend flashinfer_cutlass"),
    (dict(a2a_backend="pplx"), "deep_gemm", "moe_hook.py handle_a2a_moe sets deep_gemm"),
    (dict(architecture="Qwen3MoeForCausalLM", checkpoint_quant="modelopt_fp8", quantization="modelopt_fp8",
          capability="10.0"), "triton", "ModelOptFp8MoEMethod"),  # qwen3_moe.py has no modelopt_fp8 rule
])
def test_runner_of(kw, runner, rule):
    args = dict(architecture="MixtralForCausalLM", capability="9.0")
    args.update(kw)
    r = moe_runner(**args)
    assert r.runner == runner and rule in r.reason, r


@pytest.mark.parametrize("kw, why", [
    (dict(architecture=None), "the probe read no model config"),
    (dict(architecture="Qwen3MoeForCausalLM", capability=None), "compute capability was not probed"),
    (dict(architecture="MiniMaxM2ForCausalLM"), "model_overrides/minimax_m2.py sets the MoE runner"),
    (dict(backend="flashinfer_cutlass", quantization="w8a8_int8", checkpoint_quant="w8a8_int8"),
     "SGLang refuses to start"),
    (dict(quantization="modelopt_fp8", checkpoint_quant="fp8"), "--quantization modelopt_fp8 on a fp8 checkpoint"),
    (dict(a2a_backend="deepep"), "DeepGEMM's JIT"),
    (dict(architecture="GptOssForCausalLM", triton_kernels=None), "triton_kernels package"),
    (dict(quantization="gguf"), "quantization gguf: its MoE method is not modelled"),
])
def test_unknown_is_an_answer_with_the_reason(kw, why):
    args = dict(architecture="MixtralForCausalLM", capability="9.0")
    args.update(kw)
    r = moe_runner(**args)
    assert (r.runner, r.reads_triton_configs, r.known) == (None, None, False)
    assert why in r.reason, r.reason


def test_an_explicit_backend_of_an_unmodelled_family_is_still_known():
    r = moe_runner(backend="triton", architecture="MiniMaxM2ForCausalLM", capability="10.0")
    assert (r.runner, r.source) == ("triton", "flag")


LOOKUP = "x: Using MoE kernel config from /c/E=8,N=64,device_name=NVIDIA_B200.json.\n"
READY = "x: The server is fired up and ready to roll!\n"


def test_log_lookups_win_and_the_disagreement_is_said():
    """Qwen3 bf16 on sm100 derives flashinfer_trtllm; a start that looked up Triton files read them."""
    r = moe_runner(architecture="Qwen3MoeForCausalLM", capability="10.0", log=parse_moe_log(LOOKUP + READY))
    assert (r.runner, r.reads_triton_configs, r.source) == ("triton", True, "log")
    assert "flashinfer_trtllm" in r.disagreement


def test_a_ready_start_without_lookups_read_no_file():
    r = moe_runner(architecture="MixtralForCausalLM", capability="9.0",
                   log=parse_moe_log("x: server_args={'moe_runner_backend': 'flashinfer_cutlass'}\n" + READY))
    assert (r.runner, r.reads_triton_configs, r.source) == ("flashinfer_cutlass", False, "log")
    assert "resolved to another runner" in r.reason and "unquant.py" in r.disagreement


def test_the_start_line_stands_in_for_server_argument_resolution():
    """Without the GPU's capability, the start line's resolved backend still decides."""
    start = "x: server_args=ServerArgs(model_path='/m', moe_runner_backend='flashinfer_trtllm')\n"
    r = moe_runner(architecture="Qwen3MoeForCausalLM", capability=None, log=parse_moe_log(start))
    assert (r.runner, r.reads_triton_configs, r.source) == ("flashinfer_trtllm", False, "log")
    start = start.replace("flashinfer_trtllm", "auto")  # left to the layer: bf16 runs Triton
    r = moe_runner(architecture="Qwen3MoeForCausalLM", capability=None, log=parse_moe_log(start))
    assert (r.runner, r.reads_triton_configs) == ("triton", True)
    assert moe_runner(architecture="Qwen3MoeForCausalLM", capability=None, log=parse_moe_log("")).known is False


def test_a_derived_answer_the_log_confirms_keeps_its_reason():
    r = moe_runner(architecture="MixtralForCausalLM", capability="9.0", log=parse_moe_log(LOOKUP))
    assert r.source == "derived" and "unquant.py" in r.reason and r.disagreement is None


@pytest.mark.parametrize("config, side, method", [
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, None, "fp8"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}, None, "modelopt_fp8"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, None, "modelopt_fp4"),
    ({"quantization_config": {"quant_algo": "MXFP8"}}, None, "mxfp8"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                              "quantized_layers": {"model.layers.1.mlp.experts": {"quant_algo": "NVFP4"}}}},
     None, "modelopt_mixed"),
    ({"quantization_config": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {}}}, None, "w4afp8"),
    ({"compression_config": {"quant_method": "compressed-tensors"}}, None, "compressed-tensors"),
    ({}, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}, "modelopt_fp8"),
    ({"quantization_config": {"quant_method": "GPTQ", "bits": 4}}, None, "gptq"),
    ({}, None, None),
])
def test_checkpoint_quant_method_as_sglangs_model_config_names_it(config, side, method):
    assert checkpoint_quant_method(config, side) == method


def test_probe_inputs_read_the_probes_fields():
    probe = json.loads(json.dumps({"capability": "9.0", "triton_kernels": False,
                                   "model": {"architecture": "X", "checkpoint_quant_method": "fp8",
                                             "dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e4m3"}}))
    assert probe_inputs(probe) == {"architecture": "X", "checkpoint_quant": "fp8", "dtype_selector": "fp8_w8a8",
                                   "weight_dtype": "fp8_e4m3", "capability": "9.0", "triton_kernels": False}
    assert probe_inputs({})["architecture"] is None
