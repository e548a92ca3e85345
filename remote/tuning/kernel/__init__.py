"""Builtin fused-MoE Triton kernel (own implementation of the algorithm SGLang's
``fused_moe_kernel`` implements, with the same meta-parameters).

Import note: under ``TRITON_INTERPRET=1`` (CPU), the environment variable must be set
before this package is imported, since ``triton.jit`` reads it at decoration time.

Public API:
- :func:`remote.tuning.kernel.align.moe_align_block_size`
- :func:`remote.tuning.kernel.fused_moe.fused_moe`, :func:`~remote.tuning.kernel.fused_moe.moe_gemm`,
  :func:`~remote.tuning.kernel.fused_moe.silu_and_mul`, :func:`~remote.tuning.kernel.fused_moe.make_buffers`
- :func:`remote.tuning.kernel.reference.fused_moe_reference`, :func:`~remote.tuning.kernel.reference.route`
"""
