"""Task ``gpu_health`` (payload ``xid``): the kernel log's NVIDIA Xid lines and whether
``nvidia-smi`` answers, before anything stops and again after the tune.

Why: after an Xid error a GPU can be lost until a reset and ``nvidia-smi`` can hang in D state
forever (leptonai/gpud #117, dcgm-exporter #84); tuning on such a GPU, or installing what a tune
on it measured, is worthless, and the server may not start again. At ``stage: probe`` a fatal Xid
already in the log (``remote.gpus.nvidia.FATAL_XIDS``, from NVIDIA's Xid catalog,
docs.nvidia.com/deploy/xid-errors) or an nvidia-smi that does not answer in time refuses the
host before anything is stopped; the reading is kept as ``orch_gpu_health``. At
``stage: after_tune`` a fatal Xid that was not in that reading (or nvidia-smi no longer
answering) fails the task: in the tune playbook that is inside the stop/start block, so the
rescue puts back the earlier files and starts the unit as systemd can, and the host counts as
failed for the play's ``max_fail_percentage``.
"""

from __future__ import annotations

from typing import Literal

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.gpu_health import GpuHealth
from ..facts.schema import FactError


def _read(ctx) -> GpuHealth:
    """The payload's ``xid`` answer, typed; :class:`TaskFailed` when it does not fit."""
    data = ctx.payload.call("xid", [], timeout=120)
    try:
        return GpuHealth.parse(data, "xid")
    except FactError as exc:
        raise TaskFailed(f"{exc}: the payload's xid answer does not fit this controller") from None


@task("gpu_health", rerun=True, check_mode=READ_ONLY, sets=("orch_gpu_health",))
def gpu_health(ctx, stage: Literal["probe", "after_tune"] = "probe") -> TaskResult:
    """Read the kernel log's ``NVRM: Xid`` lines and ask ``nvidia-smi`` under a deadline (payload
    ``xid``). ``stage: probe``: refuse the host (:class:`TaskFailed`, nothing stopped) when a
    fatal Xid is in the log or nvidia-smi does not answer; keep the reading (``orch_gpu_health``).
    ``stage: after_tune``: fail naming the Xid when a fatal one appeared since that reading, or
    when nvidia-smi stopped answering. A log that cannot be read (``dmesg`` refused and no
    ``/dev/kmsg``) is said in the message, never a failure."""
    health = _read(ctx)
    smi = health.nvidia_smi
    vendor = ctx.facts.vendor
    err, tool, catalog = vendor.error_name, vendor.smi, vendor.error_catalog
    ctx.emit("gpu_health", stage=stage, source=health.source, xids=[x.to_dict() for x in health.xids],
             nvidia_smi=smi.state, mig=smi.mig)
    where = (f"kernel log from {health.source}" if health.source
             else f"kernel log not readable ({health.source_problem})")
    if stage == "probe":
        fatal = health.fatal()
        if fatal:
            raise TaskFailed("the kernel log has " + "; ".join(x.describe(vendor) for x in fatal) +
                             f": a GPU lost until it is reset ({catalog}). Nothing was stopped; reset the "
                             "GPU or reboot the host, then run again", data=health.to_dict())
        if smi.not_answering:
            raise TaskFailed(f"{smi.reason}. Nothing was stopped: a GPU whose {tool} hangs is in no state to "
                             f"tune (check the kernel log for its {err} lines)", data=health.to_dict())
        msg = f"no fatal {err} ({len(health.xids)} {err} line(s), {where}); {tool}: {smi.state}" + (
            ", MIG mode" if smi.mig else "")
        return TaskResult.ok(msg, facts={"orch_gpu_health": health}, **health.to_dict())
    new = health.new_fatal(ctx.facts.gpu_health)
    if new:
        ctx.run.summary.gpu_lost = [x.to_dict() for x in new]
        raise TaskFailed("a GPU was lost during the tune: " + "; ".join(x.describe(vendor) for x in new) +
                         f" ({catalog}). The rollout stops on this host: the earlier configs are put back "
                         "and the unit started as systemd can", data=health.to_dict())
    if smi.not_answering:
        raise TaskFailed(f"after the tune: {smi.reason}. The rollout stops on this host", data=health.to_dict())
    return TaskResult.ok(f"no new fatal {err} after the tune ({where}); {tool}: {smi.state}", **health.to_dict())
