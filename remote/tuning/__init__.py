"""The ``tune`` command and what it needs: torch, triton and the fused-MoE kernel.

- :mod:`remote.tuning.command`: the command (imports torch/triton only when it runs);
- :mod:`remote.tuning.support`: what the tuner can run and which kernel ``auto`` picks,
  standard library only (the probe reports these answers);
- :mod:`remote.tuning.kernel`: orch's own Triton fused-MoE kernel and its float64 reference;
- :mod:`remote.tuning.providers`: what is timed (builtin kernel or SGLang's);
- :mod:`remote.tuning.tuner`: search spaces, timing, search, checkpoints, per-GPU workers.

This package's ``__init__`` imports nothing, so ``remote.tuning.support`` loads without torch.
"""
