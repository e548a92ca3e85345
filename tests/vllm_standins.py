"""Stand-ins that let a vLLM release's fused-MoE Triton path import and run without vLLM installed.

For tests and ``bench/`` only: the payload (``remote/``) never imports this module; on a host
where vLLM is installed, the ``vllm`` provider imports vLLM as it is.

vLLM's package ``__init__`` files pull in its whole server (engine, configs built on pydantic,
distributed runtime, model registry) and its compiled ops (``vllm._C``). None of that is part of
the fused-MoE Triton kernel, its launch code, its config lookup or its default config, which run
for real from the release's own files. :func:`install` adds a meta-path finder that serves:

- the modules of :data:`REAL_MODULES` (and every module under :data:`REAL_PACKAGES`) from the
  release's source files, unchanged; a package among them is "hollow" (its ``__init__.py`` is
  not run) unless listed in :data:`RUN_INIT`;
- ``vllm._custom_ops``: :data:`OP_STANDINS`, torch/Triton versions of the compiled ops the MoE
  path calls (alignment, gated activation, top-k sum, fp8/int8 activation quantization);
  they cost the same for every config, so they shift absolute times, not the ranking;
- ``vllm.platforms``: :class:`CudaPlatformStandin` as ``current_platform`` (the CUDA platform's
  answers that the MoE path asks: device name, capability, fp8 dtype), since vLLM's own platform
  detection needs NVML and its compiled ops;
- ``vllm.model_executor.layers.fused_moe`` (hollow): the package's ``override_config`` /
  ``get_config`` pair, which ``try_get_optimal_moe_config`` imports from it (the release's own
  two functions are copied from its ``__init__.py`` by name with ``ast``, not rewritten);
- every other ``vllm.*`` module: a placeholder module whose attributes are inert placeholders
  (``vllm.distributed.parallel_state``'s ``is_global_first_rank``/``is_local_first_rank`` answer
  True, as on a one-GPU server, so vLLM's ``info_once``/``warning_once`` lines are emitted);
- third-party packages absent here (:data:`THIRD_PARTY`): placeholders (``regex``: the standard
  library's ``re``, which the MoE path's patterns need nothing more than).

What stood in is listed by :func:`install` (the bench prints it).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re as _re
import sys
import types
from contextlib import contextmanager
from pathlib import Path

from tests import sglang_standins as _sg

#: vLLM modules run from the release's files (besides those under :data:`REAL_PACKAGES`).
REAL_MODULES = (
    "vllm.envs",
    "vllm.logger",
    "vllm.version",
    "vllm.scalar_type",
    "vllm.utils.math_utils",
    "vllm.utils.platform_utils",
    "vllm.utils.torch_utils",
    "vllm.utils.import_utils",
    "vllm.utils.argparse_utils",
    "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.model_executor.layers.fused_moe.moe_align_block_size",
    "vllm.model_executor.layers.fused_moe.config",
    "vllm.model_executor.layers.fused_moe.activation",
    "vllm.model_executor.layers.fused_moe.utils",
    "vllm.model_executor.layers.fused_moe.modular_kernel",
    "vllm.model_executor.layers.fused_moe.moe_output",
    "vllm.model_executor.layers.fused_moe.topk_weight_and_reduce",
    "vllm.model_executor.layers.quantization.utils.quant_utils",
    "vllm.model_executor.layers.quantization.utils.fp8_utils",
    "vllm.model_executor.layers.quantization.utils.int8_utils",
)
#: Packages whose every module runs from the release's files.
REAL_PACKAGES = ("vllm.triton_utils", "vllm.logging_utils")
#: Packages whose ``__init__.py`` runs (the others among the real ones are hollow).
RUN_INIT = ("vllm.triton_utils", "vllm.logging_utils")

#: Third-party packages served as placeholders when absent, and what vLLM uses them for.
THIRD_PARTY = {
    "regex": "pattern matching (vllm.utils.platform_utils imports it as re); served by the standard re",
    "psutil": "process/memory queries of the server",
    "zmq": "inter-process messaging of the engine",
    "pydantic": "config dataclasses of the server",
    "urllib3": "HTTP client helpers",
    "cachetools": "caches of the server",
    "msgspec": "engine messages",
    "cbor2": "hashing of prefix-cache keys",
    "blake3": "hashing of prefix-cache keys",
    "transformers": "model configs",
    "huggingface_hub": "model download",
    "safetensors": "checkpoint loading",
    "einops": "tensor reshapes in model code",
    "pynvml": "NVML queries (the platform stands in)",
    "flashinfer": "FlashInfer kernels (not on the Triton path)",
    "deep_gemm": "DeepGEMM kernels (not on the Triton path)",
    "numba": "JIT helpers of the scheduler",
    "openai": "OpenAI API types of the server",
    "fastapi": "HTTP server",
    "prometheus_client": "server metrics",
    "tqdm": "progress bars",
    "gguf": "GGUF checkpoints",
    "compressed_tensors": "quantization configs of checkpoints",
    "aiohttp": "HTTP client",
    "sentencepiece": "tokenizers",
    "tokenizers": "tokenizers",
}

OP_STANDINS = {
    "moe_align_block_size": "vLLM's CUDA alignment (torch.ops._moe_C); torch version of the same contract "
                            "(every expert padded to BLOCK_SIZE_M, pads hold numel, expert_map applied)",
    "silu_and_mul": "vLLM's CUDA gated SiLU (torch.ops._C); a Triton kernel, out = silu(x[:, :d]) * x[:, d:]",
    "gelu_and_mul": "as silu_and_mul, GELU",
    "moe_sum": "vLLM's CUDA top-k sum (torch.ops._moe_C); torch.sum over the top-k axis",
    "scaled_fp8_quant": "vLLM's CUDA fp8 quantization of activations (per-tensor or per-token); torch, amax / 448",
    "scaled_int8_quant": "vLLM's CUDA int8 quantization of activations (per-token, symmetric); torch, amax / 127",
    "per_token_group_quant_fp8": "CPU only: vLLM's Triton group quantization under the interpreter casts fp32 "
                                 "to fp8 wrongly; torch, same scales (amax / 448, eps 1e-10)",
    "per_token_group_fp8_quant": "GPU: vLLM's CUDA group quantization (torch.ops._C), which per_token_group_quant_fp8 "
                                 "calls on CUDA; vLLM's own Triton fallback kernels of that function",
}

_state: dict = {}


def _placeholder_module(name: str, path: list | None = None) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__file__ = f"<stand-in for {name}>"
    m.__path__ = path if path is not None else []
    m.__getattr__ = _attr
    return m


class _Or(_sg._Placeholder):
    """A placeholder that also takes ``|`` (type hints such as ``X | None`` at class level)."""

    def __or__(self, other):
        return self

    __ror__ = __or__


def _attr(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    value = _sg._placeholder_attr(name)
    return _Or() if isinstance(value, _sg._Placeholder) else value


class CudaPlatformStandin:
    """``current_platform`` of a CUDA host, answering what vLLM's MoE Triton path asks.

    ``get_device_name``: ``torch.cuda.get_device_name`` on a GPU, else ``$ORCH_STANDIN_GPU_NAME``
    (default ``NVIDIA H200``); capability: the GPU's, else 9.0; fp8 dtype ``float8_e4m3fn``.
    Anything else is an inert placeholder (falsy)."""

    device_type = "cuda"
    device_name = "cuda"
    dispatch_key = "CUDA"
    simple_compile_backend = "inductor"
    ray_device_key = "GPU"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Or()

    @staticmethod
    def _cc() -> tuple[int, int]:
        import torch
        return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else (9, 0)

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def is_tpu(self):
        return False

    def is_out_of_tree(self):
        return False

    def is_fp8_fnuz(self):
        return False

    def supports_fp8(self):
        return self._cc() >= (8, 9)

    def fp8_dtype(self):
        import torch
        return torch.float8_e4m3fn

    def get_device_name(self, device_id: int = 0) -> str:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(device_id)
        return os.environ.get("ORCH_STANDIN_GPU_NAME", "NVIDIA H200")

    def get_device_capability(self, device_id: int = 0):
        major, minor = self._cc()
        return types.SimpleNamespace(major=major, minor=minor, to_int=lambda: major * 10 + minor,
                                     as_version_str=lambda: f"{major}.{minor}")

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        major, minor = self._cc()
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return major * 10 + minor >= want

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        major, minor = self._cc()
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return major * 10 + minor == want

    def is_device_capability_family(self, capability, device_id: int = 0) -> bool:
        major, _ = self._cc()
        return major == (capability // 10 if isinstance(capability, int) else capability[0])

    def import_kernels(self):
        return None

    def get_current_memory_usage(self, device=None) -> float:
        return 0.0


def _platforms_module() -> types.ModuleType:
    m = _placeholder_module("vllm.platforms")
    m.current_platform = CudaPlatformStandin()
    m.vllm_version_matches_substr = lambda substr: False
    m.__path__ = []
    return m


# ----------------------------------------------------------------------------- compiled ops


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         expert_map=None, scatter_idx=None, **_ignored):
    """Stand-in for vLLM's ``ops.moe_align_block_size`` (CUDA ``_moe_C``): buckets of the (mapped)
    expert ids, each padded to ``block_size``; pad slots hold ``numel``; ``experts_ids`` per block
    (-1 for an expert mapped away). Writes in place, no host synchronisation."""
    import torch

    ids = topk_ids.reshape(-1).to(torch.int64)
    if expert_map is not None:
        ids = expert_map.to(torch.int64)[ids.clamp(min=0)]
    # bucket 0 holds the ids mapped away (-1), as SGLang's +1 offset alignment does
    tmp_ids = torch.empty(0)
    _sg.moe_align_block_size(ids.to(topk_ids.dtype).view(topk_ids.shape), num_experts + 1, block_size,
                             sorted_token_ids, experts_ids, num_tokens_post_pad, None,
                             ignore_invalid_expert=True)
    del tmp_ids


def moe_sum(input, output, topk_ids=None, expert_map=None):
    """Stand-in for vLLM's ``ops.moe_sum``: ``output = input.sum(1)`` (skipping, with ``expert_map``,
    the top-k slots whose expert is not on this rank)."""
    import torch

    if expert_map is not None and topk_ids is not None:
        keep = (expert_map[topk_ids.to(torch.int64)] >= 0).unsqueeze(-1).to(input.dtype)
        torch.sum(input * keep, dim=1, out=output)
    else:
        torch.sum(input, dim=1, out=output)


def scaled_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None, use_per_token_if_dynamic=False,
                     output=None, group_shape=None, **_ignored):
    """Stand-in for vLLM's ``ops.scaled_fp8_quant``: static scale, or dynamic amax / 448 per tensor
    (or per token with ``use_per_token_if_dynamic``); returns ``(fp8 tensor, float32 scale)``."""
    import torch

    x = input.reshape(-1, input.shape[-1]).float()
    if scale is None:
        if use_per_token_if_dynamic:
            scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 448.0
        else:
            scale = (x.abs().amax().clamp(min=1e-10) / 448.0).reshape(1)
    s = scale.float()
    q = (x / (s if s.dim() == 2 else s.reshape(-1)[0])).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    if output is not None:
        output[: q.shape[0]].copy_(q)
        q = output
    return q.view(*input.shape[:-1], input.shape[-1]) if output is None else q, scale


def scaled_int8_quant(input, scale=None, azp=None, symmetric=True, **_ignored):
    """Stand-in for vLLM's ``ops.scaled_int8_quant`` (symmetric): per-token amax / 127 when no scale
    is given; returns ``(int8 tensor, float32 scales [rows, 1], None)``."""
    import torch

    x = input.reshape(-1, input.shape[-1]).float()
    if scale is None:
        s = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 127.0
    else:
        s = scale.float().reshape(-1, 1) if scale.numel() > 1 else scale.float().reshape(1, 1)
    q = _sg._round_away(x / s).clamp(-128, 127).to(torch.int8)
    return q.view(input.shape), s, None


def per_token_group_quant_fp8(x, group_size, eps=1e-10, dtype=None, column_major_scales=False, out_q=None,
                              use_ue8m0=None, **_ignored):
    """CPU stand-in for vLLM's Triton ``per_token_group_quant_fp8`` (row-major scales)."""
    q, s = _sg._group_quant(x, group_size)
    if out_q is not None:
        out_q.copy_(q)
        q = out_q
    return q.view(x.shape), s.view(*x.shape[:-1], x.shape[-1] // group_size)


def moe_wna16_gemm(A, C, B, B_scale, B_zp, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                   top_k, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, bit):
    """Torch stand-in for vLLM's compiled ``ops.moe_wna16_gemm`` (``csrc/moe/moe_wna16.cu``), which
    ``dispatch_fused_moe_kernel`` runs for int4 with a group of 32/64/128 and few tokens per expert:
    for each aligned block of ``BLOCK_SIZE_M`` sorted token slots, ``C[slot] = A[slot // top_k] @
    dequant(B[expert]).T`` (times ``topk_weights[slot]`` when given), with the dequantization of the
    Triton WNA16 kernel: ``(q - zero point) * scale`` per group, zero point 8 (int4) / 128 (int8) when
    ``B_zp`` is None. The tiles change only the real kernel's speed, but the real kernel's checks on
    them are made (RuntimeError, as its TORCH_CHECK raises)."""
    import torch

    from remote.tuning.kernel import formats

    E, N = B.shape[0], B.shape[1]
    packed = bit == 4
    K = A.shape[1]
    group = K // B_scale.shape[2]
    # the real kernel's TORCH_CHECKs (csrc/moe/moe_wna16.cu): an entry that fails them fails the server
    if K % BLOCK_SIZE_K or BLOCK_SIZE_K % group or BLOCK_SIZE_K // group not in (1, 2, 4, 8) or BLOCK_SIZE_M > 64:
        raise RuntimeError(f"moe_wna16_gemm refuses BLOCK_SIZE_M={BLOCK_SIZE_M} BLOCK_SIZE_K={BLOCK_SIZE_K} for "
                           f"size_k={K}, group_size={group}")
    fmt = formats.WeightFormat("int4_w4a16" if packed else "int8_w8a16", group_size=group, has_zp=B_zp is not None)
    out = C.view(-1, N)
    total = int(num_tokens_post_padded.reshape(-1)[0])
    slots = sorted_token_ids[:total].to(torch.int64)
    valid = out.shape[0]
    for blk in range(total // BLOCK_SIZE_M):
        e = int(expert_ids[blk])
        rows = slots[blk * BLOCK_SIZE_M:(blk + 1) * BLOCK_SIZE_M]
        rows = rows[rows < valid]
        if e < 0 or rows.numel() == 0:
            continue
        w = formats.dequantize(B[e:e + 1], B_scale[e:e + 1], None if B_zp is None else B_zp[e:e + 1], fmt,
                               dtype=torch.float32)[0]
        res = A[rows // top_k].float() @ w.T
        if topk_weights is not None:
            res = res * topk_weights.reshape(-1)[rows].float().unsqueeze(1)
        out[rows] = res.to(out.dtype)


_LIBS: list = []


def _register_torch_ops() -> list:
    """Register ``torch.ops._C.silu_and_mul`` / ``gelu_and_mul`` (vLLM's compiled gated activations,
    which its MoE activation calls through ``torch.ops``) as the Triton stand-ins, where absent.
    Returns the names registered."""
    import torch

    done = []
    libs: list = []

    def library():
        if not libs:
            libs.append(torch.library.Library("_C", "FRAGMENT"))
            _LIBS.append(libs[0])
        return libs[0]

    for name, gelu in (("silu_and_mul", False), ("gelu_and_mul", True)):
        if hasattr(torch.ops._C, name):
            continue
        lib = library()
        lib.define(f"{name}(Tensor(a!) out, Tensor input) -> ()")
        lib.impl(name, (lambda g: lambda out, x: (_sg._gated(x, out, g), None)[1])(gelu), "CompositeExplicitAutograd")
        done.append(f"torch.ops._C.{name}")
    if not hasattr(torch.ops._C, "per_token_group_fp8_quant"):
        lib = library()
        # the schema vLLM's fp8_utils.per_token_group_quant_fp8 calls on CUDA (0.26.0: input, output_q,
        # output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0, column-major scales, TMA-aligned scales)
        lib.define("per_token_group_fp8_quant(Tensor input, Tensor(a!) output_q, Tensor(b!) output_s, int group_size, "
                   "float eps, float fp8_min, float fp8_max, bool scale_ue8m0, bool column_major, bool tma_aligned) -> ()")
        lib.impl("per_token_group_fp8_quant", per_token_group_fp8_quant_op, "CompositeExplicitAutograd")
        done.append("torch.ops._C.per_token_group_fp8_quant")
    return done


def per_token_group_fp8_quant_op(x, x_q, x_s, group_size, eps, fp8_min, fp8_max, use_ue8m0, column_major,
                                 tma_aligned) -> None:
    """Stand-in for vLLM's CUDA ``per_token_group_fp8_quant`` (``torch.ops._C``), which
    ``per_token_group_quant_fp8`` calls on CUDA for a contiguous input: vLLM's own Triton fallback
    kernels of the same function (``_per_token_group_quant_fp8`` / ``_colmajor``), launched as that
    function's fallback launches them; outputs written in place."""
    import triton

    from vllm.model_executor.layers.quantization.utils import fp8_utils as fu

    rows = x.numel() // group_size
    block = triton.next_power_of_2(group_size)
    meta = dict(fp8_min=fp8_min, fp8_max=fp8_max, use_ue8m0=use_ue8m0, BLOCK=block,
                num_warps=min(max(block // 256, 1), 8), num_stages=1)
    if column_major:
        fu._per_token_group_quant_fp8_colmajor[(rows,)](x, x_q, x_s, group_size, x.shape[1], x.stride(0),
                                                       x_s.stride(1), eps, **meta)
    else:
        fu._per_token_group_quant_fp8[(rows,)](x, x_q, x_s, group_size, x.shape[1], x.stride(0), eps, **meta)


def _ops_module() -> types.ModuleType:
    m = _placeholder_module("vllm._custom_ops")
    m.__getattr__ = lambda n: (_attr(n) if n.startswith("__") or n[:1].isupper() else _sg._MissingOp(f"vllm._custom_ops.{n}"))
    m.moe_align_block_size = moe_align_block_size
    m.silu_and_mul = lambda out, x: _sg.silu_and_mul(x, out)
    m.gelu_and_mul = lambda out, x: _sg.gelu_and_mul(x, out)
    m.moe_sum = moe_sum
    m.scaled_fp8_quant = scaled_fp8_quant
    m.scaled_int8_quant = scaled_int8_quant
    m.moe_wna16_gemm = moe_wna16_gemm
    return m


# ----------------------------------------------------------------------------- finder


def _override_pair(init_file: Path) -> dict:
    """The release's own ``override_config`` and ``get_config`` (and ``_config``), compiled from
    its fused_moe package ``__init__.py`` by name (the rest of that file is not run)."""
    tree = ast.parse(init_file.read_text())
    keep = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name in ("override_config", "get_config"))
            or (isinstance(n, (ast.Assign, ast.AnnAssign)) and "_config" in ast.unparse(n).split("=")[0])]
    mod = ast.Module(body=[ast.parse("from contextlib import contextmanager\nfrom typing import Any").body[0],
                           ast.parse("from typing import Any").body[0], *keep], type_ignores=[])
    ns: dict = {}
    exec(compile(mod, str(init_file), "exec"), ns)  # noqa: S102 - the release's own two functions
    return {k: ns[k] for k in ("override_config", "get_config", "_config") if k in ns}


class _TorchUtilsLoader(importlib.machinery.SourceFileLoader):
    """Runs the release's ``vllm/utils/torch_utils.py`` unchanged, then lets
    ``direct_register_custom_op`` skip an op torch already holds: torch's op registry is
    process-wide, so a second release loaded in one test process would register ``vllm::fused_experts``
    twice (the tests and the provider call ``fused_experts_impl`` directly, never the op). The same
    for the module's own ``register_opaque_type(LayerName, ...)`` at import (torch >= 2.11)."""

    def exec_module(self, module):
        try:  # torch >= 2.11: vLLM registers its LayerName as an opaque type, once per process too
            import torch._library.opaque_object as opaque
        except ImportError:
            opaque = None
        real = getattr(opaque, "register_opaque_type", None)
        if real is not None:
            def register_once(*a, **k):
                try:
                    return real(*a, **k)
                except RuntimeError as exc:
                    if "already registered" not in str(exc):
                        raise
            opaque.register_opaque_type = register_once
        try:
            super().exec_module(module)
        finally:
            if real is not None:
                opaque.register_opaque_type = real
        register = getattr(module, "direct_register_custom_op", None)
        if register is None:
            return

        def once(op_name, *a, target_lib=None, **k):
            import torch
            lib = target_lib or getattr(module, "vllm_lib", None)
            ns = getattr(lib, "ns", "vllm")
            if hasattr(getattr(torch.ops, ns), op_name):
                return None
            return register(op_name, *a, target_lib=target_lib, **k)
        module.direct_register_custom_op = once


class _VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``vllm.*`` as described in the module docstring."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.placeholders: set[str] = set()

    def _real(self, name: str) -> bool:
        return name in REAL_MODULES or any(name == p or name.startswith(p + ".") for p in REAL_PACKAGES)

    def find_spec(self, name, path, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        rel = Path(*name.split("."))
        file, pkg = self.root / rel.with_suffix(".py"), self.root / rel / "__init__.py"
        if self._real(name):
            if file.is_file():
                loader = _TorchUtilsLoader(name, str(file)) if name == "vllm.utils.torch_utils" else None
                return importlib.util.spec_from_file_location(name, file, loader=loader)
            if pkg.is_file() and name in RUN_INIT:
                return importlib.util.spec_from_file_location(name, pkg,
                                                              submodule_search_locations=[str(pkg.parent)])
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        name = spec.name
        if name == "vllm._custom_ops":
            return _ops_module()
        if name == "vllm.platforms":
            return _platforms_module()
        rel = Path(*name.split("."))
        d = self.root / rel
        if (d / "__init__.py").is_file():
            m = _placeholder_module(name, [str(d)])
            m.__getattr__ = _package_attr(name, d)
            if name == "vllm.model_executor.layers.fused_moe":
                for k, v in _override_pair(d / "__init__.py").items():
                    setattr(m, k, v)
            elif name == "vllm":
                m.__version__ = _version(self.root)
            return m
        self.placeholders.add(name)
        m = _placeholder_module(name)
        if name == "vllm.distributed.parallel_state":
            # vLLM's *_once log calls ask whether this process is the first rank: a one-GPU server's is
            m.is_global_first_rank = m.is_local_first_rank = lambda: True
        return m

    def exec_module(self, module):
        return None


def _package_attr(package: str, folder: Path):
    """``__getattr__`` of a hollow package: a submodule that exists in the release (or a stand-in
    module) is imported, as ``from package import submodule`` needs; other names are placeholders."""
    def getattr_(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{package}.{name}"
        if full in ("vllm._custom_ops", "vllm.platforms") or (folder / f"{name}.py").is_file() \
                or (folder / name / "__init__.py").is_file():
            return importlib.import_module(full)
        return _attr(name)
    return getattr_


def _version(root: Path) -> str:
    text = (root / "vllm" / "version.py").read_text() if (root / "vllm" / "version.py").is_file() else ""
    m = _re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    return m.group(1) if m else "unknown"


class _ThirdParty(_sg._StandinFinder):
    def create_module(self, spec):
        if spec.name == "regex":
            return _re
        m = super().create_module(spec)
        m.__getattr__ = _attr
        return m


def _purge() -> None:
    for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[k]


def install(source_root) -> dict:
    """Make vLLM's MoE Triton path importable from ``source_root`` (a folder holding the ``vllm``
    package of a release, e.g. :func:`tests.vllm_releases.source_tree`). Removes any ``vllm``
    module already imported and any earlier finder of this module. Returns
    ``{"release": version, "real": [...], "third_party": [...], "ops": [...]}``."""
    for f in list(sys.meta_path):
        if isinstance(f, (_VllmFinder, _ThirdParty)):
            sys.meta_path.remove(f)
    _purge()
    root = Path(source_root)
    finder = _VllmFinder(root)
    sys.meta_path.insert(0, finder)
    absent = [n for n in THIRD_PARTY if _sg._absent(n)]
    if absent:
        sys.meta_path.append(_ThirdParty(absent))
    torch_ops = _state.get("torch_ops") or _register_torch_ops()
    _state.update(finder=finder, root=root, third_party=absent, torch_ops=torch_ops)
    return {"release": _version(root), "real": list(REAL_MODULES) + [p + ".*" for p in REAL_PACKAGES],
            "third_party": absent, "ops": sorted(OP_STANDINS), "torch_ops": torch_ops}


def uninstall() -> None:
    """Remove the finders and every ``vllm`` module imported through them."""
    for f in list(sys.meta_path):
        if isinstance(f, (_VllmFinder, _ThirdParty)):
            sys.meta_path.remove(f)
    _purge()
    for n in _state.get("third_party", []):
        sys.modules.pop(n, None)
    ops = _state.get("torch_ops")
    _state.clear()
    if ops:
        _state["torch_ops"] = ops  # torch keeps an op once defined


def fused_moe_module(source_root, cpu: bool | None = None):
    """:func:`install`, then import the release's ``fused_moe`` module and, on a machine without a
    GPU (``cpu``; default: no CUDA), replace what the interpreter cannot run: vLLM's Triton fp8
    group quantization (:data:`OP_STANDINS`). Returns the module."""
    import torch

    install(source_root)
    if cpu is None:
        cpu = not torch.cuda.is_available()
    with _release_metadata(Path(source_root)):
        _import_triton_utils(cpu)
    fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
    if cpu:
        utils = importlib.import_module("vllm.model_executor.layers.fused_moe.utils")
        if callable(vars(utils).get("per_token_group_quant_fp8")):
            utils.per_token_group_quant_fp8 = per_token_group_quant_fp8
    return fm


@contextmanager
def _release_metadata(root: Path):
    """While vLLM's Triton check imports, ``importlib.metadata.version("vllm")`` answers the
    release's version: vLLM 0.26.0's ``vllm/triton_utils/importing.py`` asks it (for a ``cpu``
    build suffix) inside the ``try`` that decides ``HAS_TRITON``, so without an installed vLLM
    distribution it disabled Triton ("Triton is installed, but `triton.backends` could not be
    imported"); 0.32.0 and newer ask the platform instead."""
    import importlib.metadata as md

    real = md.version

    def version(name):
        return _version(root) if name == "vllm" else real(name)
    md.version = version
    try:
        yield
    finally:
        md.version = real


def _import_triton_utils(cpu: bool) -> None:
    """Import ``vllm.triton_utils`` (its Triton check runs once, at import)."""
    if cpu:
        # vLLM keeps Triton only with exactly one active GPU driver, except where
        # CUDA_VISIBLE_DEVICES is set and empty (its lenient case for workers starting up): the
        # import runs in that case so the interpreter (TRITON_INTERPRET=1) gets the real Triton
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            importlib.import_module("vllm.triton_utils")
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
    else:
        importlib.import_module("vllm.triton_utils")
