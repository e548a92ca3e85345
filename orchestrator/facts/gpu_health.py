"""The payload's ``xid`` answer as typed facts (``orch_gpu_health``): the kernel log's NVIDIA Xid
lines and whether ``nvidia-smi`` answers in time, read at the probe and again after the tune.

The fields and their meaning are the payload's (``remote/host/xid.py`` module docstring);
:meth:`GpuHealth.parse` refuses an answer that lacks one or carries one it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from remote.gpus import GpuVendor

from .schema import Record


@dataclass(slots=True)
class Xid(Record):
    """One ``NVRM: Xid`` kernel log line: ``pci`` (``0000:18:00``), ``code`` (the Xid number),
    ``text`` (the rest of the line), ``time_s`` (seconds since boot; None: no stamp), ``fatal``
    (the GPU is lost until a reset, ``remote.gpus.nvidia.FATAL_XIDS``)."""

    pci: str
    code: int
    text: str
    time_s: float | None
    fatal: bool

    def key(self) -> tuple:
        """What tells two log lines apart (the same line read twice is one Xid)."""
        return (self.pci, self.code, self.text, self.time_s)

    def describe(self, vendor: GpuVendor) -> str:
        """The line in the words of the host's GPU vendor (``Xid 79 on 0000:18:00 (at 1234.5 s):
        GPU has fallen off the bus.``: :meth:`remote.gpus.GpuVendor.describe_error`)."""
        return vendor.describe_error(self.code, self.pci, self.time_s, self.text)


@dataclass(slots=True)
class SmiGpu(Record):
    """One GPU as ``nvidia-smi --query-gpu=index,uuid,mig.mode.current`` printed it; ``uuid`` and
    ``mig_mode`` None where it printed ``[N/A]`` or ``[Insufficient Permissions]``."""

    index: int
    uuid: str | None
    mig_mode: str | None


@dataclass(slots=True)
class SmiState(Record):
    """Whether ``nvidia-smi`` answered within its deadline: ``state`` (``ok``, ``failed``,
    ``timeout``, ``hung``, ``missing``, ``absent``, ``disabled``), ``reason`` (a sentence unless
    ``ok``), ``gpus`` and ``mig`` (a GPU in MIG mode)."""

    state: str
    reason: str
    gpus: list[SmiGpu] = field(default_factory=list)
    mig: bool = False

    @property
    def not_answering(self) -> bool:
        """True when nvidia-smi is there but did not answer in time (``timeout`` or ``hung``)."""
        return self.state in ("timeout", "hung")


@dataclass(slots=True)
class GpuHealth(Record):
    """The payload's ``xid`` answer: ``source`` of the kernel log (``dmesg``, ``/dev/kmsg``;
    None: unreadable, ``source_problem`` says why), its ``xids`` and ``nvidia_smi``."""

    source: str | None
    source_problem: str | None
    xids: list[Xid] = field(default_factory=list)
    nvidia_smi: SmiState = field(default_factory=lambda: SmiState("disabled", ""))

    def fatal(self) -> list[Xid]:
        """The Xids after which a GPU is lost."""
        return [x for x in self.xids if x.fatal]

    def new_fatal(self, before: "GpuHealth | None") -> list[Xid]:
        """The fatal Xids not already in ``before`` (the probe's reading; None: all are new)."""
        seen = {x.key() for x in (before.xids if before is not None else [])}
        return [x for x in self.fatal() if x.key() not in seen]
