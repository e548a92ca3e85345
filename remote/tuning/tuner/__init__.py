"""Fused-MoE config tuner: search spaces (``space``), timing (``timing``), the per-batch-size
search (``search``), parallel compilation (``compile``), checkpoints (``checkpoint``) and
the multi-GPU driver (``driver``). The ``tune`` command (``remote/tuning/command.py``) wires them up.
"""
