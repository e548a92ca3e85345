"""nvidia-smi queries both ``xid`` and ``reap`` make, each under a deadline
(:func:`remote.host.bounded.run_bounded`), and the parsing of what MIG hosts print. Standard
library only."""

from __future__ import annotations

import os
import shutil

from .bounded import run_bounded


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
    """Whether nvidia-smi answers within ``timeout_s`` and which GPUs are in MIG mode (see the
    module docstring's ``nvidia_smi``)."""
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
