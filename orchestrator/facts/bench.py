"""A benchmark's result (``orch_bench_<label>``, from the payload's ``bench`` answer) and the
line of it the run summary keeps (``bench_<label>``). Produced by the ``bench`` task
(:mod:`orchestrator.tasks.bench`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schema import Record, optional


@dataclass(slots=True)
class BenchResult(Record):
    """The payload's ``bench`` answer (``remote/bench/command.py`` module docstring).

    ``levels``: one mapping per concurrency level, keyed by ``sglang.bench_serving``'s metric
    names (``max_concurrency``, ``output_throughput`` tokens/s, ``median_ttft_ms``, ``valid``,
    ``failed``, ...: the set both of the payload's tools fill, ``remote/bench/common.py``);
    ``tool`` (``builtin``/``sglang``), ``url``, ``settings`` (the effective flags) and
    ``server_version`` (what the server reports, None when it does not say) may be absent.
    """

    levels: list[dict[str, Any]] = field(default_factory=list)
    tool: str | None = optional()
    url: str | None = optional()
    settings: dict[str, Any] | None = optional()
    server_version: str | None = optional()

    def top(self) -> dict[str, Any]:
        """The level with the highest concurrency among the valid ones (among all when none is
        valid); ``{}`` without levels."""
        valid = [lv for lv in self.levels if lv.get("valid", True)]
        return max(valid or self.levels, key=lambda lv: lv.get("max_concurrency", 0)) if self.levels else {}

    def valid_levels(self) -> dict[int | None, dict[str, Any]]:
        """max_concurrency -> level, for the valid levels."""
        return {lv.get("max_concurrency"): lv for lv in self.levels if lv.get("valid", True)}

    def summary(self) -> "BenchSummary":
        """The line of :meth:`top` the run summary keeps."""
        top = self.top()
        return BenchSummary(output_throughput=top.get("output_throughput"),
                            total_throughput=top.get("total_throughput"),
                            max_concurrency=top.get("max_concurrency"), median_ttft_ms=top.get("median_ttft_ms"),
                            median_itl_ms=top.get("median_itl_ms"), valid=top.get("valid", True),
                            server_version=self.server_version)


@dataclass(slots=True)
class BenchSummary(Record):
    """A benchmark in the run summary (``bench_before``/``bench_after``/``bench_<label>``): the
    highest valid concurrency level's ``output_throughput`` and ``total_throughput`` (tokens/s),
    ``max_concurrency``, ``median_ttft_ms`` and ``median_itl_ms`` (ms), ``valid``, and the
    server's ``server_version``. None where the benchmark measured nothing."""

    output_throughput: float | None = None
    total_throughput: float | None = None
    max_concurrency: int | None = None
    median_ttft_ms: float | None = None
    median_itl_ms: float | None = None
    valid: bool = True
    server_version: str | None = None
