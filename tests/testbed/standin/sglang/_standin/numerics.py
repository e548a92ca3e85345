"""What the stand-in SGLang answers, beyond its fixed token pattern (orch test bed, issue 32 rows 3-5).

A stand-in for a model and its MoE runner's numerics, not SGLang code:

- known answers: a prompt that asks for a product or a sum of two integers (``What is 17 multiplied
  by 23?``, ``12 plus 30``) or to extract the year from a quoted text (``Extract the year from: "..."``)
  is answered with the right value first (``" 391"``), as any working model would, then the usual
  tokens. The answer's characters are token ids ``VOCAB + ord(c)`` (:func:`token_text`), so a
  runner whose tokens are shifted answers it wrong.
- ``ORCH_STANDIN_NONDETERMINISTIC_RUNNERS="runner=K,..."``: a correct runner that is not
  deterministic at temperature 0 (FlashInfer CUTLASS MoE, sglang #10785): for one check prompt in
  about K (those whose text hashes to 0 mod K, :func:`unstable`), the tokens of the answer's second
  half come in one of two variants, alternating from one request of that prompt to the next within
  a start, and each start of a listed runner begins on the other variant than the listed runner's
  start before (such starts counted in ``$ORCH_STANDIN_STATE_DIR/starts``): two passes of one start
  disagree on those prompts, and so do the same passes of two such starts in a row. The answer's first half (a known answer) never varies.
- ``ORCH_STANDIN_WRONG_BATCHED_RUNNERS="runner,..."``: tokens made while more than one request
  decodes are wrong (shifted by one); ``ORCH_STANDIN_WRONG_SINGLE_RUNNERS``: tokens made while only
  one does are (ROCm/aiter #4041, #4788: wrong only batched, or only at batch size 1).
- ``ORCH_STANDIN_CRASH_ON_REQUEST="runner,..."``: the scheduler dies on the first generation
  request of a start (sglang #27951): it logs SGLang 0.5.23's ``Scheduler hit an exception`` and
  ``Received sigquit from a child process`` lines (``managers/scheduler.py``,
  ``entrypoints/engine.py``) and the process is killed, as ``kill_process_tree`` ends it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
from typing import Dict, Optional

VOCAB = 151936
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs")
_MUL = re.compile(r"(\d+)\s*(?:multiplied by|times|\*|×)\s*(\d+)", re.I)
_ADD = re.compile(r"(\d+)\s*(?:plus|\+)\s*(\d+)", re.I)
_YEAR = re.compile(r"extract the year[^\"]*\"([^\"]*)\"", re.I)


def listed(name: str, runner: str) -> bool:
    """``runner`` is in the comma-separated ``$name``."""
    return runner in {x.strip() for x in os.environ.get(name, "").split(",") if x.strip()}


def listed_value(name: str, runner: str) -> Optional[int]:
    """The ``K`` of ``runner=K`` in ``$name`` (None when the runner is not listed)."""
    for item in os.environ.get(name, "").split(","):
        key, _, value = item.strip().partition("=")
        if key == runner and value.strip():
            return max(1, int(value))
    return None


def known_answer(prompt: str) -> Optional[str]:
    """The value a working model answers ``prompt`` with (module docstring), None when it asks none."""
    m = _MUL.search(prompt)
    if m:
        return str(int(m.group(1)) * int(m.group(2)))
    m = _ADD.search(prompt)
    if m:
        return str(int(m.group(1)) + int(m.group(2)))
    m = _YEAR.search(prompt)
    if m:
        year = re.search(r"\b(1\d{3}|20\d{2})\b", m.group(1))
        return year.group(1) if year else None
    return None


def answer_ids(prompt: str) -> list:
    """The token ids of the known answer (``" 391"``), [] when none."""
    value = known_answer(prompt)
    return [VOCAB + ord(c) for c in " " + value] if value else []


def token_text(token_id: int) -> str:
    """The text of one output token: a character of a known answer, else a word."""
    if token_id >= VOCAB:
        return chr(token_id - VOCAB)
    return " " + WORDS[token_id % len(WORDS)]


def unstable(prompt: str, k: int) -> bool:
    """One prompt in about ``k`` (by its text's SHA-256) has two answers (module docstring)."""
    return int(hashlib.sha256(prompt.encode("utf-8")).hexdigest(), 16) % k == 0


def count_start(state_dir: str) -> int:
    """This start's number (1, 2, ...), counted in ``state_dir/starts``."""
    path = os.path.join(state_dir, "starts")
    try:
        with open(path) as f:
            n = int(f.read().strip() or 0) + 1
    except (OSError, ValueError):
        n = 1
    with open(path, "w") as f:
        f.write(str(n))
    return n


class Numerics:
    """The runner's answers (module docstring): ``runner`` (the effective MoE runner), ``start`` (this
    start's number)."""

    def __init__(self, runner: str, start: int = 0):
        self.runner = runner
        self.start = start
        self.unstable_k = listed_value("ORCH_STANDIN_NONDETERMINISTIC_RUNNERS", runner)
        self.wrong_batched = listed("ORCH_STANDIN_WRONG_BATCHED_RUNNERS", runner)
        self.wrong_single = listed("ORCH_STANDIN_WRONG_SINGLE_RUNNERS", runner)
        self.crash = listed("ORCH_STANDIN_CRASH_ON_REQUEST", runner)
        self.seen: Dict[str, int] = {}

    def variant(self, prompt: Optional[str]) -> int:
        """0, or 1 for the other answer of an unstable prompt (this request of it)."""
        if not self.unstable_k or prompt is None or not unstable(prompt, self.unstable_k):
            return 0
        n = self.seen[prompt] = self.seen.get(prompt, 0) + 1
        return (n + self.start) % 2

    def shift(self, active: int) -> int:
        """How far a token made with ``active`` requests decoding is off (0: right)."""
        if self.wrong_batched and active > 1:
            return 1
        if self.wrong_single and active <= 1:
            return 1
        return 0

    def die(self) -> None:
        """The scheduler's crash on a request (``ORCH_STANDIN_CRASH_ON_REQUEST``): never returns."""
        logging.getLogger("sglang.srt.managers.scheduler").error(
            "Scheduler hit an exception: Traceback (most recent call last):\n"
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered (stand-in: "
            f"ORCH_STANDIN_CRASH_ON_REQUEST, runner {self.runner})")
        logging.getLogger("sglang.srt.entrypoints.engine").error(
            "Received sigquit from a child process. It usually means the child failed.")
        for h in logging.getLogger().handlers:
            h.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree includes the server process
