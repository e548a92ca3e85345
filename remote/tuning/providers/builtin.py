"""Builtin provider: times ``remote.tuning.kernel`` (the payload's own fused-MoE Triton kernel)."""

from __future__ import annotations

import math

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def quant_spec(quant):
    """``None`` or a :class:`remote.tuning.kernel.quant.QuantSpec` from the tuner spec's ``quant``
    entry (``None``, or ``{"dtype": "fp8_w8a8", "block_shape": None | [bn, bk], ...}``). Raises
    ValueError for another format (int8/int4, per-channel fp8: only the sglang provider runs them)."""
    if quant is None:
        return None
    if quant.get("dtype", "fp8_w8a8") != "fp8_w8a8" or quant.get("per_channel"):
        # remote.tuning.support.unsupported_reason refuses these before a tune starts
        raise ValueError(f"the builtin kernel runs fp8_w8a8 per-tensor or block only, not {quant}")
    from ..kernel.quant import QuantSpec
    bs = quant.get("block_shape")
    return QuantSpec(tuple(int(v) for v in bs) if bs else None)


class Problem:
    """Inputs for one batch size M: random x [M, hidden], routing from a softmax top-k of
    random logits (or the tune's :class:`remote.tuning.tuner.routing.Routing`: fused shared expert,
    recorded routing, skew), shared weights, and reusable buffers. Inputs are never zeros.

    ``weights``: ``(w1 [E, 2N, hidden], w2 [E, hidden, N], qw)`` reused across batch sizes of
    a worker (regenerated only when absent). ``seed`` seeds x and the routing logits.
    ``quant``: ``None`` (weights in ``dtype``) or a :class:`remote.tuning.kernel.quant.QuantSpec`
    (fp8_w8a8): the weights are fp8 e4m3 with float32 scales (``qw``, a
    :class:`remote.tuning.kernel.quant.QuantWeights`), x and the down GEMM's input are also kept
    quantized (``xq``/``xs``, ``aq``/``as_``) so a single GEMM is timed without the
    quantization step, which no config changes.
    ``routing``: a :class:`remote.tuning.tuner.routing.Routing` (or its dict), None for the synthetic
    routing; ``top_k`` is then the routed experts per token and ``self.top_k`` the kernel's (fused
    shared experts added); ``routing_info`` says what was timed.
    """

    def __init__(self, E: int, N: int, hidden: int, top_k: int, M: int, dtype: torch.dtype, device: str,
                 seed: int, weights=None, quant=None, routing=None):
        from ..kernel.fused_moe import make_buffers
        from ..kernel.reference import route

        self.E, self.N, self.hidden, self.top_k, self.M = E, N, hidden, top_k, M
        self.dtype, self.device = dtype, torch.device(device)
        self.quant = quant
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        if weights is None:
            w1 = torch.randn(E, 2 * N, hidden, generator=gen, device=self.device, dtype=torch.float32)
            w1 = w1 / math.sqrt(hidden)
            w2 = torch.randn(E, hidden, N, generator=gen, device=self.device, dtype=torch.float32)
            w2 = w2 / math.sqrt(N)
            if quant is None:
                weights = (w1.to(dtype), w2.to(dtype), None)
            else:
                from ..kernel.quant import QuantWeights, quant_weight
                (w1q, s1), (w2q, s2) = quant_weight(w1, quant), quant_weight(w2, quant)
                weights = (w1q, w2q, QuantWeights(quant, s1, s2))
            del w1, w2
        self.w1, self.w2, self.qw = weights
        self.x = torch.randn(M, hidden, generator=gen, device=self.device, dtype=torch.float32).to(dtype)
        logits = torch.randn(M, E, generator=gen, device=self.device, dtype=torch.float32)
        from ..tuner.routing import Routing, info_of, make
        rt = routing if isinstance(routing, Routing) else Routing.from_dict(routing)
        if rt.synthetic:
            self.topk_weights, self.topk_ids = route(M, E, top_k, logits=logits)
            self.routing_info = info_of(rt, self.topk_ids, E)
        else:
            self.topk_weights, self.topk_ids, self.routing_info = make(rt, M, E, top_k, seed, self.device)
            top_k = self.top_k = int(self.topk_ids.shape[1])
        self.flat_weights = self.topk_weights.reshape(-1).contiguous()
        self.buffers = make_buffers(M, top_k, N, hidden, dtype, self.device, fill=0.0)
        # the down GEMM's input gets real (random, non-zero) activations
        self.act_in = torch.randn(M * top_k, N, generator=gen, device=self.device, dtype=torch.float32).to(dtype)
        if quant is not None:
            from ..kernel.quant import quant_activation
            self.xq, self.xs = quant_activation(self.x, quant)
            self.aq, self.as_ = quant_activation(self.act_in, quant)
        self._routing = {}

    @property
    def weights(self):
        """``(w1, w2, qw)`` for reuse by the next Problem."""
        return self.w1, self.w2, self.qw

    def routing(self, block_m: int):
        """Cached :func:`remote.tuning.kernel.fused_moe.align` result for ``block_m``."""
        from ..kernel.fused_moe import align

        if block_m not in self._routing:
            self._routing[block_m] = align(self.topk_ids, block_m, self.E)
        return self._routing[block_m]


class BuiltinProvider:
    """The payload's own kernel. ``separable``: up and down GEMMs are timed one by one."""

    name = "builtin"
    separable = True

    def make_problem(self, shape: dict, M: int, dtype: str, device: str, seed: int, weights=None,
                     quant=None, routing=None) -> Problem:
        """A :class:`Problem` for ``shape`` (keys E, N, hidden, topk) and batch size M;
        ``quant`` as the tuner spec's entry (see :func:`quant_spec`); ``routing`` the spec's routing
        entry (:class:`remote.tuning.tuner.routing.Routing` dict, None: synthetic)."""
        return Problem(shape["E"], shape["N"], shape["hidden"], shape["topk"], M, DTYPES[dtype], device, seed,
                       weights, quant_spec(quant), routing=routing)

    def floor_inputs(self, p: Problem):
        """What the floor of :mod:`remote.tuning.tuner.floor` needs of problem ``p``
        (:class:`~remote.tuning.tuner.floor.GemmShape`): fp8 weights and activations are 1 byte and run
        fp8 MMAs; 16-bit ones bf16 MMAs."""
        from ..tuner.floor import GemmShape
        from ..tuner.routing import expert_counts
        fp8 = p.qw is not None
        return GemmShape(E=p.E, N=p.N, hidden=p.hidden, M=p.M, counts=tuple(expert_counts(p.topk_ids, p.E)),
                         w_bits=8 if fp8 else 8 * p.dtype.itemsize, a_bytes=1 if fp8 else p.dtype.itemsize,
                         mma="fp8" if fp8 else "bf16")

    def gemm_fn(self, p: Problem, kind: str, cfg: dict):
        """A zero-argument callable launching one GEMM (``up`` or ``down``) with ``cfg``.

        Alignment for cfg's BLOCK_SIZE_M is precomputed (not part of the timed work).
        """
        from ..kernel.fused_moe import moe_gemm

        r = p.routing(int(cfg["BLOCK_SIZE_M"]))
        h, _act, y = p.buffers
        if p.quant is not None:
            if kind == "up":
                return lambda: moe_gemm("up", p.xq, p.w1, h, r, cfg, a_scale=p.xs, w_scale=p.qw.w1_scale,
                                        quant=p.quant)
            return lambda: moe_gemm("down", p.aq, p.w2, y, r, cfg, topk_weights=p.flat_weights, a_scale=p.as_,
                                    w_scale=p.qw.w2_scale, quant=p.quant)
        if kind == "up":
            return lambda: moe_gemm("up", p.x, p.w1, h, r, cfg)
        return lambda: moe_gemm("down", p.act_in, p.w2, y, r, cfg, topk_weights=p.flat_weights)

    def full_fn(self, p: Problem, up_cfg: dict, down_cfg: dict):
        """A callable running the whole fused MoE (up GEMM, SiLU-and-mul, down GEMM, top-k
        sum) with precomputed alignment; this is the "kernel time" of report.json."""
        from ..kernel.fused_moe import fused_moe

        r = p.routing(int(up_cfg["BLOCK_SIZE_M"]))
        out = torch.empty(p.M, p.hidden, dtype=p.dtype, device=p.device)
        return lambda: fused_moe(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, up_cfg, down_cfg,
                                 buffers=p.buffers, routing=r, out=out, quant=p.qw)

    def check(self, p: Problem, up_cfg: dict, down_cfg: dict) -> float:
        """Relative error of the fused MoE with these configs against the float64
        reference, buffers poisoned with NaN first (``inf`` if anything stayed NaN).
        fp8: against :func:`remote.tuning.kernel.reference.fused_moe_reference_fp8` (same
        quantized numbers), so the same 1e-2 bound applies."""
        from ..kernel.fused_moe import fused_moe, make_buffers
        from ..kernel.reference import fused_moe_reference, fused_moe_reference_fp8, relative_error

        bufs = make_buffers(p.M, p.top_k, p.N, p.hidden, p.dtype, p.device)
        out = torch.full((p.M, p.hidden), float("nan"), dtype=p.dtype, device=p.device)
        fused_moe(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, up_cfg, down_cfg, buffers=bufs, out=out,
                  quant=p.qw)
        if p.qw is not None:
            ref = fused_moe_reference_fp8(p.x, p.w1, p.w2, p.qw, p.topk_weights, p.topk_ids)
        else:
            ref = fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids)
        return relative_error(out, ref)

    #: What a compile worker of :class:`remote.tuning.tuner.compile.Compiler` runs: one GEMM per
    #: (kind, config), whatever the batch size (the kernel is not specialised on M).
    compile_target = "remote.tuning.providers.builtin:compile_one"
    compile_per_batch = False

    def precompile_args(self, shape: dict, dtype: str, quant=None, routing=None) -> dict:
        """Picklable arguments for :func:`compile_one` (``routing``: the spec's entry; its fused shared
        experts add to the kernel's top-k)."""
        shared = int((routing or {}).get("shared") or 0)
        return dict(dtype=dtype, E=shape["E"], N=shape["N"], hidden=shape["hidden"], top_k=shape["topk"] + shared,
                    quant=quant)


def compile_one(kind: str, cfg: dict, dtype: str, E: int, N: int, hidden: int, top_k: int, quant=None):
    """Compile the builtin GEMM ``kind`` (``up`` or ``down``) with config ``cfg`` for the shape
    (E experts, N, hidden, top-k) without launching it, in a compile worker of
    :class:`remote.tuning.tuner.compile.Compiler`; ``dtype`` is a key of :data:`DTYPES`, ``quant``
    the tuner spec's entry (fp8_w8a8, :func:`quant_spec`). Returns ``(ok, error_text)``; never raises."""
    try:
        from ..kernel.fused_moe import precompile

        precompile(kind, DTYPES[dtype], E, N, hidden, top_k, cfg, quant_spec(quant))
        return True, ""
    except Exception as exc:  # a candidate that does not compile is skipped, not fatal
        return False, f"{type(exc).__name__}: {str(exc)[:300]}"
