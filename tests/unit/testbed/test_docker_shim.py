"""The test bed's docker stand-in (tests/testbed/docker_shim.py) prints what the Docker CLI documents
(https://docs.docker.com/reference/cli/docker/container/ls/ , .../container/inspect/ ,
.../container/run/#gpus), whatever podman prints underneath."""

from __future__ import annotations

import pytest

from tests.testbed import docker_shim as shim

PODMAN_PS = {  # one entry of podman 4.3's `ps --format json`
    "Id": "842665a05de3b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5", "Names": ["sglang"],
    "Image": "localhost/sglang-standin:0.5.23", "Command": ["/opt/venv/bin/python3", "-m", "sglang.launch_server"],
    "Created": 1000.0, "StartedAt": 1000.0, "ExitedAt": 0, "ExitCode": 0, "State": "running",
    "Ports": [{"host_ip": "", "container_port": 30000, "host_port": 30000, "range": 1, "protocol": "tcp"}],
    "Labels": {"a": "1"}, "Mounts": ["/models"], "Networks": ["podman"],
}


def test_ps_fields_are_dockers():
    row = shim._ps_row(PODMAN_PS, False, now=1005.0)
    assert row["ID"] == "842665a05de3" and row["Names"] == "sglang"
    assert row["State"] == "running" and row["Status"] == "Up 5 seconds"
    assert row["Ports"] == "0.0.0.0:30000->30000/tcp"
    assert row["Command"] == '"/opt/venv/bin/pytho…"'
    assert shim.render("{{.Names}} {{.State}}", row) == "sglang running"
    stopped = dict(PODMAN_PS, State="exited", ExitCode=137, ExitedAt=1000.0)
    assert shim._ps_row(stopped, False, now=1000.0 + 120)["Status"] == "Exited (137) 2 minutes ago"
    assert shim._ps_row(dict(PODMAN_PS, State="configured"), False, 1001.0)["State"] == "created"


def test_name_filter_is_a_regular_expression_with_or_without_the_slash():
    row = shim._ps_row(PODMAN_PS, False, 1001.0)
    assert shim._filter_ok(row, PODMAN_PS, ["name=^/?sglang$"])
    assert shim._filter_ok(row, PODMAN_PS, ["name=^/sglang$"])
    assert shim._filter_ok(row, PODMAN_PS, ["name=glan"])
    assert not shim._filter_ok(row, PODMAN_PS, ["name=^orch-"])
    assert shim._filter_ok(row, PODMAN_PS, ["status=running", "label=a=1"])
    with pytest.raises(shim.DockerError, match="invalid filter 'bogus'"):
        shim._filter_ok(row, PODMAN_PS, ["bogus=1"])


def test_human_duration_follows_go_units():
    assert [shim.human_duration(s) for s in (0.2, 1, 59, 60, 150, 3600, 7200, 3 * 86400)] == [
        "Less than a second", "1 second", "59 seconds", "About a minute", "2 minutes", "About an hour",
        "2 hours", "3 days"]


def test_inspect_is_dockers_shape():
    podman = {"Id": "abc", "Name": "sglang", "Image": "f00", "ImageName": "localhost/sglang-standin:0.5.23",
              "State": {"Status": "running", "Running": True, "Pid": 42, "ExitCode": 0},
              "Config": {"Image": "localhost/sglang-standin:0.5.23"}}
    d = shim.docker_inspect(podman)
    assert shim.render("{{.Name}} {{.State.Status}} {{.State.Running}} {{.State.Pid}}", d) == "/sglang running true 42"
    assert shim.render("{{json .State.Running}} {{.Config.Image}}", d) == "true localhost/sglang-standin:0.5.23"
    assert shim.render("{{index .State \"Pid\"}} {{lower .State.Status}}", d) == "42 running"
    gone = shim.docker_inspect(dict(podman, State={"Status": "stopped", "Running": False}))
    assert shim.render("{{.State.Status}}", gone) == "exited"
    with pytest.raises(shim.DockerError, match='map has no entry for key "Nope"'):
        shim.render("{{.State.Nope}}", d)


def test_gpus_become_binds_of_the_selected_device_files(monkeypatch):
    monkeypatch.setattr(shim.os.path, "exists", lambda p: p == "/dev/nvidiactl")
    devs = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]
    assert shim.gpu_binds("all", devs) == ["-v", "/dev/nvidia0:/dev/nvidia0", "-v", "/dev/nvidia1:/dev/nvidia1",
                                           "-v", "/dev/nvidia2:/dev/nvidia2", "-v", "/dev/nvidiactl:/dev/nvidiactl"]
    assert shim.gpu_binds("1", devs)[:2] == ["-v", "/dev/nvidia0:/dev/nvidia0"]
    assert shim.gpu_binds('"device=1,2"', devs)[1::2] == ["/dev/nvidia1:/dev/nvidia1", "/dev/nvidia2:/dev/nvidia2",
                                                          "/dev/nvidiactl:/dev/nvidiactl"]
    with pytest.raises(shim.DockerError, match="both Count and DeviceIDs"):
        shim.gpu_binds("device=1,2", devs)  # unquoted: the ",2" is a count of its own, as docker reads it
    with pytest.raises(shim.DockerError, match="unexpected key"):
        shim.gpu_binds("gpu=1", devs)


def test_run_words_keep_the_image_and_its_command(monkeypatch):
    monkeypatch.setattr(shim, "_host_gpus", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(shim.os.path, "exists", lambda p: False)
    words = ["--rm", "--name", "sglang", "--gpus", "all", "-it", "-p30000:30000", "-e", "A=1", "--ipc=host",
             "img:1", "python3", "-m", "sglang.launch_server", "--gpus", "x", "-p", "1"]
    assert shim.run_argv(words) == ["--rm", "--name", "sglang", "-v", "/dev/nvidia0:/dev/nvidia0", "-it",
                                    "-p30000:30000", "-e", "A=1", "--ipc=host", "img:1", "python3", "-m",
                                    "sglang.launch_server", "--gpus", "x", "-p", "1"]
