"""The GPU vendor interface (:class:`GpuVendor`) and what every vendor shares; the package
(:mod:`remote.gpus`) says what a vendor is and picks one. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

from ..protocol import internal_error

#: ``run(argv) -> (ok, stdout, stderr)``: how the controller lets a vendor's query run on a host
#: (its connection, read-only); the vendor owns the command and the parsing of its answer
Runner = Callable[[list], "tuple[bool, str, str]"]


@internal_error("orchestrator.tasks.reap catches it and reaps nothing, saying why")
class UnresolvedDevices(ValueError):
    """A visible-devices entry (``CUDA_VISIBLE_DEVICES``) names no GPU of the host (the message says which)."""


@dataclass(frozen=True)
class GpuVendor:
    """One GPU vendor (module docstring). ``name`` identifies it (``nvidia``); the class constants
    and methods are the vendor's knowledge. Subclasses set every constant and implement every
    method; this base raises NotImplementedError for the methods."""

    name: str

    #: the vendor's management tool, as found on PATH
    smi: ClassVar[str] = ""
    #: the environment variable that selects the GPUs a process sees
    visible_devices_env: ClassVar[str] = ""
    #: how :meth:`capability` asks (for the probe's account of what it tried)
    capability_query: ClassVar[str] = ""
    #: every device file of its driver (a GPU's own and the shared control files): what holders scan
    device_glob: ClassVar[str] = ""
    #: the GPUs' own device files only (each GPU one); the shared control files say nothing of who
    #: uses which GPU (every process of the vendor's runtime holds them)
    gpu_device_glob: ClassVar[str] = ""
    #: executables that hold the device files without being anyone's leftover (never signalled)
    protected_processes: ClassVar[tuple[str, ...]] = ()
    #: files whose presence says the vendor's container toolkit is installed
    container_toolkit_paths: ClassVar[tuple[str, ...]] = ()
    #: the Container Device Interface kind of its GPUs (``--device KIND=ID``)
    cdi_kind: ClassVar[str] = ""
    #: where the vendor's CDI spec generator writes the spec of :attr:`cdi_kind` by default
    cdi_spec_file: ClassVar[str] = ""
    #: the command that lists the CDI devices the installed specs define (for messages)
    cdi_list_command: ClassVar[str] = ""
    #: what the vendor calls a GPU error line of the kernel log, and where its codes are defined
    error_name: ClassVar[str] = ""
    error_catalog: ClassVar[str] = ""

    # ------------------------------------------------------------- names and device files
    def names_device(self, device_name: str) -> bool:
        """Whether ``device_name`` (torch's form ``NVIDIA H200`` or SGLang's ``NVIDIA_H200``) is one
        of this vendor's GPUs."""
        raise NotImplementedError

    def device_file(self, index: int) -> str:
        """The device file of GPU number ``index`` (the driver's minor number)."""
        raise NotImplementedError

    def device_index(self, path: str) -> int | None:
        """The GPU number of a device file ``path`` of this vendor's, None for a shared or foreign file."""
        raise NotImplementedError

    def is_device_file(self, path: str) -> bool:
        """Whether ``path`` is one of this vendor's device files (a GPU's or a shared one)."""
        raise NotImplementedError

    def names_partition(self, entry: str) -> bool:
        """Whether a visible-devices entry names a partition of a GPU (MIG), which shares its GPU's file."""
        raise NotImplementedError

    # ------------------------------------------------------------- the GPU table (controller side)
    def table_commands(self) -> dict[str, list[str]]:
        """The read-only queries :meth:`gpu_table` reads, by key (run on the host, no host data in them)."""
        raise NotImplementedError

    def gpu_table(self, outputs: dict[str, str]) -> list:
        """The host's GPUs from the outputs of :meth:`table_commands` (a missing key: that query
        failed). Pure."""
        raise NotImplementedError

    def table_problem(self, gpus: list) -> str | None:
        """Why a table from :meth:`gpu_table` is partial (None: complete)."""
        raise NotImplementedError

    def resolve_visible_devices(self, value: str, gpus: list) -> list[str]:
        """The device files (each once, in order) of the GPUs a visible-devices value names; raises
        :class:`UnresolvedDevices` naming the first entry it cannot map. Pure."""
        raise NotImplementedError

    def gather(self, run: Runner) -> tuple[list, str | None]:
        """``(GPUs, problem)`` of a host through ``run`` (:data:`Runner`): the table queries run, the
        answers parsed; ``problem`` says why the table is empty or partial."""
        outputs = {}
        for key, argv in self.table_commands().items():
            ok, out, err = run(argv)
            if ok:
                outputs[key] = out
            elif key == "query":
                return [], f"{argv[0]} {argv[1].split('=')[0]} failed: {(err or out).strip()[:200] or 'no answer'}"
        gpus = self.gpu_table(outputs)
        return gpus, self.table_problem(gpus)

    # ------------------------------------------------------------- the driver and its CDI spec (controller side)
    def driver_version(self, run: Runner) -> str | None:
        """The GPU driver's version on the host (``MAJOR.MINOR[.PATCH]``, as its versioned user-space
        libraries are named) through ``run`` (:data:`Runner`: the vendor's read-only queries, in
        order, until one answers); None when none tells."""
        raise NotImplementedError

    def cdi_generate_command(self, path: str) -> str:
        """The command that writes the CDI spec of :attr:`cdi_kind` to ``path`` for the driver
        installed now (for a message that asks the operator to run it)."""
        raise NotImplementedError

    # ------------------------------------------------------------- on the host (payload side)
    def health(self, tool: str | None, timeout_s: float) -> dict:
        """Whether the management tool answers within ``timeout_s`` s, and the GPUs' partition mode:
        ``{"state", "reason", "gpus", "mig"}`` (``remote/host/xid.py`` documents the fields)."""
        raise NotImplementedError

    def compute_apps(self, tool: str, timeout_s: float) -> list[dict]:
        """The processes with a compute context on the GPUs: ``[{"pid", "process_name",
        "used_memory_mib"}]``; raises :class:`ToolFailed` when the tool cannot answer."""
        raise NotImplementedError

    def capability(self, tool: str | None, timeout_s: float, visible: str | None) -> tuple[str | None, str]:
        """GPU 0's compute capability (``MAJOR.MINOR``) as the server numbers its GPUs, asked of the
        management tool (no compute context needed) within ``timeout_s`` s; ``visible``: the
        server's :attr:`visible_devices_env` value (None: unset). ``(capability or None, what
        happened)``; a vendor that cannot tell returns None and says so."""
        return None, f"{self.smi or 'the GPU vendor'} gives no compute capability"

    def capability_and_name(self, tool: str | None, timeout_s: float) -> tuple[str, str] | None:
        """GPU 0's ``(compute capability "MAJOR.MINOR", name)`` as the management tool ``tool``
        (None: the one on PATH) gives them within ``timeout_s`` s, without a compute context (the
        prepare step compiles for it while the server holds the GPU); None when it cannot tell."""
        return None

    def errors_in_log(self, text: str) -> list[dict]:
        """The vendor's GPU error lines of a kernel log text, in order: ``[{"pci", "code", "text",
        "time_s", "fatal"}]``. Pure."""
        raise NotImplementedError

    def describe_error(self, code: int, pci: str, time_s: float | None, text: str) -> str:
        """One error line in words, for messages."""
        raise NotImplementedError


@internal_error("reap catches it: the management tool's view is then not used (its state: failed)")
class ToolFailed(RuntimeError):
    """The vendor's management tool could not run, failed, or did not answer within its deadline
    (the message says which)."""
