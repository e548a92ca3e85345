"""What the tuner reports while it runs: one record per kind of event (stdlib only).

:func:`remote.tuning.tuner.driver.tune_on_device` passes these to its ``emit`` callback, and
:func:`~remote.tuning.tuner.driver.tune_parallel` relays them from its GPU worker processes
(they cross a ``multiprocessing`` queue, so they are plain picklable records). The ``tune``
command (``remote/tuning/command.py``) turns them into protocol lines: :class:`Progress` and
:class:`Done` into ``progress`` lines, :class:`Log` into ``log`` lines, :class:`Error` and
:class:`Fatal` into the final ``error`` (docs/protocol.md); their wire format is the command's,
not these records'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class Progress:
    """The search of batch size ``batch_size`` (M, tokens) has a new best candidate, timed at
    ``best_us`` microseconds (the whole fused MoE, or the sum of the up and down GEMMs)."""

    batch_size: int
    best_us: float


@dataclass(frozen=True)
class Log:
    """A message for the operator; ``level`` is ``debug``, ``info``, ``warning`` or ``error``."""

    msg: str
    level: str = "info"


@dataclass(frozen=True)
class Done:
    """Batch size ``batch_size`` is tuned: ``result`` holds its ``up`` and ``down`` configs, their
    times in microseconds (``tuned_us``, ``default_us``, ``shipped_us``), the speedups and the
    correctness check (``rel_err``, ``rel_err_bar``); the tune command checkpoints it as is."""

    batch_size: int
    result: dict[str, Any]


@dataclass(frozen=True)
class Error:
    """Batch size ``batch_size`` failed (``None``: a whole worker did); ``text`` says why. The
    other batch sizes go on; the tune ends with a ``runtime`` error naming the failed ones."""

    batch_size: int | None
    text: str


@dataclass(frozen=True)
class Fatal:
    """Out of GPU memory at batch size ``batch_size`` outside any candidate (inputs, buffers or
    the correctness check): the device stops and :func:`~remote.tuning.tuner.driver.tune_parallel`
    ends every worker. ``text`` is the message, ``traceback`` the formatted traceback (its last
    4000 characters) that the tune command writes to stderr."""

    batch_size: int
    text: str
    traceback: str = ""


@dataclass(frozen=True)
class WorkerExit:
    """A GPU worker process of :func:`~remote.tuning.tuner.driver.tune_parallel` has finished
    (``device``: its ``cuda:i``); internal to the driver, never passed to ``emit``."""

    device: str


#: Any event ``emit`` receives.
Event = Union[Progress, Log, Done, Error, Fatal]
