"""A container unit's CDI GPU path checked before anything stops (issue 32 row 7,
orchestrator/host/cdi.py), on a scripted host: a spec as ``nvidia-ctk cdi generate`` writes it
(layout of NVIDIA container toolkit 1.14+: top-level device nodes, versioned library mounts, the
``nvidia-cdi-hook`` hook; per-GPU and ``all`` devices), the driver before and after an upgrade."""

from __future__ import annotations

import re

import pytest

from orchestrator.engine.results import TaskFailed
from orchestrator.facts.container import parse_container_run
from orchestrator.host.cdi import cdi_devices, cdi_refusal, library_versions, spec_paths
from orchestrator.tasks import TASKS
from tests.fakes import ScriptedConnection, make_ctx

LIB = "/usr/lib/x86_64-linux-gnu"
SPEC = f"""---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-uvm
  - path: /dev/nvidiactl
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - args: [nvidia-cdi-hook, create-symlinks, --link, libcuda.so.1::{LIB}/libcuda.so]
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  mounts:
  - containerPath: {LIB}/libcuda.so.550.54.15
    hostPath: {LIB}/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
  - containerPath: {LIB}/libnvidia-ml.so.550.54.15
    hostPath: {LIB}/libnvidia-ml.so.550.54.15
    options: [ro, nosuid, nodev, bind]
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
  name: all
kind: nvidia.com/gpu
"""
RUN = ["/usr/bin/podman", "run", "--rm", "--name", "sglang", "--device", "nvidia.com/gpu=all", "img", "python3"]


def host(spec_files: dict[str, str], missing: list[str], driver: str) -> ScriptedConnection:
    """A host whose CDI folders hold ``spec_files`` (path -> text), where ``missing`` paths are gone
    and nvidia-smi reports ``driver``."""
    script = [(r"^sh -c for d in /etc/cdi", "".join(p + "\n" for p in spec_files))]
    for path, text in spec_files.items():
        script.append((rf"^head -c \d+ -- {re.escape(path)}$", text))
    script += [(r"^sh -c for p; do", lambda argv: "".join(p + "\n" for p in argv[4:] if p in missing)),
               (r"^nvidia-smi --query-gpu=driver_version", f"{driver}\n")]
    return ScriptedConnection(script)


def test_the_paths_a_spec_gives_its_devices():
    import yaml

    spec = yaml.safe_load(SPEC)
    paths = spec_paths(spec, ["all"])
    assert paths[:2] == ["/dev/nvidia-uvm", "/dev/nvidiactl"] and "/dev/nvidia1" in paths
    assert "/usr/bin/nvidia-cdi-hook" in paths and f"{LIB}/libcuda.so.550.54.15" in paths
    assert "/dev/nvidia1" not in spec_paths(spec, ["0"])
    assert library_versions(paths) == {"550.54.15": [f"{LIB}/libcuda.so.550.54.15", f"{LIB}/libnvidia-ml.so.550.54.15"]}
    assert cdi_devices(parse_container_run(RUN)) == ["nvidia.com/gpu=all"]
    assert cdi_devices(parse_container_run(["/usr/bin/docker", "run", "--gpus", "all", "img"])) == []


def test_a_current_spec_passes():
    conn = host({"/etc/cdi/nvidia.yaml": SPEC}, [], "550.54.15")
    assert cdi_refusal(conn, parse_container_run(RUN)) is None


def test_after_a_driver_upgrade_the_spec_is_stale_and_the_fix_is_named():
    gone = [f"{LIB}/libcuda.so.550.54.15", f"{LIB}/libnvidia-ml.so.550.54.15"]
    why = cdi_refusal(host({"/etc/cdi/nvidia.yaml": SPEC}, gone, "560.35.03"), parse_container_run(RUN))
    assert why.startswith("the CDI spec /etc/cdi/nvidia.yaml for nvidia.com/gpu=all is stale (it names "
                          f"{LIB}/libcuda.so.550.54.15, {LIB}/libnvidia-ml.so.550.54.15, which do not exist")
    assert "driver libraries are version 550.54.15 while the driver is 560.35.03" in why
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in why and why.endswith("nothing was stopped")
    # the old libraries still there (not cleaned up): another version than the driver's is stale too
    assert "while the driver is 560.35.03" in cdi_refusal(host({"/etc/cdi/nvidia.yaml": SPEC}, [], "560.35.03"),
                                                          parse_container_run(RUN))


def test_var_run_cdi_takes_precedence_and_a_missing_spec_is_refused():
    fresh = SPEC.replace("550.54.15", "560.35.03")
    conn = host({"/etc/cdi/nvidia.yaml": SPEC, "/var/run/cdi/nvidia.yaml": fresh}, [], "560.35.03")
    assert cdi_refusal(conn, parse_container_run(RUN)) is None
    why = cdi_refusal(host({}, [], "560.35.03"), parse_container_run(RUN))
    assert "no CDI spec in /etc/cdi or /var/run/cdi defines nvidia.com/gpu" in why and "nvidia-ctk cdi generate" in why


def test_the_probe_task_refuses_before_its_own_container_runs(tmp_path):
    from orchestrator.facts.unit import UnitFacts
    from orchestrator.facts.schema import from_dict

    conn = host({"/etc/cdi/nvidia.yaml": SPEC}, [f"{LIB}/libcuda.so.550.54.15"], "560.35.03")
    unit = from_dict(UnitFacts, {"unit": "sglang-qwen", "load_state": "loaded", "active_state": "active",
                                 "sub_state": "running", "main_pid": 7, "control_group": ""})
    unit.container = parse_container_run(RUN)
    ctx = make_ctx(tmp_path, {"orch_unit": unit}, connection=conn)  # no payload: none may be called
    with pytest.raises(TaskFailed, match="nvidia-ctk cdi generate"):
        TASKS["probe"].fn(ctx)


def test_the_driver_and_the_fix_are_the_gpu_vendors():
    """The check speaks the vendor of the device's CDI kind (``remote.gpus.GpuVendor``): its driver
    query and its generator's command; the kernel module answers when nvidia-smi does not."""
    from dataclasses import dataclass
    from typing import ClassVar

    from remote.gpus import GpuVendor
    from remote.gpus.nvidia import NVIDIA

    @dataclass(frozen=True)
    class OtherGpus(GpuVendor):
        cdi_kind: ClassVar[str] = "example.com/gpu"
        cdi_spec_file: ClassVar[str] = "/etc/cdi/example.yaml"
        cdi_list_command: ClassVar[str] = "example-cdi list"

        def driver_version(self, run):
            ok, out, _ = run(["example-smi", "--driver"])
            return out.strip() if ok else None

        def cdi_generate_command(self, path):
            return f"example-cdi generate {path}"

    other = OtherGpus("example")
    spec = SPEC.replace("nvidia.com/gpu", "example.com/gpu")
    run = parse_container_run(["/usr/bin/podman", "run", "--device", "nvidia.com/gpu=all", "img"])
    run.gpus.options[-1] = "example.com/gpu=all"  # a kind the parser knows only for vendors orch ships
    conn = ScriptedConnection([(r"^sh -c for d in /etc/cdi", "/etc/cdi/example.yaml\n"),
                               (r"^head -c \d+ -- /etc/cdi/example.yaml$", spec),
                               (r"^sh -c for p; do", ""), (r"^example-smi --driver$", "560.35.03\n")])
    why = cdi_refusal(conn, run, vendors=(NVIDIA, other))
    assert "while the driver is 560.35.03" in why
    assert "Regenerate the spec first: example-cdi generate /etc/cdi/example.yaml (then `example-cdi list`)" in why
    assert not any(c.startswith("nvidia-smi") for c in conn.commands())
    why = cdi_refusal(ScriptedConnection([(r"^sh -c for d in /etc/cdi", "")]), run, vendors=(NVIDIA, other))
    assert "Generate one first: example-cdi generate /etc/cdi/example.yaml; nothing was stopped" in why
    # a kind no vendor of the list claims is not checked (no host command at all)
    assert cdi_refusal(ScriptedConnection([]), run, vendors=(NVIDIA,)) is None
    # nvidia-smi failing: the kernel module's version decides
    fallback = host({"/etc/cdi/nvidia.yaml": SPEC}, [], "x")
    fallback.on(r"^nvidia-smi ", (9, "", "NVIDIA-SMI has failed")).on(r"^cat /sys/module/nvidia/version$", "560.35.03\n")
    assert "while the driver is 560.35.03" in cdi_refusal(fallback, parse_container_run(RUN))
