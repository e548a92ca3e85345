"""vLLM's own fused-MoE Triton kernel as a tuner provider (needs torch, triton and vLLM).

What is timed, for a candidate config (vLLM 0.32.0-0.34.0,
``vllm/model_executor/layers/fused_moe/fused_moe.py``):

- ``joint`` (:meth:`VllmProvider.gemm_fn`): vLLM's ``fused_experts_impl`` with the candidate forced
  through vLLM's own ``override_config`` (the package's context manager that
  ``_get_configured_moe_config`` consults first): routing alignment, the up GEMM, the gated
  activation, the down GEMM and the top-k sum, with one config for both GEMMs, as vLLM uses one
  file for both (the search is joint: ``kinds == ("joint",)``);
- whole kernel (:meth:`VllmProvider.full_fn`): the same call reading a candidate file from a
  temporary ``VLLM_TUNED_CONFIG_FOLDER`` (``get_moe_configs``' cache cleared), the way the server
  reads orch's file; ``None`` means no file there (vLLM's shipped file where it has one, else its
  ``get_default_config``).

The launch is the one of a one-GPU server with the functional entry's flags
(``use_fp8_w8a8``, ``use_int8_w8a16``, ``use_int4_w4a16``, ``w1_scale``/``w2_scale``,
``w1_zp``/``w2_zp``, ``block_shape``): no expert map, router weights on the down GEMM. Weight
formats, as vLLM's Triton path holds them (:mod:`remote.tuning.kernel.formats` builds them):

- bf16/fp16; fp8_w8a8 per-tensor and block;
- ``int4_w4a16`` / ``int8_w8a16`` with a group (``MoeWNA16Method``, GPTQ/AWQ through
  ``TritonWNA16Experts``): uint8 weights (two int4 per byte along K), scales ``[E, rows, K //
  group]``, optional uint8 zero points; ``block_shape=[0, group]``, so ``dispatch_fused_moe_kernel``
  launches ``fused_moe_kernel_gptq_awq`` (``invoke_fused_moe_wna16_triton_kernel``), or on CUDA,
  for int4 with a group of 32/64/128 and at most 6 token-expert pairs per expert
  (``should_moe_wna16_use_cuda``), vLLM's compiled ``moe_wna16_gemm``: the whole kernel times
  whichever vLLM picks at that M, with the candidate's tiles;
- ``int8_w8a16`` per channel (``experts_int8``, ``Int8OnlineMoEMethod`` through ``TritonExperts``):
  int8 weights, float32 scales ``[E, rows]``, no block: ``fused_moe_kernel``.

The file's name is vLLM's (``get_config_file_name``: ``,dtype=int4_w4a16``/``,dtype=int8_w8a16``,
no block selector for ``[0, group]``; N the unpacked per-rank size, ``_moe_config_shape``).
``compile_one`` / :meth:`VllmProvider.kernel_specs` compile the two GEMMs' Triton launches
(``invoke_fused_moe_triton_kernel``, or ``invoke_fused_moe_wna16_triton_kernel`` for a group)
ahead of timing, as the SGLang provider does.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import shutil
import tempfile

import torch

from ...protocol import internal_error
from ...tuning.kernel import formats
from ...tuning.providers.builtin import DTYPES
from .lookup import TUNED_FOLDER_ENV, WNA16_ENTRY
from .naming import config_file_name, dtype_selector, vllm_device_name

FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe"
PACKAGE = "vllm.model_executor.layers.fused_moe"


@internal_error("raised while the provider is built; remote.tuning.providers.get_provider turns it into "
                "a PayloadError (not_found for --provider vllm) naming what is missing")
class VllmUnavailable(RuntimeError):
    """vLLM's fused-MoE Triton path cannot be imported on this host (the message says why)."""


class VllmKernel:
    """The host's vLLM fused-MoE module and the functions the provider calls.

    Attributes: ``version``, ``fm`` (the ``fused_moe`` module), ``override_config`` (the package's
    context manager), ``invoke`` (``invoke_fused_moe_triton_kernel`` or, before it existed,
    ``invoke_fused_moe_kernel``). Raises :class:`VllmUnavailable`."""

    def __init__(self):
        try:
            self.fm = importlib.import_module(FUSED_MOE)
            pkg = importlib.import_module(PACKAGE)
        except Exception as exc:  # ImportError, or a broken install raising anything at import
            raise VllmUnavailable(f"cannot import {FUSED_MOE}: {type(exc).__name__}: {exc}") from None
        self.override_config = getattr(pkg, "override_config", None)
        self.invoke = getattr(self.fm, "invoke_fused_moe_triton_kernel", None) or getattr(
            self.fm, "invoke_fused_moe_kernel", None)
        for need in ("fused_experts_impl", "get_moe_configs", "get_default_config", "get_config_file_name"):
            if not callable(getattr(self.fm, need, None)):
                raise VllmUnavailable(f"{FUSED_MOE} has no {need}")
        if self.override_config is None or self.invoke is None:
            raise VllmUnavailable(f"{PACKAGE} lacks override_config or the kernel launcher")
        try:
            self.version = str(importlib.import_module("vllm").__version__)
        except Exception:
            self.version = "unknown"
        self.invoke_params = frozenset(inspect.signature(self.invoke).parameters)

    def clear_config_cache(self) -> None:
        """Drop vLLM's in-process lookup cache (``get_moe_configs`` is an ``lru_cache``)."""
        clear = getattr(self.fm.get_moe_configs, "cache_clear", None)
        if clear:
            clear()


class VllmProblem:
    """Inputs for one batch size M in vLLM's layouts: x [M, hidden]; w1 [E, 2N, hidden]; w2
    [E, hidden, N] (``dtype``, or a quantized format of :mod:`remote.tuning.kernel.formats` with its
    scales and zero points; int4 packs K in half); routing from a softmax top-k of random logits.
    ``N``: the intermediate size per rank (what vLLM's file names carry)."""

    def __init__(self, E, N, hidden, top_k, M, dtype, device, seed, weights=None, quant=None, empty_weights=False):
        from ...tuning.kernel.reference import route

        self.E, self.N, self.hidden, self.top_k, self.M = E, N, hidden, top_k, M
        self.dtype, self.device, self.quant = dtype, torch.device(device), quant
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        if weights is None:
            if quant is None:
                if empty_weights:
                    weights = (torch.empty(E, 2 * N, hidden, device=self.device, dtype=dtype),
                               torch.empty(E, hidden, N, device=self.device, dtype=dtype), None)
                else:
                    w1 = (torch.randn(E, 2 * N, hidden, generator=gen, device=self.device) / math.sqrt(hidden)).to(dtype)
                    w2 = (torch.randn(E, hidden, N, generator=gen, device=self.device) / math.sqrt(N)).to(dtype)
                    weights = (w1, w2, None)
            elif empty_weights:
                w1, s1, z1 = formats.empty(E, 2 * N, hidden, quant, dtype, self.device)
                w2, s2, z2 = formats.empty(E, hidden, N, quant, dtype, self.device)
                weights = (w1, w2, (s1, s2, z1, z2))
            else:
                w1q, s1, z1 = formats.quantize(torch.randn(E, 2 * N, hidden, generator=gen, device=self.device)
                                               / math.sqrt(hidden), quant, dtype)
                w2q, s2, z2 = formats.quantize(torch.randn(E, hidden, N, generator=gen, device=self.device)
                                               / math.sqrt(N), quant, dtype)
                weights = (w1q, w2q, (s1, s2, z1, z2))
        self.w1, self.w2, scales = weights
        scales = tuple(scales) + (None, None) if scales and len(scales) == 2 else scales
        self.w1_scale, self.w2_scale, self.w1_zp, self.w2_zp = scales if scales else (None, None, None, None)
        self.x = torch.randn(M, hidden, generator=gen, device=self.device).to(dtype)
        self.topk_weights, self.topk_ids = route(M, E, top_k, logits=torch.randn(M, E, generator=gen,
                                                                                device=self.device))

    @property
    def weights(self):
        """``(w1, w2, scales)`` for reuse by the next batch size."""
        return self.w1, self.w2, ((self.w1_scale, self.w2_scale, self.w1_zp, self.w2_zp)
                                  if self.w1_scale is not None else None)

    @property
    def dtype_sel(self) -> str | None:
        """vLLM's dtype selector (``_get_config_dtype_str``) for this problem."""
        name = {torch.float32: "float32"}.get(self.dtype, "bfloat16")
        return dtype_selector(self.quant.dtype if self.quant else None, name)

    @property
    def block_shape(self):
        """The block shape vLLM passes: ``[bn, bk]`` for fp8 block, ``[0, group]`` for the weight-only
        formats with a group (``make_wna16_moe_quant_config``), None otherwise."""
        return self.quant.kernel_block_shape if self.quant is not None else None

    @property
    def flags(self) -> dict:
        """``fused_experts_impl``'s format flags (``use_fp8_w8a8``, ``use_int8_w8a16``, ``use_int4_w4a16``;
        the activations are never per-token here: ``per_channel_quant`` False)."""
        q = self.quant
        return dict(use_fp8_w8a8=q is not None and q.dtype == "fp8_w8a8",
                    use_int8_w8a16=q is not None and q.dtype == "int8_w8a16",
                    use_int4_w4a16=q is not None and q.dtype == "int4_w4a16")

    @property
    def wna16_group(self) -> bool:
        """Weight-only int4/int8 with a group: ``dispatch_fused_moe_kernel``'s WNA16 branch."""
        return self.quant is not None and self.quant.weight_only and not self.quant.int8_per_channel


#: the groups for which vLLM runs int4 weight-only MoE with its compiled ``moe_wna16_gemm`` when few
#: tokens reach each expert (``fused_moe.py`` ``should_moe_wna16_use_cuda``, 0.32.0-0.34.0: bit 4, a group of
#: 32/64/128, M x top-k / E <= :data:`WNA16_CUDA_PAIRS_PER_EXPERT`)
WNA16_CUDA_GROUPS = (32, 64, 128)
WNA16_CUDA_PAIRS_PER_EXPERT = 6


def compiled_wna16_refusal(cfg: dict, group: int, k_sizes: tuple[int, ...]) -> str | None:
    """Why vLLM's compiled ``moe_wna16_gemm`` (``csrc/moe/moe_wna16.cu``, its ``TORCH_CHECK``s) refuses the
    file entry ``cfg`` for a weight group of ``group`` and GEMM input sizes ``k_sizes`` (hidden for the up
    projection, N for the down), None when it runs it: BLOCK_SIZE_K a multiple of the group with
    BLOCK_SIZE_K / group in 1, 2, 4, 8, BLOCK_SIZE_M <= 64, every K divisible by BLOCK_SIZE_K."""
    bk, bm = int(cfg["BLOCK_SIZE_K"]), int(cfg["BLOCK_SIZE_M"])
    if bk % group or bk // group not in (1, 2, 4, 8):
        return f"BLOCK_SIZE_K {bk} is not 1, 2, 4 or 8 groups of {group}"
    if bm > 64:
        return f"BLOCK_SIZE_M {bm} > 64"
    bad = [k for k in k_sizes if k % bk]
    return f"K {bad[0]} is not divisible by BLOCK_SIZE_K {bk}" if bad else None


class VllmProvider:
    """vLLM's kernel as the tuner times it (module docstring). Raises :class:`VllmUnavailable`."""

    name = "vllm"
    separable = False
    kinds = ("joint",)
    tma_kinds = frozenset()
    fast_params = {"n_bm": 2, "max_rounds": 2}
    compile_target = "remote.engines.vllm.provider:compile_one"
    compile_per_batch = True

    def __init__(self, kernel: VllmKernel | None = None):
        self.k = kernel or VllmKernel()
        self._root = None
        self._dirs: dict = {}
        self._env_before = os.environ.get(TUNED_FOLDER_ENV)
        self.fallback_reason = None

    def describe(self) -> dict:
        """Report entry: vLLM version and what is timed."""
        return {"version": self.k.version, "kinds": list(self.kinds),
                "timed": {"joint": "vLLM fused_experts_impl with the candidate forced by override_config",
                          "whole": f"fused_experts_impl reading the candidate file from {TUNED_FOLDER_ENV}"}}

    def make_problem(self, shape: dict, M: int, dtype: str, device: str, seed: int, weights=None, quant=None,
                     empty_weights: bool = False) -> VllmProblem:
        """A :class:`VllmProblem` for ``shape`` (E, N per rank, hidden, topk) at batch size M."""
        fmt = formats.from_quant(quant)
        if fmt is not None and (fmt.dtype not in ("fp8_w8a8", "int8_w8a16", "int4_w4a16") or fmt.per_channel
                                and fmt.dtype == "fp8_w8a8"):
            raise VllmUnavailable(f"the vllm provider times bf16/fp16, fp8_w8a8 (per-tensor, block), int8_w8a16 and "
                                  f"int4_w4a16 weights, not {fmt.dtype}{' per-channel' if fmt.per_channel else ''}")
        return VllmProblem(shape["E"], shape["N"], shape["hidden"], shape["topk"], M, DTYPES[dtype], device, seed,
                           weights, fmt, empty_weights)

    def default_config(self, p: VllmProblem) -> dict:
        """vLLM's ``get_default_config`` for this problem (num_warps/num_stages made explicit; K is
        ``w1.shape[2]``, the packed size for int4, as ``try_get_optimal_moe_config`` passes it). For a
        weight-only group vLLM sets only BLOCK_SIZE_M there and its Triton launch adds BLOCK_SIZE_N/K
        (``get_moe_wna16_block_config``): they are added the same way."""
        fm = self.k.fm
        params = inspect.signature(fm.get_default_config).parameters
        args = dict(M=p.M, E=p.E, N=p.N, K=int(p.w1.shape[2]), topk=p.top_k, dtype=p.dtype_sel,
                    block_shape=p.block_shape)
        cfg = dict(fm.get_default_config(**{a: v for a, v in args.items() if a in params}))
        if p.wna16_group and callable(getattr(fm, "get_moe_wna16_block_config", None)):
            cfg.update(fm.get_moe_wna16_block_config(
                config=cfg, use_moe_wna16_cuda=False, num_valid_tokens=p.M * p.top_k, size_k=p.hidden,
                size_n=2 * p.N, num_experts=2 * p.N, group_size=p.block_shape[1], real_top_k=p.top_k,
                block_size_m=cfg["BLOCK_SIZE_M"]))
        cfg.pop("SPLIT_K", None)
        cfg.setdefault("num_warps", 4)
        cfg.setdefault("num_stages", 3)
        return cfg

    def file_name(self, p: VllmProblem, device_name: str) -> str:
        """The file vLLM reads for this problem on ``device_name`` (orch's rule, which the oracle
        tests hold against ``get_config_file_name``)."""
        return config_file_name(p.E, p.N, vllm_device_name(device_name), p.dtype_sel, p.block_shape)

    def _call(self, p: VllmProblem):
        q = p.quant
        kw = {}
        if q is not None:
            kw = dict(p.flags, w1_scale=p.w1_scale, w2_scale=p.w2_scale, block_shape=p.block_shape,
                      per_channel_quant=False)
            if q.weight_only:
                kw.update(w1_zp=p.w1_zp, w2_zp=p.w2_zp)
        fm = self.k.fm
        return lambda: fm.fused_experts_impl(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, **kw)

    def config_allowed(self, p: VllmProblem, cfg: dict) -> bool:
        """Whether ``cfg`` may be written as the entry of ``p.M`` (the search's candidate filter). vLLM
        reads the entry of the closest key for every runtime M, and for int4 with a group of 32/64/128 a
        runtime M with M x top-k <= 6 E runs the compiled ``moe_wna16_gemm``, which refuses entries that
        fail :func:`compiled_wna16_refusal` (the server then raises during inference). So every key that
        can be the closest to such an M is held to those checks: every key up to twice that bound (the
        default batch sizes grow by at most 2x from one to the next, so the first key above the bound is
        within it)."""
        q = p.quant
        if not (p.wna16_group and q.dtype == "int4_w4a16" and int(q.group_size) in WNA16_CUDA_GROUPS):
            return True
        if p.M * p.top_k > 2 * WNA16_CUDA_PAIRS_PER_EXPERT * p.E:
            return True
        return compiled_wna16_refusal(cfg, int(q.group_size), (p.hidden, p.N)) is None

    def file_entry(self, quant) -> dict:
        """Fields every entry of a file for ``quant`` (the tuner spec's entry) must carry for vLLM:
        ``{"SPLIT_K": 1}`` for a weight-only group (``invoke_fused_moe_wna16_triton_kernel`` hands the
        entry to ``fused_moe_kernel_gptq_awq``, which requires ``SPLIT_K``; the other launch sets it
        itself), else ``{}``."""
        fmt = formats.from_quant(quant)
        return dict(WNA16_ENTRY) if fmt is not None and fmt.weight_only and not fmt.int8_per_channel else {}

    def _entry(self, p: VllmProblem, cfg: dict) -> dict:
        """``cfg`` as vLLM would read it from orch's file: ``USE_TMA`` dropped, ints, plus
        :meth:`file_entry`'s fields."""
        out = {k: int(v) for k, v in cfg.items() if k != "USE_TMA"}
        return dict(out, **(dict(WNA16_ENTRY) if p.wna16_group else {}))

    def gemm_fn(self, p: VllmProblem, kind: str, cfg: dict):
        """``joint``: the whole kernel with ``cfg`` forced for both GEMMs. ValueError otherwise."""
        if kind != "joint":
            raise ValueError(f"the vllm provider times joint configs only, got {kind!r}")
        call, ov = self._call(p), self.k.override_config
        forced = self._entry(p, cfg)

        def fn():
            with ov(forced), torch.no_grad():
                return call()
        return fn

    def _folder(self, p: VllmProblem, cfg: dict | None, device_name: str) -> str:
        key = json.dumps([p.E, p.N, p.M, str(p.dtype), str(p.quant), cfg], sort_keys=True, default=str)
        if key not in self._dirs:
            if self._root is None:
                self._root = tempfile.mkdtemp(prefix="orch-vllm-configs-")
            d = os.path.join(self._root, f"c{len(self._dirs)}")
            os.makedirs(d)
            if cfg is not None:
                from .lookup import dumps
                with open(os.path.join(d, self.file_name(p, device_name)), "w") as f:
                    f.write(dumps({str(p.M): self._entry(p, cfg)}))
            self._dirs[key] = d
        return self._dirs[key]

    def dir_fn(self, p: VllmProblem, folder: str):
        """The whole kernel reading whatever ``folder`` holds as ``VLLM_TUNED_CONFIG_FOLDER``."""
        call = self._call(p)

        def fn():
            if os.environ.get(TUNED_FOLDER_ENV) != folder:
                os.environ[TUNED_FOLDER_ENV] = folder
                self.k.clear_config_cache()
            with torch.no_grad():
                return call()
        return fn

    def full_fn(self, p: VllmProblem, up_cfg: dict | None, down_cfg: dict | None = None):
        """The whole kernel reading ``up_cfg`` from a file in a temporary tuned folder (vLLM reads
        one file for both GEMMs: ``down_cfg`` is not used); None: no file there."""
        name = self.k.fm.get_config_file_name.__globals__["get_device_name_as_file_name"]()
        return self.dir_fn(p, self._folder(p, up_cfg, name))

    def check(self, p: VllmProblem, up_cfg: dict | None, down_cfg: dict | None = None) -> float:
        """Relative error of vLLM's fused MoE with ``up_cfg`` against the float64 reference."""
        from ...tuning.kernel.reference import fused_moe_reference, relative_error

        out = self.full_fn(p, up_cfg)()
        if p.quant is not None:
            ref = formats.reference(p.x, p.w1, p.w2, p.quant, p.topk_weights, p.topk_ids,
                                    scales=(p.w1_scale, p.w2_scale), zps=(p.w1_zp, p.w2_zp))
            return relative_error(out, ref)
        return relative_error(out, fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids))

    def close(self) -> None:
        """Restore ``VLLM_TUNED_CONFIG_FOLDER``, drop vLLM's lookup cache and the temporary folders."""
        if self._env_before is None:
            os.environ.pop(TUNED_FOLDER_ENV, None)
        else:
            os.environ[TUNED_FOLDER_ENV] = self._env_before
        self.k.clear_config_cache()
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root, self._dirs = None, {}

    # ------------------------------------------------------------------ compile

    def _launch_kwargs(self, p: VllmProblem, gemm: str, cfg: dict) -> dict:
        """Arguments of vLLM's GEMM launcher for the up or down GEMM of ``p`` with ``cfg``."""
        fm = self.k.fm
        clean = self._entry(p, cfg)
        extra = dict(use_int8_w8a16=p.flags["use_int8_w8a16"], use_int4_w4a16=p.flags["use_int4_w4a16"],
                     block_shape=p.block_shape)
        accepted = inspect.signature(fm._prepare_expert_assignment).parameters
        st, eid, ntpp = fm._prepare_expert_assignment(p.topk_ids, clean, p.M, p.top_k, p.E, None,
                                                      **{k: v for k, v in extra.items() if k in accepted})
        q = p.quant
        a = p.x
        a_scale = None
        if q is not None and q.weight_only:
            return self._wna16_launch_kwargs(p, gemm, clean, st, eid, ntpp)
        if q is not None:
            a, a_scale = fm.moe_kernel_quantize_input(A=p.x, A_scale=None, quant_dtype=torch.float8_e4m3fn,
                                                      per_act_token_quant=False, block_shape=p.block_shape)
        import triton.language as tl
        ct = tl.bfloat16 if p.dtype == torch.bfloat16 else tl.float16
        common = dict(sorted_token_ids=st, expert_ids=eid, num_tokens_post_padded=ntpp, config=clean,
                      compute_type=ct, use_fp8_w8a8=q is not None, use_int8_w8a8=False, use_int8_w8a16=False,
                      use_int4_w4a16=False, per_channel_quant=False, block_shape=p.block_shape)
        if gemm == "up":
            c = torch.empty(p.M, p.top_k, 2 * p.N, device=p.device, dtype=p.dtype)
            return dict(common, A=a, B=p.w1, C=c, A_scale=a_scale, B_scale=p.w1_scale, topk_weights=p.topk_weights,
                        mul_routed_weight=False, top_k=p.top_k)
        act = torch.empty(p.M * p.top_k, p.N, device=p.device, dtype=p.dtype)
        a2_scale = None
        if q is not None:
            act, a2_scale = fm.moe_kernel_quantize_input(A=act, A_scale=None, quant_dtype=torch.float8_e4m3fn,
                                                         per_act_token_quant=False, block_shape=p.block_shape)
        c = torch.empty(p.M, p.top_k, p.hidden, device=p.device, dtype=p.dtype)
        return dict(common, A=act, B=p.w2, C=c, A_scale=a2_scale, B_scale=p.w2_scale, topk_weights=p.topk_weights,
                    mul_routed_weight=True, top_k=1)

    def _wna16_launch_kwargs(self, p: VllmProblem, gemm: str, cfg: dict, st, eid, ntpp) -> dict:
        """Launch arguments of a weight-only GEMM: ``invoke_fused_moe_wna16_triton_kernel``'s for a group
        (``"_launcher": "wna16"``), else ``invoke_fused_moe_triton_kernel``'s with ``use_int8_w8a16``."""
        import triton.language as tl
        ct = tl.bfloat16 if p.dtype == torch.bfloat16 else tl.float16
        up = gemm == "up"
        a = p.x if up else torch.empty(p.M * p.top_k, p.N, device=p.device, dtype=p.dtype)
        c = torch.empty(p.M, p.top_k, 2 * p.N if up else p.hidden, device=p.device, dtype=p.dtype)
        common = dict(A=a, B=p.w1 if up else p.w2, C=c, B_scale=p.w1_scale if up else p.w2_scale,
                      topk_weights=p.topk_weights, sorted_token_ids=st, expert_ids=eid, num_tokens_post_padded=ntpp,
                      mul_routed_weight=not up, top_k=p.top_k if up else 1, config=cfg, compute_type=ct,
                      use_int8_w8a16=p.flags["use_int8_w8a16"], use_int4_w4a16=p.flags["use_int4_w4a16"],
                      block_shape=p.block_shape)
        if p.wna16_group:
            return dict(common, B_zp=p.w1_zp if up else p.w2_zp, _launcher="wna16")
        return dict(common, A_scale=None, use_fp8_w8a8=False, use_int8_w8a8=False, per_channel_quant=False)

    def _invoke(self, kw: dict):
        if kw.get("_launcher") == "wna16":
            kw = {k: v for k, v in kw.items() if k != "_launcher"}
            return self.k.fm.invoke_fused_moe_wna16_triton_kernel(**kw)
        params = self.k.invoke_params
        pos = ["A", "B", "C", "A_scale", "B_scale"]
        args = [kw[n] for n in pos]
        if "B_zp" in params:
            args.append(None)
        args += [kw["topk_weights"], kw["sorted_token_ids"], kw["expert_ids"], kw["num_tokens_post_padded"],
                 kw["mul_routed_weight"], kw["top_k"], kw["config"]]
        named = {k: v for k, v in kw.items() if k not in pos and k not in (
            "topk_weights", "sorted_token_ids", "expert_ids", "num_tokens_post_padded", "mul_routed_weight", "top_k",
            "config") and k in params}
        return self.k.invoke(*args, **named)

    def precompile_args(self, shape, dtype, quant=None):
        """Picklable arguments of :func:`compile_one` (the batch size is added per job)."""
        return dict(shape=dict(shape), dtype=dtype, quant=quant)

    def compile_workers(self, shape: dict, dtype: str, quant, device: str) -> int:
        """Compile processes: one per CPU core but one, at most 8 (each holds the problem's weights)."""
        return max(1, min(8, (os.cpu_count() or 2) - 1))

    def kernel_specs(self, p: VllmProblem, kind: str, cfg: dict) -> list:
        """The compile requests of vLLM's two GEMM launches with ``cfg`` (captured, not run)."""
        from ...tuning.tuner import aot
        fns = aot.jit_functions(self.k.fm)
        out = []
        for gemm in ("up", "down"):
            kw = self._launch_kwargs(p, gemm, cfg)
            out += aot.capture(fns, lambda kw=kw: self._invoke(kw))
        return out


_worker: dict = {}


def compile_one(kind: str, cfg: dict, shape: dict, dtype: str, quant=None, M: int = 1):
    """Compile vLLM's two GEMMs for ``cfg`` at batch size M without launching them (compile
    workers); returns ``(ok, error_text)``, never raises."""
    try:
        if "provider" not in _worker:
            prov = VllmProvider()
            for obj in vars(prov.k.fm).values():
                run = getattr(obj, "run", None)
                if run is not None and type(obj).__name__ == "JITFunction":
                    obj.run = (lambda _run: lambda *a, **kw: _run(*a, **dict(kw, warmup=True)))(run)
            _worker["provider"] = prov
        prov = _worker["provider"]
        key = (M, json.dumps(shape, sort_keys=True), dtype, json.dumps(quant))
        if _worker.get("key") != key:
            _worker["problem"] = prov.make_problem(shape, M, dtype, "cuda", 0, quant=quant, empty_weights=True)
            _worker["key"] = key
        p = _worker["problem"]
        for gemm in ("up", "down"):
            prov._invoke(prov._launch_kwargs(p, gemm, cfg))
        return True, ""
    except Exception as exc:  # a candidate that does not compile is skipped, not fatal
        return False, f"{type(exc).__name__}: {str(exc)[:300]}"


