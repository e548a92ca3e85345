"""A container unit's GPU path through CDI, checked before anything is stopped (issue 32 row 7).

A container that gets its GPUs as CDI devices (``--device nvidia.com/gpu=all``: podman, docker 25+)
is given, at each start, what a CDI spec file says: device nodes, the driver's user-space
libraries by their versioned names (``libcuda.so.550.54.15``), hooks (container-device-interface
specification, https://github.com/cncf-tags/container-device-interface/blob/main/SPEC.md: spec
files in ``/etc/cdi`` and ``/var/run/cdi``, the latter taking precedence; ``kind`` VENDOR/CLASS,
``devices[].name``, ``containerEdits`` at the top and per device with ``deviceNodes[].path``/
``hostPath``, ``mounts[].hostPath``, ``hooks[].path``). ``nvidia-ctk cdi generate`` writes that
spec for the driver installed then. After a driver upgrade the spec still names the old
libraries: the running container keeps working, and the next start fails because a path the spec
names is gone (podman #26233, nixpkgs #353059), or injects libraries of another version than the
kernel module. orch's stop and start would hit exactly that, so :func:`cdi_refusal` refuses first,
naming the file and the command that regenerates it.

The GPU vendor's knowledge comes through :class:`remote.gpus.GpuVendor`: the CDI kind of its GPUs
(:attr:`~remote.gpus.GpuVendor.cdi_kind`, NVIDIA's ``nvidia.com/gpu``), its driver's version
(:meth:`~remote.gpus.GpuVendor.driver_version`, read by :func:`orchestrator.facts.gpus.driver_version`)
and the command that regenerates its spec (:meth:`~remote.gpus.GpuVendor.cdi_generate_command`); a
device of a kind no vendor claims is not checked, nor a unit that takes its GPUs through ``--gpus``
(the vendor's runtime hook, which reads the driver at each start). The host is read through fact
helpers (:mod:`orchestrator.facts.hostfiles`). Read only.
"""

from __future__ import annotations

import re

import yaml

from remote.gpus import VENDORS, GpuVendor

from ..facts.gpus import driver_version
from ..facts.hostfiles import HostFileError, files_in_folders, missing_paths, read_file

#: the CDI spec folders, lowest precedence first (a later one's spec of the same kind wins)
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
#: the file names a CDI registry reads in them (the specification: YAML or JSON)
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
#: largest spec file read (nvidia-ctk's are tens of KiB)
MAX_SPEC_BYTES = 4 * 1024 * 1024
#: a versioned shared library's version suffix (``libcuda.so.550.54.15`` -> ``550.54.15``)
_LIB_VERSION = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")


def cdi_devices(run) -> list[str]:
    """The CDI device names (``nvidia.com/gpu=all``) a container run (:class:`orchestrator.facts.
    container.ContainerRun`) asks for with ``--device``. Pure."""
    opts = list(run.gpus.options) if run is not None else []
    return [opts[i + 1].split(":", 1)[0] for i, w in enumerate(opts[:-1])
            if w == "--device" and "/" in opts[i + 1].split("=", 1)[0] and "=" in opts[i + 1]
            and not opts[i + 1].startswith("/")]


def spec_paths(spec: dict, names: list[str]) -> list[str]:
    """The host paths a CDI ``spec`` (parsed) gives a container asking for its devices ``names``
    (``all``, ``0``, ...): device nodes (``hostPath``, else ``path``), mounts' ``hostPath`` and hooks'
    ``path``, of the spec's own ``containerEdits`` and of each named device's. Pure."""
    edits = [spec.get("containerEdits") or {}]
    for dev in spec.get("devices") or []:
        if isinstance(dev, dict) and str(dev.get("name")) in names:
            edits.append(dev.get("containerEdits") or {})
    out: list[str] = []
    for e in edits:
        if not isinstance(e, dict):
            continue
        for node in e.get("deviceNodes") or []:
            if isinstance(node, dict) and (node.get("hostPath") or node.get("path")):
                out.append(str(node.get("hostPath") or node.get("path")))
        for m in e.get("mounts") or []:
            if isinstance(m, dict) and m.get("hostPath"):
                out.append(str(m["hostPath"]))
        for h in e.get("hooks") or []:
            if isinstance(h, dict) and h.get("path"):
                out.append(str(h["path"]))
    return list(dict.fromkeys(out))


def library_versions(paths: list[str]) -> dict[str, list[str]]:
    """Version suffix -> the versioned libraries among ``paths`` (``.so.X.Y[.Z]``). Pure."""
    out: dict[str, list[str]] = {}
    for p in paths:
        m = _LIB_VERSION.search(p)
        if m:
            out.setdefault(m.group(1), []).append(p)
    return out


def stale_reason(spec_file: str, device: str, paths: list[str], missing: list[str], driver: str | None,
                 vendor: GpuVendor) -> str | None:
    """Why the spec ``spec_file`` for ``device`` would fail the container's next start, or None.
    ``paths``: what it names (:func:`spec_paths`); ``missing``: those not on the host; ``driver``:
    the driver's version now (None: not known); ``vendor``: whose spec it is (the fix's command). Pure."""
    libs = library_versions(paths)
    other = sorted(v for v in libs if driver and v != driver)
    why = []
    if missing:
        why.append(f"it names {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}, which "
                   f"{'does' if len(missing) == 1 else 'do'} not exist on the host")
    if other:
        why.append(f"its driver libraries are version {', '.join(other)} while the driver is {driver}")
    if not why:
        return None
    return (f"the CDI spec {spec_file} for {device} is stale ({'; '.join(why)}): it was generated for another "
            "driver (upgraded since?). The running container works, but its next start would fail, so orch does "
            f"not stop it. Regenerate the spec first: {vendor.cdi_generate_command(spec_file)} (then "
            f"`{vendor.cdi_list_command}`); nothing was stopped")


def _read_specs(connection) -> list[tuple[str, dict]]:
    """``(path, spec)`` of every readable CDI spec file on the host, lowest precedence first."""
    out = []
    for path in files_in_folders(connection, SPEC_DIRS, SPEC_SUFFIXES):
        try:
            text = read_file(connection, path, limit=MAX_SPEC_BYTES, become="root", timeout=30)
            spec = yaml.safe_load(text) if text is not None else None
        except (HostFileError, yaml.YAMLError):
            spec = None  # unreadable, too large or not YAML: no CDI registry loads it either
        if isinstance(spec, dict):
            out.append((path, spec))
    return out


def _vendor_of(kind: str, vendors: tuple[GpuVendor, ...] | None) -> GpuVendor | None:
    """The vendor whose GPUs are the CDI kind ``kind`` (None: no vendor orch knows)."""
    return next((v for v in vendors or VENDORS if v.cdi_kind and v.cdi_kind == kind), None)


def cdi_refusal(connection, run, vendors: tuple[GpuVendor, ...] | None = None) -> str | None:
    """Why the container unit running ``run`` must not be stopped (its GPU path through CDI would
    not come back: module docstring), or None (no CDI device of a vendor orch knows, or every spec
    it uses is current). ``vendors``: the GPU vendors whose CDI kinds are checked (None:
    :data:`remote.gpus.VENDORS`)."""
    devices = [(d, v) for d in cdi_devices(run) if (v := _vendor_of(d.partition("=")[0], vendors)) is not None]
    if not devices:
        return None
    specs = _read_specs(connection)
    drivers: dict[str, str | None] = {}
    problems = []
    for device, vendor in devices:
        kind, _, name = device.partition("=")
        found = [(p, s) for p, s in specs if s.get("kind") == kind]
        if not found:
            problems.append(f"no CDI spec in {' or '.join(SPEC_DIRS)} defines {kind} (the container's --device "
                            f"{device}): its next start would fail, so orch does not stop it. Generate one first: "
                            f"{vendor.cdi_generate_command(vendor.cdi_spec_file)}; nothing was stopped")
            continue
        path, spec = found[-1]  # /var/run/cdi over /etc/cdi, as the CDI registry resolves them
        names = [name] if name != "all" else ["all"]
        if not any(isinstance(d, dict) and str(d.get("name")) in names for d in spec.get("devices") or []):
            problems.append(f"the CDI spec {path} defines no device {name!r} of {kind}: regenerate it "
                            f"({vendor.cdi_generate_command(path)}); nothing was stopped")
            continue
        paths = spec_paths(spec, names)
        missing = missing_paths(connection, paths)
        if vendor.name not in drivers:
            drivers[vendor.name] = driver_version(connection, vendor)
        why = stale_reason(path, device, paths, missing, drivers[vendor.name], vendor)
        if why:
            problems.append(why)
    return "; ".join(problems) or None

