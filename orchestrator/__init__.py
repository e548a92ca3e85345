"""orch: retune SGLang fused-MoE Triton kernels across a fleet of GPU hosts, safely."""

__version__ = "0.1.0"
