"""The ``bench`` command: throughput against the unit's own URL (standard library only).

- :mod:`remote.bench.command`: the command (flags, result ``data``), picks the client;
- :mod:`remote.bench.common`: what the clients share (metric names, validity rule, ``--url``);
- :mod:`remote.bench.builtin`: orch's own HTTP client;
- an engine's own client (``Engine.bench_tool``): :mod:`remote.engines.sglang.bench_tool` (SGLang's
  ``python -m sglang.bench_serving``), :mod:`remote.engines.vllm.bench_tool` (``vllm bench serve``),
  once per level.
"""
