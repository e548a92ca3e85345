"""Find processes holding the GPU device files and stop the unprotected ones (``reap``).

``python -m remote reap [--devices GLOB[,GLOB]] [--protected a,b] [--term-timeout S]
[--kill-timeout S] [--check] [--only-pids 1,2] [--use-smi auto|yes|no] [--smi PATH]``

The GPU vendor's knowledge (its device files, its protected processes, its management tool and
its partitions) is the host's :class:`remote.gpus.GpuVendor` (:func:`remote.gpus.local_vendor`;
NVIDIA's below, ``remote/gpus/nvidia.py``); ``--use-nvidia-smi``/``--nvidia-smi`` are NVIDIA's
spellings of ``--use-smi``/``--smi``.

Why: after ``systemctl stop`` SGLang/vLLM workers can survive re-parented to PID 1 and keep
~100 GB per GPU, and the next start fails (sglang #23627, #1533; vllm #55510). But
``nvidia-persistenced``, ``nv-hostengine``/DCGM, exporters and Xorg also hold ``/dev/nvidia*``
and must never be killed (a SIGKILLed dcgm-exporter froze GPUs until reboot: dcgm-exporter #84).

How:

1. Holders are found by scanning ``/proc/*/fd`` symlinks and ``/proc/*/maps`` (mmapped device
   files) against the device paths (resolved with ``realpath``; also matched by device and inode
   number), not by parsing ``fuser``. With ``--use-nvidia-smi`` (``auto``: when ``nvidia-smi``
   is on PATH) the PIDs of ``nvidia-smi --query-compute-apps=pid,process_name,used_memory
   --format=csv,noheader,nounits`` are checked against ``/proc``: a PID that is gone, or alive but
   holding no device file (another PID namespace?), is reported as a *ghost*, never killed.
2. A process in the cgroup of a systemd service other than ``--unit`` (``/proc/PID/cgroup``)
   belongs to another unit (several SGLang units may share a host): it is never signalled, is
   listed under ``other_units`` and does not fail the reap.
   A process is *protected* when the basename of ``argv[0]`` (``/proc/PID/cmdline``) OR of
   ``/proc/PID/exe`` is in the protected set (``comm`` is cut at 15 characters, so
   ``nvidia-persistenced`` can't be matched there). PID 1, this payload and its ancestors are
   never signalled either (they are reported under ``skipped``).
3. Targets (every other holder, or only those in ``--only-pids``) get SIGTERM; we poll ``/proc``
   until they are gone or ``--term-timeout`` passes, then SIGKILL the rest and poll up to
   ``--kill-timeout``. A process counts as gone when its ``/proc`` entry is absent, is a zombie,
   or has another start time (PID reused). A PID is only signalled while its start time is
   still the one seen in the scan, re-read right before each signal (through a pidfd where
   the kernel has them, so a PID reused in between is never hit: :func:`signal_if_same`).
   When nvidia-smi answered and every PID it lists is one this namespace sees (no ghost), busy
   means a compute process: an unprotected holder that nvidia-smi does not list as a compute
   app and that is not an engine's (:func:`is_server`) is *non-compute* (an NVML monitor such as
   gpud or ``nvidia-smi -l``): never signalled, listed under ``non_compute``, and it does not keep
   the GPU busy (kubernetes-sigs/dra-driver-nvidia-gpu #1076, NVIDIA/gpu-operator #118: a wait for
   "no process holds /dev/nvidia*" never ends). Without that view every unprotected holder is a
   target, as before.
4. Re-scan. Any unprotected holder left (a target that survived, a new holder, or a holder we
   may not signal) -> ``PayloadError('runtime')`` listing them, ``detail`` = the result below.
   With ``--only-pids``, holders outside that set are listed under ``others`` and not fatal.
5. MIG (``--mig on``, or ``auto``: nvidia-smi says ``mig.mode.current`` Enabled, or lists a ``MIG-``
   device): every slice of a GPU shares its ``/dev/nvidiaN`` (sglang #2933, vllm #55381), so a
   holder of the file may be another slice's process. Only processes whose ``/proc/PID/cgroup``
   (systemd's hierarchy) is ``--unit``'s own cgroup are targets; every other unprotected holder is
   never signalled, is listed under ``other_slices`` and does not fail the reap. nvidia-smi's
   memory fields are not read for this (``[N/A]``/``[Insufficient Permissions]`` under MIG,
   vllm #7211).

Every nvidia-smi query runs under a deadline (:func:`remote.host.bounded.run_bounded`): one that
does not answer (hung after an Xid error, leptonai/gpud #117) counts as ``failed``.

``--check`` scans and reports ``would_kill``, signals nothing and never fails.

Result ``data``::

    {"devices": [paths], "check": bool,
     "killed": [{"pid", "cmdline", "signal": "SIGTERM"|"SIGKILL"|null, "exited": bool, "via": [...]}],
     "would_kill": [{"pid", "cmdline", "via"}],          # --check only (else [])
     "protected": [{"pid", "cmdline"}], "skipped": [{"pid", "cmdline", "why"}],
     "ghosts": [{"pid", "process_name", "used_memory_mib", "why"}],
     "others": [{"pid", "cmdline"}], "other_units": [{"pid", "cmdline", "unit"}],
     "non_compute": [{"pid", "cmdline", "why"}],
     "other_slices": [{"pid", "cmdline", "why"}],        # MIG only
     "remaining": [{"pid", "cmdline"}],
     "nvidia_smi": "used"|"absent"|"disabled"|"failed", "mig": bool}

``signal`` is the last signal sent before the process exited (``null``: it exited by itself).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import stat
from typing import Iterable

from ..engines import ENGINES
from ..gpus import DEFAULT, GpuVendor, ToolFailed, local_vendor
from ..protocol import PayloadError, log
from .bounded import GPU_QUERY_TIMEOUT_S
from .procs import (_pids, _read, _wait_gone, alive, ancestors, cmdline, exe_name, proc_stat,  # noqa: F401
                    signal_if_same)

#: Default protected executables: the GPU vendor's (persistence daemon, monitoring, exporters, X).
DEFAULT_PROTECTED = ",".join(DEFAULT.protected_processes)


def add_arguments(parser) -> None:
    """Flags of ``reap``."""
    parser.add_argument("--devices", default=None,
                        help=f"glob(s) of device files, comma separated (default: the GPU vendor's, {DEFAULT.device_glob})")
    parser.add_argument("--protected", default=DEFAULT_PROTECTED,
                        help="comma list of executable basenames never to kill")
    parser.add_argument("--term-timeout", type=float, default=15.0, help="seconds after SIGTERM")
    parser.add_argument("--kill-timeout", type=float, default=10.0, help="seconds after SIGKILL")
    parser.add_argument("--check", action="store_true", help="report only, kill nothing")
    parser.add_argument("--only-pids", default=None,
                        help="comma list: restrict the targets to these PIDs")
    parser.add_argument("--use-smi", f"--use-{DEFAULT.smi}", dest="use_smi", choices=("auto", "yes", "no"),
                        default="auto", help=f"ask the GPU vendor's management tool ({DEFAULT.smi})")
    parser.add_argument("--smi", f"--{DEFAULT.smi}", dest="smi", default=None,
                        help="path of the management tool (default: from PATH)")
    parser.add_argument("--unit", default=None,
                        help="the unit being serviced (NAME.service): processes of OTHER units' cgroups are spared")
    parser.add_argument("--mig", choices=("auto", "on", "off"), default="auto",
                        help="MIG mode: only processes of --unit's own cgroup are ended (auto: ask the management tool)")


def run(args) -> dict:
    """``reap`` command: see the module docstring."""
    only = None
    if args.only_pids is not None:
        try:
            only = {int(p) for p in args.only_pids.split(",") if p.strip()}
        except ValueError as exc:
            raise PayloadError("bad_input", f"--only-pids must be integers: {exc}") from exc
    if not (0 <= args.term_timeout < float("inf") and 0 <= args.kill_timeout < float("inf")):
        raise PayloadError("bad_input", "--term-timeout and --kill-timeout must be 0 or more seconds")
    vendor = local_vendor()
    return reap(
        device_globs=[g for g in (args.devices or vendor.device_glob).split(",") if g],
        protected={p.strip() for p in args.protected.split(",") if p.strip()},
        term_timeout=args.term_timeout, kill_timeout=args.kill_timeout, check=args.check,
        only_pids=only, use_nvidia_smi=args.use_smi, nvidia_smi=args.smi, unit=args.unit,
        mig=args.mig, vendor=vendor)


def is_server(cmd: str) -> bool:
    """True for a command line of an engine's own processes (``Engine.is_own_process``: SGLang's
    ``-m sglang.launch_server`` or a worker it names ``sglang::...``), whatever nvidia-smi shows (a
    container's PIDs are not the host's). Pure."""
    return any(e.is_own_process(cmd) for e in ENGINES.values())


def is_protected(pid: int, protected: set[str]) -> bool:
    """True when basename(argv[0]) or basename(/proc/PID/exe) is in ``protected``."""
    argv = cmdline(pid)
    names = {os.path.basename(argv[0])} if argv else set()
    exe = exe_name(pid)
    if exe:
        names.add(exe)
    return bool(names & protected)


def other_unit(cgroup_text: str, unit: str | None) -> str | None:
    """The systemd unit (``NAME.service``) whose cgroup a process is in, from its
    ``/proc/PID/cgroup`` text, when that is a service other than ``unit``; None for the unit's
    own processes and for those in no service (a session, ``init.scope``, a container's ``/``).
    Pure."""
    lines = [ln.split(":", 2) for ln in cgroup_text.splitlines() if ln.count(":") >= 2]
    # systemd's own hierarchy tells the unit: the unified one (0::) or v1's name=systemd
    lines.sort(key=lambda f: 0 if f[1] in ("", "name=systemd") else 1)
    for _, _, path in lines:
        for part in reversed(path.strip().split("/")):
            if part.endswith(".service"):
                return None if part == unit else part
    return None


def in_unit_cgroup(cgroup_text: str, unit: str | None) -> bool:
    """True when a process's ``/proc/PID/cgroup`` text puts it in ``unit``'s own cgroup (a path
    component of systemd's hierarchy, unified ``0::`` or v1 ``name=systemd``, is ``unit``, e.g.
    ``0::/system.slice/sglang.service``); False without ``unit``. Pure."""
    if not unit:
        return False
    for line in cgroup_text.splitlines():
        f = line.split(":", 2)
        if len(f) == 3 and f[1] in ("", "name=systemd") and unit in f[2].strip().split("/"):
            return True
    return False


class Devices:
    """The device files to look for: resolved paths and ``(st_dev, st_ino)`` identities."""

    def __init__(self, globs: Iterable[str]):
        self.paths: list[str] = []
        self.real: set[str] = set()
        self.ids: set[tuple[int, int]] = set()
        for g in globs:
            for p in sorted(glob.glob(g)):
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    continue
                self.paths.append(p)
                self.real.add(os.path.realpath(p))
                self.real.add(p)
                self.ids.add((st.st_dev, st.st_ino))

    def fd_hits(self, pid: int) -> list[str]:
        """Device paths ``pid`` has open (by fd symlink target, or by identity for /dev files)."""
        hits = []
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return hits
        for fd in fds:
            link = f"{fd_dir}/{fd}"
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target in self.real:
                hits.append(target)
            elif target.startswith("/dev/"):
                try:
                    st = os.stat(link)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in self.ids:
                    hits.append(target)
        return hits

    def map_hits(self, pid: int) -> list[str]:
        """Device paths mmapped by ``pid`` (``/proc/PID/maps``: path, or dev major:minor + inode)."""
        raw = _read(f"/proc/{pid}/maps")
        hits: list[str] = []
        if not raw:
            return hits
        for line in raw.decode("utf-8", "replace").splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5]
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if path in self.real:
                hits.append(path)
                continue
            try:
                ino = int(parts[4])
                maj, mnr = (int(x, 16) for x in parts[3].split(":"))
            except ValueError:
                continue
            if ino and (os.makedev(maj, mnr), ino) in self.ids:
                hits.append(path)
        return sorted(set(hits))


def scan(devices: Devices) -> dict[int, dict]:
    """Every process holding one of ``devices`` -> ``{"pid", "cmdline", "starttime", "via", "devices"}``."""
    found: dict[int, dict] = {}
    for pid in _pids():
        fd = devices.fd_hits(pid)
        mp = devices.map_hits(pid)
        if not fd and not mp:
            continue
        st = proc_stat(pid)
        if st is None or st[0] in ("Z", "X", "x"):
            continue
        via = (["fd"] if fd else []) + (["maps"] if mp else [])
        found[pid] = {"pid": pid, "cmdline": " ".join(cmdline(pid)), "starttime": st[2],
                      "via": via, "devices": sorted(set(fd + mp))}
    return found


# ---------------------------------------------------------------- the command


def _signal(p: dict, sig: signal.Signals) -> None:
    if p["exited"] or not signal_if_same(p["pid"], p["starttime"], sig):
        p["exited"] = True
        return
    p["signal"] = sig.name
    log(f"sent {sig.name} to {p['pid']} ({p['cmdline'][:200]})")


def reap(device_globs: list[str], protected: set[str], term_timeout: float = 15.0,
         kill_timeout: float = 10.0, check: bool = False, only_pids: set[int] | None = None,
         use_nvidia_smi: str = "auto", nvidia_smi: str | None = None, unit: str | None = None,
         mig: str = "auto", vendor: GpuVendor | None = None) -> dict:
    """Scan, SIGTERM/SIGKILL and verify; see the module docstring for rules and result.

    ``device_globs``: glob patterns of device files; ``protected``: executable basenames;
    ``unit``: the unit serviced (``NAME.service``): processes in another service's cgroup are
    never signalled (:func:`other_unit`); ``mig`` (``auto``/``on``/``off``): with MIG on only
    processes in ``unit``'s own cgroup are signalled (:func:`in_unit_cgroup`);
    timeouts in seconds; ``use_nvidia_smi``/``nvidia_smi``: whether to ask the GPU vendor's
    management tool and where it is (``vendor``: :class:`remote.gpus.GpuVendor`, default the
    host's). Raises ``PayloadError('runtime')`` when unprotected holders remain,
    ``PayloadError('not_found')`` when ``use_nvidia_smi == "yes"`` and it is missing.
    """
    vendor = vendor or local_vendor()
    devices = Devices(device_globs)
    if not devices.paths:
        log(f"no device files match {device_globs}", "warning")
    never = ancestors(os.getpid())
    holders = scan(devices)

    ghosts: list[dict] = []
    rows: list[dict] = []
    smi_state = "disabled"
    if use_nvidia_smi != "no":
        smi = nvidia_smi or shutil.which(vendor.smi)
        if not smi or not os.path.exists(smi):
            if use_nvidia_smi == "yes":
                raise PayloadError("not_found", f"{vendor.smi} not found")
            smi_state = "absent"
        else:
            try:
                rows = vendor.compute_apps(smi, GPU_QUERY_TIMEOUT_S)
                smi_state = "used"
            except ToolFailed as exc:
                log(f"{vendor.smi} failed: {exc}", "warning")
                rows, smi_state = [], "failed"
            for r in rows:
                if r["pid"] in holders:
                    h = holders[r["pid"]]
                    h["via"].append(vendor.smi)
                    h["used_memory_mib"] = r["used_memory_mib"]
                elif alive(r["pid"], None):
                    ghosts.append(dict(r, why="alive but holds no device file per /proc "
                                                "(other PID namespace?); not killed"))
                else:
                    ghosts.append(dict(r, why=f"no such process (stale {vendor.smi} entry)"))

    # nvidia-smi answered with PIDs this namespace sees: busy means a compute process (a CUDA
    # context), not an open device file (NVML monitors open them too: gpud, nvidia-smi -l)
    compute_view = smi_state == "used" and not ghosts
    mig_on = mig == "on" or (mig == "auto" and smi_state == "used"
                              and bool(vendor.health(smi, GPU_QUERY_TIMEOUT_S)["mig"]))
    compute_pids = {r["pid"] for r in rows} if compute_view else set()
    protected_l, skipped, targets, others, other_units, non_compute, slices = [], [], [], [], [], [], []
    for pid, h in sorted(holders.items()):
        brief = {"pid": pid, "cmdline": h["cmdline"]}
        cgroup = (_read(f"/proc/{pid}/cgroup") or b"").decode("utf-8", "replace")
        owner = other_unit(cgroup, unit)
        if is_protected(pid, protected):
            protected_l.append(brief)
        elif owner is not None:
            other_units.append(dict(brief, unit=owner))
        elif mig_on and not in_unit_cgroup(cgroup, unit):
            slices.append(dict(brief, why=f"MIG: not in {unit or 'the unit'}'s cgroup (another slice's process "
                                          "may share the GPU's device file)"))
        elif compute_view and pid not in compute_pids and not is_server(h["cmdline"]):
            non_compute.append(dict(brief, why=f"holds the device file but is no compute process ({vendor.smi})"))
        elif pid in never:
            skipped.append(dict(brief, why="PID 1 or the payload / its ancestor"))
        elif only_pids is not None and pid not in only_pids:
            others.append(brief)
        else:
            targets.append({"pid": pid, "cmdline": h["cmdline"], "starttime": h["starttime"],
                            "via": h["via"], "signal": None, "exited": False})

    result = {"devices": devices.paths, "check": check, "killed": [], "would_kill": [],
              "protected": protected_l, "skipped": skipped, "ghosts": ghosts, "others": others,
              "other_units": other_units, "non_compute": non_compute, "other_slices": slices, "remaining": [],
              "nvidia_smi": smi_state, "mig": mig_on}
    if check:
        result["would_kill"] = [{"pid": t["pid"], "cmdline": t["cmdline"], "via": t["via"]} for t in targets]
        result["remaining"] = [{"pid": t["pid"], "cmdline": t["cmdline"]} for t in targets] + \
            [{"pid": s["pid"], "cmdline": s["cmdline"]} for s in skipped]
        return result

    if targets:
        for t in targets:
            _signal(t, signal.SIGTERM)
        _wait_gone(targets, term_timeout)
        left = [t for t in targets if not t["exited"]]
        for t in left:
            _signal(t, signal.SIGKILL)
        if left:
            _wait_gone(left, kill_timeout)
    result["killed"] = [{"pid": t["pid"], "cmdline": t["cmdline"], "signal": t["signal"],
                         "exited": t["exited"], "via": t["via"]} for t in targets]

    after = scan(devices)
    remaining = []
    for pid, h in sorted(after.items()):
        if is_protected(pid, protected) or any(o["pid"] == pid for o in other_units + non_compute + slices):
            continue
        if only_pids is not None and pid not in only_pids and pid not in never:
            continue
        remaining.append({"pid": pid, "cmdline": h["cmdline"]})
    result["remaining"] = remaining
    if remaining:
        raise PayloadError("runtime", "GPU device files still held by unprotected processes: " +
                           "; ".join(f"{r['pid']} ({r['cmdline'][:120]})" for r in remaining),
                           detail=result)
    return result

