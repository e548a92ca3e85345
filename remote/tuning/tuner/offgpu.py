"""A process that prepares a tune for a GPU it never opens (``python -m remote prepare``).

Before the unit stops, the server holds the GPU; the prepare step runs beside it on the host's
CPUs and must not create a CUDA context (it would take GPU memory from the server and, on a GPU in
exclusive-process mode, fail). What it needs of the GPU is its *target*: the compute capability
(from the probe, or ``nvidia-smi --query-gpu=compute_cap``, which asks NVML and opens no context)
and the device name. This module gives the process what Triton's launch path and SGLang's launch
code ask for, answered from that target, with CUDA hidden (``CUDA_VISIBLE_DEVICES=""``):

- :class:`TargetDriver`: Triton's active driver for the capture (:func:`remote.tuning.tuner.aot.capture`):
  current device 0, stream 0, target ``GPUTarget("cuda", 90, 32)`` for compute capability 9.0.
  ``JITFunction.run`` binds and specialises CPU tensors and hands ``compile`` the request a launch
  on the GPU makes (Triton 3.3-3.9 ``python/triton/runtime/jit.py``: ``run`` asks the driver for
  the device, stream and target only, before the compile).
- :func:`answer_as_target`: ``torch.cuda``'s device queries answer as the target GPU
  (``is_available``, ``device_count``, ``current_device``, ``get_device_capability``,
  ``get_device_name``) without initialising CUDA, because SGLang's launch code chooses launch
  options from them: SGLang 0.5.23 ``sglang/kernels/jit/utils/arch.py`` ``is_arch_support_pdl``
  (programmatic dependent launch, ``USE_GDC``, on compute capability 9.0+) reads
  ``torch.cuda.current_device()`` and ``get_device_capability``; ``sglang/srt/utils/common.py``
  ``is_cuda`` reads ``torch.cuda.is_available()``. Anything else that needs the device (an
  allocation on ``cuda``) still fails, since no GPU is visible: a candidate whose launch code does
  that is not prepared and compiles after the stop.

:func:`cuda_state` says, at the end, that the process never initialised CUDA; the prepare command
refuses its own result otherwise.
"""

from __future__ import annotations

import os
import re
import sys

from ...protocol import PayloadError

#: NVIDIA GPUs run 32 threads a warp (Triton's CUDA target takes it as ``warp_size``)
CUDA_WARP = 32
def parse_capability(text: str | None) -> tuple[int, int] | None:
    """``"9.0"`` -> ``(9, 0)``; None for an empty or malformed text. Pure."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def target_of(capability: tuple[int, int]) -> tuple[str, int, int]:
    """Triton's CUDA target ``(backend, arch, warp_size)`` of a compute capability: ``(9, 0)`` ->
    ``("cuda", 90, 32)`` (Triton's ``CudaDriver.get_current_target``: ``major * 10 + minor``)."""
    return ("cuda", capability[0] * 10 + capability[1], CUDA_WARP)


def gpu_target(capability: str | None, device_name: str | None, smi: str | None = None,
               timeout_s: float = 30.0) -> dict:
    """The GPU the prepared kernels are for: ``{"capability": "9.0", "device_name": ...,
    "target": ["cuda", 90, 32], "source": "probe"|<the vendor's tool>}``. ``capability``/``device_name``
    are the controller's (the probe's, or the inventory's ``orch_gpu_capability``); what is missing
    comes from the host's GPU vendor's management tool (``GpuVendor.capability_and_name``, ``smi``:
    its path; no compute context). Raises PayloadError ``not_found`` when neither names a capability."""
    from ...gpus import local_vendor
    cap = parse_capability(capability)
    source = "probe"
    name = device_name
    if cap is None or not name:
        vendor = local_vendor()
        got = vendor.capability_and_name(smi, timeout_s)
        if got:
            if cap is None:
                cap, source = parse_capability(got[0]), vendor.smi
            name = name or got[1]
    if cap is None:
        raise PayloadError("not_found", "no compute capability to compile for: none was given (--capability) and "
                                        "the GPU vendor's management tool answered none")
    return {"capability": f"{cap[0]}.{cap[1]}", "device_name": name, "target": list(target_of(cap)),
            "source": source}


def hide_gpus() -> None:
    """Hide every GPU from this process (before torch or a CUDA library is imported): CUDA then
    cannot create a context here, whatever the code imported later does: every GPU vendor's
    visible-devices variable set empty."""
    from ...gpus import VENDORS
    for vendor in VENDORS:
        os.environ[vendor.visible_devices_env] = ""


class TargetDriver:
    """Triton's active driver in a process that compiles for ``target`` (``(backend, arch,
    warp_size)``) without a GPU: the queries ``JITFunction.run`` makes before it compiles."""

    def __init__(self, target):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(*target)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


def use_target_driver(target) -> None:
    """Make :class:`TargetDriver` Triton's active driver in this process."""
    from triton.runtime import driver
    driver.set_active(TargetDriver(target))


def answer_as_target(capability: str, device_name: str | None) -> list[str]:
    """Make ``torch.cuda``'s device queries answer as the target GPU (module docstring) in this
    process; returns the names replaced. Call before SGLang is imported (its modules read
    ``is_cuda()`` at import). Raises ValueError for a malformed ``capability``."""
    import torch
    cap = parse_capability(capability)
    if cap is None:
        raise ValueError(f"not a compute capability: {capability!r}")
    cuda = torch.cuda
    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "get_device_capability": lambda device=None: cap,
        "get_device_name": lambda device=None: device_name or "",
    }
    for name, fn in answers.items():
        setattr(cuda, name, fn)
    return sorted(answers)


def cuda_state() -> dict:
    """What this process holds of CUDA: ``{"visible": the local GPU vendor's visible-devices variable,
    "initialized": torch.cuda.is_initialized()}`` (False when torch was never imported)."""
    from ...gpus import local_vendor
    torch = sys.modules.get("torch")
    init = False
    if torch is not None:
        try:
            init = bool(torch.cuda.is_initialized())
        except Exception:
            init = False
    return {"visible": os.environ.get(local_vendor().visible_devices_env), "initialized": init}
