"""The test bed's ``nvidia-smi`` (a host has no GPU): answers in the real command's formats.

Installed per host as ``/usr/local/sbin/nvidia-smi`` when the host option ``nvidia_smi`` is set;
reads the host's GPUs from ``/run/orchtb/gpus.json`` (``[{"index", "name", "uuid", "pci_bus_id",
"mig": [{"profile", "uuid"}]}]``, written by the bed). Standard library only.

What it answers, in the formats of a real driver (R535+; samples recorded from real hosts in
``tests/unit/facts/cases/gpus.visible_devices.json``):

- ``-L`` / ``--list-gpus``::

      GPU 0: NVIDIA H200 (UUID: GPU-3f0c...)
        MIG 3g.71gb     Device  0: (UUID: MIG-8a1d...)

- ``--query-gpu=FIELD[,FIELD...] --format=csv[,noheader][,nounits]`` for the fields ``index``,
  ``uuid``, ``pci.bus_id``, ``name``, ``compute_cap`` (``12.0``: the host option ``gpu_capability``),
  ``driver_version`` (``/run/orchtb/driver.json`` ``{"version": ...}`` when a test wrote it, else
  ``550.54.15``), ``count``, ``mig.mode.current`` (``Enabled`` for a GPU with
  MIG devices, else ``Disabled``), ``memory.used``, ``memory.total`` (``[N/A]`` on a GPU in MIG
  mode, as the driver prints for a MIG parent, vllm #7211): one line per GPU, values joined by
  ``", "``; a header line (``index, uuid, pci.bus_id``) unless ``noheader``. Another field:
  ``Field "x" is not a valid field to query.`` and exit status 2, as the real command.
- ``--query-compute-apps=pid,process_name,used_memory``: one line per PID listed in
  ``/run/orchtb/compute_apps.json`` (written by a test: ``[pid, ...]``, host PIDs; the name from
  ``/proc/PID/comm``; ``used_memory`` ``[N/A]`` when a GPU is in MIG mode, else ``1024``); without
  that file no line (the bed's processes hold fake device files), or the header alone without
  ``noheader``.

Hang knob: while ``/run/orchtb/nvidia-smi.hang`` exists, every call blocks forever, as
``nvidia-smi`` does in D state after an Xid error (leptonai/gpud #117): it ignores SIGTERM, and a
child in its own session keeps its output open and sleeps, so a caller that waits for the output
to end after killing it waits forever too (the one thing of D state a user process can show:
nothing that signals it makes it go).

Anything else exits 2 with a message naming what the bed's nvidia-smi does not answer.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

GPUS_FILE = "/run/orchtb/gpus.json"
APPS_FILE = "/run/orchtb/compute_apps.json"
HANG_FILE = "/run/orchtb/nvidia-smi.hang"
DRIVER_FILE = "/run/orchtb/driver.json"
DEFAULT_DRIVER = "550.54.15"
FIELDS = {"index": "index", "uuid": "uuid", "pci.bus_id": "pci_bus_id", "name": "name", "compute_cap": "compute_cap"}
#: fields computed from the GPU's MIG devices (not stored in gpus.json)
MIG_FIELDS = ("mig.mode.current", "memory.used", "memory.total", "driver_version")


def driver_version() -> str:
    """The driver's version the host reports (see the module docstring)."""
    try:
        with open(DRIVER_FILE) as f:
            return str(json.load(f)["version"])
    except (OSError, ValueError, KeyError):
        return DEFAULT_DRIVER


def _load() -> list:
    with open(GPUS_FILE) as f:
        return json.load(f)


def list_gpus(gpus: list) -> str:
    """``nvidia-smi -L`` text for ``gpus``."""
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        for i, m in enumerate(g.get("mig") or []):
            out.append(f"  MIG {m['profile']:<12}Device {i:>2}: (UUID: {m['uuid']})")
    return "\n".join(out) + "\n"


def query_gpu(gpus: list, fields: list, header: bool) -> str:
    """``--query-gpu=FIELDS --format=csv`` text for ``gpus``; KeyError naming an unknown field."""
    rows = [", ".join(fields)] if header else []
    for g in gpus:
        vals = []
        for f in fields:
            if f == "count":
                vals.append(str(len(gpus)))
            elif f == "mig.mode.current":
                vals.append("Enabled" if g.get("mig") else "Disabled")
            elif f == "driver_version":
                vals.append(driver_version())
            elif f in ("memory.used", "memory.total"):
                vals.append("[N/A]" if g.get("mig") else ("0" if f == "memory.used" else "143771"))
            else:
                vals.append(str(g[FIELDS[f]]))
        rows.append(", ".join(vals))
    return "\n".join(rows) + ("\n" if rows else "")


def compute_apps(gpus: list) -> str:
    """``--query-compute-apps`` lines (no header) of the PIDs in :data:`APPS_FILE`."""
    try:
        with open(APPS_FILE) as f:
            pids = json.load(f)
    except OSError:
        return ""
    mem = "[N/A]" if any(g.get("mig") for g in gpus) else "1024"
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{int(pid)}/comm") as f:
                name = f.read().strip()
        except OSError:
            name = "[Not Found]"
        out.append(f"{int(pid)}, {name}, {mem}")
    return "".join(line + "\n" for line in out)


def hang() -> None:
    """Block forever (see the module docstring's hang knob)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        os.setsid()
        while True:
            time.sleep(3600)
    while True:
        time.sleep(3600)


def main(argv: list) -> int:
    """Entry point; returns the exit status."""
    if os.path.exists(HANG_FILE):
        hang()
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
    opts = set(fmt.split(",")) if fmt else set()
    if argv and argv[0] in ("-L", "--list-gpus"):
        sys.stdout.write(list_gpus(_load()))
        return 0
    q = next((a for a in argv if a.startswith("--query-gpu=")), None)
    if q is not None:
        if "csv" not in opts:
            sys.stderr.write('"--format" option must be specified with "--query-gpu".\n')
            return 2
        fields = [f.strip() for f in q.split("=", 1)[1].split(",") if f.strip()]
        bad = [f for f in fields if f not in FIELDS and f != "count" and f not in MIG_FIELDS]
        if bad:
            sys.stdout.write(f'Field "{bad[0]}" is not a valid field to query.\n\n')
            return 2
        sys.stdout.write(query_gpu(_load(), fields, "noheader" not in opts))
        return 0
    q = next((a for a in argv if a.startswith("--query-compute-apps=")), None)
    if q is not None:
        if "noheader" not in opts:
            sys.stdout.write(", ".join(q.split("=", 1)[1].split(",")) + "\n")
        sys.stdout.write(compute_apps(_load()))
        return 0
    sys.stderr.write(f"the orch test bed's nvidia-smi does not answer {' '.join(argv) or '(no arguments)'}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
