"""Parsing of systemd units that run sglang.launch_server (orchestrator.facts.unit)."""

import pytest

from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.unit import (UnitError, gather_unit, parse_server_args, parse_show_exec_start,
                                     parse_unit_settings)
from tests.fakes import unit_host

UNIT = r"""# /etc/systemd/system/sglang-qwen.service
[Unit]
Description=SGLang Qwen

[Service]
Environment="HF_HOME=/data/hf cache" CUDA_VISIBLE_DEVICES=0,1
Environment=SGLANG_MOE_CONFIG_DIR=/srv/moe
ExecStart=/opt/venv/bin/python3 -m sglang.launch_server \
    --model-path Qwen/Qwen3-30B-A3B --tp-size 2 --ep=2 \
    --port 30001 --host 0.0.0.0 --moe-runner-backend triton --disable-shared-experts-fusion
Restart=always
"""


def test_parse_unit_settings_exec_and_env():
    st = parse_unit_settings(UNIT)
    argv, env = st.exec_start, st.environment
    assert argv[:3] == ["/opt/venv/bin/python3", "-m", "sglang.launch_server"]
    assert env == {"HF_HOME": "/data/hf cache", "CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_MOE_CONFIG_DIR": "/srv/moe"}
    sa = parse_server_args(argv)
    assert sa.interpreter == "/opt/venv/bin/python3"
    assert (sa.model_path, sa.tp, sa.ep, sa.port, sa.host) == ("Qwen/Qwen3-30B-A3B", 2, 2, 30001, "0.0.0.0")
    assert sa.moe_runner_backend == "triton" and sa.disable_shared_experts_fusion


def test_dropin_reset_and_prefix():
    text = "[Service]\nExecStart=/bin/false\nExecStart=\nExecStart=-/usr/bin/python -m sglang.launch_server --model-path /m\n"
    argv = parse_unit_settings(text).exec_start
    sa = parse_server_args(argv)
    assert sa.interpreter == "/usr/bin/python" and sa.model_path == "/m"
    assert (sa.tp, sa.port, sa.host, sa.moe_runner_backend) == (1, 30000, "127.0.0.1", "auto")


def test_shell_wrappers_and_flashinfer():
    sa = parse_server_args(["/bin/bash", "-c", "exec /py/bin/python -m sglang.launch_server --model-path '/m x' "
                                               "--moe-runner-backend flashinfer_cutlass --tp 4"])
    assert sa.interpreter == "/py/bin/python" and sa.model_path == "/m x" and sa.tp == 4
    assert sa.moe_runner_backend == "flashinfer_cutlass"
    sa = parse_server_args(["/usr/bin/env", "FOO=1", "python3", "-m", "sglang.launch_server", "--model=/m"])
    assert sa.interpreter == "python3" and sa.model_path == "/m"


def test_not_sglang_and_bad_values():
    assert parse_server_args(["/usr/bin/python", "-m", "http.server"]) is None
    vllm = parse_server_args(["/usr/bin/vllm", "serve", "x"])  # vLLM is an engine of its own (issue 29)
    assert vllm is not None and vllm.model_path == "x" and vllm.port == 8000
    with pytest.raises(UnitError, match="--tp must be an integer"):
        parse_server_args(["p", "-m", "sglang.launch_server", "--tp", "four"])
    with pytest.raises(UnitError, match="has no value"):
        parse_server_args(["p", "-m", "sglang.launch_server", "--port"])


def test_real_systemd_show_exec_start():
    v = ("{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -m sglang.launch_server --model-path /m --tp 8 ; "
         "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
    assert parse_server_args(parse_show_exec_start(v)).tp == 8


def test_gather_unit_errors_name_the_unit():
    t = unit_host("LoadState=not-found\nActiveState=inactive\n", "", cat_ok=False)
    with pytest.raises(UnitError, match="unit nope not found"):
        gather_unit(t, Unit("nope"))
    t = unit_host("LoadState=loaded\nActiveState=active\nMainPID=42\n",
                  "[Service]\nExecStart=/usr/bin/python3 -m http.server 8000\n")
    with pytest.raises(UnitError, match="sglang-x is not an SGLang server"):
        gather_unit(t, Unit("sglang-x"))
    with pytest.raises(UnitError, match="invalid unit name"):
        gather_unit(t, Unit("a; rm -rf /"))
    t = unit_host("LoadState=loaded\nActiveState=active\nMainPID=42\n", UNIT)
    f = gather_unit(t, Unit("sglang-qwen"))
    assert f.main_pid == 42 and f.active_state == "active" and f.server.tp == 2
    # every call is an argument list, never a shell string
    assert all(isinstance(c, list) for c in t.raw_calls)


SCRIPT = "#!/opt/sg/bin/python3\nimport sys\nfrom sglang.cli.main import main\nsys.exit(main())\n"
SHOW = "LoadState=loaded\nActiveState=inactive\nMainPID=0\nWorkingDirectory=/srv/app\n"


def test_gather_unit_console_script_reads_the_shebang_on_the_host():
    t = unit_host(SHOW, "[Service]\nEnvironment=PATH=/opt/sg/bin:/usr/bin\n"
                            "ExecStart=numactl --cpunodebind=0 --membind=0 sglang serve /m --tp 2\n",
                      {"/opt/sg/bin/sglang": SCRIPT})
    f = gather_unit(t, Unit("sglang-serve"))
    assert f.launch.script == "/opt/sg/bin/sglang" and f.server.interpreter == "/opt/sg/bin/python3"
    assert f.launch.wrapper == ["numactl", "--cpunodebind=0", "--membind=0"]
    assert (f.server.model_path, f.server.tp) == ("/m", 2)
    t = unit_host(SHOW, "[Service]\nExecStart=/opt/sg/bin/sglang serve /m\n",
                      {"/opt/sg/bin/sglang": "#!/opt/sg/bin/python3\nfrom vllm.cli import main\n"})
    with pytest.raises(UnitError, match="is not SGLang's console script"):
        gather_unit(t, Unit("sglang-serve"))
    t = unit_host(SHOW, "[Service]\nExecStart=/opt/sg/bin/sglang serve /m\n", {})
    with pytest.raises(UnitError, match="which is not on the host"):
        gather_unit(t, Unit("sglang-serve"))


def test_gather_unit_uv_run_and_prefixes():
    t = unit_host(SHOW, "[Service]\nEnvironment=SGLANG_MOE_CONFIG_DIR=/moe\n"
                            "ExecStart=-:/usr/bin/uv run --no-sync python -m sglang.launch_server --model-path $M\n",
                      {"/srv/app/.venv/bin/python": ""})
    f = gather_unit(t, Unit("sglang-uv"))
    assert f.exec_prefix == "-:" and f.server.model_path == "$M", "':' turns variable expansion off"
    assert f.server.interpreter == "/srv/app/.venv/bin/python" and f.environment["VIRTUAL_ENV"] == "/srv/app/.venv"
    assert f.environment["SGLANG_MOE_CONFIG_DIR"] == "/moe"
    t = unit_host(SHOW, "[Service]\nExecStart=/usr/bin/uv run python -m sglang.launch_server --model-path /m\n", {})
    with pytest.raises(UnitError, match="has no /srv/app/.venv/bin/python"):
        gather_unit(t, Unit("sglang-uv"))
    t = unit_host(SHOW, "[Service]\nExecStart=@/usr/bin/python3 sglang-main -m sglang.launch_server --tp 4\n", {})
    f = gather_unit(t, Unit("sglang-at"))
    assert f.server.interpreter == "/usr/bin/python3" and f.server.tp == 4


def test_gather_unit_refuses_an_unknown_form_naming_the_forms():
    t = unit_host(SHOW, "[Service]\nExecStart=/usr/bin/nohup /usr/bin/python3 -m sglang.launch_server --tp 2\n",
                      {})
    with pytest.raises(UnitError) as exc:
        gather_unit(t, Unit("sglang-nohup"))
    msg = str(exc.value)
    assert "unit sglang-nohup is not an SGLang server" in msg and "/usr/bin/nohup /usr/bin/python3" in msg
    assert "orch knows: <python> -m sglang.launch_server; sglang serve" in msg


def test_show_exec_start_with_at_prefix_takes_the_path():
    v = ("{ path=/usr/bin/python3 ; argv[]=sglang-main -m sglang.launch_server --tp 8 ; ignore_errors=yes ; "
         "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
    assert parse_show_exec_start(v)[:2] == ["/usr/bin/python3", "-m"]
