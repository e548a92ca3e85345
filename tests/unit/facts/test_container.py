"""Container units: ``docker run``/``podman run`` command lines parsed as the runtimes parse them
(orchestrator.facts.container) and read through ``gather_unit``.

The command lines are real-world ones: SGLang's install guide ("Method 3: Docker",
https://docs.sglang.io/get_started/install.html), its multi-node DeepSeek guide, the ROCm image
guide, and forms fleets write in units (podman CDI GPUs, --env-file, --mount, --gpus with a
quoted device list as docker's own docs show it).
"""

import shlex

import pytest

from orchestrator.connection import CommandResult
from orchestrator.facts.container import (ContainerError, container_environment, detach_reason, parse_container_run,
                                          parse_container_env_file, parse_gpu_request, parse_mount, parse_publish,
                                          parse_volume, split_run_options)
from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.unit import UnitError, gather_unit, parse_server_args
from remote.engines.sglang.server_args import split_launch


def run(line: str):
    return parse_container_run(shlex.split(line))


# SGLang's install guide, "Method 3: Docker"
SGLANG_DOCS = ("docker run --gpus all --shm-size 32g -p 30000:30000 -v ~/.cache/huggingface:/root/.cache/huggingface "
               '--env "HF_TOKEN=<secret>" --ipc=host lmsysorg/sglang:latest python3 -m sglang.launch_server '
               "--model-path meta-llama/Llama-3.1-8B-Instruct --host 0.0.0.0 --port 30000")
# SGLang's multi-node guide (DeepSeek-R1 on two hosts): -it, --rm, --network=host, --ulimit, --device
MULTI_NODE = ("docker run --gpus all --device=/dev/infiniband --ulimit memlock=-1 --ulimit stack=67108864 "
              "--shm-size 32g --network=host -v ~/.cache/huggingface:/root/.cache/huggingface "
              "--name sglang_multinode1 -e GLOO_SOCKET_IFNAME=eth0 -it --rm --ipc=host lmsysorg/sglang:latest "
              "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1 --tp 16 "
              "--nccl-init-addr 10.0.0.1:30000 --nnodes 2 --node-rank 0 --trust-remote-code --host 0.0.0.0 "
              "--port 30001")
# SGLang's AMD guide (ROCm image): devices, group-add, security-opt, cap-add
ROCM = ("docker run -it --ipc=host --network=host --privileged --cap-add=CAP_SYS_ADMIN --device=/dev/kfd "
        "--device=/dev/dri --device=/dev/mem --group-add render --security-opt seccomp=unconfined "
        "-v $HOME/dockerx:/dockerx -v /data:/data lmsysorg/sglang:v0.5.23-rocm700-mi30x "
        "python3 -m sglang.launch_server --model-path /data/Qwen3-30B-A3B --tp 8 --port 30000")
# a unit as the issue describes it
UNIT_LINE = ("/usr/bin/docker run --rm --name sglang --gpus all --ipc=host -p 30000:30000 -v /models:/models "
             "-e HF_HOME=/models lmsysorg/sglang:v0.5.23 python3 -m sglang.launch_server "
             "--model-path /models/Qwen3-30B-A3B --tp 2 --host 0.0.0.0")
# podman with CDI GPUs, an env file, a read-only bind and the MoE config folder
PODMAN = ("/usr/bin/podman run --rm --name sglang --device nvidia.com/gpu=all --security-opt=label=disable "
          "--ipc=host -p 127.0.0.1:30001:30000 -v /models:/models:ro,z -v /srv/moe:/moe "
          "--env-file /etc/sglang/env -e SGLANG_MOE_CONFIG_DIR=/moe -e HF_HOME --init --shm-size=16g "
          "docker.io/lmsysorg/sglang:v0.5.23 python3 -m sglang.launch_server --model-path /models/m "
          "--host 0.0.0.0 --port 30000 --tp 2")


def test_sglang_install_guide_line():
    r = run(SGLANG_DOCS)
    assert (r.runtime, r.image, r.name, r.network) == ("docker", "lmsysorg/sglang:latest", None, None)
    assert r.gpus.how == "all" and r.gpus.options == ["--gpus", "all"]
    assert r.env == {"HF_TOKEN": "<secret>"}
    assert [(m.kind, m.source, m.target) for m in r.mounts] == [("bind", "~/.cache/huggingface",
                                                                 "/root/.cache/huggingface")]
    assert [(p.host_ip, p.host_port, p.container_port) for p in r.ports] == [("", 30000, 30000)]
    assert r.command[:3] == ["python3", "-m", "sglang.launch_server"]
    sa = parse_server_args(r.command)
    assert (sa.interpreter, sa.model_path, sa.port, sa.host) == ("python3", "meta-llama/Llama-3.1-8B-Instruct",
                                                                 30000, "0.0.0.0")
    assert not r.detach and not r.remove


def test_multi_node_guide_line():
    r = run(MULTI_NODE)
    assert r.image == "lmsysorg/sglang:latest" and r.name == "sglang_multinode1"
    assert r.host_network and r.remove and not r.detach
    assert ("interactive", "true") in r.options and ("tty", "true") in r.options
    assert ("ulimit", "memlock=-1") in r.options and ("device", "/dev/infiniband") in r.options
    sa = parse_server_args(r.command)
    assert (sa.tp, sa.nnodes, sa.node_rank, sa.dist_init_addr, sa.port) == (16, 2, 0, "10.0.0.1:30000", 30001)


def test_rocm_guide_line():
    r = run(ROCM)
    assert r.image == "lmsysorg/sglang:v0.5.23-rocm700-mi30x" and r.host_network
    assert r.gpus.how == "none"  # AMD GPUs: /dev/kfd and /dev/dri pass through, no NVIDIA selection
    assert "/dev/kfd" in r.gpus.options and "/dev/dri" in r.gpus.options
    assert ("privileged", "true") in r.options and ("group-add", "render") in r.options
    assert parse_server_args(r.command).tp == 8


def test_issue_unit_line():
    r = run(UNIT_LINE)
    assert (r.runtime_path, r.name, r.remove, r.image) == ("/usr/bin/docker", "sglang", True, "lmsysorg/sglang:v0.5.23")
    assert r.host_path("/models/Qwen3-30B-A3B/config.json") == ("/models/Qwen3-30B-A3B/config.json", r.mounts[0])
    assert r.host_path("/root/.cache") is None
    assert r.published_port(30000).host_port == 30000 and r.published_port(30001) is None


def test_podman_cdi_env_file_and_mounts():
    r = run(PODMAN)
    assert r.runtime == "podman" and r.image == "docker.io/lmsysorg/sglang:v0.5.23"
    assert r.gpus.how == "all" and r.gpus.options == ["--device", "nvidia.com/gpu=all"]
    models, moe = r.mounts
    assert (models.source, models.target, models.read_only) == ("/models", "/models", True)
    assert (moe.source, moe.target, moe.read_only) == ("/srv/moe", "/moe", False)
    assert r.host_path("/moe/configs/triton_3_4_0/E=128.json") == ("/srv/moe/configs/triton_3_4_0/E=128.json", moe)
    assert r.env_files == ["/etc/sglang/env"] and r.env_pass == ["HF_HOME"]
    p = r.published_port(30000)
    assert (p.host_ip, p.host_port) == ("127.0.0.1", 30001)
    assert ("init", "true") in r.options and ("shm-size", "16g") in r.options


def test_gpu_selections_as_docker_reads_them():
    assert parse_gpu_request('"device=0,1"').devices == ["0", "1"]  # --gpus '"device=0,1"'
    assert parse_gpu_request("device=GPU-3a2f").devices == ["GPU-3a2f"]
    sel = parse_gpu_request("2")
    assert (sel.how, sel.count) == ("count", 2)
    assert parse_gpu_request("count=all").how == "all"
    assert parse_gpu_request("all,capabilities=utility").how == "all"
    sel = parse_gpu_request("capabilities=compute")  # neither count nor devices: docker takes 1 GPU
    assert (sel.how, sel.count) == ("count", 1)
    with pytest.raises(ContainerError, match="both a count and devices"):
        parse_gpu_request("device=0,1")  # unquoted: docker reads "1" as a count and refuses
    with pytest.raises(ContainerError, match="unexpected key"):
        parse_gpu_request("devices=0")
    r = run("podman run --device nvidia.com/gpu=0 --device nvidia.com/gpu=1 img python3 -m sglang.launch_server")
    assert (r.gpus.how, r.gpus.devices) == ("devices", ["0", "1"])
    r = run("docker run --device /dev/nvidia2 --device /dev/nvidiactl --runtime nvidia img cmd")
    assert r.gpus.devices == ["2"] and "--runtime" in r.gpus.options and "/dev/nvidiactl" in r.gpus.options


def test_pflag_rules_find_the_image():
    # combined short flags, attached values, '=' forms, booleans with values, '--'
    opts, at = split_run_options(["-itd", "-p8080:80", "-e=A=1", "-eB=2", "--rm=false", "-v", "/a:/b", "img", "-p"])
    assert at == 7 and ("detach", "true") in opts and ("publish", "8080:80") in opts
    assert ("env", "A=1") in opts and ("env", "B=2") in opts and ("rm", "false") in opts
    r = run("docker run --rm -- img --rm")
    assert r.image == "img" and r.command == ["--rm"] and r.remove
    r = run("docker --host unix:///run/docker.sock container run --name x img")
    assert r.global_options == ["--host", "unix:///run/docker.sock"] and r.name == "x"
    r = run("podman --root /var/lib/c run --sig-proxy=false img")
    assert r.global_options == ["--root", "/var/lib/c"] and ("sig-proxy", "false") in r.options
    r = run("docker run -it --name=n -w /w --entrypoint python3 img -m sglang.launch_server --port 1")
    assert r.entrypoint == "python3" and r.command == ["-m", "sglang.launch_server", "--port", "1"]
    # a value option's value that looks like an option is still its value
    r = run("docker run --name -x img cmd")
    assert r.name == "-x" and r.image == "img"


def test_refusals_name_the_option():
    with pytest.raises(ContainerError, match="unknown option '--frobnicate'"):
        run("docker run --frobnicate img")
    with pytest.raises(ContainerError, match="unknown option -X"):
        run("docker run -X img")
    with pytest.raises(ContainerError, match="names no image"):
        run("docker run --rm --name x")
    with pytest.raises(ContainerError, match="has no value"):
        run("docker run --name")
    with pytest.raises(ContainerError, match="not 'podman run'"):
        run("/usr/bin/podman start -a sglang")
    with pytest.raises(ContainerError, match="not a boolean"):
        run("docker run --rm=maybe img")
    assert run("/usr/bin/python3 -m sglang.launch_server") is None


def test_volumes_mounts_ports():
    assert parse_volume("/a:/b").kind == "bind" and parse_volume("/a:/b:ro").read_only
    assert parse_volume("hf-cache:/root/.cache").kind == "volume"
    assert parse_volume("/data").kind == "anonymous"
    assert parse_volume("/data:ro").kind == "anonymous" and parse_volume("/data:ro").read_only
    with pytest.raises(ContainerError, match="not absolute"):
        parse_volume("/a:rel")
    m = parse_mount("type=bind,source=/srv/moe,target=/moe,readonly")
    assert (m.kind, m.source, m.target, m.read_only) == ("bind", "/srv/moe", "/moe", True)
    m = parse_mount("type=bind,src=/srv/moe,dst=/moe,ro=false")
    assert (m.source, m.target, m.read_only) == ("/srv/moe", "/moe", False)
    assert parse_mount("source=hf,target=/hf").kind == "volume"  # docker's default type
    assert parse_mount('type=bind,"source=/a,b",target=/c').source == "/a,b"
    with pytest.raises(ContainerError, match="names no target"):
        parse_mount("type=bind,source=/a")
    assert [(p.host_port, p.container_port) for p in parse_publish("8000-8001:30000-30001")] == [(8000, 30000),
                                                                                                 (8001, 30001)]
    p, = parse_publish("[::1]:8080:80/tcp")
    assert (p.host_ip, p.host_port, p.container_port) == ("::1", 8080, 80)
    p, = parse_publish("30000")
    assert (p.host_port, p.container_port) == (None, 30000)
    p, = parse_publish("0.0.0.0::30000")
    assert (p.host_ip, p.host_port) == ("0.0.0.0", None)
    assert parse_publish("53:53/udp")[0].protocol == "udp"
    with pytest.raises(ContainerError, match="not a port"):
        parse_publish("http:80")


def test_bind_mount_mapping_deepest_wins_and_volumes_do_not_map():
    r = run("docker run -v /srv:/data -v /fast/moe:/data/moe -v moe:/vol img cmd")
    assert r.host_path("/data/moe/x.json")[0] == "/fast/moe/x.json"
    assert r.host_path("/data/other")[0] == "/srv/other"
    assert r.host_path("/vol/x") is None  # a named volume: no host folder orch may write
    assert r.host_path("/datax") is None


def test_environment_precedence_and_env_files():
    text = "# comment\n\nHF_HOME=/models\nQUOTED=\"a b\"\nSGLANG_MOE_CONFIG_DIR=/wrong\n  PASSED\nUNSET_IN_UNIT\n"
    assert parse_container_env_file(text) == ({"HF_HOME": "/models", "QUOTED": '"a b"',
                                               "SGLANG_MOE_CONFIG_DIR": "/wrong"}, ["PASSED", "UNSET_IN_UNIT"])
    r = run("podman run --env-file /e -e SGLANG_MOE_CONFIG_DIR=/moe -e CUDA_VISIBLE_DEVICES -e NOT_SET img cmd")
    env = container_environment(r, {"PASSED": "p", "CUDA_VISIBLE_DEVICES": "0,1"}, [text])
    assert env == {"HF_HOME": "/models", "QUOTED": '"a b"', "SGLANG_MOE_CONFIG_DIR": "/moe", "PASSED": "p",
                   "CUDA_VISIBLE_DEVICES": "0,1"}  # -e wins over the file; a key the unit lacks is left out


def test_detach_is_refused_with_the_reason():
    assert detach_reason(run(UNIT_LINE)) is None
    why = detach_reason(run("podman run -d --name sglang img python3 -m sglang.launch_server"))
    assert "-d/--detach" in why and "podman#8841" in why and "Remove -d" in why


class Host:
    """Answers systemctl and file reads with canned text: the parsing is under test, not a host."""

    def __init__(self, unit_text: str, files: dict[str, str]):
        self.unit_text, self.files, self.calls = unit_text, files, []

    def run(self, argv, check=True, **kw):
        self.calls.append(argv)
        if argv[:2] == ["systemctl", "show"]:
            return CommandResult("show", 0, "LoadState=loaded\nActiveState=active\nMainPID=42\n", "")
        if argv[:2] == ["systemctl", "cat"]:
            return CommandResult("cat", 0, self.unit_text, "")
        if argv[0] == "head":
            path = argv[-1]
            if path in self.files:
                return CommandResult("head", 0, self.files[path], "")
            return CommandResult("head", 1, "", f"head: cannot open '{path}': No such file or directory")
        return CommandResult(" ".join(argv), 1, "", "unexpected")


def unit_file(line: str, extra: str = "") -> str:
    return f"[Service]\nEnvironment=HF_HOME=/host/hf\n{extra}ExecStart={line}\n"


def test_gather_unit_reads_a_container_unit():
    host = Host(unit_file(PODMAN), {"/etc/sglang/env": "SGLANG_MOE_CONFIG_DIR=/ignored\nTOKEN=t\n"})
    f = gather_unit(host, Unit("sglang"))
    assert f.container is not None and f.container.image == "docker.io/lmsysorg/sglang:v0.5.23"
    assert f.environment == {"SGLANG_MOE_CONFIG_DIR": "/moe", "TOKEN": "t", "HF_HOME": "/host/hf"}
    assert f.unit_environment == {"HF_HOME": "/host/hf"}
    s = f.server
    assert (s.interpreter, s.tp, s.port, s.model_path) == ("python3", 2, 30000, "/models/m")
    assert s.argv == f.exec_start and s.argv[0] == "/usr/bin/podman"
    assert all(isinstance(c, list) for c in host.calls)
    assert not any(c[0] == "cat" for c in host.calls)  # a container's main PID is the client: no environ diff


def test_gather_unit_container_refusals():
    with pytest.raises(UnitError, match="--env-file /etc/sglang/env does not exist"):
        gather_unit(Host(unit_file(PODMAN), {}), Unit("sglang"))
    with pytest.raises(UnitError, match="unit sglang: the unit's 'docker run' has -d"):
        gather_unit(Host(unit_file("/usr/bin/docker run -d --name s img python3 -m sglang.launch_server"), {}),
                    Unit("sglang"))
    with pytest.raises(UnitError, match="runs the container img, whose command is not an SGLang server"):
        gather_unit(Host(unit_file("/usr/bin/docker run --rm img"), {}), Unit("sglang"))
    with pytest.raises(UnitError, match="unit sglang: unknown option '--bogus'"):
        gather_unit(Host(unit_file("/usr/bin/docker run --bogus img"), {}), Unit("sglang"))


def test_gather_unit_container_config_file_read_through_the_mount():
    line = ("/usr/bin/docker run --rm -v /etc/sglang:/cfg:ro img python3 -m sglang.launch_server "
            "--config /cfg/server.yaml")
    f = gather_unit(Host(unit_file(line), {"/etc/sglang/server.yaml": "model-path: /m\ntp-size: 4\n"}), Unit("s"))
    assert f.server.config_file == "/etc/sglang/server.yaml" and f.server.tp == 4
    line = "/usr/bin/docker run --rm img python3 -m sglang.launch_server --config /inside/server.yaml"
    with pytest.raises(UnitError, match="in no folder bind-mounted from the host"):
        gather_unit(Host(unit_file(line), {}), Unit("s"))


def test_inner_command_resolved_as_a_host_launch():
    r = run("docker run --rm img bash -c 'exec python3 -m sglang.launch_server --tp 2'")
    assert split_launch(r.command) == ("python3", ["--tp", "2"])
