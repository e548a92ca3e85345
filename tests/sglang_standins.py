"""Stand-ins for the pieces of SGLang's import chain that are absent here and on the H200.

For tests and ``bench/`` only: the payload (``remote/``) never imports this module; on a host
where SGLang is installed with its dependencies, the provider runs SGLang as it is.

SGLang's fused-MoE modules import, at module level, packages that serve its HTTP server and
its compiled ops. None of them is part of the Triton GEMM, its alignment or its launch code,
which always run for real (under ``TRITON_INTERPRET=1`` on the CPU). What stands in, and for
what (:data:`MODULE_STANDINS`, :data:`OP_STANDINS`, :func:`install`):

- packages, only when ``importlib`` cannot find them: an empty module whose attributes are
  inert placeholders (see :data:`MODULE_STANDINS`), except ``msgspec`` whose ``Struct`` is a
  dataclass stand-in (SGLang's runtime context and platform structs subclass it);
- ``logging.Logger.warning_once`` / ``info_once`` (transformers adds them to ``Logger``;
  SGLang's MoE code calls them), only when missing;
- compiled ops (:data:`OP_STANDINS`), only where SGLang would call a compiled op that is
  absent: ``sgl_kernel.moe_align_block_size`` (the CUDA alignment SGLang uses for
  ``M * top_k > 64``; SGLang's own Triton alignment serves the smaller ones and stays real),
  the gated SiLU activation, ``moe_sum_reduce``. They cost the same for every config, so they
  shift absolute times but not the ranking of configs.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from pathlib import Path

# package -> what it is for in SGLang (why a placeholder is harmless for the MoE kernel)
MODULE_STANDINS = {
    "orjson": "fast JSON for HTTP responses (sglang.srt.utils.common imports it)",
    "pybase64": "base64 of multimodal inputs (sglang.srt.utils.common)",
    "psutil": "process/memory queries of the server (sglang.srt.utils.common)",
    "requests": "HTTP client of the server utilities (sglang.srt.utils.common)",
    "starlette": "HTTP server framework (sglang.srt.utils.common)",
    "pydantic_core": "request schema validation (server protocol)",
    "zmq": "inter-process messaging of the server's scheduler",
    "tvm_ffi": "loader of SGLang's JIT CUDA kernels (only type hints on the MoE path)",
    "msgspec": "server/runtime structs and msgpack; Struct stands in as a dataclass",
    "dill": "pickling of server objects (dumps/loads stand in as pickle's)",
    "IPython": "notebook display helpers",
    "setproctitle": "process titles of server workers",
    "tqdm": "progress bars (sglang.lang)",
    "pydantic": "request schemas of the server",
    "aiohttp": "HTTP client of the server",
    "torchvision": "image transforms of multimodal models (sglang.srt.configs)",
    "huggingface_hub": "model download (sglang.srt.configs)",
    "sentencepiece": "tokenizers (sglang.srt.configs)",
    "safetensors": "checkpoint loading",
    "einops": "tensor reshapes in model code",
    "compressed_tensors": "quantization configs of checkpoints (sglang.srt.layers.quantization)",
    "regex": "tokenizer/grammar helpers",
    "gguf": "GGUF checkpoints (sglang.srt.layers.quantization.gguf)",
    "openai": "OpenAI API types of the server (0.5.8)",
    "partial_json_parser": "tool-call parsing of the server (0.5.8)",
    "fastapi": "HTTP server (0.4.x)",
    "vllm": "vLLM's custom ops, imported by SGLang on non-CUDA platforms (CPU tests): _custom_ops gets the "
            "activation and moe_sum stand-ins of OP_STANDINS",
    "transformers": "model configs (sglang.srt.configs imports it on the MoE kernel's import chain); served "
                    "only after `import sglang`, so SGLang's own transformers patches see it absent and skip",
    "sgl_kernel": "SGLang's compiled CUDA ops; the MoE path needs moe_align_block_size, "
                  "silu_and_mul and moe_sum_reduce (see OP_STANDINS)",
}

OP_STANDINS = {
    "moe_align_block_size": "sgl_kernel's CUDA alignment (used for M * top_k > 64); torch version "
                            "of the same contract (+1 bucket offset, pads hold numel)",
    "silu_and_mul": "SGLang's JIT/sgl_kernel gated SiLU; a Triton kernel honouring the same row filter",
    "gelu_and_mul": "as silu_and_mul, GELU",
    "moe_sum_reduce": "sgl_kernel's top-k sum; torch.sum over the top-k axis times the scaling factor",
    "sglang_per_token_group_quant_fp8": "SGLang's JIT per-token-group fp8 quantization of the activations "
                                        "(fp8 block configs); on a GPU one Triton kernel shared with "
                                        "per_token_group_quant (same scales: amax / 448, eps 1e-10), torch on "
                                        "the CPU",
    "per_token_group_quant": "SGLang's JIT group quantization of the sorted TMA down input (fp8 block) and of "
                             "int8 block activations (out_dtype int8); skips the padding rows the real kernel "
                             "skips (whole warps of them) and leaves them unwritten; the same Triton kernel on "
                             "a GPU, torch on the CPU (see group_quant_keep)",
    "sgl_per_token_quant_fp8": "SGLang's JIT per-token fp8 quantization (per-channel fp8 weights); torch, "
                               "amax / 448 per row",
    "sgl_per_tensor_quant_fp8": "SGLang's JIT per-tensor fp8 quantization (per-tensor fp8 weights); torch, "
                                "amax / 448, or the given static scale",
    "per_token_group_quant_int8": "CPU only: SGLang's non-CUDA Triton int8 group quantization truncates; the "
                                  "CUDA branch a GPU server runs rounds; torch, amax / 127, rounded",
    "per_token_quant_int8": "CPU only: SGLang's Triton per-token int8 quantization calls CUDA libdevice round, "
                            "which the interpreter lacks; torch, amax / 127, round half away from zero",
}

_installed: dict = {}
_LATE = {"transformers"}


class _Placeholder:
    """Inert stand-in value: callable, subscriptable, usable as a base class or decorator."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return _Placeholder()


    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __getitem__(self, item):
        return _Placeholder()

    def __setitem__(self, item, value):
        pass

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)


class _MissingOp:
    """A compiled op of a stand-in package that has no stand-in: raises when called, so no
    result is ever silently wrong."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *a, **k):
        raise NotImplementedError(f"{self.name}: compiled op absent here and not stood in (tests/sglang_standins.py)")

    def __getattr__(self, attr):  # namespaces of ops (sgl_kernel.scalar_types.uint4b8, ...)
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _MissingOp(f"{self.name}.{attr}")


class _PlaceholderMeta(type):
    """Metaclass of placeholder classes: any public or private (not dunder) class attribute
    is a placeholder too; subscripting the class gives a placeholder (generic aliases)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __getitem__(cls, item):
        return cls


def _placeholder_attr(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    if name[:1].isupper():  # classes, exception types, enums
        if name.endswith(("Error", "Exception")):
            return type(name, (Exception,), {})
        return _PlaceholderMeta(name, (), {"__init__": lambda self, *a, **k: None,
                                           "__init_subclass__": classmethod(lambda cls, **kw: None),
                                           "__getattr__": lambda self, n: _Placeholder()})
    return _Placeholder()


# ----------------------------------------------------------------------------- msgspec

class _NoDefault:
    def __repr__(self):
        return "NODEFAULT"


NODEFAULT = _NoDefault()


def _ms_field(*, default=NODEFAULT, default_factory=NODEFAULT, name=None):
    if default_factory is not NODEFAULT:
        return dataclasses.field(default_factory=default_factory)
    if default is not NODEFAULT:
        if isinstance(default, (list, dict, set)):
            return dataclasses.field(default_factory=lambda d=default: type(d)(d))
        return dataclasses.field(default=default)
    return dataclasses.field()


class _Struct:
    """msgspec.Struct stand-in: every subclass becomes a (mutable) dataclass."""

    def __init_subclass__(cls, **options):
        super().__init_subclass__()
        frozen = bool(options.get("frozen")) or any(getattr(getattr(b, "__struct_config__", None), "frozen", False)
                                                    for b in cls.__mro__[1:])
        anns = cls.__dict__.get("__annotations__", {})
        for k in list(anns):  # mutable defaults need factories in dataclasses
            v = cls.__dict__.get(k, NODEFAULT)
            if isinstance(v, (list, dict, set)):
                setattr(cls, k, dataclasses.field(default_factory=lambda d=v: type(d)(d)))
        try:
            dataclasses.dataclass(cls, kw_only=bool(options.get("kw_only")), eq=True, unsafe_hash=frozen)
        except TypeError:  # a field without default after one with: msgspec allows it
            dataclasses.dataclass(cls, kw_only=True, eq=True, unsafe_hash=frozen)
        cls.__struct_fields__ = tuple(f.name for f in dataclasses.fields(cls))
        cls.__struct_config__ = types.SimpleNamespace(**options)


def _ms_replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


def _ms_fields(obj_or_cls):
    def nd(v):
        return NODEFAULT if v is dataclasses.MISSING else v
    return tuple(types.SimpleNamespace(name=f.name, encode_name=f.name, type=f.type, required=(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING),
        default=nd(f.default), default_factory=nd(f.default_factory))
        for f in dataclasses.fields(obj_or_cls))


def _ms_defstruct(name, fields, *, bases=None, module=None, namespace=None, **options):
    """msgspec.defstruct stand-in: fields are names, (name, type) or (name, type, default)."""
    ns = dict(namespace or {})
    anns = {}
    for f in fields:
        if isinstance(f, str):
            anns[f] = object
        else:
            anns[f[0]] = f[1]
            if len(f) > 2:
                ns[f[0]] = f[2]
    ns["__annotations__"] = anns
    if module:
        ns["__module__"] = module
    opts = {k: v for k, v in options.items() if k in ("frozen", "kw_only")}
    return type(name, tuple(bases or (_Struct,)), ns, **opts)


def _make_msgspec():
    ms = types.ModuleType("msgspec")
    ms.__file__ = __file__
    ms.__path__ = []
    ms.Struct = _Struct
    ms.field = _ms_field
    ms.NODEFAULT = NODEFAULT
    ms.UNSET = _NoDefault()
    ms.UnsetType = _NoDefault
    ms.Meta = lambda *a, **k: None
    for exc in ("MsgspecError", "DecodeError", "ValidationError", "EncodeError"):
        setattr(ms, exc, type(exc, (Exception,), {}))
    structs = types.ModuleType("msgspec.structs")
    structs.replace = _ms_replace
    structs.fields = _ms_fields
    structs.asdict = dataclasses.asdict
    structs.astuple = dataclasses.astuple
    structs.force_setattr = object.__setattr__
    ms.structs = structs
    ms.to_builtins = lambda o, **k: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else o
    ms.convert = lambda o, t=None, **k: o
    ms.defstruct = _ms_defstruct
    for sub in ("msgpack", "json", "yaml", "toml", "inspect"):
        m = types.ModuleType(f"msgspec.{sub}")
        m.__getattr__ = _placeholder_attr
        setattr(ms, sub, m)
        sys.modules[f"msgspec.{sub}"] = m
    sys.modules["msgspec.structs"] = structs
    return ms


# ----------------------------------------------------------------------------- finder

class _StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :data:`MODULE_STANDINS` packages (and their submodules) that are not installed."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name == "msgspec":
            return _make_msgspec()
        m = types.ModuleType(spec.name)
        m.__file__ = f"<stand-in for {spec.name}>"
        m.__path__ = []
        if spec.name.split(".")[0] == "sgl_kernel":
            m.__getattr__ = lambda n, _p=spec.name: (_placeholder_attr(n) if n.startswith("__") or n[:1].isupper()
                                                     else _MissingOp(f"{_p}.{n}"))
        else:
            m.__getattr__ = _placeholder_attr
        m.__version__ = "0.0.0+standin"
        return m

    def exec_module(self, module):
        if module.__name__ == "sgl_kernel":
            _fill_sgl_kernel(module)
        elif module.__name__ == "vllm._custom_ops":
            _fill_vllm_ops(module)
        elif module.__name__ == "dill":
            import pickle
            module.dumps, module.loads, module.dump, module.load = pickle.dumps, pickle.loads, pickle.dump, pickle.load


def _absent(name: str) -> bool:
    if name in sys.modules:
        return False
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


# ----------------------------------------------------------------------------- ops

def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                         num_tokens_post_pad, cumsum_buffer=None, pad_sorted_token_ids=False,
                         ignore_invalid_expert=False):
    """torch stand-in for ``sgl_kernel.moe_align_block_size`` (same buffers, same contract).

    ``num_experts`` is the bucket count E + 1 ("+1 offset": expert id -1, filtered by EP,
    maps to bucket 0 and its blocks get expert id -1). Every bucket is padded to a multiple
    of ``block_size``; pad slots below the padded total hold ``numel``; order inside a bucket
    is the pair index. No host synchronisation (CUDA-graph safe). Writes in place.
    """
    import torch

    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    buckets = (flat + 1).clamp(min=0)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, buckets, torch.ones_like(buckets))
    padded = (counts + block_size - 1) // block_size * block_size
    if ignore_invalid_expert:
        padded[:1].zero_()  # no Python scalar: it would be a host copy, refused in a CUDA graph
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.sort(buckets, stable=True).indices
    sb = buckets[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=flat.device) - first[sb]
    dest = starts[sb] + rank
    total = ends[-1:]
    fill = torch.full_like(sorted_token_ids, n)
    sorted_token_ids.copy_(fill)
    keep = torch.ones_like(dest, dtype=torch.bool) if not ignore_invalid_expert else sb > 0
    sorted_token_ids.scatter_(0, torch.where(keep, dest, torch.zeros_like(dest)),
                              torch.where(keep, order, torch.full_like(order, n)).to(sorted_token_ids.dtype))
    nb = experts_ids.numel()
    bstart = torch.arange(nb, device=flat.device) * block_size
    owner = torch.searchsorted(ends, bstart, right=True).clamp(max=num_experts - 1)
    experts_ids.copy_((owner - 1).to(experts_ids.dtype))
    num_tokens_post_pad[:1].copy_(total.to(num_tokens_post_pad.dtype))
    if cumsum_buffer is not None and cumsum_buffer.numel() >= num_experts + 1:
        cumsum_buffer[:1].zero_()
        cumsum_buffer[1:num_experts + 1].copy_(ends.to(cumsum_buffer.dtype))


_ACT_KERNEL = None


def _act_kernel():
    global _ACT_KERNEL
    if _ACT_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _gated_act(x_ptr, y_ptr, D, filt_ptr, step, sorted_ptr, ntpp_ptr, num_valid,
                       MODE: tl.constexpr, GELU: tl.constexpr, BLOCK: tl.constexpr):
            # MODE 0: every row; 1: skip rows whose expert (filt[row // step]) is -1;
            # 2: sorted rows: skip rows past the padded total or holding a pad slot.
            row = tl.program_id(0)
            if MODE == 1:
                if tl.load(filt_ptr + row // step) == -1:
                    return
            if MODE == 2:
                if row >= tl.load(ntpp_ptr):
                    return
                if tl.load(sorted_ptr + row) >= num_valid:
                    return
            for s in range(0, D, BLOCK):
                offs = s + tl.arange(0, BLOCK)
                m = offs < D
                g = tl.load(x_ptr + row * 2 * D + offs, mask=m, other=0.0).to(tl.float32)
                u = tl.load(x_ptr + row * 2 * D + D + offs, mask=m, other=0.0).to(tl.float32)
                if GELU:
                    a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
                else:
                    a = g / (1.0 + tl.exp(-g))
                tl.store(y_ptr + row * D + offs, (a * u).to(y_ptr.dtype.element_ty), mask=m)

        _ACT_KERNEL = _gated_act
    return _ACT_KERNEL


def _gated(x, out, gelu, expert_ids=None, expert_step=1, sorted_token_ids=None, num_tokens_post_padded=None,
           num_valid_tokens=0, **_ignored):
    import torch
    import triton

    x2 = x.reshape(-1, x.shape[-1])
    d = x2.shape[1] // 2
    if out is None:
        out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    mode = 0 if expert_ids is None else (2 if sorted_token_ids is not None else 1)
    dummy = torch.zeros(1, dtype=torch.int32, device=x.device)
    _act_kernel()[(x2.shape[0],)](
        x2, out, d, expert_ids if expert_ids is not None else dummy, int(expert_step),
        sorted_token_ids if sorted_token_ids is not None else dummy,
        num_tokens_post_padded if num_tokens_post_padded is not None else dummy, int(num_valid_tokens),
        MODE=mode, GELU=gelu, BLOCK=min(1024, triton.next_power_of_2(max(d, 16))))
    return out


def silu_and_mul(x, out=None, **row_filter):
    """Stand-in for SGLang's gated SiLU: ``out = silu(x[:, :d]) * x[:, d:]`` (fp32 math),
    computing only the rows SGLang's row filter selects (``expert_ids``/``expert_step``,
    or the sorted TMA layout with ``sorted_token_ids``/``num_tokens_post_padded``)."""
    return _gated(x, out, False, **row_filter)


def gelu_and_mul(x, out=None, **row_filter):
    """As :func:`silu_and_mul` with exact GELU."""
    return _gated(x, out, True, **row_filter)


def moe_sum_reduce(x, out, routed_scaling_factor=1.0):
    """Stand-in for ``sgl_kernel.moe_sum_reduce``: ``out = x.sum(1) * routed_scaling_factor``."""
    import torch

    torch.sum(x, dim=1, out=out)
    if routed_scaling_factor not in (None, 1.0):
        out.mul_(routed_scaling_factor)
    return out


def _group_quant(x, group_size, out_dtype=None):
    import torch
    rows, cols = x.reshape(-1, x.shape[-1]).shape
    g = x.reshape(rows, cols // group_size, group_size).float()
    if out_dtype == torch.int8:
        scale = g.abs().amax(dim=2).clamp(min=1e-10) / 127.0
        q = _round_away(g / scale.unsqueeze(2)).clamp(-128, 127).reshape(rows, cols).to(torch.int8)
        return q, scale.contiguous()
    scale = g.abs().amax(dim=2).clamp(min=1e-10) / 448.0
    q = (g / scale.unsqueeze(2)).clamp(-448.0, 448.0).reshape(rows, cols).to(torch.float8_e4m3fn)
    return q, scale.contiguous()


def _int8():
    import torch
    return torch.int8


def _round_away(x):
    """CUDA ``roundf``: halves away from zero (torch.round rounds them to even)."""
    import torch
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def sgl_per_token_quant_fp8(input, output_q, output_s):
    """Stand-in for SGLang's JIT ``sgl_per_token_quant_fp8``: one scale per row, amax / 448."""
    x = input.reshape(-1, input.shape[-1]).float()
    s = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 448.0
    output_s.copy_(s.reshape(output_s.shape))
    output_q[: x.shape[0]].copy_((x / s).clamp(-448.0, 448.0).to(output_q.dtype))


def sgl_per_tensor_quant_fp8(input, output_q, output_s, is_static=False):
    """Stand-in for SGLang's JIT ``per_tensor_quant_fp8``: dynamic amax / 448 (written to
    ``output_s``) or the static scale in ``output_s``."""
    x = input.reshape(-1, input.shape[-1]).float()
    if not is_static:
        output_s.fill_(float(x.abs().amax().clamp(min=1e-10)) / 448.0)
    s = output_s.reshape(-1)[0].float()
    output_q[: x.shape[0]].copy_((x / s).clamp(-448.0, 448.0).to(output_q.dtype))


def per_token_quant_int8(x, scale_dtype=None, cal_sum=False):
    """Stand-in (CPU only) for SGLang's Triton ``per_token_quant_int8``: ``(x_q int8, scales [rows, 1])``."""
    import torch
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10)
    q = _round_away(xf * (127.0 / amax)).clamp(-128, 127).to(torch.int8)
    s = (amax / 127.0).to(scale_dtype or torch.float32)
    if cal_sum:
        return q, s, xf.sum(dim=-1).to(x.dtype)
    return q, s


def sglang_per_token_group_quant_fp8(x, group_size, eps=1e-10, column_major_scales=False, scale_tma_aligned=False,
                                     scale_ue8m0=False, fuse_silu_and_mul=False, masked_m=None, *, output_q=None,
                                     output_s=None):
    """Stand-in for SGLang's JIT ``sglang_per_token_group_quant_fp8`` (row-major float32 scales, every
    row: the call SGLang 0.5.23's ``invoke_fused_moe_kernel`` makes for the up GEMM and the non-TMA
    down GEMM of fp8 block configs). Runs :func:`group_quant`: on a GPU the same Triton kernel as
    :func:`per_token_group_quant`, so both down paths (TMA and not) pay the same per-row cost.
    Raises NotImplementedError for what the stand-in does not do (column-major or UE8M0 scales, the
    fused SiLU, the masked layout) rather than compute it wrong."""
    if column_major_scales or scale_ue8m0 or fuse_silu_and_mul or masked_m is not None:
        raise NotImplementedError("stand-in: row-major float32 scales of a flat input only")
    return group_quant(x, group_size, None, output_q=output_q, output_s=output_s)


def per_token_group_quant(input, output_q=None, output_s=None, group_size=128, scale_ue8m0=False,
                          fuse_silu_and_mul=False, masked_m=None, expected_m=None, *, out_dtype=None,
                          column_major_scales=False, sorted_token_ids=None, num_tokens_post_padded=None,
                          num_valid_tokens=0, silu_and_mul_mode="legacy"):
    """Stand-in for SGLang's JIT ``per_token_group_quant`` (SGLang 0.5.23
    ``kernels/ops/quantization/per_token_group_quant.py``; fp8, or int8 with ``out_dtype=torch.int8``).

    With ``sorted_token_ids`` (the sorted, block-padded layout of the down-TMA path,
    ``fused_experts_impl``), it does the work the real kernel does: rows at or past
    ``num_tokens_post_padded`` or holding a padding slot (``sorted_token_ids[row] >= num_valid_tokens``)
    are skipped and left unwritten, by whole warps as the real kernel skips them
    (:func:`group_quant_keep`). What it cannot match: the real kernel is one CUDA kernel of 8-lane
    subwarps per group with vector loads; the stand-in is a Triton kernel of one program per row
    (same bytes read and written, same rows, its own speed), and torch on the CPU. Raises
    NotImplementedError for the variants it does not do (UE8M0 or column-major scales, the fused
    SiLU, the masked layout)."""
    if scale_ue8m0 or fuse_silu_and_mul or masked_m is not None or column_major_scales:
        raise NotImplementedError("stand-in: row-major float32 scales of a flat or sorted input only")
    if output_q is not None and out_dtype is None:
        out_dtype = output_q.dtype
    sorted_layout = None
    if sorted_token_ids is not None:
        sorted_layout = (sorted_token_ids, num_tokens_post_padded, int(num_valid_tokens))
    return group_quant(input, group_size, out_dtype, output_q=output_q, output_s=output_s, sorted_layout=sorted_layout)


#: SGLang 0.5.23 ``kernels/jit/csrc/gemm/per_token_group_quant.cuh``: ``kVecSize = 32 / 2`` elements per
#: lane, ``kNumLanes = group_size / kVecSize`` lanes per group, so a 32-thread warp covers
#: ``32 / kNumLanes`` consecutive (row, group) work items; a warp exits only when every row it covers is
#: padding ("only warps whose rows are all padding exit; a mixed warp also quantizes its padding rows").
_VEC = 16


def group_quant_keep(rows: int, num_groups: int, group_size: int, sorted_token_ids, num_tokens_post_padded,
                     num_valid_tokens: int):
    """The (row, group) work items SGLang's sorted-layout kernel computes: bool [rows, num_groups].

    A row is padding when ``row >= num_tokens_post_padded`` or ``sorted_token_ids[row] >=
    num_valid_tokens``; work item ``row * num_groups + group`` belongs to warp ``item // (32 //
    (group_size // 16))``; a warp whose rows are all padding skips all its items. Torch, no host
    synchronisation (graph-safe)."""
    import torch
    dev = sorted_token_ids.device
    r = torch.arange(rows, device=dev)
    skip = (r >= num_tokens_post_padded.reshape(-1)[0].to(torch.int64)) | (
        sorted_token_ids[:rows].to(torch.int64) >= int(num_valid_tokens))
    per_warp = max(1, 32 // max(1, group_size // _VEC))
    item = torch.arange(rows * num_groups, device=dev)
    warp = item // per_warp
    n_warps = (rows * num_groups + per_warp - 1) // per_warp
    live = torch.zeros(n_warps, dtype=torch.int32, device=dev)
    live.scatter_reduce_(0, warp, (~skip[item // num_groups]).to(torch.int32), reduce="amax")
    return live[warp].bool().reshape(rows, num_groups)


_GQ_KERNEL = None


def _gq_kernel():
    global _GQ_KERNEL
    if _GQ_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _group_quant_rows(x_ptr, q_ptr, s_ptr, sorted_ptr, ntpp_ptr, num_valid, rows, G,
                              GS: tl.constexpr, G_PAD: tl.constexpr, PER_WARP: tl.constexpr, SPAN: tl.constexpr,
                              SORTED: tl.constexpr, INT8: tl.constexpr):
            # one program per row; with SORTED, a group is computed when its warp (PER_WARP consecutive
            # (row, group) items) covers at least one non-padding row, as SGLang's kernel does
            row = tl.program_id(0)
            g = tl.arange(0, G_PAD)
            gm = g < G
            if SORTED:
                ntpp = tl.load(ntpp_ptr)
                item = row * G + g
                first = (item // PER_WARP) * PER_WARP
                last = tl.minimum(first + PER_WARP - 1, rows * G - 1)
                lo = first // G
                hi = last // G
                keep = tl.zeros([G_PAD], dtype=tl.int1)
                for j in tl.static_range(SPAN):
                    rj = lo + j
                    inr = (rj <= hi) & (rj < rows)
                    sid = tl.load(sorted_ptr + rj, mask=inr & gm, other=num_valid)
                    keep = keep | (inr & (rj < ntpp) & (sid < num_valid))
                keep = keep & gm
            else:
                keep = gm
            if tl.max(keep.to(tl.int32), axis=0) == 0:
                return
            offs = g[:, None] * GS + tl.arange(0, GS)[None, :]
            m = keep[:, None]
            x = tl.load(x_ptr + row * G * GS + offs, mask=m, other=0.0).to(tl.float32)
            amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10)
            if INT8:
                scale = amax / 127.0
                v = x / scale[:, None]
                v = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(-v + 0.5))
                v = tl.minimum(tl.maximum(v, -128.0), 127.0)
            else:
                scale = amax / 448.0
                v = tl.minimum(tl.maximum(x / scale[:, None], -448.0), 448.0)
            tl.store(q_ptr + row * G * GS + offs, v.to(q_ptr.dtype.element_ty), mask=m)
            tl.store(s_ptr + row * G + g, scale, mask=keep)

        _GQ_KERNEL = _group_quant_rows
    return _GQ_KERNEL


def group_quant(x, group_size, out_dtype=None, output_q=None, output_s=None, sorted_layout=None, use_triton=None):
    """Per-token-group quantization of ``x`` [rows, cols] (fp8 e4m3: scale amax / 448; int8 with
    ``out_dtype=torch.int8``: amax / 127, rounded half away from zero; amax at least 1e-10):
    ``(q [rows, cols], scales float32 [rows, cols / group_size])``. ``sorted_layout``:
    ``(sorted_token_ids, num_tokens_post_padded, num_valid_tokens)``: only the work items of
    :func:`group_quant_keep` are written, the rest keep whatever ``output_q``/``output_s`` held.
    ``use_triton`` (default: on a GPU): the Triton kernel; else torch (the CPU: Triton's interpreter
    casts fp32 to fp8 wrongly)."""
    import torch
    import triton

    x2 = x.reshape(-1, x.shape[-1])
    rows, cols = x2.shape
    if cols % group_size:
        raise ValueError(f"{cols} columns are not a multiple of the group size {group_size}")
    G = cols // group_size
    qd = out_dtype or (output_q.dtype if output_q is not None else torch.float8_e4m3fn)
    q = output_q if output_q is not None else torch.empty(x.shape, dtype=qd, device=x.device)
    s = output_s if output_s is not None else torch.empty((*x.shape[:-1], G), dtype=torch.float32, device=x.device)
    if use_triton is None:
        use_triton = x.is_cuda
    if rows == 0:
        return q, s
    if use_triton:
        per_warp = max(1, 32 // max(1, group_size // _VEC))
        span = per_warp // G + 2 if G < per_warp else 2
        st, ntpp, nv = sorted_layout if sorted_layout is not None else (None, None, 0)
        dummy = torch.zeros(1, dtype=torch.int32, device=x.device)
        _gq_kernel()[(rows,)](x2.contiguous(), q.reshape(rows, cols), s.reshape(rows, G),
                              st if st is not None else dummy, ntpp if ntpp is not None else dummy, int(nv), rows, G,
                              GS=group_size, G_PAD=triton.next_power_of_2(G), PER_WARP=per_warp, SPAN=span,
                              SORTED=sorted_layout is not None, INT8=qd == torch.int8)
        return q, s
    qq, ss = _group_quant(x2, group_size, qd if qd == torch.int8 else None)
    if sorted_layout is None:
        q.reshape(rows, cols).copy_(qq)
        s.reshape(rows, G).copy_(ss)
        return q, s
    keep = group_quant_keep(rows, G, group_size, *sorted_layout)
    # fp8 and int8 are one byte each: select on the bytes (torch.where has no fp8 kernel on the CPU)
    qv, sv = q.reshape(rows, G, group_size).view(torch.uint8), s.reshape(rows, G)
    qv.copy_(torch.where(keep.unsqueeze(2), qq.reshape(rows, G, group_size).view(torch.uint8), qv))
    sv.copy_(torch.where(keep, ss, sv))
    return q, s


def _fill_vllm_ops(module):
    """vLLM's ``_custom_ops`` argument order: ``(out, x)`` for activations, ``(x, out)`` for moe_sum."""
    module.silu_and_mul = lambda out, x: silu_and_mul(x, out)
    module.gelu_and_mul = lambda out, x: gelu_and_mul(x, out)
    module.moe_sum = lambda x, out: moe_sum_reduce(x, out, 1.0)


def _fill_sgl_kernel(module):
    module.moe_align_block_size = moe_align_block_size
    module.silu_and_mul = silu_and_mul
    module.gelu_and_mul = gelu_and_mul
    module.moe_sum_reduce = moe_sum_reduce


# ----------------------------------------------------------------------------- install

def unpack_wheel(wheel_path, dest) -> "Path":
    """Unpack an SGLang wheel's ``sglang/`` package (every file: SGLang checks that its JIT
    ``include``/``csrc`` folders exist at import) into ``dest``; returns ``dest`` (the folder
    to put on ``sys.path``). Done once: a ``.complete`` marker names the wheel."""
    import zipfile
    from pathlib import Path

    dest = Path(dest)
    marker = dest / ".complete"
    name = Path(wheel_path).name
    if marker.exists() and marker.read_text().strip() == name:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_path) as zf:
        for member in zf.namelist():
            if member.startswith("sglang/"):
                zf.extract(member, dest)
    marker.write_text(name + "\n")
    return dest


def release_tree(version: str) -> "Path":
    """The whole ``sglang`` package of release ``version`` (from the wheel cache of
    :mod:`tests.sglang_releases`), unpacked once under its cache root in ``full/<version>``."""
    from tests.sglang_releases import cache_root, wheel

    return unpack_wheel(wheel(version), cache_root() / "full" / version)


def install(source_root=None) -> dict:
    """Make SGLang importable here: put ``source_root`` (a folder holding the ``sglang``
    package, e.g. :func:`tests.sglang_releases.source_tree`) first on ``sys.path``, serve
    the absent packages of :data:`MODULE_STANDINS`, add ``Logger.warning_once``.

    Returns ``{"modules": [stand-in package names], "logger": [methods added]}``. Idempotent.
    """
    if source_root is not None:
        root = str(source_root)
        if root in sys.path:
            sys.path.remove(root)
        sys.path.insert(0, root)
    names = [n for n in MODULE_STANDINS if n not in _installed.get("modules", []) and _absent(n)]
    late = [n for n in names if n in _LATE]
    early = [n for n in names if n not in _LATE]
    if early:
        sys.meta_path.append(_StandinFinder(early))
    if late:
        importlib.import_module("sglang")  # its transformers patches: skipped when absent
        sys.meta_path.append(_StandinFinder(late))
    _installed.setdefault("modules", []).extend(names)
    added = []
    for meth, base in (("warning_once", "warning"), ("info_once", "info"), ("debug_once", "debug")):
        if not hasattr(logging.Logger, meth):
            def once(self, msg, *args, _base=base, **kw):
                key = (id(self), msg)
                if key not in _seen:
                    _seen.add(key)
                    getattr(self, _base)(msg, *args, **kw)
            setattr(logging.Logger, meth, once)
            added.append(meth)
    _installed.setdefault("logger", []).extend(added)
    import torch
    if not torch.cuda.is_available() and not _installed.get("cpu_ops"):
        _installed["cpu_ops"] = _register_custom_ops_for_cpu()
        added.extend(_installed["cpu_ops"])
    if not hasattr(torch._C._cpu, "_is_amx_tile_supported"):
        # SGLang 0.4.x probes Intel AMX through this private torch API at import; newer
        # torch dropped it. The answer only selects SGLang's CPU (AMX) MoE path.
        torch._C._cpu._is_amx_tile_supported = lambda: False
        added.append("torch._C._cpu._is_amx_tile_supported")
    return {"modules": list(_installed["modules"]), "logger": list(_installed["logger"])}


_seen: set = set()


def _register_custom_ops_for_cpu() -> list:
    """SGLang registers its custom ops (e.g. ``sglang::outplace_fused_experts``) with one
    dispatch key, the GPU's ("CUDA"); on a machine without one, register the same Python
    function for "CPU" too, so the op runs what it runs on a GPU. Done by wrapping
    ``impl`` of SGLang's ``sglang_lib`` (``torch.library.Library``) before the MoE modules
    register their ops."""
    for name in ("sglang.srt.utils.common", "sglang.srt.utils"):
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        lib = getattr(mod, "sglang_lib", None)
        if lib is None:
            continue
        orig = lib.impl

        def impl(op_name, fn, dispatch_key="", *a, _orig=orig, **k):
            out = _orig(op_name, fn, dispatch_key, *a, **k)
            if dispatch_key == "CUDA":
                _orig(op_name, fn, "CPU", *a, **k)
            return out
        lib.impl = impl
        return [f"{name}.sglang_lib.impl (+CPU)"]
    return []


def patch_ops(modules, follow_cuda_align: bool = False, bind_activation: bool = False,
              device_name: str | None = None) -> list:
    """Replace, in SGLang's already-imported ``modules``, the compiled ops of
    :data:`OP_STANDINS` that cannot run here (names those modules bound from ``sgl_kernel``,
    from SGLang's JIT activation, or left unbound because the platform is not CUDA).
    Returns ``["module.name", ...]`` patched.

    ``follow_cuda_align`` (CPU tests): in SGLang's alignment module (the one defining
    ``moe_align_block_size`` with a module-level ``_is_cuda``), take the CUDA branch: SGLang's
    own Triton alignment for ``M * top_k <= 64`` (``moe_align_small_numel``, real, run by the
    interpreter) and the :func:`moe_align_block_size` stand-in above that.
    ``bind_activation`` (CPU tests): bind :func:`silu_and_mul` in modules that define
    ``fused_experts`` but bound no ``silu_and_mul`` (SGLang binds it on CUDA only), so the
    provider's ``down`` timing includes the activation as on a GPU; likewise :func:`moe_sum_reduce`
    where the top-k sum (``moe_combine_topk``) lacks it.
    On the CPU (``follow_cuda_align``) SGLang's Triton ``per_token_group_quant_fp8`` is stood in
    too: under ``TRITON_INTERPRET=1`` its fp32 -> fp8 cast stores wrong values (seen: off by two
    fp8 steps), which is the interpreter's, not the GPU's, behaviour.
    ``device_name`` (CPU tests): what SGLang's ``get_device_name`` answers in modules that
    bound it (SGLang names config files after the GPU; without one it returns None and its
    file-name rule fails).
    SGLang's Triton GEMM and its launch code are never replaced.
    """
    done = []
    if device_name is not None:
        for mod in modules:
            if "get_device_name" in vars(mod):
                mod.get_device_name = lambda device_id=0, _n=device_name: _n
                done.append(f"{mod.__name__}.get_device_name")
    if follow_cuda_align:
        for mod in modules:
            if callable(vars(mod).get("per_token_group_quant_fp8")):
                mod.per_token_group_quant_fp8 = sglang_per_token_group_quant_fp8
                done.append(f"{mod.__name__}.per_token_group_quant_fp8")
            if callable(vars(mod).get("per_token_quant_int8")):
                mod.per_token_quant_int8 = per_token_quant_int8
                done.append(f"{mod.__name__}.per_token_quant_int8")
            if callable(vars(mod).get("per_token_group_quant_int8")) and "fused_moe" in mod.__name__:
                # SGLang's non-CUDA Triton group quantization truncates (no rounding); a GPU server
                # runs the CUDA branch (sglang_per_token_group_quant_int8, rounding): stand in for it
                mod.per_token_group_quant_int8 = lambda x, group_size, *a, **k: _group_quant(x, group_size, _int8())
                done.append(f"{mod.__name__}.per_token_group_quant_int8")
    for mod in modules:
        if mod.__name__.endswith("quantization.fp8_kernel") and callable(vars(mod).get("scaled_fp8_quant")):
            # the compiled fp8 quantizations scaled_fp8_quant calls (absent names off CUDA: bound here)
            for name, fn in (("sgl_per_token_quant_fp8", sgl_per_token_quant_fp8),
                             ("sgl_per_tensor_quant_fp8", sgl_per_tensor_quant_fp8)):
                cur = vars(mod).get(name)
                origin = getattr(cur, "__module__", "") or ""
                if cur is None or isinstance(cur, _Placeholder) or origin.startswith(
                        ("sgl_kernel", "sglang.kernels.ops.quantization")):
                    setattr(mod, name, fn)
                    done.append(f"{mod.__name__}.{name}")
    if bind_activation:
        for mod in modules:
            if "fused_experts" in vars(mod) and "silu_and_mul" not in vars(mod):
                mod.silu_and_mul = silu_and_mul
                done.append(f"{mod.__name__}.silu_and_mul")
            if "moe_combine_topk" in vars(mod) and "moe_sum_reduce" not in vars(mod):
                # SGLang 0.5.23 binds sgl_kernel's moe_sum_reduce on CUDA only; with _is_cuda followed
                # (follow_cuda_align) its top-k sum calls it for top-k > 2 (a fused shared expert: top-k + 1)
                mod.moe_sum_reduce = moe_sum_reduce
                done.append(f"{mod.__name__}.moe_sum_reduce")
    ops = {"silu_and_mul": silu_and_mul, "gelu_and_mul": gelu_and_mul, "moe_sum_reduce": moe_sum_reduce,
           "sglang_per_token_group_quant_fp8": sglang_per_token_group_quant_fp8,
           "per_token_group_quant": per_token_group_quant}
    for mod in modules:
        names = vars(mod)
        for name, fn in ops.items():
            if name in names:
                origin = getattr(names[name], "__module__", "") or ""
                if origin.startswith(("sgl_kernel", "sglang.kernels.ops.activation", "sglang.kernels.ops.quantization")) \
                        or origin == __name__ \
                        or isinstance(names[name], _Placeholder):
                    setattr(mod, name, fn)
                    done.append(f"{mod.__name__}.{name}")
        if "moe_align_block_size" in names and "_is_cuda" in names and callable(names["moe_align_block_size"]):
            cur = names.get("sgl_moe_align_block_size")
            origin = getattr(cur, "__module__", "") or ""
            if cur is None or origin.startswith("sgl_kernel") or origin == __name__ or "kernels.ops.moe" in origin:
                # sgl_kernel's CUDA alignment, directly (0.4.x-0.5.x) or through SGLang's kernel registry
                setattr(mod, "sgl_moe_align_block_size", moe_align_block_size)
                done.append(f"{mod.__name__}.sgl_moe_align_block_size")
            if follow_cuda_align and not names["_is_cuda"]:
                mod._is_cuda = True
                done.append(f"{mod.__name__}._is_cuda")
                try:
                    small = importlib.import_module("sglang.kernels.ops.moe.moe_align_small_numel")
                    mod.SMALL_NUMEL_LIMIT, mod.moe_align_small_numel = small.SMALL_NUMEL_LIMIT, small.moe_align_small_numel
                except ImportError:
                    pass
    return done


def prepare(source_root=None, cpu: bool | None = None, device_name: str = "NVIDIA H200") -> dict:
    """One call that makes SGLang's fused MoE run here: :func:`install`, import SGLang's MoE
    modules (the entry points ``remote.engines.sglang.kernel_roles.SGLANG_KERNEL_ROLES`` names), then :func:`patch_ops`
    on them; on a machine without a GPU (``cpu``, default: no CUDA) also the CPU-only
    stand-ins (CUDA alignment path, activation binding, ``device_name``).

    Returns ``{"modules": [...], "logger": [...], "ops": ["module.name", ...]}``: every piece
    that stands in (the bench prints it).
    """
    import torch

    from remote.engines.sglang.kernel_roles import SGLANG_KERNEL_ROLES as ROLES

    if cpu is None:
        cpu = not torch.cuda.is_available()
    info = install(source_root)
    mods = []
    for cands in ROLES.values():
        for mod_name, _attr in cands:
            try:
                mods.append(importlib.import_module(mod_name))
            except Exception:
                continue
    for extra in ("sglang.kernels.ops.quantization.fp8_kernel", "sglang.kernels.ops.quantization.int8_kernel"):
        try:
            mods.append(importlib.import_module(extra))
        except Exception:
            pass
    mods = list({id(m): m for m in mods}.values())
    ops = patch_ops(mods, follow_cuda_align=cpu, bind_activation=cpu, device_name=device_name if cpu else None)
    info["ops"] = sorted(set(ops))
    _installed["ops"] = info["ops"]
    return info


SITECUSTOMIZE = """# written by tests/sglang_standins.py: makes SGLang's MoE importable in every Python process
import os, sys
sys.path.insert(0, os.environ["ORCH_STANDINS_REPO"])
from tests.sglang_standins import prepare
prepare(os.environ["ORCH_STANDINS_SGLANG"])
"""


def subprocess_env(site_dir, source_root, repo_root, base_env=None) -> dict:
    """Environment for child processes (``python -m remote tune`` and its compile workers)
    that runs :func:`prepare` at interpreter start: a ``sitecustomize.py`` in ``site_dir``
    first on ``PYTHONPATH``. Returns the new environment (``base_env``: default os.environ)."""
    import os
    from pathlib import Path

    Path(site_dir).mkdir(parents=True, exist_ok=True)
    (Path(site_dir) / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(base_env if base_env is not None else os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), str(repo_root)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["ORCH_STANDINS_REPO"] = str(repo_root)
    env["ORCH_STANDINS_SGLANG"] = str(source_root)
    return env
