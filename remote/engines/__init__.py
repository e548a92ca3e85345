"""The inference engines orch tunes for, each in a folder of its own (standard library only).

- :mod:`remote.engines.triton_moe`: what every engine that runs the fused-MoE Triton kernel with
  per-shape JSON tile configs shares (the config format and its validation);
- :mod:`remote.engines.sglang`: SGLang's rules (file names, model shapes, loader search, log
  lines, server flags, MoE runner selection, FlashInfer autotune).

With :mod:`remote.protocol`, the only part of ``remote`` that ``orchestrator`` may import.
"""
