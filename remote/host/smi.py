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
