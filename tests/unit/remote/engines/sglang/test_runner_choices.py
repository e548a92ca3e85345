"""``remote.engines.sglang.runner_choices``: the names a runner trial accepts, and ``auto``'s candidates, by
SGLang's rules (``remote.engines.sglang.runner.moe_runner``) for the weights and the GPU."""

from __future__ import annotations

import pytest

from remote.protocol import PayloadError
from remote.engines.sglang.runner import moe_runner
from remote.engines.sglang.runner_choices import parse_candidates, release_choices


def effective(arch="Qwen3MoeForCausalLM", ckpt=None, cap="9.0"):
    def fn(backend):
        r = moe_runner(backend=backend, architecture=arch, checkpoint_quant=ckpt, capability=cap)
        return r.runner if r.known else None
    return fn


def test_named_runners_in_release_order():
    assert parse_candidates("flashinfer_cutlass, triton", "0.5.23", effective()) == ["triton", "flashinfer_cutlass"]
    assert parse_candidates("triton,triton", "0.5.23+cu129", effective()) == ["triton"]


@pytest.mark.parametrize("text,version,words", [
    ("tritn", "0.5.23", ["'tritn' is not a --moe-runner-backend choice", "triton"]),
    ("flashinfer_megamoe", "0.5.8", ["not a --moe-runner-backend choice of SGLang 0.5.8"]),
    ("lora_triton", "0.5.23", ["not tried by orch"]),
    ("auto,triton", "0.5.23", ["stands alone"]),
    ("", "0.5.23", ["empty"]),
    ("triton", "0.4.0", ["holds no list", "0.4.0"]),
    # unquantized weights: SGLang's cutlass request runs the Triton runner (unquant.py)
    ("cutlass", "0.5.23", ["runs the triton runner", "name triton instead"]),
])
def test_bad_names_are_one_clear_error(text, version, words):
    with pytest.raises(PayloadError) as exc:
        parse_candidates(text, version, effective())
    assert exc.value.kind == "bad_input"
    for w in words:
        assert w in exc.value.msg


def test_a_runner_sglang_refuses_for_the_weights():
    # flashinfer_cutedsl accepts only FP4 weights (moe_hook.py handle_moe_kernel_config)
    with pytest.raises(PayloadError, match="would not start"):
        parse_candidates("flashinfer_cutedsl", "0.5.23", effective())


def test_auto_is_every_runner_sglang_would_run_for_these_weights():
    bf16 = parse_candidates("auto", "0.5.23", effective())
    assert bf16[0:2] == ["deep_gemm", "triton"] and "flashinfer_cutlass" in bf16 and "flashinfer_trtllm" in bf16
    assert "cutlass" not in bf16 and "flashinfer_cutedsl" not in bf16 and "aiter" not in bf16
    assert all(not c.startswith("lora_") for c in bf16)
    # fp8 weights: FlashInfer CUTLASS is not an fp8 path (fp8.py), Triton is always there
    fp8 = parse_candidates("auto", "0.5.23", effective(ckpt="fp8"))
    assert "triton" in fp8 and "flashinfer_cutlass" not in fp8


def test_release_lists():
    assert "flashinfer_megamoe" in release_choices("0.5.23") and "flashinfer_megamoe" not in release_choices("0.5.12")
    assert release_choices("0.5.12.post1") == release_choices("0.5.12")
