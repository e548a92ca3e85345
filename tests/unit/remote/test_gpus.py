"""The GPU vendor seam (``remote.gpus``): a second vendor is one more object, and the controller's
GPU decisions (which device files are the unit's, MIG, the container's GPUs, the health messages,
the GPU table) follow the host's vendor, never NVIDIA's names. The second vendor here is a fake in
ROCm's terms (``amd-smi``, ``/dev/dri/renderD*``, ``HIP_VISIBLE_DEVICES``, ``AMD Instinct MI300X``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import ClassVar

import pytest

from orchestrator.facts.catalog import HostFacts
from orchestrator.facts.gpu_health import GpuHealth
from orchestrator.facts.gpus import gather_gpus
from orchestrator.host.devices import unit_gpu_devices
from remote.gpus import DEFAULT, VENDORS, GpuVendor, UnresolvedDevices, vendor_for, vendor_named
from remote.gpus.nvidia import NVIDIA, NvidiaGpus
from tests.fakes import FakePayload, ScriptedConnection, make_ctx


@dataclass(frozen=True)
class FakeRocm(GpuVendor):
    """A second vendor, as ROCm would be one (its names; the queries answer from text)."""

    smi: ClassVar[str] = "amd-smi"
    visible_devices_env: ClassVar[str] = "HIP_VISIBLE_DEVICES"
    device_glob: ClassVar[str] = "/dev/dri/renderD*"
    gpu_device_glob: ClassVar[str] = "/dev/dri/renderD*"
    protected_processes: ClassVar[tuple[str, ...]] = ("amd-smi-exporter",)
    cdi_kind: ClassVar[str] = "amd.com/gpu"
    error_name: ClassVar[str] = "amdgpu error"
    error_catalog: ClassVar[str] = "the amdgpu driver's RAS events"

    def names_device(self, device_name):
        return device_name.replace("_", " ").startswith("AMD ")

    def device_file(self, index):
        return f"/dev/dri/renderD{128 + int(index)}"

    def device_index(self, path):
        return int(path.rsplit("D", 1)[1]) - 128 if path.startswith("/dev/dri/renderD") else None

    def is_device_file(self, path):
        return path.startswith("/dev/dri/") or path == "/dev/kfd"

    def names_partition(self, entry):
        return False

    def table_commands(self):
        return {"query": ["amd-smi", "list", "--csv"]}

    def gpu_table(self, outputs):
        return [line.split(",")[0] for line in outputs.get("query", "").splitlines() if line]

    def table_problem(self, gpus):
        return None

    def resolve_visible_devices(self, value, gpus):
        out = []
        for e in value.split(","):
            if not e.strip().isdigit():
                raise UnresolvedDevices(f"HIP_VISIBLE_DEVICES entry {e!r}")
            out.append(self.device_file(int(e)))
        return out

    def describe_error(self, code, pci, time_s, text):
        return f"amdgpu error {code} on {pci}: {text}"


ROCM = FakeRocm("rocm")
BOTH = (NVIDIA, ROCM)


def test_the_vendor_is_chosen_from_the_device_name_the_engine_sees():
    assert vendor_for("AMD_Instinct_MI300X", BOTH) is ROCM and vendor_for("AMD Instinct MI300X", BOTH) is ROCM
    for name in ("NVIDIA H200", "NVIDIA_H200", "Tesla V100-SXM2-16GB", "GeForce RTX 4090"):
        assert vendor_for(name, BOTH) is NVIDIA, name
    assert vendor_for(None, BOTH) is NVIDIA and vendor_for("Something Else", BOTH) is NVIDIA  # the default
    assert vendor_named("rocm", BOTH) is ROCM
    with pytest.raises(ValueError, match="known: nvidia, rocm"):
        vendor_named("intel", BOTH)
    # orch knows NVIDIA today: an AMD name falls back to it, as before the seam
    assert VENDORS == (NVIDIA,) and DEFAULT is NVIDIA and vendor_for("AMD_Instinct_MI300X") is NVIDIA


def test_nvidia_implements_every_method_of_the_interface():
    base = {n for n, f in vars(GpuVendor).items() if inspect.isfunction(f) and not n.startswith("_")}
    missing = sorted(n for n in base - {"gather"} if vars(NvidiaGpus).get(n) is None)
    assert not missing, missing
    constants = ("smi", "visible_devices_env", "device_glob", "gpu_device_glob", "protected_processes",
                 "container_toolkit_paths", "cdi_kind", "cdi_spec_file", "cdi_list_command", "error_name",
                 "error_catalog")
    assert all(getattr(NVIDIA, c) for c in constants)
    assert NVIDIA.device_file(3) == "/dev/nvidia3" and NVIDIA.device_index("/dev/nvidia3") == 3
    assert NVIDIA.device_index("/dev/nvidiactl") is None and NVIDIA.is_device_file("/dev/nvidiactl")


def test_nvidias_driver_version_and_cdi_spec_command():
    """The driver's version a CDI spec is compared with: nvidia-smi's, else the kernel module's
    (``/sys/module/nvidia/version``), else unknown; the command that regenerates the spec."""
    def runner(answers):
        asked = []

        def run(argv):
            asked.append(" ".join(argv))
            return answers.get(argv[0], (False, "", "not found"))

        return run, asked

    run, asked = runner({"nvidia-smi": (True, "560.35.03\n560.35.03\n", "")})
    assert NVIDIA.driver_version(run) == "560.35.03"
    assert asked == ["nvidia-smi --query-gpu=driver_version --format=csv,noheader"]
    run, asked = runner({"nvidia-smi": (False, "", "NVIDIA-SMI has failed"), "cat": (True, "550.54.15\n", "")})
    assert NVIDIA.driver_version(run) == "550.54.15" and asked[-1] == "cat /sys/module/nvidia/version"
    run, _ = runner({"nvidia-smi": (True, "[N/A]\n", ""), "cat": (False, "", "No such file")})
    assert NVIDIA.driver_version(run) is None
    assert NVIDIA.cdi_generate_command("/etc/cdi/x.yaml") == "nvidia-ctk cdi generate --output=/etc/cdi/x.yaml"
    assert NVIDIA.cdi_spec_file == "/etc/cdi/nvidia.yaml" and NVIDIA.cdi_list_command == "nvidia-ctk cdi list"


def _ctx(tmp_path, vendor, env, **more):
    variables = {"orch_unit": {"unit": "sglang-qwen", "environment": env}, **more}
    if vendor is not None:
        variables["orch_gpu_vendor"] = vendor
    return make_ctx(tmp_path, variables, connection=ScriptedConnection())


def test_the_units_device_files_follow_the_hosts_vendor(tmp_path):
    ctx = _ctx(tmp_path, ROCM, {"HIP_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "0"})
    HostFacts.check({"orch_gpu_vendor": ROCM})  # a typed fact, of any vendor
    assert ctx.facts.vendor is ROCM
    assert unit_gpu_devices(ctx) == ("/dev/dri/renderD129,/dev/dri/renderD130", "HIP_VISIBLE_DEVICES=1,2")
    assert unit_gpu_devices(_ctx(tmp_path, ROCM, {})) == ("/dev/dri/renderD*", "HIP_VISIBLE_DEVICES unset: every "
                                                                               "GPU of the host")
    # the same environment on an NVIDIA host: CUDA's variable, NVIDIA's files
    assert unit_gpu_devices(_ctx(tmp_path, NVIDIA, {"HIP_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "0"})) == (
        "/dev/nvidia0", "CUDA_VISIBLE_DEVICES=0")
    # before the probe: the inventory's device name says which vendor (else NVIDIA)
    assert _ctx(tmp_path, None, {}).facts.vendor is NVIDIA
    assert _ctx(tmp_path, None, {}, orch_device_name="NVIDIA H100").facts.vendor is NVIDIA


def test_the_gpu_table_is_the_vendors_queries_and_parsing(tmp_path):
    conn = ScriptedConnection([(r"^amd-smi list --csv$", "0,gpu0\n1,gpu1\n")])
    assert gather_gpus(conn, ROCM) == (["0", "1"], None)
    down = ScriptedConnection([(r"^amd-smi", (1, "", "amd-smi: no driver"))])
    assert gather_gpus(down, ROCM) == ([], "amd-smi list failed: amd-smi: no driver")
    nv = ScriptedConnection([(r"^nvidia-smi --query-gpu", (9, "", "NVIDIA-SMI has failed"))])
    assert gather_gpus(nv, NVIDIA) == ([], "nvidia-smi --query-gpu failed: NVIDIA-SMI has failed")


def test_reap_and_health_speak_the_hosts_vendor(tmp_path):
    from orchestrator.tasks import TASKS

    answer = {"devices": [], "check": False, "killed": [], "would_kill": [], "protected": [], "skipped": [],
              "ghosts": [], "others": [], "other_units": [], "remaining": [], "other_slices": [], "mig": False,
              "nvidia_smi": "used", "non_compute": [{"pid": 9, "cmdline": "monitor"}]}
    payload = FakePayload({"reap": answer})
    ctx = make_ctx(tmp_path, {"orch_unit": {"unit": "sglang-qwen", "environment": {"HIP_VISIBLE_DEVICES": "0"}},
                              "orch_gpu_vendor": ROCM}, payload=payload)
    got = TASKS["reap"].fn(ctx, protected=[])
    args = payload.calls[0][1]
    assert args[args.index("--devices") + 1] == "/dev/dri/renderD128" and args[args.index("--mig") + 1] == "auto"
    assert "no compute process (amd-smi)" in got.msg and "nvidia" not in got.msg.lower()
    # a fatal GPU error in the kernel log, in the vendor's words
    xid = {"source": "dmesg", "source_problem": None, "nvidia_smi": {"state": "ok", "reason": "", "gpus": [], "mig": False},
           "xids": [{"pci": "0000:c1:00", "code": 79, "text": "lost", "time_s": None, "fatal": True}]}
    ctx = make_ctx(tmp_path, {"orch_gpu_vendor": ROCM}, payload=FakePayload({"xid": xid}))
    from orchestrator.engine.results import TaskFailed

    with pytest.raises(TaskFailed, match=r"amdgpu error 79 on 0000:c1:00: lost: a GPU lost until it is reset "
                                         r"\(the amdgpu driver's RAS events\)"):
        TASKS["gpu_health"].fn(ctx, stage="probe")
    assert GpuHealth.parse(xid, "xid").fatal()[0].describe(NVIDIA) == "Xid 79 on 0000:c1:00: lost"
