"""The kernel log's NVIDIA Xid lines and whether ``nvidia-smi`` still answers (``xid``).

``python -m remote xid [--nvidia-smi PATH] [--smi-timeout S] [--no-smi]``

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
import re
import shutil

from .bounded import GPU_QUERY_TIMEOUT_S, run_bounded
from .smi import smi_state

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


def add_arguments(parser) -> None:
    """Flags of ``xid``."""
    parser.add_argument("--nvidia-smi", default=None, help="path of nvidia-smi (default: from PATH)")
    parser.add_argument("--smi-timeout", type=float, default=GPU_QUERY_TIMEOUT_S,
                        help="seconds each nvidia-smi query may take")
    parser.add_argument("--no-smi", action="store_true", help="read the kernel log only")


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
    source, text, problem = kernel_log()
    smi = ({"state": "disabled", "reason": "--no-smi", "gpus": [], "mig": False} if args.no_smi
           else smi_state(args.nvidia_smi, args.smi_timeout))
    return {"source": source, "source_problem": problem, "xids": parse_xids(text), "nvidia_smi": smi}
