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

NVIDIA's device kind only (``nvidia.com/gpu``); a unit that takes its GPUs through ``--gpus``
(the NVIDIA runtime hook, which reads the driver at each start) is not checked. Read only.
"""

from __future__ import annotations

import posixpath
import re

import yaml

#: the CDI spec folders, lowest precedence first (a later one's spec of the same kind wins)
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
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


def stale_reason(spec_file: str, device: str, paths: list[str], missing: list[str], driver: str | None) -> str | None:
    """Why the spec ``spec_file`` for ``device`` would fail the container's next start, or None.
    ``paths``: what it names (:func:`spec_paths`); ``missing``: those not on the host; ``driver``:
    the driver's version now (None: not known). Pure."""
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
            f"not stop it. Regenerate the spec first: nvidia-ctk cdi generate --output={spec_file} (then "
            "`nvidia-ctk cdi list`); nothing was stopped")


def _read_specs(connection) -> list[tuple[str, dict]]:
    """``(path, spec)`` of every readable CDI spec file on the host, lowest precedence first."""
    dirs = " ".join(SPEC_DIRS)
    res = connection.run(["sh", "-c", f"for d in {dirs}; do for f in \"$d\"/*.yaml \"$d\"/*.yml \"$d\"/*.json; do "
                                      "[ -f \"$f\" ] && printf '%s\\n' \"$f\"; done; done; true"],
                         check=False, become=True, timeout=30)
    out = []
    for path in res.stdout.splitlines() if res.ok else []:
        got = connection.run(["head", "-c", str(MAX_SPEC_BYTES), "--", path], check=False, become=True, timeout=30)
        try:
            spec = yaml.safe_load(got.stdout) if got.ok else None
        except yaml.YAMLError:
            spec = None
        if isinstance(spec, dict):
            out.append((path, spec))
    return out


def driver_version(connection) -> str | None:
    """The NVIDIA driver's version on the host: ``nvidia-smi --query-gpu=driver_version``, else the
    kernel module's ``/sys/module/nvidia/version``; None when neither answers."""
    res = connection.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], check=False,
                         timeout=30)
    first = (res.stdout.splitlines() or [""])[0].strip() if res.ok else ""
    if re.fullmatch(r"\d+\.\d+(\.\d+)?", first):
        return first
    res = connection.run(["cat", "/sys/module/nvidia/version"], check=False, timeout=30)
    text = res.stdout.strip() if res.ok else ""
    return text if re.fullmatch(r"\d+\.\d+(\.\d+)?", text) else None


def cdi_refusal(connection, run) -> str | None:
    """Why the container unit running ``run`` must not be stopped (its GPU path through CDI would
    not come back: module docstring), or None (no CDI device, or every spec it uses is current)."""
    devices = cdi_devices(run)
    if not devices:
        return None
    specs = _read_specs(connection)
    driver = None
    problems = []
    for device in devices:
        kind, _, name = device.partition("=")
        found = [(p, s) for p, s in specs if s.get("kind") == kind]
        if not found:
            problems.append(f"no CDI spec in {' or '.join(SPEC_DIRS)} defines {kind} (the container's --device "
                            f"{device}): its next start would fail, so orch does not stop it. Generate one first: "
                            f"nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml; nothing was stopped")
            continue
        path, spec = found[-1]  # /var/run/cdi over /etc/cdi, as the CDI registry resolves them
        names = [name] if name != "all" else ["all"]
        if not any(isinstance(d, dict) and str(d.get("name")) in names for d in spec.get("devices") or []):
            problems.append(f"the CDI spec {path} defines no device {name!r} of {kind}: regenerate it "
                            f"(nvidia-ctk cdi generate --output={path}); nothing was stopped")
            continue
        paths = spec_paths(spec, names)
        missing = _missing(connection, paths)
        if driver is None:
            driver = driver_version(connection)
        why = stale_reason(path, device, paths, missing, driver)
        if why:
            problems.append(why)
    return "; ".join(problems) or None


def _missing(connection, paths: list[str]) -> list[str]:
    """Those of ``paths`` that do not exist on the host (one command; a path is absolute)."""
    paths = [p for p in paths if posixpath.isabs(p)]
    if not paths:
        return []
    res = connection.run(["sh", "-c", 'for p; do [ -e "$p" ] || printf "%s\\n" "$p"; done', "sh", *paths],
                         check=False, become=True, timeout=30)
    return [line for line in res.stdout.splitlines() if line] if res.ok else []
