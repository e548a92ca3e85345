"""The runner trial's table (``orch_runner_trial``, ``orch tune --moe-runners``): one row per MoE
runner started, with its throughput, its output agreement with the unit's runner, and whether it
was kept. Produced by the ``runner_trial`` task (:mod:`orchestrator.tasks.runner_trial`), kept in
the run summary (``runner_trial``), shown by the recap (:mod:`orchestrator.ui`) and the HTML report.

Definitions (also in ``docs/runners-trial.md``):

- ``agreement``: the share of the check prompts whose greedy answer (temperature 0,
  ``max_new_tokens`` fixed), asked one at a time, under the candidate is identical, token for
  token, to the answer under the unit's runner before the trial (the reference);
  ``batch_agreement``: the same for the prompts sent at once as one concurrent batch.
- ``self_agreement``: the reference's agreement with itself, its one-at-a-time answers against its
  batch answers (two passes): a non-deterministic (or batch-variant) runner agrees with itself on
  less than every prompt. A candidate passes when both its agreements reach ``min_agreement``
  percent of ``self_agreement`` and it gets every known answer the reference got in both passes
  (``known_missed`` lists the ones it did not).
- ``tokens_per_s``: output tokens/s per concurrency level of the benchmark (``orch_bench_*``
  settings); the candidates are ranked by the value at the highest concurrency valid for all.
- ``kept``: the fastest passing candidate, when it beats the reference by more than ``min_gain_pct``
  percent; else the unit keeps its runner (``kept`` is the reference row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .schema import OPTIONAL, Record, optional


@dataclass(slots=True)
class RunnerCandidate(Record):
    """One row: ``runner`` (``--moe-runner-backend`` value), ``reference`` (the unit's runner as it
    was), ``tokens_per_s`` (concurrency, as text -> output tokens/s), ``agreement`` (0..1, None
    when not measured), ``passed`` (output check), ``kept``, ``why`` (the reason it was not kept,
    or kept), ``log_runner`` (the runner the start's log names), ``ready_s`` (seconds to ready),
    ``triton_files`` (the Triton candidate started on config files the trial installed: ``tuned``
    by this run, or from the controller's ``store``; None: on the files the host had),
    ``batch_agreement`` (0..1: its concurrent batch's answers against the reference's),
    ``known_missed`` (the check prompts with a known answer it missed, ``"PROMPT -> ANSWER"``),
    ``crashed`` (the server died during its output check or benchmark: the log's last lines)."""

    runner: str
    reference: bool = False
    tokens_per_s: dict[str, float | None] = field(default_factory=dict)
    agreement: float | None = None
    passed: bool = False
    kept: bool = False
    why: str = ""
    log_runner: str | None = optional()
    ready_s: float | None = optional()
    triton_files: str | None = optional()
    batch_agreement: float | None = optional()
    known_missed: list[str] = field(default_factory=list, metadata={OPTIONAL: True})
    crashed: str | None = optional()

    def top(self) -> float | None:
        """Output tokens/s at the highest concurrency measured (None when none was)."""
        vals = [(int(c), v) for c, v in self.tokens_per_s.items() if v is not None]
        return max(vals)[1] if vals else None


@dataclass(slots=True)
class RunnerTrial(Record):
    """The whole trial of one host: ``reference`` (the unit's runner before, ``--moe-runner-backend``
    value or ``auto``), ``candidates`` (rows, the reference first), ``kept`` (the runner the unit
    runs after the trial), ``changed`` (a drop-in now sets it), ``min_agreement`` (0..1),
    ``min_gain_pct`` (percent), ``prompts`` (how many check prompts), ``max_new_tokens``,
    ``dropin`` (the file the kept runner is set in: orch's drop-in, or the unit's own ``EnvironmentFile=``/``--config`` file), ``measured_on`` (the host of its tuning group whose trial
    measured the table and the verdict this host reuses; None: measured here), ``group_key`` (the
    trial group this host measures for, its verdict published under it), ``measuring_failed``
    (this host was to reuse a verdict, but the measuring host of its group failed before it gave
    one: ``"HOST: cause"``; the table was then measured here), ``self_agreement`` (0..1, the
    reference's one-at-a-time answers against its batch answers), ``known_answers`` (check prompts
    with a known answer) and ``known_checked`` (those the reference got in both passes: each
    candidate must get them too), ``autotune_hangs`` (starts whose autotune on a warm cache hung:
    the cache was put back as before the run and the unit started again)."""

    reference: str
    candidates: list[RunnerCandidate] = field(default_factory=list)
    kept: str = ""
    changed: bool = False
    min_agreement: float = 1.0
    min_gain_pct: float = 3.0
    prompts: int = 0
    max_new_tokens: int = 0
    dropin: str = ""
    measured_on: str | None = optional()
    measuring_failed: str | None = optional()
    group_key: str | None = optional()
    self_agreement: float | None = optional()
    known_answers: int = optional(0)
    known_checked: int = optional(0)
    autotune_hangs: int = optional(0)

    def required(self) -> float:
        """The agreement (0..1) a candidate needs: ``min_agreement`` percent of ``self_agreement``."""
        return float(self.min_agreement) / 100.0 * (1.0 if self.self_agreement is None else self.self_agreement)


@dataclass(slots=True)
class RunnerTritonFiles(Record):
    """The Triton config files the trial's ``triton`` candidate runs on (``orch_runner_triton``,
    task ``runner_triton_files``), by the rule ``orch tune`` decides with: ``action`` ``current``
    (the controller's store holds this host's tuning key and those bytes are installed: no tune,
    no install), ``install`` (the store's files differ from the installed ones: installed before
    the candidate starts, no tune) or ``tune`` (no stored result, or ``--retune``: tuned with the
    unit stopped, then installed); ``none`` when the tuner cannot run these weights (``reason``):
    the candidate runs on the files the host has. ``paths``: role -> the file the server reads;
    ``install_dir``: their folder (``orch_plan``)."""

    action: str
    reason: str = ""
    install_dir: str = ""
    paths: dict[str, str] = field(default_factory=dict)
