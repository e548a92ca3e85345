"""GPU vendors behind one interface: everything orch needs to know of the GPUs' maker, in one object
per vendor, chosen once per host and carried as a typed fact (``orch_gpu_vendor``, set by the
``probe`` task from the device name the engine sees). Standard library only: the payload's host
commands (``reap``, ``xid``, ``runner_change``) and the controller use the same objects; the
controller imports them through this package (its facade), never a vendor's module.

A vendor (:class:`GpuVendor`) says:

- which device names are its own, as the engine sees them (torch's ``get_device_name()``, NVML's
  name; e.g. ``NVIDIA H200``; ``AMD Instinct MI300X`` for ROCm): :meth:`GpuVendor.names_device`;
- its management tool (``nvidia-smi``; ``amd-smi``) and the queries orch makes of it, each under a
  deadline (:func:`remote.host.bounded.run_bounded`): health (:meth:`GpuVendor.health`), the
  compute processes (:meth:`GpuVendor.compute_apps`), the GPU table with partitions and device
  numbers (:meth:`GpuVendor.table_commands`, :meth:`GpuVendor.gpu_table`);
- its device files (``/dev/nvidiaN``; ``/dev/kfd``, ``/dev/dri/renderD*``) and who may hold them
  without being a leftover (its persistence daemon, its monitoring): :attr:`GpuVendor.device_glob`,
  :attr:`GpuVendor.gpu_device_glob`, :meth:`GpuVendor.device_file`, :attr:`GpuVendor.protected_processes`;
- the variable that selects GPUs for a process (``CUDA_VISIBLE_DEVICES``; ``HIP_VISIBLE_DEVICES``)
  and how its entries map to device files (:meth:`GpuVendor.resolve_visible_devices`), including
  partitions (MIG) that share their GPU's file (:meth:`GpuVendor.names_partition`);
- its kernel log error lines (Xid) and which of them lose a GPU (:meth:`GpuVendor.errors_in_log`,
  :meth:`GpuVendor.describe_error`);
- its container toolkit, whose hooks a ``systemctl daemon-reload`` can undo
  (:attr:`GpuVendor.container_toolkit_paths`), its CDI device kind (:attr:`GpuVendor.cdi_kind`), the
  command that regenerates its CDI spec (:meth:`GpuVendor.cdi_generate_command`,
  :attr:`GpuVendor.cdi_spec_file`, :attr:`GpuVendor.cdi_list_command`) and the driver's version that
  spec must match (:meth:`GpuVendor.driver_version`).

:data:`VENDORS` lists the vendors orch knows; :func:`vendor_for` picks one for a device name. A
second vendor is one more module here (``rocm.py``: ``amd-smi``, ``/dev/kfd``,
``/dev/dri/renderD*``, ``HIP_VISIBLE_DEVICES``, names like ``AMD_Instinct_MI300X``) and one entry
in :data:`VENDORS`.
"""

from __future__ import annotations

from .base import GpuVendor, Runner, ToolFailed, UnresolvedDevices  # noqa: F401  (the facade)
from .nvidia import NVIDIA

#: every vendor orch knows, the first the default (where no device name tells)
VENDORS: tuple[GpuVendor, ...] = (NVIDIA,)
#: the vendor of a host whose device name is unknown or names no known vendor: NVIDIA, the only one
#: orch supported before this seam, so such a host is handled as before
DEFAULT = VENDORS[0]


def vendor_named(name: str, vendors: tuple[GpuVendor, ...] | None = None) -> GpuVendor:
    """The vendor called ``name`` (``nvidia``); raises ValueError naming the known ones."""
    for v in vendors or VENDORS:
        if v.name == name:
            return v
    raise ValueError(f"unknown GPU vendor {name!r} (known: {', '.join(v.name for v in vendors or VENDORS)})")


def vendor_for(device_name: str | None, vendors: tuple[GpuVendor, ...] | None = None) -> GpuVendor:
    """The vendor of the GPU called ``device_name`` (as the engine sees it: ``NVIDIA H200``,
    ``NVIDIA_H200``): the first of ``vendors`` (default :data:`VENDORS`) whose
    :meth:`GpuVendor.names_device` says so; the first of them when none does or no name is known."""
    pool = vendors or VENDORS
    if device_name:
        for v in pool:
            if v.names_device(device_name):
                return v
    return pool[0]


def local_vendor(vendors: tuple[GpuVendor, ...] | None = None) -> GpuVendor:
    """On a host (payload side): the vendor whose device files exist here, else :data:`DEFAULT`."""
    import glob

    pool = vendors or VENDORS
    for v in pool:
        if glob.glob(v.device_glob):
            return v
    return pool[0]
