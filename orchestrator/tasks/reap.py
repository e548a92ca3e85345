"""Task ``reap`` (payload ``reap``): end leftover processes holding ``/dev/nvidia*`` after the unit stopped.

The work is done on the host by the payload's ``reap`` command (it scans
``/proc/*/fd``; SIGTERM, wait, SIGKILL; never the protected set, never a process of another
systemd unit's cgroup: several SGLang units may share a host). Only the unit's own GPUs are
scanned (:func:`orchestrator.host.devices.unit_gpu_devices`). Default protected
set: ``nvidia-persistenced``, ``nv-hostengine``, ``dcgm-exporter``, ``dcgmi``, ``Xorg``
(SIGKILL of dcgm-exporter froze GPUs, dcgm-exporter #84), plus
``orch_protected_processes`` (it adds to the built-in set; it never removes from it).

With ``KillMode=process`` or ``none`` the stop leaves the server's children running in the unit's
cgroup: they hold the unit's GPUs and are reaped here (the unit's cgroup, or no service's);
another service's processes never are. After the reap the unit must still be down
(:func:`held_stopped`).
"""

from __future__ import annotations

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import AWARE, task
from ..host.container import end_leftover_container
from ..host.devices import all_gpus, unit_gpu_devices
from ..host.sigkill import note_sigkills
from ..inventory import BUILTIN_PROTECTED_PROCESSES


@task("reap", rerun=True, check_mode=AWARE)
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

    A container unit's leftovers are the runtime's: its container is ended through the runtime
    (``stop``, ``rm -f``), never by host PID, and the GPU holders left are only listed
    (:func:`_reap_container`).
    """
    facts = ctx.facts.unit
    if facts is not None and facts.container is not None:
        return _reap_container(ctx, protected, devices, term_timeout)
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
    mig, mig_why = mig_mode(ctx)
    args += ["--mig", mig]
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
        msg += f"\nleft alone, no compute process ({ctx.facts.vendor.smi}): " + ", ".join(
            f"{p.get('pid')} ({str(p.get('cmdline'))[:80]})" for p in idle)
    spared = [f"{p.get('pid')} ({p.get('unit')})" for p in data.get("other_units") or []]
    if spared:
        msg += "\nother units' processes left alone: " + ", ".join(spared)
    slices = data.get("other_slices") or []
    if slices:
        ctx.emit("gpu_holders_left", holders=slices, why="mig")
        msg += (f"\nMIG ({mig_why}): left alone, not in {unit}'s cgroup (another slice may use the GPU): " +
                ", ".join(f"{p.get('pid')} ({str(p.get('cmdline'))[:80]})" for p in slices))
    msg += f"\n[{why}]"
    if unit and ctx.run.stopped_by_orch and not ctx.check:
        held_stopped(ctx, unit)
    return TaskResult("changed" if killed and not ctx.check else "ok", msg, data)


def mig_mode(ctx) -> tuple[str, str]:
    """``(--mig value, why)`` for the payload's reap: ``on`` when the probe's ``gpu_health`` found a GPU
    in MIG mode or the unit's ``CUDA_VISIBLE_DEVICES`` names ``MIG-`` devices (every slice shares
    the GPU's ``/dev/nvidiaN``: sglang #2933; only the unit's own cgroup is then reaped), else
    ``auto`` (the payload asks nvidia-smi itself)."""
    vendor = ctx.facts.vendor
    cvd = str(ctx.facts.environment.get(vendor.visible_devices_env, ""))
    if any(vendor.names_partition(p) for p in cvd.split(",")):
        return "on", f"{vendor.visible_devices_env} names MIG devices"
    health = ctx.facts.gpu_health
    if health is not None and health.nvidia_smi.mig:
        return "on", f"{vendor.smi}: MIG mode"
    return "auto", f"{vendor.smi} asked on the host"


def held_stopped(ctx, unit: str) -> None:
    """The unit orch stopped is still down after the reap. ``systemctl stop`` is an explicit stop:
    ``Restart=always``/``on-failure`` never restart it (systemd.service(5)), and the reap ends
    leftovers only once the unit is inactive, so no exit it causes counts as a crash of the unit.
    Something else can start it (a unit that ``Requires=`` it, a timer, the operator): then the
    tuner would share the GPUs with the server. Raises :class:`TaskFailed` naming the state."""
    state = ctx.facts.unit_handle(unit).is_active(ctx.connection)
    if state in ("active", "activating", "reloading"):
        raise TaskFailed(f"{unit} is {state} again while orch holds it stopped for the tune (it was started by "
                         "something other than orch: a unit that Requires= or Wants= it, a timer, the operator; "
                         "systemd's Restart= does not restart a unit stopped with systemctl stop)")


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



def container_gpu_devices(ctx) -> tuple[str, str]:
    """Device files of a container unit's GPUs (``--gpus``/``--device`` as the run command gives
    them, :class:`orchestrator.facts.container.GpuSelection`) and how they were found: GPU
    indexes -> ``/dev/nvidiaN``; ``all``, a count or UUIDs -> every GPU node."""
    sel = ctx.facts.unit.container.gpus
    vendor = ctx.facts.vendor
    if sel.how == "devices" and all(d.isdigit() for d in sel.devices):
        return (",".join(vendor.device_file(int(d)) for d in sel.devices),
                f"the container's GPUs {','.join(sel.devices)}")
    return all_gpus(ctx), f"the container's GPUs ({sel.how}): every GPU of the host"


def _reap_container(ctx, protected: list[str], devices: str | None, term_timeout: float) -> TaskResult:
    """``reap`` for a container unit: end its container through the runtime (when the stop left
    it), then list (payload ``reap --check``: nothing signalled) the processes still holding its
    GPUs, which orch does not end by host PID (they may be another container's)."""
    c = ctx.facts.unit.container
    unit = ctx.run.unit or ctx.facts.unit.unit
    done = [] if ctx.check else end_leftover_container(ctx, unit, term_timeout)
    why = "devices given to the task"
    if not devices:
        devices, why = container_gpu_devices(ctx)
    ctx.run.summary.reap_devices = devices
    protected = list(dict.fromkeys([*BUILTIN_PROTECTED_PROCESSES, *protected]))
    data = ctx.payload.call("reap", ["--devices", devices, "--protected", ",".join(protected), "--check"],
                            timeout=120)
    left = data.get("would_kill") or []
    msg = (f"the {c.runtime} container {c.name}: {' and '.join(done)} through {c.runtime}" if done
           else f"the {c.runtime} container {c.name} is gone")
    if left:
        ctx.emit("gpu_holders_left", holders=left)
        msg += ("\nstill holding the container's GPUs (not ended: orch ends a container's processes only through "
                "its runtime):\n" + "\n".join(f"pid {p.get('pid')}: {p.get('cmdline')}" for p in left))
    msg += f"\n[{why}]"
    return TaskResult("changed" if done else "ok", msg, {**data, "container": done})
