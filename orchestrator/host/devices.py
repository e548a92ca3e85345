"""The GPU device files of the unit's own GPUs (reap ends leftovers on them; doctor lists their
holders)."""

from __future__ import annotations

from ..facts.gpus import UnresolvedDevices, gather_gpus, resolve_visible_devices

ALL_GPUS = "/dev/nvidia[0-9]*"


def unit_gpu_devices(ctx) -> tuple[str | None, str]:
    """Device files of the GPUs the unit uses, comma separated, for the reaper, and how they were
    found: ``(devices or None, why)``.

    ``CUDA_VISIBLE_DEVICES`` of the unit (its effective environment, EnvironmentFile= included)
    unset -> every GPU node (``/dev/nvidia[0-9]*``); indices -> ``/dev/nvidiaN`` for those; GPU or
    MIG UUIDs -> the device files nvidia-smi maps them to (:mod:`orchestrator.facts.gpus`; a MIG
    device is on its parent GPU's file). When they cannot be mapped (no nvidia-smi, an entry that
    names no GPU) the devices are None: reap nothing rather than every GPU (another unit's
    processes would be hit). Never ``nvidiactl``/``nvidia-uvm``: every CUDA process on the host
    holds those, so they say nothing about who uses these GPUs.
    """
    env = ctx.facts.environment
    if "CUDA_VISIBLE_DEVICES" not in env:
        return ALL_GPUS, "CUDA_VISIBLE_DEVICES unset: every GPU of the host"
    cvd = str(env["CUDA_VISIBLE_DEVICES"]).strip()
    entries = [p.strip() for p in cvd.split(",")]
    gpus, problem = [], None
    if not all(e.isdigit() for e in entries):
        gpus, problem = gather_gpus(ctx.connection)
        if not gpus:
            return None, f"CUDA_VISIBLE_DEVICES={cvd} names GPUs by UUID and {problem or 'nvidia-smi lists no GPU'}"
    try:
        devices = resolve_visible_devices(cvd, gpus)
    except UnresolvedDevices as exc:
        return None, str(exc)
    why = f"CUDA_VISIBLE_DEVICES={cvd}" + (f" ({problem})" if problem else "")
    return ",".join(devices), why
