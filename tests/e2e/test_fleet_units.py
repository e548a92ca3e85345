"""End to end: fleets as they really are (issue 13): unit variants and shared hosts.

Each test sets up test-bed hosts shaped like a real fleet (``tests/testbed/bed.py``
``FLEET_OPTION_DEFAULTS``) and runs the real ``orch`` over SSH against them:

1. variables only in ``EnvironmentFile=`` (``SGLANG_MOE_CONFIG_DIR`` overriding ``Environment=``);
2. arguments in SGLang's ``--config`` YAML (model, TP 4, port 30001);
3. servers bound to loopback (no ``--host``) or to their NIC address only;
4. the port still held after the stop by a leftover of the unit that holds no GPU;
5. two units on one host with GPUs named by UUID in ``CUDA_VISIBLE_DEVICES``;
6. (multi-node servers: tests/e2e/test_multi_node.py);
7. two hosts sharing one orch state folder;
8. the model only in the ModelScope cache (``SGLANG_USE_MODELSCOPE=true``).

docs/reliability.md ("Real fleets") lists what orch does in each case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import inventory, orch, recap
from tests.testbed.bed import TINY_MOE_CONFIG, gpu_uuid

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


def _from_unit(path: Path) -> Path:
    """Drop the bed's ``orch_model_config`` override: the model comes from the unit, as on a real fleet."""
    data = yaml.safe_load(path.read_text())
    for group in data["all"]["children"].values():
        group["vars"].pop("orch_model_config", None)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _main_pid(host, unit=None) -> int:
    out = host.sh(f"systemctl show -p MainPID {unit or host.unit}").stdout.strip()
    return int(out.split("=", 1)[1] or 0)


def _server_pids(host) -> list:
    """PIDs of the host's processes whose argv runs ``-m sglang.launch_server`` (the server and forks)."""
    code = ("import os\n"
            "for p in os.listdir('/proc'):\n"
            "    try: a = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
            "    except OSError: continue\n"
            "    if any(a[i] == b'-m' and a[i + 1] == b'sglang.launch_server' for i in range(len(a) - 1)): print(p)\n")
    return [int(x) for x in host.py(code).stdout.split()]


def _events(state: Path, run_id: str) -> list:
    path = state / "runs" / run_id / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _loaded(host, path: str) -> bool:
    return f"Using MoE kernel config from {path}." in host.unit_log()


# --------------------------------------------------------------------------- 1. EnvironmentFile


def test_environment_file_decides_where_configs_go(testbed_factory, tmp_path):
    """SGLANG_MOE_CONFIG_DIR and CUDA_VISIBLE_DEVICES only in an EnvironmentFile (which overrides the
    unit's own Environment=, as systemd does): orch installs where SGLang reads, and doctor looks there."""
    env_file = "SGLANG_MOE_CONFIG_DIR=/srv/moe\n# GPUs of this server\nCUDA_VISIBLE_DEVICES=0,1,2,3\n"
    bed = testbed_factory(1, {0: {
        "n_gpus": 4, "env": {"SGLANG_MOE_CONFIG_DIR": "/srv/not-read"},
        "env_files": ["-/etc/default/sglang-qwen", "-/etc/default/sglang-qwen-absent"],
        "files": {"/etc/default/sglang-qwen": env_file, "/srv/moe/configs/.keep": ""}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    want = f"/srv/moe/configs/triton_{h.triton_version.replace('.', '_')}"
    package_dir = h.triton_dir  # the bed's moe_config_dir is unset: the package's configs/triton_X_Y_Z
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert r["summary"]["plan"]["install_dir"] == want
    for name in (UP, DOWN):
        assert h.sh(f"test -f {want}/{name}", check=False).returncode == 0, name
        assert _loaded(h, f"{want}/{name}")
    assert h.sh(f"ls {package_dir}", check=False).stdout.strip() == "", "nothing goes to the package folder"
    doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    row = recap(doc)[h.name]
    assert row["verdict"] == "tuned", row
    assert row["configs_root"] == "/srv/moe/configs", row


# --------------------------------------------------------------------------- 2. --config YAML


def test_arguments_in_sglang_config_file(testbed_factory, tmp_path):
    """Model, TP and port only in the YAML of ``--config``: orch merges it as SGLang does and tunes
    for TP 4 (N = 64 / 4), waits on port 30001."""
    yaml_text = "# SGLang server flags\nmodel-path: /models/tiny-moe\ntp-size: 4\nport: 30001\nhost: 0.0.0.0\n"
    bed = testbed_factory(1, {0: {"n_gpus": 4, "tp": 4, "port": 30001,
                                  "launch_args": ["--config", "/etc/sglang/qwen3.yaml"],
                                  "files": {"/etc/sglang/qwen3.yaml": yaml_text}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = _from_unit(inventory(bed, tmp_path / "hosts.yaml"))
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", r
    for name in ("E=8,N=16,device_name=NVIDIA_H200.json", "E=8,N=16,device_name=NVIDIA_H200_down.json"):
        assert h.sh(f"test -f {h.triton_dir}/{name}", check=False).returncode == 0, name
        assert _loaded(h, f"{h.triton_dir}/{name}")
    assert h.unit_state() == "active"


# --------------------------------------------------------------------------- 3. loopback / NIC


def test_server_bound_to_loopback_or_to_its_address(testbed_factory, tmp_path):
    """gpu-a: no --host (SGLang binds 127.0.0.1, the controller cannot reach it); gpu-b: --host its
    own address (127.0.0.1 is refused). orch finds where each answers before the stop and uses that
    address for readiness and both benchmarks."""
    bed = testbed_factory(2, {0: {"bind_host": None}, 1: {"bind_host": "address"}})
    for h in bed.hosts:
        h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml", orch_ready_timeout=40)
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    res = recap(proc)
    for h in bed.hosts:
        r = res["hosts"][h.name]
        assert r["outcome"] == "completed", (h.name, r)
        assert r["summary"]["bench_before"]["output_throughput"] and r["summary"]["bench_after"]["output_throughput"]
        assert _loaded(h, f"{h.triton_dir}/{UP}")
    ends = {h.name: res["hosts"][h.name]["summary"]["endpoint"]["url"] for h in bed.hosts}
    assert ends == {"gpu-a": "http://127.0.0.1:30000", "gpu-b": f"http://{bed.hosts[1].address}:30000"}, ends


# --------------------------------------------------------------------------- 4. port still held


def test_port_held_after_stop_by_a_leftover_of_the_unit(testbed_factory, tmp_path):
    """A leftover child of the server keeps the listening socket (no GPU) after the stop: orch ends
    it before the start (it runs the unit's command line), instead of starting into 'address already
    in use' and failing the rescue the same way."""
    bed = testbed_factory(1, {0: {"env": {"ORCH_STANDIN_LEAK_PORT_HOLDER": "1"}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    main = _main_pid(h)
    leftovers = [p for p in _server_pids(h) if p != main]
    assert leftovers, "the stand-in left no port holder"
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert h.unit_state() == "active" and _loaded(h, f"{h.triton_dir}/{UP}")
    for pid in leftovers:
        assert h.sh(f"test -d /proc/{pid}", check=False).returncode != 0, f"leftover {pid} still runs"
    freed = [e for e in _events(state, res["run_id"]) if e["event"] == "port_holder_killed"]
    assert {e["pid"] for e in freed} >= set(leftovers), freed


# --------------------------------------------------------------------------- 5. two units, UUIDs


def test_two_units_on_one_host_gpus_by_uuid(testbed_factory, tmp_path):
    """8 GPUs, sglang-a on GPUs 0-3 and sglang-b on 4-7, both named by UUID: tuning sglang-a reaps
    only leftovers on GPUs 0-3 and never touches sglang-b."""
    bed = testbed_factory(1, {0: {
        "n_gpus": 8, "nvidia_smi": True, "unit": "sglang-a", "gpus": [0, 1, 2, 3], "cvd": "uuid",
        "more_units": [{"unit": "sglang-b", "port": 30001, "gpus": [4, 5, 6, 7], "cvd": "uuid", "env": {}}]}})
    h = bed.hosts[0]
    h.wait_http("/health")
    b_pid = _main_pid(h, "sglang-b")
    assert b_pid and h.unit_state("sglang-b") == "active"
    b_holds = [p for p, _ in h.pids_holding("/dev/nvidia4")]
    assert b_pid in b_holds
    cvd = h.sh("systemctl show -p Environment sglang-a").stdout
    assert gpu_uuid(h.name, 0) in cvd and "/dev/nvidia" not in cvd.split("CUDA_VISIBLE_DEVICES=")[1].split()[0]
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-a", "--json", state_dir=state)
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed", r
    assert h.unit_state("sglang-b") == "active" and _main_pid(h, "sglang-b") == b_pid
    assert h.sh(f"test -d /proc/{b_pid}", check=False).returncode == 0
    killed = [e for e in _events(state, res["run_id"]) if e["event"] == "process_killed"]
    assert killed and all("scheduler_TP0" in e["cmdline"] for e in killed), killed
    assert r["summary"]["reap_devices"] == ",".join(f"/dev/nvidia{i}" for i in range(4))


# --------------------------------------------------------------------------- 7. shared state folder


def test_hosts_sharing_one_state_folder(testbed_factory, tmp_path):
    """gpu-b mounts gpu-a's /var/lib/orch (NFS, or a cloned data disk): the state folder belongs to
    the first host that used it; the other is refused at the lock, naming that host, before any change."""
    bed = testbed_factory(2, {1: {"shares_state_with": "gpu-a"}})
    for h in bed.hosts:
        h.wait_http("/health")
    pids = {h.name: _main_pid(h) for h in bed.hosts}
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)["hosts"]
    done = [n for n, r in res.items() if r["outcome"] == "completed"]
    refused = [n for n, r in res.items() if r["outcome"] == "failed"]
    assert len(done) == 1 and len(refused) == 1, res
    cause = res[refused[0]]["cause"]
    assert "Lock the host" in cause and done[0] in cause and "/var/lib/orch" in cause, cause
    loser = bed.host(refused[0])
    assert _main_pid(loser) == pids[loser.name] and loser.unit_state() == "active"
    assert loser.sh(f"ls {loser.triton_dir}", check=False).stdout.strip() == ""
    # a later run on that host alone is refused the same way
    again = recap(orch("tune", str(inv), "--service", "sglang-qwen", "--json", "--limit", loser.name,
                       state_dir=state))["hosts"][loser.name]
    assert again["outcome"] == "failed" and done[0] in again["cause"], again


# --------------------------------------------------------------------------- 8. ModelScope cache


def test_model_only_in_the_modelscope_cache(testbed_factory, tmp_path):
    """``--model-path Qwen/Qwen3-30B-A3B`` with SGLANG_USE_MODELSCOPE=true: the config is found where
    SGLang finds it (``$MODELSCOPE_CACHE/models/Qwen/Qwen3-30B-A3B``), not in the HF cache."""
    cfg = "/srv/modelscope/models/Qwen/Qwen3-30B-A3B/config.json"
    bed = testbed_factory(1, {0: {
        "env": {"SGLANG_USE_MODELSCOPE": "true", "MODELSCOPE_CACHE": "/srv/modelscope"},
        "launch_args": ["--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "1", "--port", "30000", "--host", "0.0.0.0"],
        "files": {cfg: json.dumps(TINY_MOE_CONFIG, indent=2)}}})
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = _from_unit(inventory(bed, tmp_path / "hosts.yaml"))
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed", r
    probe = json.loads((state / "runs" / res["run_id"] / "hosts" / h.name / "probe.json").read_text())
    assert probe["model_config_path"] == cfg
    assert _loaded(h, f"{h.triton_dir}/{UP}")
