"""Acting on a container unit (orchestrator.host.container, the payload client's container mode,
the endpoint of a published port): install folder mapped to the host or refused with the exact
-v/-e, the stop checked and leftovers ended through the runtime, the payload run in the image."""

import shlex

import pytest

from orchestrator.connection import CommandResult
from orchestrator.engine.results import TaskFailed
from orchestrator.facts.container import parse_container_run
from orchestrator.facts.unit import parse_server_args
from orchestrator.host.container import (container_states, end_container, end_payload_containers, install_target,
                                         payload_container, payload_container_prefix, require_name)
from orchestrator.host.endpoint import endpoint_candidates
from orchestrator.payload.client import PayloadClient

WITH_MOE = ("/usr/bin/podman run --rm --name sglang --device nvidia.com/gpu=all --ipc=host -p 30000:30000 "
            "-v /models:/models:ro -v /srv/moe:/moe -e SGLANG_MOE_CONFIG_DIR=/moe --env-file /etc/sglang/env "
            "-it localhost/sglang-standin:0.5.23 python3 -m sglang.launch_server --model-path /models/m "
            "--host 0.0.0.0 --port 30000")
NO_MOUNT = ("/usr/bin/podman run --rm --name sglang --gpus all -p 30000:30000 -v /models:/models "
            "localhost/sglang-standin:0.5.23 python3 -m sglang.launch_server --model-path /models/m --host 0.0.0.0")


def run(line):
    return parse_container_run(shlex.split(line))


def test_install_folder_maps_to_the_host_bind_mount():
    r = run(WITH_MOE)
    assert install_target(r, "/moe/configs/triton_3_4_0", {"SGLANG_MOE_CONFIG_DIR": "/moe"}) == \
        "/srv/moe/configs/triton_3_4_0"


def test_no_mount_is_refused_with_the_exact_options_to_add():
    r = run(NO_MOUNT)
    with pytest.raises(TaskFailed) as exc:
        install_target(r, "/usr/lib/python3/site-packages/sglang/srt/layers/moe/fused_moe_triton/configs/triton_3_4_0",
                       {})
    msg = str(exc.value)
    assert "-v /srv/sglang-moe:/sglang-moe -e SGLANG_MOE_CONFIG_DIR=/sglang-moe" in msg
    assert "vanishes at the next start (--rm)" in msg and "nothing was stopped" in msg
    # SGLANG_MOE_CONFIG_DIR given but not mounted: only the -v is missing
    r = run(NO_MOUNT.replace("--gpus all", "--gpus all -e SGLANG_MOE_CONFIG_DIR=/cfg"))
    with pytest.raises(TaskFailed, match=r"Add -v /srv/sglang-moe:/cfg \(SGLANG_MOE_CONFIG_DIR is /cfg\)"):
        install_target(r, "/cfg/configs/triton_3_4_0", {"SGLANG_MOE_CONFIG_DIR": "/cfg"})
    # a named volume holds files across restarts, but orch writes host folders only
    r = run(NO_MOUNT.replace("-v /models:/models", "-v moe:/moe"))
    with pytest.raises(TaskFailed, match="no host folder is bind-mounted"):
        install_target(r, "/moe/configs/triton_3_4_0", {"SGLANG_MOE_CONFIG_DIR": "/moe"})
    r = run(NO_MOUNT.replace("-v /models:/models", "-v /srv/moe:/moe:ro"))
    with pytest.raises(TaskFailed, match="read-only bind mount '-v /srv/moe:/moe:ro'"):
        install_target(r, "/moe/configs/triton_3_4_0", {"SGLANG_MOE_CONFIG_DIR": "/moe"})


def test_unnamed_container_is_refused():
    with pytest.raises(TaskFailed, match="without --name.*--name sglang-x"):
        require_name(run("docker run --rm img python3 -m sglang.launch_server"), "sglang-x.service")
    assert require_name(run(WITH_MOE), "sglang") == "sglang"


def test_payload_container_same_image_gpus_mounts_env_not_ports_or_name():
    r = run(WITH_MOE)
    argv = payload_container(r, "/var/lib/orch/payload/abc", "/var/lib/orch", "orch-run1-x")
    assert argv[:6] == ["/usr/bin/podman", "run", "--rm", "--name", "orch-run1-x", "--device=nvidia.com/gpu=all"]
    assert "--ipc=host" in argv and "--volume=/srv/moe:/moe" in argv and "--env=SGLANG_MOE_CONFIG_DIR=/moe" in argv
    assert "--env-file=/etc/sglang/env" in argv and "--volume=/models:/models:ro" in argv
    assert argv[-1] == "localhost/sglang-standin:0.5.23"
    assert argv[-5:-1] == ["-v", "/var/lib/orch/payload/abc:/var/lib/orch/payload/abc:ro",
                           "-v", "/var/lib/orch:/var/lib/orch"]
    assert not any(a.startswith(("--publish", "--name=", "--interactive", "--tty", "--rm=")) for a in argv)
    with pytest.raises(ValueError):
        payload_container(r, "/p", "/s", "x; rm -rf /")


def test_payload_client_runs_probe_and_tune_in_the_image_and_the_rest_on_the_host():
    r = run(WITH_MOE)
    c = PayloadClient(None, "/usr/bin/python3", "/var/lib/orch/payload/abc", "/var/lib/orch",
                      {"SGLANG_MOE_CONFIG_DIR": "/moe"})
    c.run_tag = "run.1"
    c.in_container(r, parse_server_args(r.command).interpreter)
    probe = c.argv("probe", ["--model-config", "/models/m"], timeout=300, tag="run.1.ab")
    assert probe[:4] == ["timeout", "--kill-after=30", "300", "/usr/bin/podman"]
    name = probe[probe.index("--name") + 1]
    assert name.startswith(payload_container_prefix("run.1")) and "." not in name
    image_at = probe.index("localhost/sglang-standin:0.5.23")
    assert probe[image_at - 2:image_at] == ["-e", "ORCH_TAG=run.1.ab"]  # on the client, before the image
    inner = probe[image_at + 1:]
    assert inner[0] == "env" and "python3" in inner and inner[inner.index("python3") + 1:][:3] == ["-m", "remote",
                                                                                                  "probe"]
    assert not any(w.startswith("ORCH_TAG=") for w in inner)  # the container's processes carry no tag
    assert "PYTHONPATH=/var/lib/orch/payload/abc" in inner and "SGLANG_MOE_CONFIG_DIR=/moe" in inner
    install = c.argv("install", ["--request", "/r.json"])
    assert install[0] == "env" and "/usr/bin/python3" in install and "/usr/bin/podman" not in install


class Runtime:
    """A container runtime's CLI answers as podman documents them (ps --format, stop, rm -f):
    the container table is state, the commands change it."""

    def __init__(self, containers: dict[str, str], stop_works=True):
        self.containers, self.stop_works, self.calls = dict(containers), stop_works, []

    def run(self, argv, check=True, **kw):
        self.calls.append(argv)
        assert isinstance(argv, list)
        sub = argv[1]
        if sub == "ps":
            pattern = argv[argv.index("--filter") + 1].split("=", 1)[1]
            import re

            names = [n for n in self.containers if re.search(pattern, n)]
            fmt = argv[argv.index("--format") + 1]
            lines = [f"{n} {self.containers[n]}" if ".State" in fmt else n for n in names]
            return CommandResult("ps", 0, "\n".join(lines) + ("\n" if lines else ""), "")
        if sub == "stop":
            if self.stop_works and argv[-1] in self.containers:
                self.containers[argv[-1]] = "exited"
            return CommandResult("stop", 0, argv[-1], "")
        if sub == "rm":
            self.containers.pop(argv[-1], None)
            return CommandResult("rm", 0, argv[-1], "")
        raise AssertionError(f"unexpected {argv}")


def test_stop_is_checked_with_the_runtime_and_leftovers_ended_through_it():
    r = run(WITH_MOE)
    rt = Runtime({"sglang": "running", "sglang-other": "running"})
    assert container_states(rt, r, "sglang") == ["running"]
    assert end_container(rt, r, "sglang", 30) == ["stopped", "removed"]
    assert rt.containers == {"sglang-other": "running"}  # another container of a similar name is left alone
    assert ["/usr/bin/podman", "stop", "-t", "30", "sglang"] in rt.calls
    assert ["/usr/bin/podman", "rm", "-f", "sglang"] in rt.calls
    assert not any(c[0] in ("kill", "pkill") for c in rt.calls)  # never by host PID
    assert end_container(rt, r, "sglang", 30) == []  # gone: nothing to do
    rt = Runtime({"sglang": "exited"})  # a --rm container the runtime failed to remove blocks `run --name`
    assert end_container(rt, r, "sglang", 30) == ["removed"]
    rt = Runtime({"sglang": "Up 3 seconds ago"})  # podman 4.3 prints its status as {{.State}}
    assert container_states(rt, r, "sglang") == ["running"]
    assert end_container(rt, r, "sglang", 30) == ["stopped", "removed"]


def test_a_container_that_survives_is_reported():
    class Stuck(Runtime):
        def run(self, argv, check=True, **kw):
            if argv[1] == "rm":
                self.calls.append(argv)
                return CommandResult("rm", 1, "", "container is busy")
            return super().run(argv, check, **kw)

    rt = Stuck({"sglang": "running"}, stop_works=False)
    with pytest.raises(TaskFailed, match="container sglang is still there"):
        end_container(rt, run(WITH_MOE), "sglang", 5)


def test_payload_containers_of_this_run_only():
    r = run(WITH_MOE)
    rt = Runtime({"orch-run-1-ab-cd": "running", "orch-run-2-ab-cd": "running", "sglang": "running"})
    assert end_payload_containers(rt, r, "run.1", 5) == ["orch-run-1-ab-cd"]
    assert set(rt.containers) == {"orch-run-2-ab-cd", "sglang"}


def test_endpoint_is_the_published_port_or_the_host_network():
    r = run(WITH_MOE.replace("-p 30000:30000", "-p 127.0.0.1:31000:30000"))
    assert endpoint_candidates(parse_server_args(r.command), r) == ["http://127.0.0.1:31000"]
    r = run(WITH_MOE)
    assert endpoint_candidates(parse_server_args(r.command), r) == ["http://127.0.0.1:30000"]
    r = run(WITH_MOE.replace("-p 30000:30000", "--network host") + " --port 30005")
    assert endpoint_candidates(parse_server_args(r.command), r) == ["http://127.0.0.1:30005"]
    r = run(WITH_MOE.replace("-p 30000:30000", ""))
    assert endpoint_candidates(parse_server_args(r.command), r) == []  # plan refuses: unreachable


def test_host_paths_map_back_into_the_container():
    r = run("docker run -v /srv:/data -v /srv/moe:/moe -v vol:/vol img cmd")
    assert r.container_path("/srv/moe/configs/x.json") == "/moe/configs/x.json"  # the deepest source wins
    assert r.container_path("/srv/other") == "/data/other"
    assert r.container_path("/elsewhere/x") is None
    assert r.container_path(r.host_path("/moe/a.json")[0]) == "/moe/a.json"


def _container_unit(line=WITH_MOE):
    from orchestrator.facts.container import container_environment
    from orchestrator.facts.unit import UnitFacts

    r = run(line)
    return UnitFacts(unit="sglang", load_state="loaded", active_state="active", sub_state="running", main_pid=7,
                     control_group="", container=r, server=parse_server_args(r.command),
                     environment=container_environment(r, {}, []))


def test_service_stop_ends_the_container_the_stop_left_through_the_runtime(tmp_path):
    """`systemctl stop` returns and the unit is inactive, but the container still runs (a stop
    that returns early, as reported for docker units): orch stops and removes it with podman."""
    from orchestrator.tasks import TASKS
    from tests.fakes import ScriptedConnection, make_ctx

    table = {"sglang": "running"}

    def ps(argv):
        return (0, "".join(f"{n} {s}\n" for n, s in table.items()), "")

    def stop(argv):
        table["sglang"] = "exited"
        return (0, "sglang\n", "")

    def rm(argv):
        table.pop("sglang", None)
        return (0, "sglang\n", "")

    conn = ScriptedConnection([("^systemctl is-active", {"seq": ["active", "inactive"]}), ("^systemctl stop", ""),
                               (r"^/usr/bin/podman ps -a --filter name=\^/\?sglang\$", ps),
                               ("^/usr/bin/podman stop -t 5 sglang$", stop), ("^/usr/bin/podman rm -f sglang$", rm)])
    ctx = make_ctx(tmp_path, {"orch_unit": _container_unit()}, connection=conn)
    res = TASKS["service"].fn(ctx, name="sglang", state="stopped", timeout=5)
    assert res.status == "changed" and "stopped and removed through the runtime" in res.msg
    assert table == {}
    ended = [f for ev, f in ctx.events if ev == "container_ended"]
    assert [(f["container"], f["runtime"], f["actions"]) for f in ended] == [("sglang", "podman", ["stopped", "removed"])]
    assert not any(argv[0] in ("kill", "pkill") for argv, _ in conn.calls)


def test_plan_refuses_a_container_without_a_writable_mount_before_the_stop(tmp_path):
    """The probe (run in the image) names the package's config folder inside the container: no
    bind mount holds it, so plan fails with the -v/-e to add, and nothing is stopped."""
    from orchestrator.tasks import TASKS
    from tests.fakes import FakePayload, ScriptedConnection, make_ctx
    from tests.unit.remote.test_probe import CURRENT, QWEN, make_sglang, probe

    site = tmp_path / "site"
    make_sglang(site, (CURRENT,), version="0.5.23")
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200", "--capability", "9.0")
    assert rc == 0, last
    data = last["data"]
    unit = _container_unit(NO_MOUNT + " --moe-runner-backend triton")
    conn = ScriptedConnection([(r"^journalctl", "")])
    ctx = make_ctx(tmp_path, {"orch_unit": unit, "orch_probe": data}, connection=conn, payload=FakePayload({}))
    with pytest.raises(TaskFailed, match="-e SGLANG_MOE_CONFIG_DIR=/sglang-moe"):
        TASKS["plan"].fn(ctx, name="sglang")
    assert not any("stop" in argv for argv, _ in conn.calls)
