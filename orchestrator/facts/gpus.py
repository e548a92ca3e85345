"""The host's GPUs as facts: index, UUID, PCI bus id, MIG devices, device file (``/dev/nvidiaN``).

Gathered with ``nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`` and
``nvidia-smi -L`` (MIG devices under their GPU), plus the driver's
``/proc/driver/nvidia/gpus/<bus id>/information`` (``Device Minor: N``: the N of ``/dev/nvidiaN``;
nvidia-smi's index follows the PCI order, the minor number the driver's probe order, which
usually agree). Without that file the minor number is taken to be the index (said in the
result). Recorded real outputs: ``tests/unit/facts/cases/gpus.visible_devices.json``.

:func:`resolve_visible_devices` maps a ``CUDA_VISIBLE_DEVICES`` value (indices, ``GPU-<uuid>``,
``MIG-<uuid>`` or the older ``MIG-GPU-<uuid>/<gi>/<ci>``; CUDA also accepts a unique prefix of a
UUID) to device files; a MIG device lives on its parent GPU's ``/dev/nvidiaN``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import internal_error


@dataclass
class Gpu:
    """One GPU: nvidia-smi ``index``, ``uuid`` (``GPU-...``), ``pci_bus_id`` (as nvidia-smi prints
    it, ``00000000:18:00.0``), ``minor`` (N of ``/dev/nvidiaN``; None when unknown), ``mig``: UUIDs
    of its MIG devices (``MIG-...``)."""

    index: int
    uuid: str
    pci_bus_id: str
    minor: int | None = None
    mig: list[str] = field(default_factory=list)

    @property
    def device(self) -> str:
        """``/dev/nvidiaN`` (N: the minor number, else the index)."""
        return f"/dev/nvidia{self.minor if self.minor is not None else self.index}"


def parse_query_gpu(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`` -> GPUs (lines that
    are not three comma-separated fields with an integer index are ignored). Pure."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[1].startswith("GPU-"):
            out.append(Gpu(int(parts[0]), parts[1], parts[2]))
    return out


_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[0-9A-Fa-f-]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG\s.*\(UUID:\s*(MIG-[^)\s]+)\)")


def parse_list_gpus(text: str) -> dict[int, tuple[str, list[str]]]:
    """``nvidia-smi -L`` -> ``{index: (GPU uuid, [MIG uuids listed under it])}``. Pure."""
    out: dict[int, tuple[str, list[str]]] = {}
    current: int | None = None
    for line in text.splitlines():
        m = _GPU_LINE.match(line)
        if m:
            current = int(m.group(1))
            out[current] = (m.group(2), [])
            continue
        m = _MIG_LINE.match(line)
        if m and current is not None:
            out[current][1].append(m.group(1))
    return out


def parse_driver_info(text: str) -> dict[str, int]:
    """The concatenated ``/proc/driver/nvidia/gpus/*/information`` files -> ``{key: minor}`` where
    the keys of each GPU are its ``GPU UUID:`` and its ``Bus Location:`` (lower case, 4-digit
    domain), the minor its ``Device Minor:``. Each file starts with its ``Model:`` line. Pure."""
    out: dict[str, int] = {}
    block: dict[str, str] = {}

    def flush() -> None:
        minor = block.get("Device Minor", "")
        if minor.isdigit():
            for k in ("GPU UUID", "Bus Location"):
                if block.get(k):
                    out[normalize_bus_id(block[k]) if k == "Bus Location" else block[k]] = int(minor)

    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "Model" and block:
            flush()
            block = {}
        block[key] = value.strip()
    flush()
    return out


def normalize_bus_id(bus: str) -> str:
    """A PCI bus id in the driver's form (``0000:18:00.0``, lower case) from nvidia-smi's
    (``00000000:18:00.0``) or the driver's. Pure."""
    bus = bus.strip().lower()
    dom, sep, rest = bus.partition(":")
    if not sep:
        return bus
    try:
        return f"{int(dom, 16):04x}:{rest}"
    except ValueError:
        return bus


def gpu_table(query_text: str, list_text: str = "", driver_text: str = "") -> list[Gpu]:
    """The GPUs of a host from the three outputs above (minor numbers and MIG devices where
    known). Pure."""
    gpus = parse_query_gpu(query_text)
    listed = parse_list_gpus(list_text)
    minors = parse_driver_info(driver_text)
    for g in gpus:
        g.minor = minors.get(g.uuid, minors.get(normalize_bus_id(g.pci_bus_id)))
        if g.index in listed and listed[g.index][0] == g.uuid:
            g.mig = list(listed[g.index][1])
    return gpus


@internal_error("orchestrator.tasks.reap catches it and reaps nothing, saying why")
class UnresolvedDevices(ValueError):
    """A ``CUDA_VISIBLE_DEVICES`` entry names no GPU of the host (the message says which)."""


def resolve_visible_devices(cvd: str, gpus: list[Gpu]) -> list[str]:
    """Device files (``/dev/nvidiaN``, each once, in order) of the GPUs a ``CUDA_VISIBLE_DEVICES``
    value ``cvd`` names. Indices need no table (``/dev/nvidia<index>``, or the GPU's minor number
    when ``gpus`` knows it); ``GPU-``/``MIG-`` UUIDs (or unique prefixes, as CUDA accepts) need
    ``gpus``. CUDA stops at the first entry it cannot use; so does this, raising
    :class:`UnresolvedDevices` naming it (a caller then reaps nothing). Pure."""
    out: list[str] = []
    by_index = {g.index: g for g in gpus}
    for raw in cvd.split(","):
        e = raw.strip()
        if not e:
            raise UnresolvedDevices(f"empty entry in CUDA_VISIBLE_DEVICES={cvd!r}")
        if e.isdigit():
            g = by_index.get(int(e))
            dev = g.device if g is not None else f"/dev/nvidia{int(e)}"
        else:
            g = _by_uuid(e, gpus)
            if g is None:
                raise UnresolvedDevices(f"CUDA_VISIBLE_DEVICES entry {e!r} matches no GPU or MIG device that "
                                        f"nvidia-smi lists on the host ({len(gpus)} GPU(s))")
            dev = g.device
        if dev not in out:
            out.append(dev)
    return out


def _by_uuid(entry: str, gpus: list[Gpu]) -> Gpu | None:
    if entry.startswith("MIG-GPU-"):  # R450/R460 form: MIG-GPU-<gpu uuid>/<gi>/<ci>
        parent = entry[len("MIG-"):].split("/", 1)[0]
        hits = [g for g in gpus if g.uuid == parent]
        return hits[0] if len(hits) == 1 else None
    if entry.startswith("MIG-"):
        hits = [g for g in gpus if any(m.startswith(entry) for m in g.mig)]
    elif entry.startswith("GPU-"):
        hits = [g for g in gpus if g.uuid.startswith(entry)]
    else:
        return None
    return hits[0] if len(hits) == 1 else None


#: the driver's per-GPU information files, printed one after another (no host data in the command)
DRIVER_INFO_SCRIPT = 'for f in /proc/driver/nvidia/gpus/*/information; do [ -r "$f" ] && cat "$f"; done; exit 0'


def gather_gpus(connection) -> tuple[list[Gpu], str | None]:
    """``(GPUs, problem)`` of the host: ``problem`` says why the table is empty or partial
    (nvidia-smi missing or failing; no driver information, so minor numbers are assumed to be
    the indices), None when complete. Read-only."""
    q = connection.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                       check=False, timeout=60)
    if not q.ok:
        return [], f"nvidia-smi --query-gpu failed: {(q.stderr or q.stdout).strip()[:200] or 'exit ' + str(q.exited)}"
    lst = connection.run(["nvidia-smi", "-L"], check=False, timeout=60)
    drv = connection.run(["sh", "-c", DRIVER_INFO_SCRIPT], check=False, timeout=30)
    gpus = gpu_table(q.stdout, lst.stdout if lst.ok else "", drv.stdout if drv.ok else "")
    problem = None
    if gpus and any(g.minor is None for g in gpus):
        problem = "no /proc/driver/nvidia/gpus information: /dev/nvidiaN taken to be nvidia-smi's index N"
    return gpus, problem
