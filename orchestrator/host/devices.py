"""The GPU device files of the unit's own GPUs (reap ends leftovers on them; doctor lists their
holders), through the host's GPU vendor (``ctx.facts.vendor``, :class:`remote.gpus.GpuVendor`)."""

from __future__ import annotations

from ..facts.gpus import UnresolvedDevices, gather_gpus, resolve_visible_devices


def all_gpus(ctx) -> str:
    """Every GPU device file of the host (the vendor's glob of the GPUs' own files)."""
    return ctx.facts.vendor.gpu_device_glob


def unit_gpu_devices(ctx) -> tuple[str | None, str]:
    """Device files of the GPUs the unit uses, comma separated, for the reaper, and how they were
    found: ``(devices or None, why)``.

    The vendor's visible-devices variable of the unit (``CUDA_VISIBLE_DEVICES`` for NVIDIA; its
    effective environment, EnvironmentFile= included) unset -> every GPU node (:func:`all_gpus`);
    indices -> those GPUs' device files; GPU or partition UUIDs -> the device files the vendor's
    GPU table maps them to (:mod:`orchestrator.facts.gpus`; a partition is on its parent GPU's
    file). When they cannot be mapped (no management tool, an entry that names no GPU) the devices
    are None: reap nothing rather than every GPU (another unit's processes would be hit). Never the
    vendor's shared control files: every process of its runtime holds those, so they say nothing
    about who uses these GPUs.
    """
    vendor = ctx.facts.vendor
    name = vendor.visible_devices_env
    env = ctx.facts.environment
    if name not in env:
        return all_gpus(ctx), f"{name} unset: every GPU of the host"
    cvd = str(env[name]).strip()
    entries = [p.strip() for p in cvd.split(",")]
    gpus, problem = [], None
    if not all(e.isdigit() for e in entries):
        gpus, problem = gather_gpus(ctx.connection, vendor)
        if not gpus:
            return None, f"{name}={cvd} names GPUs by UUID and {problem or vendor.smi + ' lists no GPU'}"
    try:
        devices = resolve_visible_devices(cvd, gpus, vendor)
    except UnresolvedDevices as exc:
        return None, str(exc)
    why = f"{name}={cvd}" + (f" ({problem})" if problem else "")
    return ",".join(devices), why
