"""The kernel log's NVIDIA Xid lines and whether ``nvidia-smi`` still answers (``xid``).

``python -m remote xid [--smi PATH] [--smi-timeout S] [--no-smi]``

The GPU vendor's part (which kernel log lines are its errors and which of them lose a GPU, its
management tool's answer) is the host's :class:`remote.gpus.GpuVendor` (NVIDIA's:
``remote/gpus/nvidia.py``; ``--nvidia-smi`` is its spelling of ``--smi``); this command reads the
kernel log and asks the vendor.

Why: an Xid is the driver's report of a GPU error, logged by the kernel as
``NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus.``; after
some of them the GPU is lost until a reset, and ``nvidia-smi`` may hang in D state forever
(leptonai/gpud #117, dcgm-exporter #84). The controller reads this before anything stops (a lost
GPU: the host is refused) and after the tune (a new one: the rollout stops for that host).

The log is read with ``dmesg`` (util-linux; its default line ``[ 1234.567890] text``); where that
is refused (``kernel.dmesg_restrict=1`` for a non-root login) ``/dev/kmsg`` is read without
blocking (records ``PRIO,SEQ,USEC,FLAGS;text``, Documentation/ABI/testing/dev-kmsg). Each GPU
query runs under a deadline (:func:`remote.host.bounded.run_bounded`).

Result ``data``::

    {"source": "dmesg" | "/dev/kmsg" | null,   # null: the log could not be read
     "source_problem": str | null,             # why not (both ways refused)
     "xids": [{"pci": "0000:18:00", "code": 79, "text": "pid=..., GPU has fallen off the bus.",
               "time_s": 1234.567 | null, "fatal": bool}],
     "nvidia_smi": {"state": "ok"|"failed"|"timeout"|"hung"|"missing"|"absent"|"disabled",
                    "reason": str, "gpus": [{"index", "uuid", "mig_mode"}], "mig": bool}}

``mig_mode`` is nvidia-smi's ``mig.mode.current`` (``Enabled``/``Disabled``) or null where it
printed ``[N/A]``/``[Insufficient Permissions]`` or nothing usable; ``mig`` is true when a GPU
says ``Enabled`` or ``nvidia-smi -L`` lists a ``MIG-`` device.
"""

from __future__ import annotations

import errno
import os
import shutil

from ..gpus import DEFAULT, local_vendor
from .bounded import GPU_QUERY_TIMEOUT_S, run_bounded

def add_arguments(parser) -> None:
    """Flags of ``xid``."""
    parser.add_argument("--smi", f"--{DEFAULT.smi}", dest="smi", default=None,
                        help=f"path of the GPU vendor's management tool ({DEFAULT.smi}; default: from PATH)")
    parser.add_argument("--smi-timeout", type=float, default=GPU_QUERY_TIMEOUT_S,
                        help="seconds each query of the management tool may take")
    parser.add_argument("--no-smi", action="store_true", help="read the kernel log only")


def read_kmsg(path: str = "/dev/kmsg", limit: int = 100000) -> str:
    """The records ``/dev/kmsg`` holds now, read without blocking (one record per read; EAGAIN:
    no more; EPIPE: a record was overwritten, go on), one per line. Raises OSError when it cannot
    be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        for _ in range(limit):
            try:
                rec = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                raise
            if not rec:
                break
            out.append(rec.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return "\n".join(out)


def kernel_log() -> tuple[str | None, str, str | None]:
    """``(source, text, problem)``: the kernel log from ``dmesg``, else ``/dev/kmsg``; ``source``
    None (and ``problem`` saying why) when neither can be read."""
    problems = []
    dmesg = shutil.which("dmesg")
    if dmesg:
        r = run_bounded([dmesg], timeout_s=15)
        if r.ok:
            return "dmesg", r.stdout, None
        problems.append(r.reason or f"dmesg: {r.state}")
    else:
        problems.append("dmesg not found")
    try:
        return "/dev/kmsg", read_kmsg(), None
    except OSError as exc:
        problems.append(f"/dev/kmsg: {exc.strerror or exc}")
    return None, "", "; ".join(problems)


def run(args) -> dict:
    """``xid`` command: see the module docstring."""
    vendor = local_vendor()
    source, text, problem = kernel_log()
    smi = ({"state": "disabled", "reason": "--no-smi", "gpus": [], "mig": False} if args.no_smi
           else vendor.health(args.smi, args.smi_timeout))
    return {"source": source, "source_problem": problem, "xids": vendor.errors_in_log(text), "nvidia_smi": smi}
