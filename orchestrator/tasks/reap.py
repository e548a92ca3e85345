"""Task ``reap`` (payload ``reap``): end leftover processes holding ``/dev/nvidia*`` after the unit stopped.

The work is done on the host by the payload's ``reap`` command (it scans
``/proc/*/fd``; SIGTERM, wait, SIGKILL; never the protected set, never a process of another
systemd unit's cgroup: several SGLang units may share a host). Only the unit's own GPUs are
scanned (:func:`orchestrator.host.devices.unit_gpu_devices`). Default protected
set: ``nvidia-persistenced``, ``nv-hostengine``, ``dcgm-exporter``, ``dcgmi``, ``Xorg``
(SIGKILL of dcgm-exporter froze GPUs, dcgm-exporter #84), plus
``orch_protected_processes`` (it adds to the built-in set; it never removes from it).
"""

from __future__ import annotations

from ..engine.results import TaskResult
from ..engine.task import AWARE, task
from ..host.devices import unit_gpu_devices
from ..host.sigkill import note_sigkills
from ..inventory import BUILTIN_PROTECTED_PROCESSES


@task("reap", check_mode=AWARE)
def reap(ctx, protected: list[str], devices: str | None = None, term_timeout: float = 15) -> TaskResult:
    """End the processes left holding the unit's GPUs; record each PID killed with its command line.

    ``protected``: process names never signalled (``orch_protected_processes``), added to the
    built-in set (``nvidia-persistenced``, DCGM, Xorg, ...), never replacing it. ``devices``
    (comma-separated globs) defaults to the unit's own GPUs
    (:func:`orchestrator.host.devices.unit_gpu_devices`);
    ``term_timeout`` is the seconds between SIGTERM and SIGKILL. Under ``--check`` it lists what
    it would end. Fails (payload error) when an unprotected holder remains. Where nvidia-smi lists
    the compute processes (and its PIDs are this host's), "free" means no unprotected compute
    process on the unit's GPUs: a holder that only opened the device file (an NVML monitor) is
    left alone and named in the message (payload ``reap``, ``non_compute``). The wait is bounded:
    ``term_timeout`` after SIGTERM, the payload's ``--kill-timeout`` after SIGKILL.
    """
    why = "devices given to the task"
    if not devices:
        devices, why = unit_gpu_devices(ctx)
    ctx.run.summary.reap_devices = devices
    if devices is None:
        ctx.emit("reap_skipped", why=why)
        return TaskResult.ok(f"reaped nothing: the unit's GPUs are not known ({why}); a leftover on them may "
                             "make the start fail (then the earlier configs are restored)", devices=None, why=why)
    protected = list(dict.fromkeys([*BUILTIN_PROTECTED_PROCESSES, *protected]))
    args = ["--devices", devices, "--protected", ",".join(protected), "--term-timeout", str(term_timeout)]
    unit = ctx.run.unit or (ctx.facts.unit.unit if ctx.facts.unit is not None else None)
    if unit:
        args += ["--unit", unit if "." in unit else f"{unit}.service"]
    if ctx.check:
        args.append("--check")
    data = ctx.payload.call("reap", args, timeout=float(term_timeout) * 3 + 120)
    killed = data.get("killed") or []
    for k in killed:
        ctx.emit("process_killed", pid=k.get("pid"), cmdline=k.get("cmdline"), signal=k.get("signal"))
    ctx.run.summary.reaped = killed
    note_sigkills(ctx, killed, "reap")
    msg = reap_message(killed, data.get("protected") or [])
    idle = data.get("non_compute") or []
    if idle:  # the GPU is free of compute processes: these only opened the device (NVML monitors)
        msg += "\nleft alone, no compute process (nvidia-smi): " + ", ".join(
            f"{p.get('pid')} ({str(p.get('cmdline'))[:80]})" for p in idle)
    spared = [f"{p.get('pid')} ({p.get('unit')})" for p in data.get("other_units") or []]
    if spared:
        msg += "\nother units' processes left alone: " + ", ".join(spared)
    msg += f"\n[{why}]"
    return TaskResult("changed" if killed and not ctx.check else "ok", msg, data)


def reap_message(killed: list[dict], protected: list[dict]) -> str:
    """The reap task's message: a count line, then one line per process with its PID, the signal
    that ended it (or ``protected, kept``) and its whole command line (nothing cut: the terminal
    wraps it at spaces). ``killed``/``protected``: the payload's ``reap`` lists of
    ``{"pid", "cmdline", "signal"}``."""
    if not killed and not protected:
        return "no leftover GPU processes"
    head = f"killed {len(killed)} leftover GPU process(es)" if killed else "no leftover GPU processes"
    if protected:
        head += f"; kept {len(protected)} protected"
    lines = [head]
    lines += [f"killed pid {k.get('pid')} by {k.get('signal')}: {k.get('cmdline')}" for k in killed]
    lines += [f"kept pid {p.get('pid')} (protected): {p.get('cmdline')}" for p in protected]
    return "\n".join(lines)

