"""The ``bench`` command: throughput against the unit's own URL (standard library only).

- :mod:`remote.bench.builtin`: orch's own HTTP client and the command;
- :mod:`remote.bench.sglang_tool`: SGLang's ``python -m sglang.bench_serving`` per level.
"""
