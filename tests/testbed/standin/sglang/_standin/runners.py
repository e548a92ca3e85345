"""Which MoE runner the stand-in SGLang runs, and FlashInfer's start-up autotune (orch test bed).

The runner: :data:`AUTO_RULES`, a table of what SGLang 0.5.23's server-argument resolution does
with ``--moe-runner-backend auto`` (no ``--moe-a2a-backend``) for the model families, weights and
GPU generations the bed has hosts for, each with the line SGLang logs. It is the stand-in's own
table, not orch's rules: ``tests/unit/testbed/test_standin_runners.py`` runs the wheel's own
override functions (as ``tests/unit/remote/engines/sglang/test_runner_oracle.py`` does) on every row and
holds the resolved backend and the logged line against it. Anything the table does not list keeps
the backend as given; ``auto`` then runs the Triton runner (what 0.5.23's unquantized and fp8 MoE
methods make of ``auto``).

The autotune: for a FlashInfer backend on compute capability 9.0+ without
``--disable-flashinfer-autotune``, :func:`autotune` computes the cache path with the release's
own ``flashinfer_autotune_cache_path`` (``srt/model_executor/runner/flashinfer_autotune.py``,
copied unchanged into the tree as ``sglang/_standin/release_flashinfer_autotune.py`` by
``standin_tree``, its function taken out with :mod:`ast` and run with stand-ins for the process
state), logs SGLang's lines and, between them, FlashInfer's own autotuner lines
(:func:`flashinfer_log`), and writes a rank file there (a ``runs/`` file with
``SGLANG_FLASHINFER_AUTOTUNE_CACHE=0``). ``ORCH_STANDIN_AUTOTUNE_HANG=warm``: a start whose cache file
exists hangs after FlashInfer's start line (issue 32 row 6, vllm PR #54618). The GPU's capability is ``$ORCH_STANDIN_GPU_CAPABILITY``
(default ``9.0``); FlashInfer's version is ``flashinfer.__version__`` of the tree's stand-in
``flashinfer`` package (present when the host option ``flashinfer_version`` is set).
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import logging
import os
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

_DS = "Use flashinfer_trtllm as MoE runner backend on sm100 for DeepseekV3ForCausalLM"
_CUTLASS = ("Use flashinfer_cutlass as MoE runner backend on SM110/SM120 for modelopt_fp4 (trtllm-gen MoE kernels "
            "are SM100-only)")
#: (architectures, quantizations (a declaring row: the flag, else the checkpoint's quant_method,
#: None for 16-bit; any other row: the flag only, as ``_moe_runner_backend_quant_constraints`` reads it), GPU
#: major versions) -> (backend set for ``--moe-runner-backend auto``, line logged, whether
#: ``--quantization`` becomes the checkpoint's when not given, whatever the backend); rows tried in order.
AUTO_RULES: Tuple[Tuple[Tuple[str, ...], Tuple[Optional[str], ...], Tuple[int, ...], str, str, bool], ...] = (
    (("DeepseekV3ForCausalLM",), ("fp8", "modelopt_fp8", "modelopt_fp4"), (10,), "flashinfer_trtllm", _DS, True),
    (("Qwen3MoeForCausalLM",), ("fp8", "modelopt_fp4", None), (10,), "flashinfer_trtllm",
     "Use flashinfer_trtllm as MoE runner backend on sm100 for Qwen3MoeForCausalLM", True),
    (("DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"), ("modelopt_fp4",), (11, 12),
     "flashinfer_cutlass", _CUTLASS, False),
)
#: ``should_run_flashinfer_autotune``'s list of autotuned MoE backends (0.5.23).
AUTOTUNE_BACKENDS = ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_mxfp4", "flashinfer_cutedsl",
                     "flashinfer_cutlass", "flashinfer_megamoe")
#: transformers' config class of each model type the bed serves (``hf_config.__class__.__name__``).
CONFIG_CLASSES = {"deepseek_v3": "DeepseekV3Config", "qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig"}
_DTYPES = {"half": "torch.float16", "float16": "torch.float16", "float": "torch.float32", "float32": "torch.float32",
           "bfloat16": "torch.bfloat16"}

logger = logging.getLogger("sglang.srt.model_executor.runner.flashinfer_autotune")


def capability() -> Tuple[int, int]:
    """The GPU's compute capability, ``$ORCH_STANDIN_GPU_CAPABILITY`` (``"10.0"``; default 9.0)."""
    major, _, minor = (os.environ.get("ORCH_STANDIN_GPU_CAPABILITY") or "9.0").partition(".")
    return int(major), int(minor or 0)


def checkpoint_quant(config: Dict[str, Any]) -> Optional[str]:
    """``quantization_config.quant_method`` of the model config (None: 16-bit weights)."""
    qc = config.get("quantization_config")
    return str(qc.get("quant_method")).lower() if isinstance(qc, dict) and qc.get("quant_method") else None


def resolve(backend: str, quantization: Optional[str],
            config: Dict[str, Any]) -> Tuple[str, Optional[str], Optional[str]]:
    """``(moe_runner_backend, --quantization after resolution, the line SGLang logs or None)``
    (module docstring): a row that matches sets its backend when the backend is ``auto``, and
    declares the checkpoint's quantization (when the row does) whatever the backend."""
    arch = (config.get("architectures") or ["?"])[0]
    quant = quantization or checkpoint_quant(config)
    major = capability()[0]
    for archs, quants, majors, target, line, declares in AUTO_RULES:
        if arch in archs and (quant if declares else quantization) in quants and major in majors:
            declared = quant if declares else quantization
            if backend != "auto":
                return backend, declared, None
            return target, declared, line
    return backend, quantization, None


def runner_of(backend: str) -> str:
    """The runner the MoE layer builds for a resolved backend: ``auto`` is Triton."""
    return "triton" if backend == "auto" else backend


def model_dtype(flag: str, config: Dict[str, Any]) -> str:
    """``str(torch dtype)`` of the model (SGLang's ``_get_and_verify_dtype`` for the bed's models)."""
    if flag and flag != "auto":
        return _DTYPES[flag.lower()]
    tc = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    found = _DTYPES.get(str(tc.get("dtype") or tc.get("torch_dtype") or "float32"), "torch.float32")
    if found != "torch.float32":
        return found
    return "torch.bfloat16" if str(tc.get("model_type", "")).startswith("gemma") else "torch.float16"


def _release_cache_path():
    """The release's ``flashinfer_autotune_cache_path`` and ``get_flashinfer_autotune_skip_ops``,
    ready to run with the stand-in's process state (``state``)."""
    path = Path(__file__).with_name("release_flashinfer_autotune.py")
    tree = ast.parse(path.read_text())
    want = {"flashinfer_autotune_cache_path", "get_flashinfer_autotune_skip_ops", "FLASHINFER_AUTOTUNE_WORKAROUND_SKIPS"}
    body = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in want)
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", None) in want for t in n.targets))]
    for n in body:
        if isinstance(n, ast.FunctionDef):
            n.decorator_list = []
    state: Dict[str, Any] = {}
    envs = SimpleNamespace(SGLANG_CACHE_DIR=SimpleNamespace(
        get=lambda: os.environ.get("SGLANG_CACHE_DIR", os.path.expanduser("~/.cache/sglang"))))
    ns: Dict[str, Any] = {"hashlib": hashlib, "Path": Path, "envs": envs,
                          "torch": SimpleNamespace(cuda=SimpleNamespace(get_device_capability=lambda d=None: capability())),
                          "get_model": lambda: state["model"], "get_exec": lambda: state["exec"],
                          "get_parallel": lambda: state["parallel"]}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)
    return ns["flashinfer_autotune_cache_path"], state


def reuse_cache() -> bool:
    """``SGLANG_FLASHINFER_AUTOTUNE_CACHE`` (``EnvBool``, default true)."""
    value = os.environ.get("SGLANG_FLASHINFER_AUTOTUNE_CACHE")
    return value is None or value.lower() not in ("false", "0", "no", "n")


def autotune(args: Any, backend: str, config: Dict[str, Any], skip_ops: List[str]) -> Optional[str]:
    """Run FlashInfer's start-up autotune when SGLang would (module docstring); returns the file
    written, None when it does not run (also when FlashInfer is not installed, where SGLang would not
    start: the bed's hosts without the stand-in ``flashinfer`` package keep serving)."""
    if backend not in AUTOTUNE_BACKENDS or args.disable_flashinfer_autotune or capability()[0] < 9:
        return None
    try:
        import flashinfer  # noqa: F401  - the release imports it here; the tree's stand-in names a version
    except ImportError:  # a bed host without the stand-in package: SGLang would not start; the stand-in runs on
        logger.info("(stand-in) FlashInfer is not installed: no autotune")
        return None

    cache_path, state = _release_cache_path()
    state["model"] = SimpleNamespace(model_path=args.model_path, quantization=args.quantization_resolved)
    state["exec"] = SimpleNamespace(kernel=SimpleNamespace(flashinfer_autotune_skip_ops=skip_ops or None),
                                    moe=SimpleNamespace(moe_runner_backend=backend))
    state["parallel"] = SimpleNamespace(tp_size=args.tp_size, pp_size=args.pp_size, attn_dp_size=args.attn_dp_size,
                                        moe_ep_size=args.ep_size, tp_rank=0, pp_rank=0, dp_rank=None)
    hf = type(CONFIG_CLASSES.get(str(config.get("model_type")), "PretrainedConfig"), (), {})()
    mr = SimpleNamespace(device="cuda", dtype=model_dtype(args.dtype, config), is_draft_worker=False,
                         model_config=SimpleNamespace(hf_config=hf, quantization=args.quantization_resolved))
    path = cache_path(mr)
    if reuse_cache():
        target = path
        logger.info("Running FlashInfer autotune with cache: %s", target)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
        (path.parent / "runs").mkdir(parents=True, exist_ok=True)
        target = path.parent / "runs" / f"{path.stem}.{stamp}.{uuid.uuid4().hex}{path.suffix}"
        logger.info("Running FlashInfer autotune (cache reuse DISABLED via SGLANG_FLASHINFER_AUTOTUNE_CACHE=0); "
                    "writing fresh result to: %s", target)
    warm = reuse_cache() and target.is_file()
    flashinfer_log().info("[Autotuner]: Autotuning process starts ...")
    if warm and os.environ.get("ORCH_STANDIN_AUTOTUNE_HANG", "").strip() == "warm":
        # vllm PR #54618: a warm cache under TP/EP leaves the ranks waiting on each other; nothing more
        # is logged and the port is never bound (SIGTERM still ends the process)
        threading.Event().wait()
    flashinfer_log().info("[Autotuner]: Autotuning process ends")
    target.write_text(json.dumps({"_metadata": {"stand_in": True}, "tactics": {}}) + "\n")
    logger.info("FlashInfer autotune completed.")
    return str(target)


def flashinfer_log() -> logging.Logger:
    """FlashInfer's own logger (``flashinfer.jit``, its own handler and format, as FlashInfer sets it
    up: ``%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - %(name)s: %(message)s``)."""
    log = logging.getLogger("flashinfer.jit")
    if not log.handlers:
        import sys

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - autotuner.py:%(lineno)d - "
                                               "%(name)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        log.setLevel(logging.INFO)
    return log
