"""SGLang 0.5.23's own code is the judge of where FlashInfer's autotune cache lies and when it is
made (``remote.engines.sglang.autotune``).

From the wheel (``tests/sglang_releases.py``), unchanged, taken out of their files with :mod:`ast`
as ``test_runner_oracle.py`` does: ``flashinfer_autotune_cache_path``,
``get_flashinfer_autotune_skip_ops`` and ``should_run_flashinfer_autotune`` of
``srt/model_executor/runner/flashinfer_autotune.py``, run with stand-ins only for what they ask of
the process (``get_model()``, ``get_exec()``, ``get_parallel()``: the resolved server arguments;
``torch.cuda.get_device_capability``; ``flashinfer.__version__``; the dense-GEMM backend probes),
with the wheel's own ``EnvStr``/``EnvBool`` of ``srt/environ.py`` reading a real environment; and
``_get_and_verify_dtype`` of ``configs/model_config.py`` with the real torch. Over a grid the path
must be the one orch computes, and the decision orch's where orch gives one.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from remote.engines.sglang import autotune
from tests.sglang_releases import source_tree
from tests.unit.remote.engines.sglang.test_runner_oracle import extract


def srt() -> Path:
    return source_tree("0.5.23") / "sglang" / "srt"


class Envs:
    """``envs`` holding the wheel's own fields for the variables asked."""

    def __init__(self, environ_ns: dict):
        self.SGLANG_CACHE_DIR = environ_ns["EnvStr"](os.path.expanduser("~/.cache/sglang"))
        self.SGLANG_CACHE_DIR.name = "SGLANG_CACHE_DIR"
        self.SGLANG_FLASHINFER_AUTOTUNE_CACHE = environ_ns["EnvBool"](True)
        self.SGLANG_FLASHINFER_AUTOTUNE_CACHE.name = "SGLANG_FLASHINFER_AUTOTUNE_CACHE"


@pytest.fixture(scope="module")
def wheel():
    """``(namespace with the wheel's functions, state)``; ``state`` holds the stand-ins' answers."""
    import contextlib
    import warnings
    environ_ns: dict = {}
    tree = ast.parse((srt() / "environ.py").read_text())
    body = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in ("EnvField", "EnvStr", "EnvBool")]
    assert len(body) == 3
    environ_ns.update({"os": os, "warnings": warnings, "contextmanager": contextlib.contextmanager, "Any": object})
    exec(compile(ast.Module(body=body, type_ignores=[]), "environ.py", "exec"), environ_ns)
    state: dict = {}
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_device_capability=lambda device=None: state["capability"]))
    ns = {"torch": fake_torch, "envs": Envs(environ_ns), "hashlib": hashlib, "Path": Path,
          "get_model": lambda: state["model"], "get_exec": lambda: state["exec"],
          "get_parallel": lambda: state["parallel"], "get_spec": lambda: state["spec"]}
    extract(srt() / "model_executor" / "runner" / "flashinfer_autotune.py",
            {"FLASHINFER_AUTOTUNE_WORKAROUND_SKIPS", "get_flashinfer_autotune_skip_ops",
             "flashinfer_autotune_cache_path", "should_run_flashinfer_autotune",
             "_serves_block_fp8_as_mxfp8_on_flashinfer"}, ns)
    gemm = types.SimpleNamespace(is_flashinfer_cutlass=lambda: False, is_flashinfer_cutedsl=lambda: False,
                                 is_flashinfer=lambda: False)
    fake = {"flashinfer": types.SimpleNamespace(__version__="0.6.9"),
            "sglang.srt.layers.quantization.fp4_utils": types.SimpleNamespace(get_fp4_gemm_runner_backend=lambda: gemm),
            "sglang.srt.layers.quantization.fp8_utils": types.SimpleNamespace(
                flashinfer_per_tensor_fp8_supported=lambda: False, resolve_mxfp8_dense_gemm_backend=lambda: gemm),
            "sglang.srt.layers.quantization.fp8": types.SimpleNamespace(Fp8LinearMethod=type("Fp8LinearMethod", (), {}))}
    saved = {k: sys.modules.get(k) for k in fake}
    sys.modules.update(fake)
    yield ns, state, fake["flashinfer"]
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


def runner_of(state, *, model_path, dtype, quantization, backend, tp, pp, attn_dp, ep, config_class, skip_ops,
              capability=(10, 0), a2a="none", disabled=False):
    kernel = types.SimpleNamespace(flashinfer_autotune_skip_ops=list(skip_ops) or None,
                                   disable_flashinfer_autotune=disabled)
    state["capability"] = capability
    state["model"] = types.SimpleNamespace(model_path=model_path, quantization=quantization)
    state["exec"] = types.SimpleNamespace(kernel=kernel, moe=types.SimpleNamespace(moe_runner_backend=backend,
                                                                                   moe_a2a_backend=a2a),
                                          deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    state["parallel"] = types.SimpleNamespace(tp_size=tp, pp_size=pp, attn_dp_size=attn_dp, moe_ep_size=ep,
                                              tp_rank=0, pp_rank=0, dp_rank=None, enable_kv_cache_sharding=False)
    hf = type(config_class, (), {})()
    return types.SimpleNamespace(device="cuda", dtype=dtype, is_draft_worker=False, model=types.SimpleNamespace(
        modules=lambda: []), spec_algorithm=types.SimpleNamespace(is_speculative=lambda: False),
        model_config=types.SimpleNamespace(hf_config=hf, quantization=quantization))


GRID = list(itertools.product(
    ("/models/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "/m/a b"), (torch.bfloat16, torch.float16),
    (None, "fp8", "modelopt_fp4"), ("flashinfer_trtllm", "flashinfer_cutlass", "auto"), ((1, 1, 1, 1), (8, 1, 1, 8),
                                                                                          (8, 2, 4, 1)),
    ("DeepseekV3Config", "Qwen3MoeConfig"), ((), ("b", "a"))))


def test_cache_path_matches_the_wheel(wheel, tmp_path, monkeypatch):
    ns, state, flashinfer = wheel
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "cache"))
    for version, cap in (("0.6.9", (10, 0)), ("0.4.1", (9, 0)), ("0.6.9", (12, 1))):
        flashinfer.__version__ = version
        for path, dt, quant, backend, (tp, pp, dp, ep), cls, skip in GRID:
            mr = runner_of(state, model_path=path, dtype=dt, quantization=quant, backend=backend, tp=tp, pp=pp,
                           attn_dp=dp, ep=ep, config_class=cls, skip_ops=skip, capability=cap)
            theirs = ns["flashinfer_autotune_cache_path"](mr)
            key = autotune.cache_key(model_path=path, dtype=str(dt), quantization=quant, backend=backend, tp=tp,
                                     pp=pp, attn_dp=dp, ep=ep, config_class=cls, skip_ops=skip)
            ours = Path(autotune.cache_dir(str(tmp_path / "cache"), version, f"{cap[0]}.{cap[1]}", key)) / \
                autotune.rank_file()
            assert theirs == ours
            assert autotune.key_of_path(str(theirs)) == (version, f"sm{cap[0]}{cap[1]}", key)


def test_cache_root_default_and_set(wheel, monkeypatch):
    ns, _state, _fi = wheel
    envs = ns["envs"]
    monkeypatch.delenv("SGLANG_CACHE_DIR", raising=False)
    # the default is fixed at import from the importing user's home
    assert envs.SGLANG_CACHE_DIR.get() == autotune.cache_root({}, os.path.expanduser("~"))
    for value in ("/srv/cache", "~/not-expanded", "rel/dir"):
        monkeypatch.setenv("SGLANG_CACHE_DIR", value)
        assert envs.SGLANG_CACHE_DIR.get() == autotune.cache_root({"SGLANG_CACHE_DIR": value}, "/home/x")


@pytest.mark.parametrize("value", ["0", "1", "false", "True", "NO", "y", "maybe", ""])
def test_reuse_switch(wheel, monkeypatch, value):
    ns, _state, _fi = wheel
    monkeypatch.setenv("SGLANG_FLASHINFER_AUTOTUNE_CACHE", value)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = ns["envs"].SGLANG_FLASHINFER_AUTOTUNE_CACHE.get()
    assert theirs == autotune.reuses_cache({"SGLANG_FLASHINFER_AUTOTUNE_CACHE": value})


def test_reuse_default(wheel, monkeypatch):
    ns, _state, _fi = wheel
    monkeypatch.delenv("SGLANG_FLASHINFER_AUTOTUNE_CACHE", raising=False)
    assert ns["envs"].SGLANG_FLASHINFER_AUTOTUNE_CACHE.get() is autotune.reuses_cache({}) is True


BACKENDS = ("triton", "auto", "deep_gemm", "marlin", "cutlass") + autotune.AUTOTUNE_BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
def test_should_run_matches_the_wheel(wheel, backend):
    ns, state, _fi = wheel
    for cap, a2a, disabled, quant in itertools.product(((8, 0), (9, 0), (10, 0), (12, 0)), ("none", "deepep"),
                                                       (False, True), (None, "fp8", "mxfp4")):
        mr = runner_of(state, model_path="/m", dtype=torch.bfloat16, quantization=quant, backend=backend, tp=1, pp=1,
                       attn_dp=1, ep=1, config_class="C", skip_ops=(), capability=cap, a2a=a2a, disabled=disabled)
        theirs = ns["should_run_flashinfer_autotune"](mr)
        ours, why = autotune.autotune_runs(backend=backend, capability=f"{cap[0]}.{cap[1]}", quantization=quant,
                                           a2a_backend=a2a, disabled=disabled)
        assert ours is theirs, (backend, cap, a2a, disabled, quant, why)
        assert why


def test_dense_gemm_quantizations_are_not_guessed():
    """Where the dense GEMMs may autotune, orch says unknown rather than no."""
    for quant in ("modelopt_fp4", "mxfp8", "modelopt_fp8"):
        assert autotune.autotune_runs(backend="triton", capability="10.0", quantization=quant)[0] is None


def test_dtype_matches_the_wheel():
    ns = extract(srt() / "configs" / "model_config.py", {"_get_and_verify_dtype", "_STR_DTYPE_TO_TORCH_DTYPE"},
                 {"torch": torch, "Union": object, "PretrainedConfig": object,
                  "logger": types.SimpleNamespace(info=lambda *a, **k: None, debug=lambda *a, **k: None,
                                                  warning=lambda *a, **k: None)})
    for flag, cfg, model_type in itertools.product((None, "auto", "bfloat16", "half", "float32", "BFloat16"),
                                                   (None, "bfloat16", "float16", "float32"),
                                                   ("deepseek_v3", "gemma3", "qwen3_moe")):
        config = {"model_type": model_type, "torch_dtype": cfg}
        theirs = ns["_get_and_verify_dtype"](config, flag or "auto")
        assert str(theirs) == autotune.torch_dtype(flag, cfg, model_type), (flag, cfg, model_type)


def test_log_wordings_are_the_wheels():
    text = (srt() / "model_executor" / "runner" / "flashinfer_autotune.py").read_text()
    assert f'"{autotune.LOG_WITH_CACHE}%s"' in text
    assert '"' + autotune.LOG_DONE + '"' in text
    import re
    joined = re.sub(r'"\s*\n\s*"', "", text)  # adjacent string literals, as Python joins them
    assert '"' + autotune.LOG_NO_REUSE + '%s"' in joined


def test_autotune_log_reads_a_start():
    path = "/root/.cache/sglang/flashinfer/autotune/0.6.9/sm100/0123456789abcdef/rank_tp0_pp0_dp0.json"
    found = autotune.autotune_log([
        "[2026-01-01 00:00:01 TP0] Running FlashInfer autotune with cache: " + path,
        "[2026-01-01 00:00:09 TP0] FlashInfer autotune completed."])
    assert found == autotune.AutotuneLog(path, True, True)
    runs = path.replace("rank_tp0", "runs/rank_tp0").replace(".json", ".20260101_000001.abcd.json")
    fresh = autotune.autotune_log(["[x] " + autotune.LOG_NO_REUSE + runs])
    assert fresh == autotune.AutotuneLog(runs, False, False)
    assert autotune.key_of_path(runs) == ("0.6.9", "sm100", "0123456789abcdef")
    assert autotune.autotune_log(["Using MoE kernel config from /x.json."]) is None


def test_config_classes_agree_with_sglangs_own_registry():
    """The hash's config class: where SGLang 0.5.23 registers its own config class for a model type
    (``utils/hf_transformers/common.py`` ``_CONFIG_REGISTRY``), orch names that class; the other
    model types load transformers' class of that name (transformers is not in the test venv, so
    those names are not checked here)."""
    common = ast.parse((srt() / "utils" / "hf_transformers" / "common.py").read_text())
    registered: set[str] = set()
    for node in ast.walk(common):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_CONFIG_REGISTRY":
            registered = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    assert "DbrxConfig" in registered
    by_type: dict[str, str] = {}
    for path in (srt() / "configs").glob("*.py"):
        for cls in ast.parse(path.read_text()).body:
            if isinstance(cls, ast.ClassDef) and cls.name in registered:
                for stmt in cls.body:
                    if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "model_type"
                                                            for t in stmt.targets):
                        by_type[ast.literal_eval(stmt.value)] = cls.name
    assert by_type, "no registered config class found"
    for model_type, name in autotune.CONFIG_CLASSES.items():
        if model_type in by_type:
            assert by_type[model_type] == name, model_type


@pytest.mark.parametrize("value", ["~/c", "rel/dir", "/abs/cache", ""])
def test_cache_root_as_the_server_expands_it(wheel, tmp_path, monkeypatch, value):
    """A ``$SGLANG_CACHE_DIR`` that is set is used as written, relative to the server's working
    directory (no ``~`` expansion): the wheel's ``flashinfer_autotune_cache_path`` run in a working
    directory lands where ``cache_dir(cache_root(env, home, workdir))`` says (issue 28: one answer
    for ``orch doctor``'s probe and the runner trial's backup)."""
    ns, state, flashinfer = wheel
    flashinfer.__version__ = "0.6.9"
    workdir = tmp_path / "srv"
    workdir.mkdir()
    if value.startswith("/"):
        value = str(tmp_path / value.lstrip("/"))
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "svc"))
    monkeypatch.setenv("SGLANG_CACHE_DIR", value)
    mr = runner_of(state, model_path="/m", dtype=torch.bfloat16, quantization=None, backend="flashinfer_trtllm",
                   tp=1, pp=1, attn_dp=1, ep=1, config_class="Qwen3MoeConfig", skip_ops=())
    theirs = os.path.abspath(ns["flashinfer_autotune_cache_path"](mr))
    key = autotune.cache_key(model_path="/m", dtype=str(torch.bfloat16), quantization=None, backend="flashinfer_trtllm",
                             config_class="Qwen3MoeConfig")
    root = autotune.cache_root({"SGLANG_CACHE_DIR": value}, str(tmp_path / "home" / "svc"), str(workdir))
    ours = os.path.join(autotune.cache_dir(root, "0.6.9", "10.0", key), autotune.rank_file())
    assert theirs == os.path.normpath(ours), (value, theirs, ours)
    assert theirs.startswith(str(workdir)) or value.startswith("/")


def test_autotune_log_reads_flashinfers_own_start_and_end_lines():
    """FlashInfer's autotuner logs its own start and end lines (``flashinfer.jit`` logger) inside
    SGLang's two: a start whose last one is the start line is still tuning, or hung (issue 32 row 6)."""
    path = "/c/flashinfer/autotune/0.6.9/sm90/0123456789abcdef/rank_tp0_pp0_dp0.json"
    head = ["[x TP0] " + autotune.LOG_WITH_CACHE + path,
            "2026-05-19 02:34:52,301 - INFO - autotuner.py:446 - flashinfer.jit: [Autotuner]: Autotuning process starts ..."]
    hung = autotune.autotune_log(head)
    assert hung.tuning and hung.unfinished and not hung.completed and hung.path == path
    ended = autotune.autotune_log(head + [
        "2026-05-19 02:34:53,771 - INFO - autotuner.py:455 - flashinfer.jit: [Autotuner]: Autotuning process ends"])
    assert not ended.tuning and ended.unfinished  # SGLang's own end line not yet logged
    done = autotune.autotune_log(head + ["... [Autotuner]: Autotuning process ends", "[x TP0] " + autotune.LOG_DONE])
    assert not done.unfinished and done.completed
    assert autotune.autotune_log([head[1]]).unfinished  # FlashInfer's line alone (another caller of it)
