"""Fused-MoE config tuner: search spaces (``space``), timing (``timing``), the per-batch-size
search (``search``), parallel compilation (``compile``), checkpoints (``checkpoint``), the
multi-GPU driver (``driver``) and the events it reports (``events``). The ``tune`` command
(``remote/tuning/command.py``) wires them up. Nothing here imports a provider module: what is
timed and compiled comes from the provider ``remote.tuning.providers`` resolves.
"""
