"""The fused-MoE Triton tile config format shared by the engines that read it (standard library only).

- :mod:`remote.engines.triton_moe.configfile`: config JSON validation, reading and writing;
- :mod:`remote.engines.triton_moe.shape`: the fused-MoE GEMM shape record (E, N, top-k, name selectors).
"""
