"""The fused-MoE Triton tile config format shared by the engines that read it (standard library only).

- :mod:`remote.engines.triton_moe.configfile`: config JSON validation, reading and writing.
"""
