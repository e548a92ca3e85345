"""SGLang 0.5.23's own code is the judge of which MoE runner orch says a server uses
(``remote.engines.sglang.runner``) and of the start-up lines orch reads about it (``remote.engines.sglang.moe_log``).

Run from the wheel (``tests/sglang_releases.py``), unchanged: the functions are taken out of their
files with :mod:`ast` (decorators dropped) and executed with stand-ins only for what they ask of the
machine and the model: ``get_platform()`` (the GPU generation), ``model_config_of`` (the checkpoint's
``hf_config``), ``envs`` (all unset), ``logger`` (captured), ``has_fp8_weights_in_checkpoint``,
``is_triton_kernels_available`` and ``get_nvidia_driver_version``. ``get_quantization_config`` and
``MXFP8_MOE_RUNNER_BACKEND_CHOICES`` are the wheel's own. Over a grid of (architecture, flag and
checkpoint quantization, compute capability, ``--moe-runner-backend``, ``--moe-a2a-backend``,
``triton_kernels`` installed) the server-argument resolution SGLang runs (``pipeline.py``: the
model-family override of ``model_overrides/`` qwen3_moe, glm4_moe, llama4, gemma4, gpt_oss, then
``overrides.py`` ``_deepseek_moe_quant_resolution``, then ``_moe_runner_backend_quant_constraints``)
must end where orch's step 1 ends, refuse where orch says unknown, and where orch says unknown
without a refusal, the hidden fact orch names (the NVIDIA driver version) must change SGLang's answer.

Checked by reading code (the wheel files and lines cited in ``remote/engines/sglang/runner.py``), with the
structural checks below:

* ``handle_moe_kernel_config`` (``moe_hook.py``): the quantizations each FlashInfer runner accepts
  (``_ALLOWED_QUANT``) are the lists of its asserts, compared as text;
* ``handle_a2a_moe`` (``moe_hook.py``): pplx and DeepEP v2 resolve ``auto`` to ``deep_gemm``,
  FlashInfer MegaMoE to ``flashinfer_megamoe`` (their log lines are checked below);
* ``create_moe_runner`` of each quantization method: every method orch maps names a class of the
  wheel that defines it (or ``apply`` for W4AFp8), and every runner orch derives for ``auto`` is a
  ``MoeRunnerBackend`` member that method's body names; the always-Triton methods build
  ``MoeRunner(MoeRunnerBackend.TRITON, ...)`` whatever the backend.
"""

from __future__ import annotations

import ast
import itertools
import logging
import re
import sys
import types
from pathlib import Path

import pytest

from remote.engines.sglang import moe_log, runner
from tests.sglang_releases import source_tree

SRT = None


def srt() -> Path:
    global SRT
    if SRT is None:
        SRT = source_tree("0.5.23") / "sglang" / "srt"
    return SRT


def extract(path: Path, names: set[str], namespace: dict) -> dict:
    """Execute the top-level functions and assignments ``names`` of the wheel file ``path`` (their
    decorators dropped) in ``namespace``; returns it."""
    tree = ast.parse(path.read_text())
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            body.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets):
            body.append(node)
    assert {getattr(n, "name", None) or n.targets[0].id for n in body} == names, path
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


class Platform:
    """``get_platform()`` of a CUDA machine whose GPU has compute capability ``major``.x."""

    def __init__(self, major: int):
        self.is_sm90, self.is_sm100, self.is_sm110, self.is_sm120 = (major == m for m in (9, 10, 11, 12))
        self.is_blackwell = major in (10, 11, 12)
        self.is_cuda, self.is_hip, self.is_npu, self.is_xpu, self.is_musa, self.has_amx = True, False, False, False, \
            False, False


class Unset:
    """An ``envs`` variable nobody set."""

    def get(self):
        return False

    def is_set(self):
        return False


class Envs:
    def __getattr__(self, name):
        return Unset()


class View(types.SimpleNamespace):
    """A server-args record; reading it sees the declarations made so far."""


@pytest.fixture(scope="module")
def wheel():
    """The wheel's resolution functions, ready to run: ``{name: function}``."""
    logger = logging.getLogger("sglang-0.5.23-oracle")
    state = {"platform": Platform(9), "fp8_weights": False, "triton_kernels": False, "driver": (0,)}
    common = extract(srt() / "utils" / "common.py", {"get_quantization_config"}, {})
    choices = extract(srt() / "arg_groups" / "choices.py", {"MXFP8_MOE_RUNNER_BACKEND_CHOICES"}, {})
    stub = {
        "get_platform": lambda: state["platform"], "envs": Envs(), "logger": logger,
        "get_quantization_config": common["get_quantization_config"], "is_gfx95_supported": lambda: False,
        "model_config_of": lambda view: view._model_config, "resolving_view": lambda view: view,
        "is_attention_backend_not_set": lambda cfg: False, "is_cpu": lambda: False, "is_mps": lambda: False,
        "use_mlx": lambda: False, "is_triton_kernels_available": lambda: state["triton_kernels"],
        "get_nvidia_driver_version": lambda: state["driver"], "Any": object, "Dict": dict,
    }
    fns = {}
    extract(srt() / "arg_groups" / "overrides.py", {"_DEEPSEEK_FAMILY_ARCHS", "_deepseek_moe_quant_resolution",
                                                    "_moe_runner_backend_quant_constraints"}, stub)
    fns.update({k: stub[k] for k in ("_deepseek_moe_quant_resolution", "_moe_runner_backend_quant_constraints")})
    for file, fn, helpers in (("qwen3_moe.py", "_qwen3_moe_family_overrides", {"_mixed_precision_moe_quant_algos"}),
                              ("glm4_moe.py", "_glm4_moe_overrides", set()),
                              ("llama4.py", "_llama4_overrides", set()),
                              ("gemma4.py", "_gemma4_overrides", set()),
                              ("gpt_oss.py", "_gpt_oss_overrides", set())):
        ns = extract(srt() / "arg_groups" / "model_overrides" / file, {fn} | helpers, dict(stub))
        fns[fn] = ns[fn]
    fake = {"sglang.srt.utils.common": types.SimpleNamespace(
                has_fp8_weights_in_checkpoint=lambda path: state["fp8_weights"]),
            "sglang.srt.server_args": types.SimpleNamespace(
                MXFP8_MOE_RUNNER_BACKEND_CHOICES=choices["MXFP8_MOE_RUNNER_BACKEND_CHOICES"])}
    saved = {k: sys.modules.get(k) for k in fake}
    sys.modules.update(fake)
    yield fns, state, stub["_DEEPSEEK_FAMILY_ARCHS"]
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


FAMILY_FN = {**{a: "_qwen3_moe_family_overrides" for a in runner.QWEN3_FAMILY_ARCHS},
             **{a: "_glm4_moe_overrides" for a in runner.GLM4_MOE_ARCHS},
             **{a: "_llama4_overrides" for a in runner.LLAMA4_ARCHS},
             **{a: "_gemma4_overrides" for a in runner.GEMMA4_ARCHS},
             **{a: "_gpt_oss_overrides" for a in runner.GPT_OSS_ARCHS}}
ARCHS = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "LongcatFlashForCausalLM", "Qwen3MoeForCausalLM",
         "Glm4MoeForCausalLM", "Llama4ForConditionalGeneration", "Gemma4ForConditionalGeneration", "GptOssForCausalLM",
         "MixtralForCausalLM")
#: (--quantization, checkpoint method as the model config names it, MoeShape.weight_dtype)
QUANTS = ((None, None, "bfloat16"), (None, "fp8", "fp8_e4m3"), ("fp8", "fp8", "fp8_e4m3"), ("fp8", None, "fp8_e4m3"),
          ("modelopt_fp8", "modelopt_fp8", "fp8_e4m3"), (None, "modelopt_fp8", "fp8_e4m3"),
          ("modelopt_fp4", "modelopt_fp4", "nvfp4"), (None, "modelopt_fp4", "nvfp4"), (None, "mxfp8", "mxfp8"),
          ("mxfp8", "mxfp8", "mxfp8"), ("nvfp4_online", "fp8", "fp8_e4m3"),
          ("w8a8_int8", "compressed-tensors", "int8"), (None, "compressed-tensors", "fp8_e4m3"),
          ("mxfp4", "mxfp4", "mxfp4"), (None, "mxfp4", "mxfp4"), ("moe_wna16", "gptq", "int4"))
CAPABILITIES = ("8.0", "9.0", "10.0", "11.0", "12.0")
BACKENDS = ("auto", "triton", "flashinfer_trtllm", "flashinfer_cutlass", "deep_gemm")
A2A = ("none", "deepep", "pplx")


def hf_config(arch: str, ckpt: str | None) -> types.SimpleNamespace:
    qc = None
    if ckpt == "compressed-tensors":
        qc = {"quant_method": ckpt, "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}
    elif ckpt:
        qc = {"quant_method": ckpt}
    return types.SimpleNamespace(architectures=[arch], quantization_config=qc)


def sglang_backend(fns, state, ds_archs, arch, flag, ckpt, capability, backend, a2a, driver=(0,)) -> str | None:
    """The ``moe_runner_backend`` SGLang 0.5.23's resolution ends with, None when it refuses."""
    state["platform"], state["driver"] = Platform(int(capability.split(".")[0])), driver
    hf = hf_config(arch, ckpt)
    declared: dict = {}

    def view():
        fields = dict(moe_runner_backend=backend, quantization=flag, moe_a2a_backend=a2a, ep_size=1, device="cuda",
                      attention_backend="fa3", dtype="auto", model_path="/m", fp8_gemm_runner_backend="auto",
                      _quantization_explicitly_unset=False)
        fields.update(declared)
        return View(**fields, _model_config=types.SimpleNamespace(hf_config=hf, quantization=flag or ckpt,
                                                                  nvfp4_moe_meta=None))
    try:
        if arch in FAMILY_FN:
            declared.update(fns[FAMILY_FN[arch]](view(), hf))
        if arch in ds_archs:
            declared.update(fns["_deepseek_moe_quant_resolution"](view()))
        declared.update(fns["_moe_runner_backend_quant_constraints"](view()))
    except ValueError:
        return None
    return declared.get("moe_runner_backend", backend)


def orch_backend(arch, flag, ckpt, weight, capability, backend, a2a, triton_kernels) -> str | None:
    """orch's step 1 (the same passes), None when it says unknown."""
    major, minor = (int(x) for x in capability.split("."))
    s = runner._Server(backend, flag, a2a, arch, ckpt, None, weight, major, minor, 1, triton_kernels)
    try:
        b, declared, _why = runner._model_override(s)
        b, _why = runner._quant_constraints(b, declared, s)
    except runner._Unknown:
        return None
    return b


def test_server_argument_resolution_agrees_with_the_wheel_over_the_grid(wheel):
    fns, state, ds_archs = wheel
    agreed = refused = hidden = 0
    for arch, (flag, ckpt, weight), cap, backend, a2a, tk in itertools.product(
            ARCHS, QUANTS, CAPABILITIES, BACKENDS, A2A, (False, True)):
        state["triton_kernels"] = tk
        theirs = sglang_backend(fns, state, ds_archs, arch, flag, ckpt, cap, backend, a2a)
        ours = orch_backend(arch, flag, ckpt, weight, cap, backend, a2a, tk)
        case = (arch, flag, ckpt, cap, backend, a2a, tk)
        if ours is None and theirs is not None:  # orch names a fact it cannot see: it must change SGLang's answer
            hidden += 1
            other = sglang_backend(fns, state, ds_archs, arch, flag, ckpt, cap, backend, a2a, driver=(595,))
            assert other != theirs, (case, theirs)
            continue
        assert ours == theirs, (case, ours, theirs)
        refused += ours is None
        agreed += ours is not None
    assert agreed > 20000 and refused > 1000 and hidden < 100, (agreed, refused, hidden)


def test_the_done_when_cases_are_what_the_wheel_resolves(wheel):
    """DeepSeek-V3, --quantization modelopt_fp8, auto: left to the layer on an H200, flashinfer_trtllm on a B200."""
    fns, state, ds_archs = wheel
    args = ("DeepseekV3ForCausalLM", "modelopt_fp8", "modelopt_fp8")
    assert sglang_backend(fns, state, ds_archs, *args, "9.0", "auto", "none") == "auto"
    assert sglang_backend(fns, state, ds_archs, *args, "10.0", "auto", "none") == "flashinfer_trtllm"


# ------------------------------------------------------------------------- the tables orch keeps

def registered_overrides() -> dict[str, str]:
    """Architecture -> model_overrides file of every provider that sets ``moe_runner_backend``."""
    out = {}
    for path in sorted((srt() / "arg_groups" / "model_overrides").glob("*.py")):
        for fn in ast.parse(path.read_text()).body:
            if not isinstance(fn, ast.FunctionDef) or "moe_runner_backend" not in ast.unparse(fn):
                continue
            for dec in fn.decorator_list:
                if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) in ("_register_for",
                                                                                  "register_model_override"):
                    out.update({a.value: path.name for a in dec.args})
    return out


def test_every_model_override_of_the_runner_is_modelled_or_named_unknown():
    found = registered_overrides()
    modelled = {a: f for a, f in found.items() if a not in runner.UNMODELLED_OVERRIDES}
    assert {a: found[a] for a in runner.UNMODELLED_OVERRIDES} == {a: f for a, (f, _) in
                                                                  runner.UNMODELLED_OVERRIDES.items()}
    by_file = {"qwen3_moe.py": runner.QWEN3_FAMILY_ARCHS, "glm4_moe.py": runner.GLM4_MOE_ARCHS,
               "llama4.py": runner.LLAMA4_ARCHS, "gemma4.py": runner.GEMMA4_ARCHS, "gpt_oss.py": runner.GPT_OSS_ARCHS,
               "deepseek_v2.py": runner.DEEPSEEK_FAMILY_ARCHS}
    assert {a: f for a, f in modelled.items()} == {a: f for f, archs in by_file.items() for a in archs}


def test_deepseek_family_is_the_wheels(wheel):
    assert runner.DEEPSEEK_FAMILY_ARCHS == wheel[2]


def test_flashinfer_refusals_are_the_asserts_of_handle_moe_kernel_config():
    text = (srt() / "arg_groups" / "moe_hook.py").read_text()
    body = text.split("def handle_moe_kernel_config", 1)[1].split("\ndef ", 1)[0]
    for backend, allowed in runner._ALLOWED_QUANT.items():
        block = body.split(f'"{backend}"', 1)[1]
        listed = ast.literal_eval(re.search(r"view\.quantization in (\[.*?\])", block, re.S).group(1))
        assert listed == list(allowed), backend


def test_routing_declared_architectures_pass_a_routing_method():
    files = {"DeepseekV3ForCausalLM": "deepseek_v2.py", "Qwen3MoeForCausalLM": "qwen3_moe.py",
             "Glm4MoeForCausalLM": "glm4_moe.py", "Llama4ForConditionalGeneration": "llama4.py",
             "Llama4ForCausalLM": "llama4.py"}
    assert set(files) == runner.ROUTING_DECLARED_ARCHS
    for arch, file in files.items():
        text = (srt() / "models" / file).read_text()
        assert re.search(r"routing_method_type=(getattr\(\s*config, \"routing_method_type\", )?RoutingMethodType\.",
                         text), arch


def method_body(rule: str) -> str:
    """The source of the method a ``_METHODS`` rule names (``path Class.method``)."""
    path, qual = rule.split(" ", 1)
    cls, _, meth = qual.partition(".")
    tree = ast.parse((srt() / path.removeprefix("srt/")).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            if not meth:
                return ast.unparse(node)
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == meth:
                    return ast.unparse(fn)
    raise AssertionError(f"{rule}: no such method in the wheel")


ENUM = {"triton": "TRITON", "flashinfer_trtllm": "FLASHINFER_TRTLLM", "flashinfer_cutlass": "FLASHINFER_CUTLASS",
        "marlin": "MARLIN", "deep_gemm": "DEEP_GEMM", "triton_kernel": "TRITON_KERNELS"}


@pytest.mark.parametrize("quant", [q for q in runner._METHODS if q not in ("compressed-tensors",)])
def test_each_method_orch_maps_is_the_wheels(quant):
    fn, rule = runner._METHODS[quant]
    text = method_body(rule)
    s = runner._Server("auto", quant, "none", "MixtralForCausalLM", quant, None, None, 9, 0, 1, False)
    out = fn("auto", s)
    if out in ENUM:
        assert f"MoeRunnerBackend.{ENUM[out]}" in text, (rule, out)
    if fn is runner._always_triton:
        assert "MoeRunner(MoeRunnerBackend.TRITON, moe_runner_config)" in text and "get_moe_runner_backend" not in text


def test_compressed_tensors_schemes_are_the_wheels():
    text = method_body(runner._METHODS["compressed-tensors"][1])
    assert "CompressedTensorsW8A8Fp8MoE(" in text and "implemented only for NPU" in text
    fp8 = method_body("srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8_moe.py "
                      "CompressedTensorsW8A8Fp8MoE.create_moe_runner")
    assert "MoeRunnerBackend.TRITON" in fp8 and "is_flashinfer_trtllm()" in fp8


# ------------------------------------------------------------------------------- the log lines

def logging_calls():
    """``(file, line, rendered message, runner set in the same block)`` of every ``logger`` call of
    ``arg_groups/`` in a block that sets ``moe_runner_backend`` to a constant (its nested ``if``
    branches included); f-string fields render as ``{}``."""
    def render(call):
        a = call.args[0] if call.args else None
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            return a.value
        if isinstance(a, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in a.values)
        return None

    def sets(stmt):
        for n in ast.walk(stmt):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant):
                for t in n.targets:
                    if (isinstance(t, ast.Subscript) and getattr(t.slice, "value", None) == "moe_runner_backend") or (
                            isinstance(t, ast.Name) and t.id == "moe_runner_backend"):
                        return n.value.value
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "declare_resolution":
                for k in n.keywords:
                    if k.arg == "moe_runner_backend" and isinstance(k.value, ast.Constant):
                        return k.value.value
        return None

    out = []
    for path in sorted((srt() / "arg_groups").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            for stmts in (getattr(node, "body", None), getattr(node, "orelse", None)):
                if not isinstance(stmts, list) or isinstance(node, (ast.Module, ast.FunctionDef)):
                    continue
                direct = [st for st in stmts if not isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try))]
                value = next((v for v in map(sets, direct) if v), None)
                if not value:
                    continue
                nested = [st for st in stmts if isinstance(st, ast.If) and not sets(st)]
                for n in (n for st in direct + nested for n in ast.walk(st)):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and getattr(
                            n.func.value, "id", None) == "logger" and render(n):
                        out.append((path.name, n.lineno, render(n), value))
    return out


def test_every_runner_choice_sglang_logs_parses_to_the_runner_it_set():
    calls = logging_calls()
    assert len(calls) > 20, calls
    for file, line, text, value in calls:
        if value == "auto":  # the ROCm branch of gpt_oss.py hands the choice back to the layer
            continue
        parsed = moe_log.parse_runner_line(text.replace("{}", "DeepseekV3ForCausalLM"))
        assert parsed is not None and parsed.runner == value, (file, line, text)


@pytest.mark.parametrize("line, runner_name", [
    ("Use flashinfer_trtllm as MoE runner backend on sm100 for DeepseekV3ForCausalLM", "flashinfer_trtllm"),
    ("Use flashinfer_cutlass as MoE runner backend on SM110/SM120 for modelopt_fp4 (trtllm-gen MoE kernels are "
     "SM100-only)", "flashinfer_cutlass"),
    ("auto set moe_runner_backend=`deep_gemm` for PPLX EP", "deep_gemm"),
])
def test_the_lines_named_in_issue_17_are_the_wheels_and_parse(line, runner_name):
    assert any(text == line for _f, _l, text, _v in logging_calls()), line
    parsed = moe_log.parse_runner_line(f"[2026-11-30 10:00:00] {line}")
    assert (parsed.runner, parsed.text) == (runner_name, f"[2026-11-30 10:00:00] {line}")


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.8", "0.5.16", "0.5.23"])
def test_start_line_is_the_releases_and_shows_the_resolved_runner(version):
    """The line that opens a start (``moe_log.START_MARKERS``) is what ``srt/entrypoints/engine.py``
    logs, and its ``moe_runner_backend`` is read in both forms (a dataclass repr, a dict)."""
    root = source_tree(version) / "sglang" / "srt"
    engine = (root / "entrypoints" / "engine.py").read_text()
    if 'logger.info(f"{server_args=}")' in engine:
        args = (root / "server_args.py").read_text()
        assert "@dataclasses.dataclass\nclass ServerArgs" in args or 'return f"ServerArgs({values})"' in args
        line = "[2026-11-30 10:00:00] server_args=ServerArgs(model_path='/m', speculative_moe_runner_backend=None, " \
               "moe_runner_backend='flashinfer_trtllm', tp_size=8)"
        marker = "server_args=ServerArgs("
    else:
        assert 'logger.info(f"server_args={_server_args_for_logging(server_args)}")' in engine
        assert "redact_watermark_secrets(server_args.resolved_dict())" in engine
        line = "[2026-11-30 10:00:00] server_args=" + repr({"model_path": "/m", "speculative_moe_runner_backend": None,
                                                          "moe_runner_backend": "flashinfer_trtllm", "tp_size": 8})
        marker = "server_args={"
    assert marker in moe_log.START_MARKERS
    text = "old start\n" + line + "\nx: The server is fired up and ready to roll!\n"
    assert text[moe_log.last_start_at(text):].startswith(line)
    assert moe_log.parse_moe_log(text).start_runner == "flashinfer_trtllm"
