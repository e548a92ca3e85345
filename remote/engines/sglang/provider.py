"""SGLang's own fused-MoE Triton kernel as a tuner provider, timed per GEMM.

The method is the one of SGLang's separate tuner
(``benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton_sep.py``), written here
independently against whatever SGLang the host has installed:

- ``up``: SGLang's Triton GEMM entry (``invoke_fused_moe_kernel``) for the gate/up projection
  (``x @ w1[e]^T``) with the candidate config; the token-to-block alignment is SGLang's own
  ``moe_align_block_size`` for the config's BLOCK_SIZE_M, computed once per BLOCK_SIZE_M and
  not timed. ``USE_TMA`` in an up config means TMA loads of the weights (``b_use_tma``), where
  the release reads it from up configs (0.5.20+).
- ``down``: SGLang's gated activation exactly as its fused MoE calls it (so the down GEMM
  reads an input that was just written, L2-resident as in the server) followed by the down
  GEMM (``act @ w2[e]^T`` times the routing weight). ``USE_TMA`` in a down config means TMA
  loads of both operands on the sorted, block-padded layout (``a_use_tma``/``b_use_tma``),
  where the release reads it from ``_down`` files (0.5.5+).
- ``joint`` (releases without ``_down`` files: one config serves both GEMMs): up, activation
  and down with the same config.
- whole kernel (:meth:`SglangProvider.full_fn`): SGLang's ``fused_experts`` as the server runs
  it, reading candidate up/``_down`` files from a temporary ``SGLANG_MOE_CONFIG_DIR`` (its
  lookup cache cleared), so a winner is measured exactly as the server will use it.
  ``None`` configs mean "no file": SGLang's default config.

Launch options are the ones of a one-GPU server: no expert filtering (``filter_expert`` is
False when ``num_experts == num_local_experts``), no fused all-reduce, out-of-place output;
programmatic dependent launch, ``swap_ab`` and TMA support are decided by SGLang's own launch
code. Entry points are found by what imports
(:data:`remote.engines.sglang.kernel_roles.SGLANG_KERNEL_ROLES`, :func:`load_kernel`), never by version
strings: SGLang 0.5.16+ (``sglang.kernels.ops.moe`` + ``moe_runner/triton_utils``), 0.5.12
(``moe_runner/triton_utils``), 0.5.2-0.5.10 (``fused_moe_triton/`` split into modules), 0.4.x
(``fused_moe_triton/fused_moe.py``). Releases before 0.5.3 (no ``SGLANG_MOE_CONFIG_DIR``, no
``_down`` file) run the whole kernel with the candidate forced through ``override_config``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import re
import shutil
import tempfile

import torch

from ...protocol import internal_error
from .kernel_roles import SGLANG_KERNEL_ROLES, SGLANG_OPTIONAL_ROLES
from ...tuning.kernel import formats
from ...tuning.providers.builtin import DTYPES

ROLES = SGLANG_KERNEL_ROLES
OPTIONAL_ROLES = SGLANG_OPTIONAL_ROLES

# USE_TMA popped from the down / up config inside SGLang's fused MoE (what the release reads)
_DOWN_TMA_RE = re.compile(r"\bdown_config\.pop\(\s*[\"']USE_TMA[\"']")
_UP_TMA_RE = re.compile(r"(?<![\w.])config\.pop\(\s*[\"']USE_TMA[\"']")

# one-GPU server launch options, set when the release's invoke_fused_moe_kernel takes them
_SERVER_LAUNCH = {"filter_expert": False, "no_combine": False}


@internal_error("raised while the provider is built; remote.tuning.providers.get_provider turns it into "
                "a PayloadError (not_found for --provider sglang, runtime for auto) naming the fix")
class SglangUnavailable(RuntimeError):
    """SGLang's fused-MoE kernel cannot be used on this host (the message says why)."""


def _find(role: str):
    errors = []
    for mod_name, attr in ROLES[role]:
        try:
            mod = importlib.import_module(mod_name)
        except Exception as exc:  # ImportError, or a broken install raising anything at import
            errors.append(f"{mod_name}: {type(exc).__name__}: {exc}")
            continue
        if hasattr(mod, attr):
            return mod, getattr(mod, attr), f"{mod_name}:{attr}"
        errors.append(f"{mod_name} has no {attr}")
    raise SglangUnavailable(f"no SGLang {role} entry ({'; '.join(errors[:4])})")


def _server_args_published(sa) -> bool:
    """Whether this process already holds SGLang server args (0.5.x: ``get_server_args`` of
    the runtime context, or the older ``get_global_server_args``; both raise when unset)."""
    getters = []
    try:
        getters.append(importlib.import_module("sglang.srt.runtime_context").get_server_args)
    except Exception:
        pass
    if getattr(sa, "get_global_server_args", None):
        getters.append(sa.get_global_server_args)
    for get in getters:
        try:
            return get() is not None
        except ValueError:  # "Global server args is not set yet!"
            return False
        except Exception:  # retired accessor (0.5.23's get_global_server_args raises RuntimeError)
            continue
    return True  # a release without process-wide server args: nothing to publish


def publish_default_server_args() -> str | None:
    """Give this (tuner) process SGLang's default server args when it has none, the way
    SGLang's own kernel tests and benchmarks do (``set_global_server_args_for_scheduler(
    ServerArgs(model_path="dummy"))``): SGLang 0.5.x MoE code reads server options
    (deterministic mode, fused all-reduce) from them, all off by default, as in a server
    started without those flags. Returns what was done, or None when nothing was needed."""
    try:
        sa = importlib.import_module("sglang.srt.server_args")
    except Exception:
        return None
    setter, server_args = getattr(sa, "set_global_server_args_for_scheduler", None), getattr(sa, "ServerArgs", None)
    if setter is None or server_args is None or _server_args_published(sa):
        return None
    setter(server_args(model_path="dummy"))
    done = "published SGLang's default ServerArgs(model_path='dummy') for this process"
    try:
        par = importlib.import_module("sglang.srt.runtime_context").get_parallel()
    except Exception:
        return done
    try:
        par.tp_group  # noqa: B018 (a read that raises when no group is written)
    except Exception:
        # a one-GPU server's topology, as SGLang's own unit tests state it
        par.override_permanently(tp_size=1, tp_rank=0, tp_group=None)
        done += "; stated the one-GPU parallel topology (tp_size=1, tp_rank=0, tp_group=None)"
    return done


def _sglang_version() -> str:
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:
        pass
    try:
        return str(importlib.import_module("sglang.version").__version__)
    except Exception:
        return "unknown"


class SglangKernel:
    """The host's SGLang fused-MoE entry points and what they support.

    Attributes: ``version`` (str), ``entry_points`` ({role: "module:attribute"}),
    ``invoke``/``align``/``fused_experts``/``get_moe_configs``/``get_default_config``/
    ``get_config_file_name`` (SGLang's callables), ``fused_module`` (module of
    ``fused_experts``), ``invoke_params`` (parameter names of ``invoke_fused_moe_kernel``),
    ``down_file`` (the release reads ``_down`` files), ``down_tma``/``up_tma`` (it reads
    ``USE_TMA`` from down/up configs), ``tma_device`` (TMA can run here: SGLang's
    ``support_tensor_descriptor()`` and a CUDA device of compute capability 9.0+).
    Raises :class:`SglangUnavailable` when a required entry point does not import.
    """

    def __init__(self):
        importlib.import_module("sglang")
        self.server_args = publish_default_server_args()
        self.entry_points = {}
        found = {}
        for role in ROLES:
            try:
                mod, obj, where = _find(role)
            except SglangUnavailable:
                if role in OPTIONAL_ROLES:
                    found[role] = (None, None)
                    continue
                raise
            found[role] = (mod, obj)
            self.entry_points[role] = where
        self.version = _sglang_version()
        self.kernel_module, self.invoke = found["invoke"]
        self.fused_module, self.fused_experts = found["fused_experts"]
        self.align_module, self.align = found["align"]
        self.config_module, self.get_moe_configs = found["get_moe_configs"]
        self.get_default_config = found["get_default_config"][1]
        self.get_config_file_name = found["get_config_file_name"][1]
        self.topk_output_cls = found["topk_output"][1]
        self.runner_config_cls = found["runner_config"][1]
        self.override_config = found["override_config"][1]
        self.invoke_params = frozenset(inspect.signature(self.invoke).parameters)
        self.fused_params = frozenset(inspect.signature(self.fused_experts).parameters)
        from .lookup import loader_rules
        try:
            rules = loader_rules(inspect.getsource(self.config_module)) or {}
        except (OSError, TypeError):
            rules = {}
        self.loader_rules = rules
        # the loader reads _down files / SGLANG_MOE_CONFIG_DIR (the probe's rule, read from its source)
        named_down = "down_moe" in inspect.signature(self.get_config_file_name).parameters
        self.down_file = bool(rules.get("reads_down", named_down))
        self.config_dir_env = bool(rules.get("config_dir_env", True))
        if not self.config_dir_env and (self.down_file or self.override_config is None):
            raise SglangUnavailable("this SGLang's loader reads neither SGLANG_MOE_CONFIG_DIR nor a forced config "
                                    "for both GEMMs: its whole kernel cannot be run on candidate configs")
        try:
            src = inspect.getsource(self.fused_module)
        except (OSError, TypeError):
            src = ""
        self.down_tma = (self.down_file and {"a_use_tma", "b_use_tma"} <= self.invoke_params
                         and bool(_DOWN_TMA_RE.search(src)))
        self.up_tma = "b_use_tma" in self.invoke_params and bool(_UP_TMA_RE.search(src))
        support = getattr(self.kernel_module, "support_tensor_descriptor", None)
        tma_lib = bool(support()) if callable(support) else False
        cc = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
        self.tma_device = tma_lib and cc >= (9, 0) and os.environ.get("TRITON_INTERPRET") != "1"

    def describe(self) -> dict:
        """What the tune report records: version, entry points, features."""
        return {"version": self.version, "entry_points": dict(self.entry_points), "down_file": self.down_file,
                "config_dir_env": self.config_dir_env,
                "server_args": self.server_args,
                "up_tma": self.up_tma, "down_tma": self.down_tma, "tma_device": self.tma_device,
                "invoke_params": sorted(self.invoke_params)}

    # ------------------------------------------------------------------ SGLang's own rules

    def config_dtype(self, dtype: torch.dtype, quant) -> str | None:
        """SGLang's dtype selector (``get_config_dtype_str``) for the activation dtype and
        ``quant`` (a :class:`remote.tuning.kernel.formats.WeightFormat` or None)."""
        if quant is not None:
            return quant.dtype
        return "float32" if dtype == torch.float32 else None

    def file_names(self, E: int, N: int, dtype_sel, block_shape, per_channel_quant: bool = False) -> dict:
        """``{"up": name, "down": name | None}`` from SGLang's ``get_config_file_name`` (``N``: the
        stored ``w2.shape[2]``, halved for int4; ``block_shape`` as the server passes it, e.g.
        ``[0, 128]`` for int4 groups, which names no block). Raises ValueError for
        ``per_channel_quant`` on a release whose file names have no such selector."""
        bs = list(block_shape) if block_shape else None
        kw = {}
        if per_channel_quant:
            if "per_channel_quant" not in inspect.signature(self.get_config_file_name).parameters:
                raise ValueError(f"SGLang {self.version}'s get_config_file_name has no per_channel_quant selector")
            kw["per_channel_quant"] = True
        up = self.get_config_file_name(E, N, dtype_sel, bs, **kw)
        down = self.get_config_file_name(E, N, dtype_sel, bs, down_moe=True, **kw) if self.down_file else None
        return {"up": up, "down": down}

    def installed_configs(self, E: int, N: int, dtype_sel, block_shape, per_channel_quant: bool = False) -> dict | None:
        """The configs the server would load now (SGLang's ``get_moe_configs`` with the
        server's environment: the installed tree, or ``SGLANG_MOE_CONFIG_DIR``):
        ``{"up": {M: cfg}, "down": {M: cfg} | None}``, or None when SGLang finds no file."""
        bn, bk = (int(block_shape[0]), int(block_shape[1])) if block_shape else (0, 0)
        self.clear_config_cache()
        try:
            up = self._get_configs(E, N, dtype_sel, bn, bk, False, per_channel_quant)
            down = self._get_configs(E, N, dtype_sel, bn, bk, True, per_channel_quant) if self.down_file else None
        finally:
            self.clear_config_cache()
        if not up:
            return None
        return {"up": {str(k): dict(v) for k, v in up.items()},
                "down": ({str(k): dict(v) for k, v in down.items()} if down and down is not up else None)}

    def _get_configs(self, E, N, dtype_sel, bn, bk, down: bool, per_channel_quant: bool = False):
        params = inspect.signature(self.get_moe_configs).parameters
        kw = {}
        if "per_channel_quant" in params:
            kw["per_channel_quant"] = bool(per_channel_quant)
        if down:
            kw["down_moe"] = True
        if "block_n" in params:
            return self.get_moe_configs(E, N, dtype_sel, bn, bk, **kw)
        return self.get_moe_configs(E, N, dtype_sel, **kw)

    def align_shapes(self, topk_ids, block_m: int, num_experts: int):
        """SGLang's ``moe_align_block_size`` output tensors, allocated by SGLang's own Python with
        the sizes the server's launch gets, but not filled: the compiled ops and Triton launches it
        calls (module-level functions of SGLang's alignment module other than the entry itself) do
        nothing meanwhile. For a process without a GPU that only captures compile requests
        (``python -m remote prepare``): a kernel is specialised on these sizes (``EM`` =
        ``sorted_token_ids.shape[0]``), never on their values. Raises what SGLang's code raises
        where a release's alignment is a compiled op through and through."""
        mod = self.align_module
        stubbed = {n: v for n, v in vars(mod).items()
                   if callable(v) and not isinstance(v, type) and v is not self.align
                   and str(getattr(v, "__module__", "") or "").startswith(("sglang", "sgl_kernel"))}
        try:
            for n in stubbed:
                setattr(mod, n, lambda *a, **k: None)
            return self.align(topk_ids, int(block_m), num_experts)
        finally:
            for n, v in stubbed.items():
                setattr(mod, n, v)

    def clear_config_cache(self) -> None:
        """Drop SGLang's in-process config cache (``get_moe_configs`` is an lru_cache)."""
        clear = getattr(self.get_moe_configs, "cache_clear", None)
        if clear:
            clear()

    def default_config(self, M: int, E: int, N: int, K: int, topk: int, dtype_sel, block_shape) -> dict:
        """SGLang's ``get_default_config`` for M with num_warps/num_stages made explicit
        (Triton's launch defaults, 4 and 3, where SGLang leaves them out)."""
        params = inspect.signature(self.get_default_config).parameters
        args = dict(M=M, E=E, N=N, K=K, topk=topk, dtype=dtype_sel, is_marlin=False,
                    block_shape=list(block_shape) if block_shape else None)
        cfg = dict(self.get_default_config(**{k: v for k, v in args.items() if k in params}))
        cfg.setdefault("num_warps", 4)
        cfg.setdefault("num_stages", 3)
        return cfg


_loaded: dict = {}


def load_kernel() -> SglangKernel:
    """Import the host's SGLang fused-MoE entry points (once per process; a failure is
    remembered too). Raises :class:`SglangUnavailable`."""
    if "kernel" not in _loaded:
        try:
            _loaded["kernel"] = SglangKernel()
        except SglangUnavailable as exc:
            _loaded["kernel"] = exc
        except Exception as exc:  # a broken install raising anything at import
            _loaded["kernel"] = SglangUnavailable(f"{type(exc).__name__}: {exc}")
    k = _loaded["kernel"]
    if isinstance(k, SglangUnavailable):
        raise k
    return k


# --------------------------------------------------------------------------- inputs


class SglangProblem:
    """Inputs for one batch size M in SGLang's layouts.

    x [M, hidden] (``dtype``); w1 [E, 2N, hidden], w2 [E, hidden, N] (``dtype``, or fp8 e4m3
    with float32 scales ``w1_scale``/``w2_scale``: [E] per-tensor, [E, rows/bn, cols/bk]
    block); routing ``topk_weights`` float32 [M, top_k] / ``topk_ids`` int32 [M, top_k]
    from a softmax top-k of random logits (``router_logits``); buffers sized for the largest
    BLOCK_SIZE_M with TMA's sorted, block-padded layout: ``cache1`` [rows, 2N] (up output,
    filled with random values so the activation never sees garbage), ``cache2`` [rows, N]
    (down input), ``cache3`` [M, top_k, hidden] (down output). ``weights``: reuse
    ``(w1, w2, (w1_scale, w2_scale) | None)`` of another batch size; ``empty_weights``:
    uninitialised weights (compiling only); ``shape_only``: uninitialised weights and buffers, and
    the alignment's tensors allocated but not computed (:meth:`SglangKernel.align_shapes`), for
    capturing compile requests on the CPU (``python -m remote prepare``). ``routing``: the tune's
    :class:`remote.tuning.tuner.routing.Routing` (or its dict; None: random router logits): with a
    fused shared expert every row also runs expert ``E - 1`` (``top_k`` is then the routed experts
    and ``self.top_k`` the kernel's top-k, as SGLang's ``select_experts`` returns it), a recorded
    routing or a skew replace the random logits; ``routing_info`` says what was timed.
    """

    def __init__(self, kernel: SglangKernel, E: int, N: int, hidden: int, top_k: int, M: int, dtype, device,
                 seed: int, weights=None, quant=None, empty_weights: bool = False, routing=None,
                 shape_only: bool = False):
        from ...tuning.kernel.reference import route

        self.k = kernel
        self.shape_only = shape_only
        empty_weights = empty_weights or shape_only
        self.E, self.N, self.hidden, self.top_k, self.M = E, N, hidden, top_k, M
        self.dtype, self.device = dtype, torch.device(device)
        self.quant = quant
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        fmt = quant
        self.K1 = hidden  # the real K of the up GEMM (the stored one is halved for int4)
        if weights is None:
            if fmt is None:
                if empty_weights:  # compile-only: shapes, strides and dtypes matter, values do not
                    weights = (torch.empty(E, 2 * N, hidden, device=self.device, dtype=dtype),
                               torch.empty(E, hidden, N, device=self.device, dtype=dtype), None)
                else:
                    w1 = torch.randn(E, 2 * N, hidden, generator=gen, device=self.device) / math.sqrt(hidden)
                    w2 = torch.randn(E, hidden, N, generator=gen, device=self.device) / math.sqrt(N)
                    weights = (w1.to(dtype), w2.to(dtype), None)
                    del w1, w2
            elif empty_weights:
                w1, s1, z1 = formats.empty(E, 2 * N, hidden, fmt, dtype, self.device)
                w2, s2, z2 = formats.empty(E, hidden, N, fmt, dtype, self.device)
                weights = (w1, w2, (s1, s2, z1, z2))
            else:
                w1 = torch.randn(E, 2 * N, hidden, generator=gen, device=self.device) / math.sqrt(hidden)
                (w1q, s1, z1) = formats.quantize(w1, fmt, dtype)
                del w1
                w2 = torch.randn(E, hidden, N, generator=gen, device=self.device) / math.sqrt(N)
                (w2q, s2, z2) = formats.quantize(w2, fmt, dtype)
                del w2
                weights = (w1q, w2q, (s1, s2, z1, z2))
        self.w1, self.w2, scales = weights
        self.w1_scale, self.w2_scale, self.w1_zp, self.w2_zp = scales if scales else (None, None, None, None)
        self.x = torch.randn(M, hidden, generator=gen, device=self.device).to(dtype)
        self.router_logits = torch.randn(M, E, generator=gen, device=self.device)
        from ...tuning.tuner.routing import Routing, info_of, make
        rt = routing if isinstance(routing, Routing) else Routing.from_dict(routing)
        if rt.synthetic:
            self.topk_weights, self.topk_ids = route(M, E, top_k, logits=self.router_logits)
            self.routing_info = info_of(rt, self.topk_ids, E)
        else:
            self.topk_weights, self.topk_ids, self.routing_info = make(rt, M, E, top_k, seed, self.device)
            top_k = self.top_k = int(self.topk_ids.shape[1])
        rows = self.rows(256, True)
        if shape_only:
            self.cache1 = torch.empty(rows, 2 * N, device=self.device, dtype=dtype)
            self.cache2 = torch.empty(rows, N, device=self.device, dtype=dtype)
        else:
            self.cache1 = torch.randn(rows, 2 * N, generator=gen, device=self.device).to(dtype)
            self.cache2 = torch.randn(rows, N, generator=gen, device=self.device).to(dtype)
        self.cache3 = torch.zeros(M, top_k, hidden, device=self.device, dtype=dtype)
        self._routing = {}

    @property
    def N_file(self) -> int:
        """The N of SGLang's file names and default config: the stored ``w2.shape[2]``."""
        return int(self.w2.shape[2])

    @property
    def K_file(self) -> int:
        """The K SGLang's default config gets: the stored ``w1.shape[2]``."""
        return int(self.w1.shape[2])

    @property
    def weights(self):
        """``(w1, w2, scales)`` for reuse by the next batch size."""
        return self.w1, self.w2, ((self.w1_scale, self.w2_scale, self.w1_zp, self.w2_zp)
                                  if self.w1_scale is not None else None)

    def rows(self, block_m: int, tma: bool) -> int:
        """Rows of the intermediate buffers SGLang allocates: M * top_k, plus, with the TMA
        down path (sorted, block-padded layout), ``min(M * top_k, E + 1) * (BLOCK_SIZE_M - 1)``
        (SGLang 0.5.x ``fused_experts_impl``)."""
        pairs = self.M * self.top_k
        return pairs + (min(pairs, self.E + 1) * (int(block_m) - 1) if tma else 0)

    def routing(self, block_m: int):
        """SGLang's ``moe_align_block_size`` for ``block_m`` (cached):
        ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``."""
        if block_m not in self._routing:
            align = self.k.align_shapes if self.shape_only else self.k.align
            self._routing[block_m] = align(self.topk_ids, int(block_m), self.E)
        return self._routing[block_m]


def down_tma_computes(fmt) -> bool:
    """Whether SGLang's kernel computes the down GEMM right with ``USE_TMA`` for weight format
    ``fmt`` (a :class:`remote.tuning.kernel.formats.WeightFormat`, None for 16-bit weights). Pure.

    Down TMA (``a_use_tma``) reads the activations in the sorted, block-padded layout. SGLang
    0.5.23 ``fused_moe_kernel`` (srt ``kernels/ops/moe/fused_moe_triton_kernels.py``) asserts
    ``use_fp8_w8a8 and group_n > 0 and group_k > 0`` when ``a_desc`` is set, and only the block
    branch indexes the activation scales by the sorted row (``offs_token_id``); the per-channel
    branch reads them by the unsorted token (``offs_token // top_k``), so a per-channel int8/fp8
    down GEMM with TMA scales each row by another row's scale (GPU builds drop the assert; the
    likely cause of the H200 int8_w8a8 per-channel rejections in docs/benchmarks.md §4.3, rel.
    error 0.34 to 4.6e37, not confirmed on the GPU). True for 16-bit weights (the layout needs no scales) and block
    fp8; False for every other quantized format."""
    if fmt is None:
        return True
    return fmt.dtype == "fp8_w8a8" and bool(fmt.block_shape)


# --------------------------------------------------------------------------- provider


class SglangProvider:
    """SGLang's kernel, timed per GEMM (module docstring).

    ``separable`` is True when the release reads ``_down`` files (up and down configs are
    searched separately under one BLOCK_SIZE_M); otherwise ``kinds == ("joint",)``.
    ``tma_kinds``: the GEMMs whose ``USE_TMA`` the search may set (empty where the release
    or the device cannot use TMA). Raises :class:`SglangUnavailable` at construction when
    SGLang's kernel does not import.
    """

    name = "sglang"
    #: ``fast`` search for this kernel: 2 BLOCK_SIZE_M finalists refined over at most 2 rounds
    #: (SGLang's kernel is specialised on M-dependent integers, so candidates compile per class of
    #: batch size; the shipped config and SGLang's default always reach the final stage anyway)
    fast_params = {"n_bm": 2, "max_rounds": 2}

    def __init__(self, kernel: SglangKernel | None = None):
        self.k = kernel or load_kernel()
        self.separable = self.k.down_file
        self.kinds = ("up", "down") if self.separable else ("joint",)
        tma = set()
        if self.k.tma_device:
            if self.k.up_tma and self.separable:
                tma.add("up")
            if self.k.down_tma:
                tma.add("down")
        self.tma_kinds = frozenset(tma)
        self._dirs: dict = {}
        self._active_dir = None
        self._root = None
        self._env_before = os.environ.get("SGLANG_MOE_CONFIG_DIR")

    def tma_kinds_for(self, p: "SglangProblem") -> frozenset:
        """The GEMMs whose ``USE_TMA`` the search may set for this problem: :attr:`tma_kinds`,
        none for the weight-only formats (SGLang 0.5.23 runs them in ``fused_moe_kernel_gptq_awq``,
        which takes no TMA descriptors), and no down TMA where :func:`down_tma_computes` says the
        kernel would compute it wrong."""
        if p.quant is not None and p.quant.weight_only:
            return frozenset()
        if not down_tma_computes(p.quant):
            return self.tma_kinds - {"down"}
        return self.tma_kinds

    def describe(self) -> dict:
        """Report entry: SGLang version, entry points, features, what is timed."""
        d = self.k.describe()
        d.update(tma_kinds=sorted(self.tma_kinds), kinds=list(self.kinds),
                 timed={"up": "invoke_fused_moe_kernel, gate/up GEMM (alignment precomputed)",
                        "down": "SGLang's gated activation + invoke_fused_moe_kernel, down GEMM",
                        "joint": "up GEMM + activation + down GEMM with one config",
                        "whole": "fused_experts with the candidate files in SGLANG_MOE_CONFIG_DIR"})
        return d

    def host_configs(self, shape: dict, naming: dict, names: dict[str, str], cpu: bool) -> tuple[dict, dict | None]:
        """``(report entry, the configs the server would load now)`` for the tune command: what
        :meth:`describe` says plus the file names this release gives ``shape``/``naming`` (a warning
        is logged when they are not ``names``, orch's; not on CPU), and the installed configs the
        server would load (``get_moe_configs``: the baseline to beat and the tie preference; None
        when it loads none)."""
        from ...protocol import log

        info = self.describe()
        block = naming["block_shape"]
        kblock = [0, naming["group_size"]] if naming.get("group_size") else block  # as the server passes it
        info["file_names"] = self.k.file_names(shape["E"], shape["N"], naming["dtype_selector"], kblock,
                                               bool(naming["per_channel_quant"]))
        if not cpu and info["file_names"]["up"] != names["up"]:
            log(f"SGLang {self.k.version} names the up file {info['file_names']['up']!r}, orch "
                f"{names['up']!r}: the server would not read orch's file", "warning")
        inst = self.k.installed_configs(shape["E"], shape["N"], naming["dtype_selector"], kblock,
                                        bool(naming["per_channel_quant"]))
        shipped = dict(inst, path="SGLang get_moe_configs (installed tree or SGLANG_MOE_CONFIG_DIR)",
                       down_path=None) if inst else None
        return info, shipped

    #: what the report says the whole fused MoE timing is
    whole_timed = ("whole fused MoE = SGLang's fused_experts reading the candidate files (alignment, up GEMM, "
                   "activation, down GEMM, top-k sum)")

    # ------------------------------------------------------------------ problems

    def make_problem(self, shape: dict, M: int, dtype: str, device: str, seed: int, weights=None,
                     quant=None, empty_weights: bool = False, routing=None, shape_only: bool = False) -> SglangProblem:
        """A :class:`SglangProblem` for ``shape`` (E, N, hidden, topk; N as the file names it, i.e.
        the stored ``w2.shape[2]``, half the intermediate size for int4) and batch size M; ``quant``
        as the tuner spec's entry (:func:`remote.tuning.kernel.formats.from_quant`); ``routing`` the
        spec's routing entry (:class:`remote.tuning.tuner.routing.Routing`, None: random logits);
        ``shape_only``: see :class:`SglangProblem`."""
        fmt = formats.from_quant(quant)
        N = shape["N"] * 2 if fmt is not None and fmt.packed else shape["N"]
        return SglangProblem(self.k, shape["E"], N, shape["hidden"], shape["topk"], M, DTYPES[dtype],
                             device, seed, weights, fmt, empty_weights=empty_weights, routing=routing,
                             shape_only=shape_only)

    def floor_inputs(self, p: SglangProblem):
        """What the floor of :mod:`remote.tuning.tuner.floor` needs of problem ``p``
        (:class:`~remote.tuning.tuner.floor.GemmShape`): weight bits and scale bytes per weight of the
        format, activation bytes the GEMMs read (1 for w8a8, whose activations SGLang quantizes), and
        the MMA class (fp8/int8 for w8a8; bf16 for 16-bit weights and the weight-only formats, which
        SGLang's ``fused_moe_kernel_gptq_awq`` dequantizes to the activation dtype)."""
        from ...tuning.tuner.floor import GemmShape
        from ...tuning.tuner.routing import expert_counts
        q = p.quant
        w_bits, a_bytes, mma, scale = 8 * p.dtype.itemsize, p.dtype.itemsize, "bf16", 0.0
        if q is not None:
            if q.weight_only:
                w_bits = 4 if q.packed else 8
                scale = (p.dtype.itemsize + (0.5 if q.has_zp else 0.0)) / max(1, int(q.group_size))
            else:
                w_bits, a_bytes, mma = 8, 1, ("fp8" if q.dtype == "fp8_w8a8" else "int8")
        return GemmShape(E=p.E, N=p.N, hidden=p.hidden, M=p.M, counts=tuple(expert_counts(p.topk_ids, p.E)),
                         w_bits=w_bits, a_bytes=a_bytes, mma=mma, scale_bytes=scale)

    def default_config(self, p: SglangProblem) -> dict:
        """SGLang's default config for this problem (``get_default_config``)."""
        q = p.quant
        # SGLang passes N = w2.shape[2] and K = w1.shape[2]: the stored (packed, for int4) sizes
        return self.k.default_config(p.M, p.E, p.N_file, p.K_file, p.top_k, self.k.config_dtype(p.dtype, q),
                                     q.kernel_block_shape if q else None)

    # ------------------------------------------------------------------ per GEMM

    def _compute_type(self, p):
        import triton.language as tl
        return tl.bfloat16 if p.dtype == torch.bfloat16 else tl.float16

    def _launch_kwargs(self, p: SglangProblem, kind: str, cfg: dict) -> dict:
        tma = bool(cfg.get("USE_TMA", False))
        clean = {k: int(v) for k, v in cfg.items() if k != "USE_TMA"}
        bm = clean["BLOCK_SIZE_M"]
        st, eid, ntpp = p.routing(bm)
        q = p.quant
        kw = dict(topk_weights=p.topk_weights, topk_ids=p.topk_ids, sorted_token_ids=st, expert_ids=eid,
                  num_tokens_post_padded=ntpp, config=clean, compute_type=self._compute_type(p),
                  block_shape=q.kernel_block_shape if q else None)
        kw.update(q.flags() if q else dict(use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                                           use_int4_w4a16=False, per_channel_quant=False))
        if kind == "up":
            # [M, top_k, 2N] as SGLang 0.4.x indexes C (C.stride(1), C.stride(2)); 0.5.x reads the last two strides
            c1 = p.cache1[: p.rows(bm, False)].view(p.M, p.top_k, 2 * p.N)
            kw.update(A=p.x, B=p.w1, C=c1, A_scale=None, B_scale=p.w1_scale, B_zp=p.w1_zp, mul_routed_weight=False,
                      top_k=p.top_k)
            flags = {"b_use_tma": True} if tma else {}
            if "c_sorted" in self.k.invoke_params:
                kw["c_sorted"] = False
        else:
            kw.update(A=p.cache2[: p.rows(bm, tma)], B=p.w2, C=p.cache3, A_scale=None, B_scale=p.w2_scale,
                      B_zp=p.w2_zp, mul_routed_weight=True, top_k=1)
            if "router_topk" in self.k.invoke_params:
                # SGLang 0.5.11-0.5.23 fused_moe.py passes router_topk=topk to the down GEMM (the
                # kernel's ROUTER_TOPK constexpr, read only on fused-output paths): the same kernel,
                # so the server's launch finds the tuner's binary instead of compiling another
                kw["router_topk"] = p.top_k
            flags = {"a_use_tma": True, "b_use_tma": True} if tma else {}
        for f in flags:
            if f not in self.k.invoke_params:
                raise ValueError(f"USE_TMA: this SGLang's invoke_fused_moe_kernel has no {f}")
        kw.update(flags)
        if "bias" in self.k.invoke_params:
            kw["bias"] = None
        for f, v in _SERVER_LAUNCH.items():
            if f in self.k.invoke_params:
                kw[f] = v
        return kw

    def _activation(self, p: SglangProblem, bm: int, tma: bool):
        """SGLang's gated activation as its fused MoE calls it for this layout, or None when
        this platform's SGLang binds none (then ``down`` times the GEMM alone)."""
        fm = self.k.fused_module
        act = getattr(fm, "silu_and_mul", None)
        if act is None:
            return None
        rows = p.rows(bm, tma)
        src, dst = p.cache1[:rows], p.cache2[:rows]
        kw = {}
        row_filter = getattr(fm, "_activation_row_filter", None)
        if row_filter is not None:
            st, eid, ntpp = p.routing(bm)
            kw = row_filter(down_moe_use_tma=tma, filter_expert=False, topk_ids=p.topk_ids, expert_ids=eid,
                            sorted_token_ids=st, num_tokens_post_padded=ntpp, block_size_m=bm)
        return lambda: act(src, dst, **kw)

    def gemm_fn(self, p: SglangProblem, kind: str, cfg: dict):
        """A zero-argument callable: ``up``, ``down`` (activation + down GEMM) or ``joint``
        (up, activation, down with one config) with ``cfg`` (SGLang fields, optional
        ``USE_TMA``). Raises ValueError for a ``USE_TMA`` the release cannot take."""
        invoke = self.k.invoke
        bm = int(cfg["BLOCK_SIZE_M"])
        tma = bool(cfg.get("USE_TMA", False))
        if kind == "up":
            kw = self._launch_kwargs(p, "up", cfg)
            return lambda: invoke(**kw)
        if kind == "down":
            kw = self._launch_kwargs(p, "down", cfg)
            act = self._activation(p, bm, tma)
            if act is None:
                return lambda: invoke(**kw)

            def down():
                act()
                invoke(**kw)
            return down
        if kind == "joint":
            if tma:
                raise ValueError("USE_TMA: a joint config (no _down file) cannot use TMA")
            up_kw, down_kw = self._launch_kwargs(p, "up", cfg), self._launch_kwargs(p, "down", cfg)
            act = self._activation(p, bm, False)

            def joint():
                invoke(**up_kw)
                if act is not None:
                    act()
                invoke(**down_kw)
            return joint
        raise ValueError(f"kind must be up, down or joint, got {kind!r}")

    # ------------------------------------------------------------------ whole kernel

    def _dir_for(self, p: SglangProblem, up_cfg: dict | None, down_cfg: dict | None) -> str:
        """A config folder holding the candidate files (one key, M) under
        ``configs/triton_X_Y_Z/`` with SGLang's own file names; an empty one for ``None``."""
        import triton

        from ..triton_moe.configfile import dumps_config
        from .naming import triton_folder

        key = json.dumps([p.E, p.N, p.M, str(p.dtype), str(p.quant), up_cfg, down_cfg], sort_keys=True, default=str)
        if key in self._dirs:
            return self._dirs[key]
        if self._root is None:
            self._root = tempfile.mkdtemp(prefix="orch-sglang-configs-")
        d = os.path.join(self._root, f"c{len(self._dirs)}")
        folder = os.path.join(d, "configs", triton_folder(triton.__version__))
        os.makedirs(folder)
        if up_cfg is not None:
            q = p.quant
            names = self.k.file_names(p.E, p.N_file, self.k.config_dtype(p.dtype, q),
                                      q.kernel_block_shape if q else None, bool(q and q.per_channel))
            with open(os.path.join(folder, names["up"]), "w") as f:
                f.write(dumps_config({str(p.M): up_cfg}))
            if names["down"] and down_cfg is not None:
                with open(os.path.join(folder, names["down"]), "w") as f:
                    f.write(dumps_config({str(p.M): down_cfg}))
        self._dirs[key] = d
        return d

    def _use_dir(self, d: str) -> None:
        if self._active_dir != d or os.environ.get("SGLANG_MOE_CONFIG_DIR") != d:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = d
            self.k.clear_config_cache()
            self._active_dir = d

    def _fused_call(self, p: SglangProblem):
        k = self.k
        q = p.quant
        kw = {}
        if q is not None:
            # the flags, scales and zero points the quantization method's TritonMoeQuantInfo passes
            kw = dict(q.flags(), w1_scale=p.w1_scale, w2_scale=p.w2_scale, block_shape=q.kernel_block_shape)
            if q.weight_only:
                kw.update(w1_zp=p.w1_zp, w2_zp=p.w2_zp)
            missing = [f for f, v in kw.items() if v is not None and v is not False and f not in k.fused_params]
            if missing:
                raise SglangUnavailable(f"SGLang {k.version}'s fused_experts takes no {', '.join(missing)}: it does not "
                                        f"run {q.dtype} weights this way")
            kw = {f: v for f, v in kw.items() if f in k.fused_params}  # unset flags an older release lacks
        if "topk_output" in k.fused_params:
            topk = (k.topk_output_cls(p.topk_weights, p.topk_ids, p.router_logits) if k.topk_output_cls
                    else (p.topk_weights, p.topk_ids, p.router_logits))
            if "moe_runner_config" in k.fused_params:
                fields = set(inspect.signature(k.runner_config_cls).parameters)
                rc = dict(num_experts=p.E, num_local_experts=p.E, hidden_size=p.hidden,
                          intermediate_size_per_partition=p.N, top_k=p.top_k, params_dtype=p.dtype,
                          activation="silu", is_gated=True, inplace=False)
                cfg = k.runner_config_cls(**{a: v for a, v in rc.items() if a in fields})
                return lambda: k.fused_experts(p.x, p.w1, p.w2, topk, moe_runner_config=cfg, **kw)
            return lambda: k.fused_experts(p.x, p.w1, p.w2, topk, inplace=False, **kw)
        return lambda: k.fused_experts(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, inplace=False, **kw)

    def full_fn(self, p: SglangProblem, up_cfg: dict | None, down_cfg: dict | None):
        """A callable running SGLang's ``fused_experts`` for this problem with ``up_cfg`` in
        the up file and ``down_cfg`` in the ``_down`` file (releases with ``_down`` files;
        otherwise ``up_cfg`` serves both GEMMs); ``None`` = no file (SGLang's default). A
        release older than 0.5.3 (no SGLANG_MOE_CONFIG_DIR) gets the config forced with its
        ``override_config`` instead, which is what such a release does with a one-config file."""
        if not self.k.config_dir_env:
            # before SGLang 0.5.3: no SGLANG_MOE_CONFIG_DIR and no _down file; its override_config
            # forces one config for both GEMMs, as a file with that single config would
            cfg = dict(up_cfg if up_cfg is not None else self.default_config(p))
            call = self._fused_call(p)

            def forced():
                with self.k.override_config(cfg), torch.no_grad():
                    return call()
            return forced
        return self.dir_fn(p, self._dir_for(p, up_cfg, down_cfg))

    def dir_fn(self, p: SglangProblem, config_dir: str):
        """A callable running SGLang's ``fused_experts`` for this problem with
        ``SGLANG_MOE_CONFIG_DIR=config_dir`` (a folder holding ``configs/triton_X_Y_Z/``; its
        lookup cache cleared when the folder changes): whatever files it holds are read
        exactly as the server reads them (closest batch-size key, ``_down`` file, USE_TMA).
        Raises SglangUnavailable for a release whose loader ignores SGLANG_MOE_CONFIG_DIR."""
        if not self.k.config_dir_env:
            raise SglangUnavailable(f"SGLang {self.k.version} does not read SGLANG_MOE_CONFIG_DIR")
        call = self._fused_call(p)

        def fn():
            self._use_dir(config_dir)
            with torch.no_grad():  # as in the server (and SGLang's custom op skips its dispatcher then)
                return call()
        return fn

    def close(self) -> None:
        """Restore ``SGLANG_MOE_CONFIG_DIR``, drop SGLang's config cache and the temporary folders."""
        if self._env_before is None:
            os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
        else:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = self._env_before
        self.k.clear_config_cache()
        self._active_dir = None
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
            self._dirs = {}

    # ------------------------------------------------------------------ checks

    def check(self, p: SglangProblem, up_cfg: dict | None, down_cfg: dict | None) -> float:
        """Relative error of SGLang's fused MoE with these configs against the float64
        reference (quantized formats: on the same quantized weights, scales and zero points,
        activations quantized as SGLang's launch does; :func:`remote.tuning.kernel.formats.reference`)."""
        from ...tuning.kernel.reference import fused_moe_reference, relative_error

        out = self.full_fn(p, up_cfg, down_cfg)()
        if p.quant is not None:
            ref = formats.reference(p.x, p.w1, p.w2, p.quant, p.topk_weights, p.topk_ids,
                                    scales=(p.w1_scale, p.w2_scale), zps=(p.w1_zp, p.w2_zp))
            return relative_error(out, ref)
        return relative_error(out, fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids))

    # ------------------------------------------------------------------ compile

    def precompile_args(self, shape, dtype, quant=None, routing=None):
        """Picklable arguments of :func:`compile_one` (the batch size is added per job). ``routing``:
        the spec's routing entry; the workers get its fused shared experts only (the kernel is
        specialised on the top-k and the buffer sizes, which the routing's values do not change)."""
        shared = int((routing or {}).get("shared") or 0)
        return dict(shape=dict(shape), dtype=dtype, quant=quant, **({"routing": {"shared": shared}} if shared else {}))

    def compile_workers(self, shape: dict, dtype: str, quant, device: str) -> int:
        """How many compile processes fit: each holds the problem's weights and buffers on the
        GPU (uninitialised) besides its CUDA context; a worker is counted at four times its
        buffers, at least 10 GiB (measured on the H200: 7-10 GiB each; 16 workers left the timing
        process out of memory), within half the free memory, and at most 16 processes or CPU
        cores - 1."""
        cpus = max(1, (os.cpu_count() or 2) - 1)
        if not device.startswith("cuda"):
            return cpus
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        wbytes = 1 if quant is not None else DTYPES[dtype].itemsize
        E, N, H, k = shape["E"], shape["N"], shape["hidden"], shape["topk"]
        rows = 4096 * k + min(4096 * k, E + 1) * 255
        need = 3 * E * N * H * wbytes + rows * 3 * N * 2 + 4096 * k * H * 2 + (600 << 20)
        # measured on the H200 (E=128, N=768, hidden 2048): a worker held 7-10 GiB, about four times
        # this estimate (SGLang's import and Triton's launch machinery besides the buffers)
        need = max(4 * need, 10 << 30)
        return max(1, min(cpus, 16, int(free / 2 // need)))

    def kernel_specs(self, p: SglangProblem, kind: str, cfg: dict) -> list:
        """The compile requests SGLang's launch code makes for GEMM ``kind`` (``up``, ``down``, or
        both for ``joint``) with ``cfg`` on problem ``p``, captured without compiling or launching
        (:func:`remote.tuning.tuner.aot.capture`: SGLang 0.5.23 ``invoke_fused_moe_kernel`` binds and
        specialises the real tensors, TMA descriptors and launch options, and Triton's launch path
        hands them to ``compile``); ``[]`` for a kernel already loaded in this process. Raises
        :class:`remote.tuning.tuner.aot.CaptureError` when the launch path cannot be captured, and
        whatever SGLang's launch code raises for a config it rejects. ``up_sorted``: the up GEMM as
        the server launches it when the down GEMM uses TMA (:meth:`server_variants`)."""
        from ...tuning.tuner import aot
        fns = aot.jit_functions(self.k.kernel_module)
        out = []
        for gemm in (("up", "down") if kind == "joint" else (kind,)):
            kw = self._launch_kwargs(p, "up" if gemm == "up_sorted" else gemm, cfg)  # routing computed here
            if gemm == "up_sorted":
                kw["c_sorted"] = True
            out += aot.capture(fns, lambda kw=kw: self.k.invoke(**kw))
        return out

    def server_variants(self, p: SglangProblem, kind: str) -> tuple[str, ...]:
        """Other launches the server makes of GEMM ``kind`` with the same config, as kinds of
        :meth:`kernel_specs`: SGLang 0.5.23 ``fused_moe.py`` launches the up GEMM with
        ``c_sorted=down_moe_use_tma`` (its output in the sorted, block-padded layout the TMA down GEMM
        reads), another kernel than the up GEMM timed alone; ``("up_sorted",)`` for ``up`` where the
        down GEMM may use TMA here, else ``()``. The prepare step compiles these too, so the
        whole-kernel stage after the stop finds them (``python -m remote prepare``)."""
        if kind == "up" and "down" in self.tma_kinds_for(p) and "c_sorted" in self.k.invoke_params:
            return ("up_sorted",)
        return ()

    compile_target = "remote.engines.sglang.provider:compile_one"
    #: SGLang's kernel is specialised on M-dependent integers: candidates compile per batch size
    compile_per_batch = True


_worker_state: dict = {}


def compile_one(kind: str, cfg: dict, shape: dict, dtype: str, quant=None, M: int = 1, routing=None):
    """Compile SGLang's GEMM for (kind, cfg) at batch size M without launching it (worker
    processes of :class:`remote.tuning.tuner.compile.Compiler`). SGLang's own launch code runs with
    its kernels switched to Triton's compile-only mode (``JITFunction.run(warmup=True)``) on
    inputs of the same shapes, strides and dtypes (weights left uninitialised), so the binary
    lands in Triton's on-disk cache for the
    timing process. Returns ``(ok, error_text)``; never raises."""
    try:
        st = _worker_state
        if "provider" not in st:
            prov = SglangProvider()
            for mod in {prov.k.kernel_module}:
                for obj in vars(mod).values():
                    run = getattr(obj, "run", None)
                    if run is not None and type(obj).__name__ == "JITFunction":
                        obj.run = (lambda _run: lambda *a, **kw: _run(*a, **dict(kw, warmup=True)))(run)
            st["provider"] = prov
        prov = st["provider"]
        key = (M, json.dumps(shape, sort_keys=True), dtype, json.dumps(quant), json.dumps(routing))
        if st.get("key") != key:
            st.pop("problem", None)
            # the real shapes (uninitialised weights): every integer the kernel is specialised on
            # (strides, descriptor shapes, alignment sizes) matches the timing process's launch
            st["problem"] = prov.make_problem(shape, M, dtype, "cuda", 0, quant=quant, empty_weights=True,
                                              routing=routing)
            st["key"] = key
        p = st["problem"]
        if kind == "down":  # compile the GEMM only (the activation kernel does not depend on cfg)
            kw = prov._launch_kwargs(p, "down", cfg)
            prov.k.invoke(**kw)
        else:
            prov.gemm_fn(p, kind, cfg)()
        return True, ""
    except Exception as exc:  # a candidate that does not compile is skipped, not fatal
        return False, f"{type(exc).__name__}: {str(exc)[:300]}"
