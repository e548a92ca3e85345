"""End to end: a unit that runs SGLang in a container (issue 19): ``podman run --rm --name sglang
... localhost/sglang-standin:0.5.23 /opt/venv/bin/python3 -m sglang.launch_server ...``, a real
podman inside the test-bed host (``container`` host option, tests/testbed/README.md), and the same
as fleets write it for docker, ``/usr/bin/docker run --rm --name sglang --gpus all ...`` (the bed's
docker is a stand-in CLI over podman: tests/testbed/docker_shim.py). Every case runs with both.

1. with ``-v /srv/moe:/moe -e SGLANG_MOE_CONFIG_DIR=/moe``: ``orch tune`` probes and tunes inside
   the image, installs into the host folder, the restarted container loads the files (its log names
   them as ``/moe/...``); ``orch doctor`` says tuned; ``orch rollback`` puts the defaults back;
2. without that mount: refused before the stop with the ``-v``/``-e`` to add, nothing stopped;
3. ``orch recover`` after a controller died with the container stopped: the unit runs again.

docs/containers.md says what orch does with a container unit.
"""

from __future__ import annotations


import pytest

from tests.e2e.helpers import inventory, orch, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"


RUNTIMES = ["podman", "docker"]


def _containers(host, runtime: str = "podman") -> dict:
    out = host.sh(f"{runtime} ps -a --format '{{{{.Names}}}} {{{{.State}}}}'").stdout
    return {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line.strip()}


def _bed_options(runtime: str, moe_mount: bool) -> dict:
    return {"container": {"moe_mount": moe_mount, "runtime": runtime}}


def _check_docker_unit(h) -> None:
    """The docker host's unit is docker's shape and its container is seen as docker shows it."""
    unit = h.sh("systemctl cat sglang-qwen").stdout
    assert "ExecStart=/usr/bin/docker run --rm --name sglang --gpus all " in unit, unit
    assert h.sh("docker inspect --format '{{.Name}} {{.State.Status}} {{.State.Running}}' sglang").stdout.split() \
        == ["/sglang", "running", "true"]
    assert h.sh("docker ps --filter name=^/sglang$ --format '{{.Status}}'").stdout.startswith("Up ")
    # --gpus all gave the container the host's GPU file (podman itself has no --gpus)
    assert h.sh("docker exec sglang test -e /dev/nvidia0", check=False).returncode == 0


def _loaded_lines(host) -> list:
    return [ln for ln in host.unit_log().splitlines() if "Using MoE kernel config from" in ln]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_tune_doctor_rollback_in_a_container(testbed_factory, tmp_path, runtime):
    bed = testbed_factory(1, {0: _bed_options(runtime, True)})
    h = bed.hosts[0]
    h.wait_http("/health")
    assert list(_containers(h, runtime)) == ["sglang"]
    if runtime == "docker":
        _check_docker_unit(h)
    host_dir = h.triton_dir  # /srv/moe/configs/triton_X_Y_Z on the host
    seen = "/moe/configs/" + host_dir.rsplit("/", 1)[1]  # the same folder inside the container
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "completed", (r, proc.stderr[-4000:])
    assert r["summary"]["plan"]["install_dir"] == seen
    for name in (UP, DOWN):
        assert h.sh(f"test -f {host_dir}/{name}", check=False).returncode == 0, name
        assert f"Using MoE kernel config from {seen}/{name}." in h.unit_log()
    assert h.unit_state() == "active" and list(_containers(h, runtime)) == ["sglang"]
    assert h.sh("test -e /opt/venv", check=False).returncode != 0  # the probe's Python was the image's
    doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    row = recap(doc)[h.name]
    assert row["verdict"] == "tuned", row
    rb = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    rr = recap(rb)["hosts"][h.name]
    assert rr["outcome"] == "completed", (rr, rb.stderr[-4000:])
    for name in (UP, DOWN):
        assert h.sh(f"test -f {host_dir}/{name}", check=False).returncode != 0, name
    assert h.unit_state() == "active" and list(_containers(h, runtime)) == ["sglang"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_no_writable_mount_is_refused_before_the_stop(testbed_factory, tmp_path, runtime):
    bed = testbed_factory(1, {0: _bed_options(runtime, False)})
    h = bed.hosts[0]
    h.wait_http("/health")
    pid = h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip()
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] != "completed"
    assert "-v /srv/sglang-moe:/sglang-moe -e SGLANG_MOE_CONFIG_DIR=/sglang-moe" in r["cause"], r
    assert "nothing was stopped" in r["cause"]
    assert h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip() == pid  # never stopped
    assert h.unit_state() == "active" and list(_containers(h, runtime)) == ["sglang"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_recover_after_the_controller_died_with_the_container_stopped(testbed_factory, tmp_path, runtime):
    """The controller is killed (SIGKILL) while the tuner runs in its own container and the unit's
    container is stopped: ``orch recover`` ends the tuner's container through podman, restores and
    starts the unit; only the server's container is left (with docker: the run's ``orch-*`` container
    found with ``docker ps --filter name=...`` and ended with ``docker stop``/``rm -f``)."""
    from orchestrator.records.controller import new_run_id
    from tests.e2e.test_faults import LONG_TUNE, _popen, _progress, _task_done, _wait_event
    from tests.waiting import process_ended, wait_until

    bed = testbed_factory(1, {0: _bed_options(runtime, True)})
    h = bed.hosts[0]
    h.wait_http("/health")
    inv = inventory(bed, tmp_path / "hosts.yaml", **LONG_TUNE)
    state, rid, log = tmp_path / "state", new_run_id("tune"), tmp_path / "orch.log"
    proc = _popen(["tune", str(inv), "--service", "sglang-qwen"], state, rid, log)
    tuner = []
    try:
        _wait_event(state, rid, proc, _task_done("Reap leftover GPU processes"), "the reap before tuning")
        tuner = wait_until(lambda: [n for n in _containers(h, runtime) if n.startswith("orch-")],
                           "the tuner's container", progress=_progress(state, log, h), alive=process_ended(proc),
                           poll=0.5)
    finally:
        proc.kill()
        proc.wait()
    assert tuner, "the tuner never ran in its own container"
    assert h.unit_state() in ("inactive", "failed")
    rec = orch("recover", str(inv), "--service", "sglang-qwen", "--json", "--state-dir", str(tmp_path / "s2"),
               state_dir=tmp_path / "s2")
    assert rec.returncode == 0, (rec.stdout[-3000:], rec.stderr[-3000:])
    assert recap(rec)["hosts"][h.name]["outcome"] == "completed"
    assert h.unit_state() == "active"
    assert list(_containers(h, runtime)) == ["sglang"], _containers(h, runtime)  # no orch-* tuner container left
    h.wait_http("/health")


def test_tune_and_rollback_on_a_notify_unit_whose_conmon_is_the_main_pid(testbed_factory, tmp_path):
    """``Type=notify`` with ``podman run --sdnotify=conmon`` (podman-run(1)): podman sends systemd
    ``MAINPID=`` of the container's conmon and ``READY=1`` once the container runs, so the unit's
    MainPID is conmon (the server's parent), not the podman client. Tune and rollback complete, the
    server's log is the unit's journal, and each start has a new conmon as MainPID."""
    bed = testbed_factory(1, {0: {"container": {"moe_mount": True, "sdnotify": "conmon"},
                                  "unit_lines": ["Type=notify", "NotifyAccess=all"]}})
    h = bed.hosts[0]
    h.wait_http("/health")

    def main_pid() -> int:
        pid = int(h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip().removeprefix("MainPID="))
        assert h.sh(f"cat /proc/{pid}/comm").stdout.strip() == "conmon"
        children = h.sh(f"ps -o args= --ppid {pid}").stdout
        assert "-m sglang.launch_server" in children, children
        return pid

    first = main_pid()
    host_dir = h.triton_dir
    seen = "/moe/configs/" + host_dir.rsplit("/", 1)[1]
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed", (r, proc.stderr[-4000:])
    events = (state / "runs" / res["run_id"] / "events.jsonl").read_text()
    assert "Type=notify" in events
    assert f"Using MoE kernel config from {seen}/{UP}." in h.unit_log()
    tuned = main_pid()
    assert tuned != first and h.unit_state() == "active"
    rb = orch("rollback", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    assert recap(rb)["hosts"][h.name]["outcome"] == "completed", rb.stderr[-4000:]
    assert h.sh(f"test -f {host_dir}/{UP}", check=False).returncode != 0
    assert main_pid() != tuned and list(_containers(h)) == ["sglang"]


def test_docker_client_ended_by_the_stop_leaves_its_container_which_docker_stop_ends(testbed_factory, tmp_path):
    """Issue 32 row 8 (moby #31459): a ``docker run --rm`` unit whose client ends at SIGTERM and leaves
    its container running (the docker stand-in's ``client_leaves_container`` knob: the container is
    the runtime's, outside the unit's processes). The fault first: ``systemctl stop`` makes the unit
    inactive while the container still runs and holds the GPU. Then ``orch tune``: after its stop
    the container is ended through ``docker stop`` (then gone: ``--rm``), nothing is killed by PID
    (the reap ends no process), and the tune completes on a new container."""
    import json

    bed = testbed_factory(1, {0: _bed_options("docker", True)})
    h = bed.hosts[0]
    h.wait_http("/health")
    h.sh("cat > /run/orchtb/docker.json", input=json.dumps({"client_leaves_container": True}))
    h.sh(f"systemctl restart {h.unit}")  # the next `docker run` is such a client
    h.wait_http("/health")
    h.sh(f"systemctl stop {h.unit}")
    assert h.unit_state() in ("inactive", "failed")
    assert _containers(h, "docker") == {"sglang": "running"}
    held = [c for _p, c in h.pids_holding("/dev/nvidia0") if "sglang.launch_server" in c]
    assert held, "the left container's server holds the GPU"
    h.sh(f"systemctl start {h.unit}")  # its ExecStartPre=-docker rm -f frees the name, as fleets write it
    h.wait_http("/health")
    calls = len(h.sh("cat /run/orchtb/docker-calls.jsonl").stdout.splitlines())
    inv = inventory(bed, tmp_path / "hosts.yaml")
    state = tmp_path / "state"
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
    res = recap(proc)
    r = res["hosts"][h.name]
    assert r["outcome"] == "completed", (r, proc.stderr[-4000:])
    events = [json.loads(x) for x in (state / "runs" / res["run_id"] / "events.jsonl").read_text().splitlines()]
    ended = [e for e in events if e.get("event") == "container_ended"]
    assert ended and ended[0]["container"] == "sglang" and "stopped" in ended[0]["actions"], ended
    assert not [e for e in events if e.get("event") == "process_killed"]
    new = [json.loads(x)["argv"] for x in h.sh("cat /run/orchtb/docker-calls.jsonl").stdout.splitlines()[calls:]]
    stops = [a for a in new if a[:1] == ["stop"] and a[-1] == "sglang"]
    assert stops and not [a for a in new if a[:1] == ["kill"]], new
    assert h.unit_state() == "active" and list(_containers(h, "docker")) == ["sglang"]


def test_stale_cdi_spec_after_a_driver_upgrade_is_refused_before_the_stop(testbed_factory, tmp_path):
    """Issue 32 row 7 (podman #26233, nixpkgs #353059): a podman unit gets its GPU through CDI
    (``--device nvidia.com/gpu=all``, the spec in the host's /etc/cdi names the stand-in driver's
    ``libcuda.so.550.54.15``). With the spec current, ``orch tune --check`` passes. After a driver
    upgrade (the library is now 560.35.03, nvidia-smi says so) the running container still works,
    ``orch tune`` is refused before anything stops, naming the spec and ``nvidia-ctk cdi generate``,
    and the unit keeps its process; a restart would indeed fail (real podman's CDI injection). Once
    the spec is regenerated the unit starts and a tune is no longer refused."""
    from tests.testbed.bed import cdi_spec

    bed = testbed_factory(1, {0: {"container": {"moe_mount": True, "cdi": True}, "nvidia_smi": True}})
    h = bed.hosts[0]
    h.wait_http("/health")
    assert "--device nvidia.com/gpu=all" in h.sh("systemctl cat sglang-qwen").stdout
    assert h.sh("podman exec sglang test -e /opt/nvidia-driver/libcuda.so.550.54.15", check=False).returncode == 0
    inv = inventory(bed, tmp_path / "hosts.yaml")
    check = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "s1")
    assert recap(check)["hosts"][h.name]["outcome"] == "check", check.stderr[-3000:]

    h.sh("rm /srv/nvidia-driver/libcuda.so.550.54.15 && echo stand-in > /srv/nvidia-driver/libcuda.so.560.35.03 && "
         "echo '{\"version\": \"560.35.03\"}' > /run/orchtb/driver.json")
    pid = h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip()
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "s2")
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed" and "Probe GPUs" in r["cause"], r
    assert "the CDI spec /etc/cdi/nvidia.yaml for nvidia.com/gpu=all is stale" in r["cause"]
    assert "/srv/nvidia-driver/libcuda.so.550.54.15, which does not exist" in r["cause"]
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in r["cause"] and "nothing was stopped" in r["cause"]
    assert h.sh("systemctl show -p MainPID sglang-qwen").stdout.strip() == pid and h.unit_state() == "active"
    h.wait_http("/health")

    # the fault orch kept away from: a restart on the stale spec does not come back
    h.sh("systemctl restart sglang-qwen", check=False)
    h.sh("for i in $(seq 600); do s=$(systemctl is-active sglang-qwen); "
         "[ \"$s\" = active ] || [ \"$s\" = activating ] || exit 0; sleep 0.1; done; exit 1")
    assert h.unit_state() != "active" and "libcuda.so.550.54.15" in h.unit_log()
    h.sh("cat > /etc/cdi/nvidia.yaml", input=cdi_spec(1, "560.35.03"))  # what nvidia-ctk would write now
    h.sh("systemctl start sglang-qwen")
    h.wait_http("/health")
    again = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "s3")
    assert recap(again)["hosts"][h.name]["outcome"] == "check", again.stderr[-3000:]
