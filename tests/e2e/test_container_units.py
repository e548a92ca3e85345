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
