"""GPU 0's compute capability from nvidia-smi where torch opens no CUDA context (issue 32 row 18):
the parsing, which GPU is the server's GPU 0, and the probe falling back to it (a fake
``nvidia-smi`` on PATH answering as a real driver does; this machine has no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remote.gpus.nvidia import parse_compute_caps, pick_capability
from tests.paths import REPO

TWO = "0, GPU-aaaa1111, 9.0\n1, GPU-bbbb2222, 12.0\n"


def test_parse_compute_caps_tolerates_what_drivers_print():
    rows = parse_compute_caps(TWO + "2, [N/A], [N/A]\nNo devices were found\n")
    assert rows == [{"index": 0, "uuid": "GPU-aaaa1111", "compute_cap": "9.0"},
                    {"index": 1, "uuid": "GPU-bbbb2222", "compute_cap": "12.0"},
                    {"index": 2, "uuid": None, "compute_cap": None}]


def test_which_gpu_is_the_servers_gpu_0():
    same = parse_compute_caps("0, GPU-a, 12.0\n1, GPU-b, 12.0\n")
    assert pick_capability(same, None)[0] == "12.0"
    assert pick_capability(same, "1")[0] == "12.0"
    two = parse_compute_caps(TWO)
    assert pick_capability(two, "1,0")[0] == "12.0"
    assert pick_capability(two, "GPU-aaaa")[0] == "9.0"  # CUDA takes a UUID prefix
    cap, why = pick_capability(two, None)
    assert cap is None and "different compute capabilities" in why  # CUDA's order is not nvidia-smi's
    assert pick_capability(same, "")[0] is None  # the server sees no GPU
    assert pick_capability([], None) == (None, "nvidia-smi listed no GPU with a compute capability")


def _fake_smi(tmp_path, text: str, status: int = 0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\nexit {status}\n")
    smi.chmod(0o755)
    return bin_dir


def _probe(tmp_path, bin_dir, cvd: str | None, *flags: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    r = subprocess.run([sys.executable, "-m", "remote", "probe", *flags], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    return json.loads(r.stdout.splitlines()[-1])["data"]


def test_probe_takes_nvidia_smis_capability_where_torch_sees_no_gpu(tmp_path):
    data = _probe(tmp_path, _fake_smi(tmp_path, TWO), "1")
    assert data["gpus"] == [] and data["capability"] == "12.0" and data["capability_source"] == "nvidia-smi"
    assert data["capability_tried"][0].startswith("torch in the unit's environment: no CUDA device visible")
    assert "compute_cap of GPU 1 (CUDA_VISIBLE_DEVICES=1)" in data["capability_tried"][1]
    # the operator's value wins and nvidia-smi is not asked
    data = _probe(tmp_path, _fake_smi(tmp_path / "x", "0, GPU-a, 8.0\n"), None, "--capability", "9.0")
    assert (data["capability"], data["capability_source"]) == ("9.0", "flag")
    assert len(data["capability_tried"]) == 1


def test_an_old_driver_without_compute_cap_is_named(tmp_path):
    data = _probe(tmp_path, _fake_smi(tmp_path, 'Field "compute_cap" is not a valid field to query.\n', 2), None)
    assert data["capability"] is None and data["capability_source"] is None
    assert data["capability_tried"][-1].startswith("nvidia-smi --query-gpu=compute_cap: failed")
