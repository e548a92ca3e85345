"""The host's GPUs as facts, through the host's GPU vendor (:class:`remote.gpus.GpuVendor`, the
fact ``orch_gpu_vendor``): the GPU table (index, UUID, bus id, partitions, device file) and the
device files a visible-devices value (``CUDA_VISIBLE_DEVICES`` for NVIDIA) names, and the driver's
version (what a CDI spec's driver libraries are compared with). The vendor owns
the queries and their parsing (``remote/gpus/nvidia.py`` for NVIDIA, with the recorded real outputs
it is tested on); this module runs them on the host, read-only.
"""

from __future__ import annotations

from remote.gpus import DEFAULT, GpuVendor, UnresolvedDevices  # noqa: F401  (UnresolvedDevices: for callers)


def gpu_table(query_text: str, list_text: str = "", driver_text: str = "", vendor: GpuVendor = DEFAULT) -> list:
    """The GPUs of a host from the outputs of the vendor's three table queries
    (:meth:`remote.gpus.GpuVendor.table_commands`: ``query``, ``list``, ``driver``). Pure."""
    return vendor.gpu_table({"query": query_text, "list": list_text, "driver": driver_text})


def resolve_visible_devices(value: str, gpus: list, vendor: GpuVendor = DEFAULT) -> list[str]:
    """Device files (each once, in order) of the GPUs a visible-devices value names
    (:meth:`remote.gpus.GpuVendor.resolve_visible_devices`); raises :class:`UnresolvedDevices`. Pure."""
    return vendor.resolve_visible_devices(value, gpus)


def gather_gpus(connection, vendor: GpuVendor) -> tuple[list, str | None]:
    """``(GPUs, problem)`` of the host (:meth:`remote.gpus.GpuVendor.gather`): ``problem`` says why
    the table is empty or partial (the management tool missing or failing, no driver information),
    None when complete. Read-only."""

    def run(argv: list[str]) -> tuple[bool, str, str]:
        # a query that fails is an answer: the vendor says what the table lacks then
        res = connection.run(argv, check=False, timeout=60)
        return res.ok, res.stdout, res.stderr

    return vendor.gather(run)


def driver_version(connection, vendor: GpuVendor) -> str | None:
    """The host's GPU driver version (``550.54.15``) as ``vendor`` reads it
    (:meth:`remote.gpus.GpuVendor.driver_version`: its queries, its parsing), None when it cannot
    tell. Read-only."""

    def run(argv: list[str]) -> tuple[bool, str, str]:
        # a query that fails is an answer: the vendor tries its next one, or says it cannot tell
        res = connection.run(argv, check=False, timeout=30)
        return res.ok, res.stdout, res.stderr

    return vendor.driver_version(run)
