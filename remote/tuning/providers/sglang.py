"""Thin adapter timing SGLang's own fused-MoE Triton entry with a forced config.

Version-tolerant: it tries the import paths and call forms of sglang 0.4.x-0.5.x
(``sglang.srt.layers.moe.fused_moe_triton.override_config`` + ``fused_moe``; newer builds
take a ``TopKOutput`` and a ``MoeRunnerConfig``, older ones the gating logits and
``topk``). Up and down GEMMs share one forced config (``override_config`` forces one
dict), so the search is joint, and the written ``_down`` file equals the up file.
Not exercised in this project's CI or on its H200 (no SGLang there): the builtin provider
is what was measured. ``provider: auto`` picks it when the entry is installed
(:func:`remote.tuning.support.resolve_provider_name`, read from disk; the probe reports the same
answer); an installed entry that then fails to import is an error, not a silent fallback.
"""

from __future__ import annotations

import importlib

import torch

from ..support import SGLANG_MOE_ENTRY
from .builtin import DTYPES, Problem, quant_spec


def _imports():
    """``(override_config, fused_moe)`` of SGLang's entry (:data:`remote.tuning.support.SGLANG_MOE_ENTRY`)."""
    return tuple(getattr(importlib.import_module(module), attr) for module, attr in SGLANG_MOE_ENTRY)


class SglangProvider:
    """SGLang's kernel. ``separable`` is False: a candidate config is timed as the whole
    fused MoE with that config forced for both GEMMs."""

    name = "sglang"
    separable = False

    def __init__(self):
        self.override_config, self.fused_moe = _imports()
        self._new_api = None

    def make_problem(self, shape, M, dtype, device, seed, weights=None, quant=None) -> Problem:
        """Same inputs as the builtin provider (see :class:`remote.tuning.providers.builtin.Problem`)."""
        return Problem(shape["E"], shape["N"], shape["hidden"], shape["topk"], M, DTYPES[dtype], device, seed,
                       weights, quant_spec(quant))

    @staticmethod
    def _quant_kwargs(p: Problem) -> dict:
        """fp8_w8a8 arguments of SGLang's ``fused_moe`` (per-tensor or block weight scales;
        activations quantized dynamically by SGLang)."""
        if p.qw is None:
            return {}
        return dict(use_fp8_w8a8=True, w1_scale=p.qw.w1_scale, w2_scale=p.qw.w2_scale,
                    block_shape=list(p.quant.block_shape) if p.quant.block_shape else None)

    def _call(self, p: Problem):
        if self._new_api is None:
            try:
                from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig  # noqa: F401
                from sglang.srt.layers.moe.topk import StandardTopKOutput  # noqa: F401
                self._new_api = True
            except Exception:
                self._new_api = False
        if self._new_api:
            from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
            from sglang.srt.layers.moe.topk import StandardTopKOutput

            logits = torch.zeros(p.M, p.E, device=p.device, dtype=torch.float32)
            topk = StandardTopKOutput(p.topk_weights, p.topk_ids, logits)
            cfg = MoeRunnerConfig(inplace=False)
            return lambda: self.fused_moe(p.x, p.w1, p.w2, topk, moe_runner_config=cfg, **self._quant_kwargs(p))
        logits = torch.log(torch.full((p.M, p.E), 1e-6, device=p.device)).scatter(
            1, p.topk_ids.long(), torch.log(p.topk_weights))
        return lambda: self.fused_moe(p.x, p.w1, p.w2, logits, p.top_k, renormalize=True, inplace=False,
                                      **self._quant_kwargs(p))

    def full_fn(self, p: Problem, up_cfg: dict, down_cfg: dict):
        """Callable running SGLang's fused MoE with ``up_cfg`` forced (``down_cfg`` must be
        equal or is ignored: one forced config covers both GEMMs)."""
        run = self._call(p)
        cfg = dict(up_cfg)

        def fn():
            with self.override_config(cfg):
                return run()
        return fn

    def gemm_fn(self, p, kind, cfg):
        raise NotImplementedError("sglang provider times the whole fused MoE only")

    def check(self, p: Problem, up_cfg: dict, down_cfg: dict) -> float:
        """Relative error of SGLang's output against the float64 reference."""
        from ..kernel.reference import fused_moe_reference, fused_moe_reference_fp8, relative_error

        out = self.full_fn(p, up_cfg, down_cfg)()
        if p.qw is not None:
            return relative_error(out, fused_moe_reference_fp8(p.x, p.w1, p.w2, p.qw, p.topk_weights, p.topk_ids))
        return relative_error(out, fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids))

    def precompile_args(self, shape, dtype, quant=None):
        return None
