"""NVIDIA GPUs (:data:`NVIDIA`): names, ``nvidia-smi`` queries under deadlines, device files and who
may hold them, Xid lines, MIG, ``CUDA_VISIBLE_DEVICES``. Standard library only.

- **Names**: torch's ``torch.cuda.get_device_name()`` (NVML's name) is ``NVIDIA H200``; boards from
  before 2020 were named ``Tesla V100-SXM2-16GB``, ``Quadro ...``, ``GeForce ...``, ``TITAN ...``;
  SGLang writes the name with ``_`` for spaces (``NVIDIA_H200``).
- **Device files**: ``/dev/nvidiaN`` per GPU (N: the driver's minor number), ``/dev/nvidiactl``,
  ``/dev/nvidia-uvm`` and others shared by every CUDA process. The GPU table comes from
  ``nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader``, ``nvidia-smi -L`` (MIG
  devices under their GPU) and the driver's ``/proc/driver/nvidia/gpus/<bus id>/information``
  (``Device Minor: N``; nvidia-smi's index follows the PCI order, the minor number the driver's
  probe order, which usually agree; without that file the minor number is taken to be the index).
  Recorded real outputs: ``tests/unit/facts/cases/gpus.visible_devices.json``.
- **CUDA_VISIBLE_DEVICES**: indices, ``GPU-<uuid>``, ``MIG-<uuid>`` or the older
  ``MIG-GPU-<uuid>/<gi>/<ci>``; CUDA also accepts a unique prefix of a UUID and stops at the first
  entry it cannot use. A MIG device lives on its parent GPU's ``/dev/nvidiaN`` (sglang #2933, vllm
  #55381), so every slice shares that file.
- **Processes that hold the device files and are no one's leftover**: ``nvidia-persistenced``,
  DCGM's ``nv-hostengine``, ``dcgmi`` and ``nvidia-dcgm`` (its service's name on some
  distributions), ``dcgm-exporter`` (a SIGKILLed dcgm-exporter froze GPUs until reboot:
  dcgm-exporter #84) and ``Xorg``.
- **Xid**: the driver's report of a GPU error, logged by the kernel as ``NVRM: Xid
  (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``; after some of them
  the GPU is lost until a reset and ``nvidia-smi`` may hang in D state forever (leptonai/gpud #117,
  dcgm-exporter #84), hence every query under a deadline.
- **MIG**: ``mig.mode.current`` of ``--query-gpu``, or a ``MIG-`` device in ``nvidia-smi -L``;
  MIG hosts and restricted logins print ``[N/A]`` / ``[Insufficient Permissions]`` where a value
  is not given (sglang #2933, vllm #7211).
- **Container toolkit**: ``nvidia-container-runtime`` (and its hook, ``nvidia-ctk``) set up a
  container's device access outside systemd, which a ``systemctl daemon-reload`` can undo
  (NVIDIA/nvidia-container-toolkit #48); CDI names its GPUs ``nvidia.com/gpu=ID``, in the spec
  ``nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`` writes for the driver installed then
  (its versioned libraries, ``libcuda.so.550.54.15``); the driver's version is
  ``nvidia-smi --query-gpu=driver_version``, else the kernel module's ``/sys/module/nvidia/version``.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from typing import ClassVar

from ..host.bounded import run_bounded
from .base import GpuVendor, ToolFailed, UnresolvedDevices

#: Xid codes after which the GPU is lost or its memory cannot be trusted until a reset, from
#: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): 48 double-bit ECC error, 63/64 ECC
#: page retirement or row remapping (event / failure), 74 NVLink error, 79 GPU has fallen off the
#: bus, 94/95 contained / uncontained ECC error, 119/120 GSP RPC timeout / GSP error
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95, 119, 120})

#: NVRM's Xid line; the ``PCI:`` tag is absent in older drivers (``NVRM: Xid (0000:18:00): 13, ...``)
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):\s*(\d+),?\s*(.*)$")
#: dmesg's default time stamp (seconds since boot)
_DMESG_TIME = re.compile(r"^\[\s*(\d+\.\d+)\]\s?")
#: a /dev/kmsg record's prefix: priority/facility, sequence, microseconds since boot, flags
_KMSG_HEAD = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
#: torch's names of NVIDIA boards (``NVIDIA ...`` since 2020; older families by their own name)
NAME_PREFIXES = ("NVIDIA", "Tesla", "Quadro", "GeForce", "TITAN")
_DEVICE = re.compile(r"/dev/nvidia(\d+)")
#: a driver version as nvidia-smi and ``/sys/module/nvidia/version`` print it (``550.54.15``)
_DRIVER_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")


# ----------------------------------------------------------------------------- the GPU table

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
    """The GPUs of a host from the three outputs of the module docstring (minor numbers and MIG
    devices where known). Pure."""
    gpus = parse_query_gpu(query_text)
    listed = parse_list_gpus(list_text)
    minors = parse_driver_info(driver_text)
    for g in gpus:
        g.minor = minors.get(g.uuid, minors.get(normalize_bus_id(g.pci_bus_id)))
        if g.index in listed and listed[g.index][0] == g.uuid:
            g.mig = list(listed[g.index][1])
    return gpus


def resolve_visible_devices(cvd: str, gpus: list[Gpu]) -> list[str]:
    """Device files (``/dev/nvidiaN``, each once, in order) of the GPUs a ``CUDA_VISIBLE_DEVICES``
    value ``cvd`` names. Indices need no table (``/dev/nvidia<index>``, or the GPU's minor number
    when ``gpus`` knows it); ``GPU-``/``MIG-`` UUIDs (or unique prefixes, as CUDA accepts) need
    ``gpus``. CUDA stops at the first entry it cannot use; so does this, raising
    :class:`remote.gpus.UnresolvedDevices` naming it (a caller then reaps nothing). Pure."""
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


# ----------------------------------------------------------------------------- on the host

def parse_mig_query(text: str) -> list[dict]:
    """``nvidia-smi --query-gpu=index,uuid,mig.mode.current --format=csv,noheader`` ->
    ``[{"index", "uuid", "mig_mode"}]``. Tolerates what MIG hosts and restricted logins print
    (``[N/A]``, ``[Insufficient Permissions]``, ``MIG-`` UUIDs, a missing field: sglang #2933,
    vllm #7211): such a value becomes None, a line without an integer index is skipped. Pure."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not parts or not parts[0].isdigit():
            continue
        vals = [None if (not p or p.startswith("[")) else p for p in parts[1:]] + [None, None]
        out.append({"index": int(parts[0]), "uuid": vals[0], "mig_mode": vals[1]})
    return out


def smi_state(path: str | None, timeout_s: float) -> dict:
    """Whether nvidia-smi answers within ``timeout_s`` and which GPUs are in MIG mode:
    ``{"state", "reason", "gpus", "mig"}`` (``remote/host/xid.py`` documents the fields)."""
    smi = path or shutil.which("nvidia-smi")
    if not smi or not os.path.exists(smi):
        return {"state": "absent", "reason": "nvidia-smi not found", "gpus": [], "mig": False}
    r = run_bounded([smi, "--query-gpu=index,uuid,mig.mode.current", "--format=csv,noheader"], timeout_s)
    if not r.ok:
        return {"state": r.state, "reason": r.reason, "gpus": [], "mig": False}
    gpus = parse_mig_query(r.stdout)
    mig = any((g["mig_mode"] or "").lower() == "enabled" for g in gpus)
    if not mig:
        lst = run_bounded([smi, "-L"], timeout_s)
        if lst.state in ("hung", "timeout"):
            return {"state": lst.state, "reason": lst.reason, "gpus": gpus, "mig": False}
        mig = lst.ok and "(UUID: MIG-" in lst.stdout
    return {"state": "ok", "reason": "", "gpus": gpus, "mig": mig}


def nvidia_smi_apps(path: str, timeout: float) -> list[dict]:
    """Rows of ``nvidia-smi --query-compute-apps=pid,process_name,used_memory`` (CSV, no header/units).

    Returns ``[{"pid": int, "process_name": str, "used_memory_mib": int|None}]``; a memory value
    that is no integer (``[N/A]``, ``[Insufficient Permissions]`` on MIG hosts, vllm #7211) is None,
    a line whose first field is no PID is skipped. Runs under ``timeout`` seconds
    (:func:`remote.host.bounded.run_bounded`); raises :class:`remote.gpus.ToolFailed` when it
    cannot run, exits non-zero or does not answer in time.
    """
    cp = run_bounded([path, "--query-compute-apps=pid,process_name,used_memory",
                      "--format=csv,noheader,nounits"], timeout)
    if not cp.ok:
        raise ToolFailed(cp.reason)
    return parse_compute_apps(cp.stdout)


def parse_compute_apps(text: str) -> list[dict]:
    """The rows of :func:`nvidia_smi_apps` from its output ``text``. Pure."""
    rows = []
    for line in text.splitlines():  # "No running processes found" and the like: no row
        parts = [p.strip() for p in line.split(",")]
        if not parts or not parts[0].isdigit():
            continue
        mem = parts[-1] if len(parts) >= 3 else ""
        rows.append({"pid": int(parts[0]),
                     "process_name": ",".join(parts[1:-1]) if len(parts) >= 3 else (parts[1] if len(parts) > 1 else ""),
                     "used_memory_mib": int(mem) if mem.isdigit() else None})
    return rows


def parse_compute_caps(text: str) -> list[dict]:
    """``nvidia-smi --query-gpu=index,uuid,compute_cap --format=csv,noheader`` -> ``[{"index",
    "uuid", "compute_cap"}]`` (``compute_cap`` as ``MAJOR.MINOR``, None when the driver prints
    ``[N/A]`` or anything that is not one). A line without an integer index is skipped. Pure."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        major, dot, minor = parts[2].partition(".")
        cap = f"{int(major)}.{int(minor)}" if dot and major.isdigit() and minor.isdigit() else None
        out.append({"index": int(parts[0]), "uuid": None if parts[1].startswith("[") else parts[1],
                    "compute_cap": cap})
    return out


def pick_capability(gpus: list[dict], visible: str | None) -> tuple[str | None, str]:
    """GPU 0's compute capability as the server's CUDA numbers its GPUs, from nvidia-smi's rows
    (:func:`parse_compute_caps`) and the server's ``CUDA_VISIBLE_DEVICES`` (``visible``; None: unset),
    and how it was told. All GPUs of one capability give it whatever the order; else the first entry of
    ``CUDA_VISIBLE_DEVICES``, an index or a (prefix of a) ``GPU-`` UUID, names the GPU; CUDA's own
    default order (fastest first) is not nvidia-smi's, so without it nothing is guessed. Returns
    ``(capability or None, why)``. Pure."""
    caps = {g["compute_cap"] for g in gpus if g["compute_cap"]}
    if not gpus or not caps:
        return None, "nvidia-smi listed no GPU with a compute capability"
    if visible is not None and not visible.strip():
        return None, "CUDA_VISIBLE_DEVICES is empty: the server sees no GPU"
    if len(caps) == 1 and all(g["compute_cap"] for g in gpus):
        return caps.pop(), f"nvidia-smi compute_cap of all {len(gpus)} GPU(s)"
    first = (visible or "").split(",")[0].strip()
    for g in gpus:
        if (first.isdigit() and g["index"] == int(first)) or (
                first.startswith("GPU-") and g["uuid"] and g["uuid"].startswith(first)):
            if g["compute_cap"]:
                return g["compute_cap"], f"nvidia-smi compute_cap of GPU {g['index']} (CUDA_VISIBLE_DEVICES={visible})"
    return None, ("GPUs of different compute capabilities and no CUDA_VISIBLE_DEVICES entry naming GPU 0 "
                  "(CUDA numbers GPUs fastest first, not in nvidia-smi's order)")


def smi_capability(path: str | None, timeout_s: float, visible: str | None) -> tuple[str | None, str]:
    """GPU 0's compute capability from ``nvidia-smi --query-gpu=index,uuid,compute_cap`` under a
    deadline (:func:`remote.host.bounded.run_bounded`), for a host where torch opens no CUDA context
    (an exclusive-process GPU the server holds, a restricted ``CUDA_VISIBLE_DEVICES``): nvidia-smi
    asks NVML, which needs none. ``(capability or None, what happened)`` (:func:`pick_capability`);
    drivers before ``compute_cap`` existed answer that the field is not valid: None."""
    smi = path or shutil.which("nvidia-smi")
    if not smi or not os.path.exists(smi):
        return None, "nvidia-smi not found"
    r = run_bounded([smi, "--query-gpu=index,uuid,compute_cap", "--format=csv,noheader"], timeout_s)
    if not r.ok:
        return None, f"nvidia-smi --query-gpu=compute_cap: {r.state} ({(r.reason or r.stdout).strip()[:120]})"
    return pick_capability(parse_compute_caps(r.stdout), visible)


#: ``nvidia-smi`` query of GPU 0's compute capability and name (NVML: no CUDA context)
CAP_NAME_QUERY = ["--query-gpu=compute_cap,name", "--format=csv,noheader"]


def parse_cap_name(text: str) -> tuple[str, str] | None:
    """The first GPU's ``(compute capability, name)`` of ``nvidia-smi --query-gpu=compute_cap,name
    --format=csv,noheader`` output (``9.0, NVIDIA H200``); None when no line has a capability (an old
    driver prints ``[N/A]`` or rejects the field). Pure."""
    for line in text.splitlines():
        cap, _, name = line.partition(",")
        if re.fullmatch(r"\s*\d+\.\d+\s*", cap):
            return cap.strip(), name.strip()
    return None


def smi_cap_name(path: str | None, timeout_s: float) -> tuple[str, str] | None:
    """GPU 0's ``(compute capability, name)`` from ``nvidia-smi`` under a deadline
    (:func:`parse_cap_name`), or None when nvidia-smi is absent, fails or does not know the field
    (drivers before 510)."""
    exe = path or shutil.which("nvidia-smi")
    if not exe:
        return None
    r = run_bounded([exe, *CAP_NAME_QUERY], timeout_s)
    return parse_cap_name(r.stdout) if r.ok else None


def parse_xid_line(line: str) -> dict | None:
    """One kernel log line (dmesg's ``[secs] text``, a ``/dev/kmsg`` record, or bare text) ->
    ``{"pci", "code", "text", "time_s", "fatal"}`` when it is an ``NVRM: Xid`` line, else None.
    ``pci`` is lower case with a 4-digit domain (``0000:18:00``); ``time_s`` is seconds since
    boot (None when the line has no stamp); ``fatal``: the code is in :data:`FATAL_XIDS`. Pure."""
    time_s = None
    m = _KMSG_HEAD.match(line)
    if m:
        time_s = int(m.group(1)) / 1e6
        line = line[m.end():]
    else:
        m = _DMESG_TIME.match(line)
        if m:
            time_s = float(m.group(1))
            line = line[m.end():]
    x = _XID.search(line)
    if not x:
        return None
    dom, _, rest = x.group(1).lower().partition(":")
    code = int(x.group(2))
    return {"pci": f"{int(dom, 16):04x}:{rest}", "code": code, "text": x.group(3).strip(),
            "time_s": time_s, "fatal": code in FATAL_XIDS}


def parse_xids(text: str) -> list[dict]:
    """Every Xid line of a kernel log text (:func:`parse_xid_line`), in order. Pure."""
    return [x for x in (parse_xid_line(ln) for ln in text.splitlines()) if x is not None]


# ----------------------------------------------------------------------------- the vendor

@dataclass(frozen=True)
class NvidiaGpus(GpuVendor):
    """NVIDIA's GPUs (module docstring), behind :class:`remote.gpus.GpuVendor`."""

    smi: ClassVar[str] = "nvidia-smi"
    visible_devices_env: ClassVar[str] = "CUDA_VISIBLE_DEVICES"
    capability_query: ClassVar[str] = "nvidia-smi --query-gpu=compute_cap"
    device_glob: ClassVar[str] = "/dev/nvidia*"
    gpu_device_glob: ClassVar[str] = "/dev/nvidia[0-9]*"
    protected_processes: ClassVar[tuple[str, ...]] = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter",
                                                      "dcgmi", "nvidia-dcgm", "Xorg")
    container_toolkit_paths: ClassVar[tuple[str, ...]] = (
        "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime-hook", "/usr/bin/nvidia-ctk",
        "/etc/nvidia-container-runtime/config.toml")
    cdi_kind: ClassVar[str] = "nvidia.com/gpu"
    #: ``nvidia-ctk cdi generate``'s usual output (the toolkit's CDI guide)
    cdi_spec_file: ClassVar[str] = "/etc/cdi/nvidia.yaml"
    cdi_list_command: ClassVar[str] = "nvidia-ctk cdi list"
    error_name: ClassVar[str] = "Xid"
    error_catalog: ClassVar[str] = "NVIDIA Xid catalog"
    #: the toolkit's own issue: a daemon-reload can take the GPUs away from its containers
    toolkit_issue: ClassVar[str] = "NVIDIA/nvidia-container-toolkit #48"

    def names_device(self, device_name: str) -> bool:
        words = device_name.replace("_", " ").split()
        return bool(words) and any(words[0].lower() == p.lower() for p in NAME_PREFIXES)

    def device_file(self, index: int) -> str:
        return f"/dev/nvidia{int(index)}"

    def device_index(self, path: str) -> int | None:
        m = _DEVICE.fullmatch(path)
        return int(m.group(1)) if m else None

    def is_device_file(self, path: str) -> bool:
        return path.startswith("/dev/nvidia")

    def names_partition(self, entry: str) -> bool:
        return entry.strip().startswith("MIG-")

    def table_commands(self) -> dict[str, list[str]]:
        return {"query": ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                "list": ["nvidia-smi", "-L"], "driver": ["sh", "-c", DRIVER_INFO_SCRIPT]}

    def gpu_table(self, outputs: dict[str, str]) -> list[Gpu]:
        return gpu_table(outputs.get("query", ""), outputs.get("list", ""), outputs.get("driver", ""))

    def table_problem(self, gpus: list) -> str | None:
        if gpus and any(g.minor is None for g in gpus):
            return "no /proc/driver/nvidia/gpus information: /dev/nvidiaN taken to be nvidia-smi's index N"
        return None

    def resolve_visible_devices(self, value: str, gpus: list) -> list[str]:
        return resolve_visible_devices(value, gpus)

    def health(self, tool: str | None, timeout_s: float) -> dict:
        return smi_state(tool, timeout_s)

    def compute_apps(self, tool: str, timeout_s: float) -> list[dict]:
        return nvidia_smi_apps(tool, timeout_s)

    def capability(self, tool: str | None, timeout_s: float, visible: str | None) -> tuple[str | None, str]:
        return smi_capability(tool, timeout_s, visible)

    def capability_and_name(self, tool: str | None, timeout_s: float) -> tuple[str, str] | None:
        return smi_cap_name(tool, timeout_s)

    def errors_in_log(self, text: str) -> list[dict]:
        return parse_xids(text)

    def driver_version(self, run) -> str | None:
        ok, out, _ = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        first = (out.splitlines() or [""])[0].strip() if ok else ""
        if _DRIVER_VERSION.fullmatch(first):
            return first
        # without nvidia-smi (or with it failing) the loaded kernel module still says its version
        ok, out, _ = run(["cat", "/sys/module/nvidia/version"])
        text = out.strip() if ok else ""
        return text if _DRIVER_VERSION.fullmatch(text) else None

    def cdi_generate_command(self, path: str) -> str:
        return f"nvidia-ctk cdi generate --output={path}"

    def describe_error(self, code: int, pci: str, time_s: float | None, text: str) -> str:
        at = f" (at {time_s:g} s since boot)" if time_s is not None else ""
        return f"Xid {code} on {pci}{at}: {text}"


#: the NVIDIA vendor object
NVIDIA = NvidiaGpus("nvidia")
