"""The launch forms of a unit's ExecStart (remote.engines.sglang.launcher): each resolves to the interpreter,
the wrapper prefix the payload reuses, the entry point and SGLang's arguments; the others are refused."""

import shlex

import pytest

from remote.engines.sglang.launcher import (ENTRY_MODULE, ENTRY_SERVE, LaunchError, apply_exec_prefix, is_entry_process,
                                    is_sglang_script, refusal, resolve, serve_server_argv, shebang_interpreter,
                                    split_exec_prefix)

ARGS = ["--model-path", "/m", "--tp", "2"]


def r(cmd: str, **kw):
    return resolve(shlex.split(cmd), **kw)


def test_module_entry_plain_and_python_options():
    la = r("/opt/venv/bin/python3 -u -X faulthandler -m sglang.launch_server --model-path /m --tp 2")
    assert (la.interpreter, la.entry, la.server_argv, la.wrapper) == ("/opt/venv/bin/python3", ENTRY_MODULE, ARGS, [])
    assert la.entry_args == ARGS and la.script is None
    la = r("/usr/bin/pypy3 -m sglang.launch_server --tp 2")
    assert la.interpreter == "/usr/bin/pypy3"
    with pytest.raises(LaunchError, match="http.server is not SGLang's server"):
        r("/usr/bin/python3 -m http.server")


def test_console_script_serve_forms():
    la = r("/opt/venv/bin/sglang serve /m --tp 2")
    assert la.entry == ENTRY_SERVE and la.interpreter is None and la.script == "/opt/venv/bin/sglang"
    assert la.server_argv == ARGS and la.entry_args == ["/m", "--tp", "2"]
    la = r("sglang serve --model-type llm --model-path /m --tp 2")
    assert la.server_argv == ARGS and la.script == "sglang"
    assert r("sglang serve --tp 2 --model-type=auto --model /m").server_argv == ["--tp", "2", "--model", "/m"]
    la = r("/opt/venv/bin/python3 /opt/venv/bin/sglang serve /m --tp 2")
    assert la.interpreter == "/opt/venv/bin/python3" and la.server_argv == ARGS
    with pytest.raises(LaunchError, match="diffusion is not SGLang's language-model server"):
        r("sglang serve --model-type diffusion /m")
    with pytest.raises(LaunchError, match="--model-type has no value"):
        r("sglang serve /m --model-type")
    with pytest.raises(LaunchError, match="'sglang generate' does not start a server"):
        r("/opt/venv/bin/sglang generate --model-path /m")


def test_serve_server_argv_matches_serve_py_rules():
    with pytest.raises(LaunchError, match="names no model"):
        serve_server_argv(["--port", "1"])
    # only the first word becomes the model path; later words stay as they are
    assert serve_server_argv(["/m", "/n"]) == ["--model-path", "/m", "/n"]
    assert serve_server_argv(["--model-type", "llm", "/m"]) == ["--model-path", "/m"]


def test_systemd_prefixes():
    assert split_exec_prefix("-@:/usr/bin/python3 python3 -m x") == ("-@:", "/usr/bin/python3 python3 -m x")
    assert split_exec_prefix("!!/usr/bin/x") == ("!!", "/usr/bin/x")
    assert split_exec_prefix("/usr/bin/x") == ("", "/usr/bin/x")
    argv = shlex.split("/usr/bin/python3 sglang-qwen -m sglang.launch_server --model-path /m --tp 2")
    assert apply_exec_prefix("@", argv)[:2] == ["/usr/bin/python3", "-m"]
    la = resolve(argv, prefixes="-@")
    assert la.interpreter == "/usr/bin/python3" and la.server_argv == ARGS and la.forms[0] == "systemd prefix -@"
    for p in ("-", "+", "!", "!!", ":", "-+"):
        assert resolve(shlex.split("/p -m sglang.launch_server --tp 2"), prefixes=p).server_argv == ["--tp", "2"]
    with pytest.raises(LaunchError, match="'@' prefix needs"):
        resolve(["/p"], prefixes="@")


def test_numactl_taskset_nice_stdbuf_are_kept_for_the_payload():
    la = r("numactl --cpunodebind=0 --membind 0 -C0-7 -l taskset -ac 0-7 nice -n 5 stdbuf -oL -e0 "
           "/py -m sglang.launch_server --model-path /m --tp 2")
    assert la.wrapper == shlex.split("numactl --cpunodebind=0 --membind 0 -C0-7 -l taskset -ac 0-7 nice -n 5 "
                                     "stdbuf -oL -e0")
    assert la.forms == ["numactl", "taskset", "nice", "stdbuf", "python -m sglang.launch_server"]
    assert la.interpreter == "/py" and la.server_argv == ARGS
    assert r("/usr/bin/taskset 0xff /py -m sglang.launch_server").wrapper == ["/usr/bin/taskset", "0xff"]
    assert r("nice -10 /py -m sglang.launch_server").wrapper == ["nice", "-10"]
    assert r("nice --adjustment=3 /py -m sglang.launch_server").wrapper == ["nice", "--adjustment=3"]
    assert r("numactl -N 1 -m 1 -- /py -m sglang.launch_server").wrapper == ["numactl", "-N", "1", "-m", "1", "--"]
    with pytest.raises(LaunchError, match="numactl option --hardware is not one orch reads"):
        r("numactl --hardware /py -m sglang.launch_server")
    with pytest.raises(LaunchError, match="taskset option -p"):
        r("taskset -p 0xff 1234")
    with pytest.raises(LaunchError, match="option --membind has no value"):
        r("numactl --membind")


def test_env_and_env_split_string():
    la = r("/usr/bin/env -S 'HF_HOME=/hf /py -u' -m sglang.launch_server --tp 2")
    assert la.interpreter == "/py" and la.env_set == {"HF_HOME": "/hf"} and la.server_argv == ["--tp", "2"]
    assert la.wrapper == ["env", "HF_HOME=/hf"]
    la = r("env -u PYTHONPATH SGLANG_MOE_CONFIG_DIR=/moe python3 -m sglang.launch_server")
    assert la.env_unset == ["PYTHONPATH"] and la.env_set == {"SGLANG_MOE_CONFIG_DIR": "/moe"}
    assert la.environment({"PYTHONPATH": "/x", "A": "1"}) == {"A": "1", "SGLANG_MOE_CONFIG_DIR": "/moe"}
    assert r("env -C /srv /py -m sglang.launch_server").cwd == "/srv"
    with pytest.raises(LaunchError, match="env -i"):
        r("env -i /py -m sglang.launch_server")


def test_bash_c_simple_command_only():
    la = r("/bin/bash -c 'HF_HOME=/hf exec numactl -N 0 /py -m sglang.launch_server --model-path \"/m\" --tp 2'")
    assert la.forms == ["bash -c", "numactl", "python -m sglang.launch_server"]
    assert la.wrapper == ["env", "HF_HOME=/hf", "numactl", "-N", "0"] and la.server_argv == ARGS
    with pytest.raises(LaunchError, match="more than one simple command"):
        r("bash -c 'source /opt/venv/bin/activate && python -m sglang.launch_server'")
    with pytest.raises(LaunchError, match="more than one simple command"):
        r("sh -c 'python -m sglang.launch_server | tee /tmp/log'")


def test_uv_run_uses_the_project_environment_not_uv():
    la = r("/usr/local/bin/uv run --project /srv/app --no-sync python -m sglang.launch_server --model-path /m --tp 2")
    assert la.interpreter == "/srv/app/.venv/bin/python" and la.venv_python == la.interpreter
    assert la.wrapper == ["env", "VIRTUAL_ENV=/srv/app/.venv"], "uv run itself (a sync) is not repeated"
    assert la.env_set["VIRTUAL_ENV"] == "/srv/app/.venv" and la.server_argv == ARGS
    la = r("uv run sglang serve /m --tp 2", workdir="/srv/app")
    assert la.script == "/srv/app/.venv/bin/sglang" and la.entry == ENTRY_SERVE
    la = r("uv --directory sub run -- python3 -m sglang.launch_server", workdir="/srv",
           environment={"UV_PROJECT_ENVIRONMENT": "/envs/sg"})
    assert la.interpreter == "/envs/sg/bin/python3" and la.cwd == "/srv/sub"
    with pytest.raises(LaunchError, match="needs the unit's WorkingDirectory"):
        r("uv run python -m sglang.launch_server")
    with pytest.raises(LaunchError, match="--with runs the command in a temporary environment"):
        r("uv run --with sglang python -m sglang.launch_server", workdir="/srv")
    with pytest.raises(LaunchError, match="is not 'uv run'"):
        r("uv pip install sglang", workdir="/srv")


def test_conda_run_is_kept_with_output_uncaptured():
    la = r("/opt/conda/bin/conda run -n sglang python -m sglang.launch_server --model-path /m --tp 2")
    assert la.wrapper == ["/opt/conda/bin/conda", "run", "--name", "sglang", "--no-capture-output"]
    assert la.interpreter == "python" and la.server_argv == ARGS
    la = r("conda run --live-stream -p /opt/envs/sg sglang serve /m --tp 2")
    assert la.wrapper == ["conda", "run", "--no-capture-output", "--prefix", "/opt/envs/sg"]
    assert la.script == "/opt/envs/sg/bin/sglang" and la.env_set["CONDA_PREFIX"] == "/opt/envs/sg"
    la = r("numactl --cpunodebind=0 --membind=0 conda run -n sg --no-capture-output python3 -m sglang.launch_server")
    assert la.wrapper[:3] == ["numactl", "--cpunodebind=0", "--membind=0"] and la.wrapper.count("--no-capture-output") == 1
    with pytest.raises(LaunchError, match="exactly one of -n ENV and -p PREFIX"):
        r("conda run python -m sglang.launch_server")
    with pytest.raises(LaunchError, match="is not 'conda run'"):
        r("conda activate sg")


def test_unknown_forms_are_refused_naming_what_orch_knows():
    for cmd in ("/usr/bin/vllm serve /m", "/usr/bin/docker run lmsysorg/sglang python3 -m sglang.launch_server",
                "/usr/bin/torchrun --nproc-per-node 8 x.py", "/usr/bin/python3 /srv/start.py"):
        with pytest.raises(LaunchError) as exc:
            r(cmd)
        msg = refusal(shlex.split(cmd), str(exc.value))
        assert "does not start an SGLang server in a form orch knows" in msg and "sglang serve" in msg
        assert "numactl" in msg and "uv run" in msg and shlex.split(cmd)[0] in msg


def test_container_hook_unwraps_a_container_run():
    seen = []

    def hook(argv):
        seen.append(argv)
        i = argv.index("lmsysorg/sglang:v0.5.23")
        return argv[i + 1:], {"image": argv[i]}

    la = r("numactl -N 0 /usr/bin/docker run --rm lmsysorg/sglang:v0.5.23 python3 -m sglang.launch_server --tp 2",
           container=hook)
    assert seen and la.container == {"image": "lmsysorg/sglang:v0.5.23"} and la.interpreter == "python3"
    assert la.forms == ["numactl", "docker run", "python -m sglang.launch_server"]
    with pytest.raises(LaunchError, match="a container"):
        r("/usr/bin/podman run img x", container=lambda argv: None)


def test_shebangs_and_console_scripts():
    pip_script = "#!/opt/venv/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n" \
                 "from sglang.cli.main import main\nif __name__ == '__main__':\n    sys.exit(main())\n"
    assert shebang_interpreter(pip_script) == "/opt/venv/bin/python3" and is_sglang_script(pip_script)
    assert shebang_interpreter("#!/usr/bin/env python3\n") == "python3"
    long_form = "#!/bin/sh\n'''exec' /very/long/venv/bin/python \"$0\" \"$@\"\n' '''\nfrom sglang.cli.main import main\n"
    assert shebang_interpreter(long_form) == "/very/long/venv/bin/python" and is_sglang_script(long_form)
    assert shebang_interpreter("#!/bin/bash\nexec foo\n") is None and shebang_interpreter("no shebang") is None
    assert not is_sglang_script("#!/usr/bin/python3\nfrom vllm.entrypoints.cli.main import main\n")


def test_entry_processes():
    assert is_entry_process(["/py", "-m", "sglang.launch_server", "--tp", "2"], ENTRY_MODULE, ["--tp", "2"])
    assert not is_entry_process(["/py", "-m", "sglang.launch_server", "--tp", "4"], ENTRY_MODULE, ["--tp", "2"])
    assert is_entry_process(["/venv/bin/python3", "/venv/bin/sglang", "serve", "/m"], ENTRY_SERVE, ["/m"])
    assert not is_entry_process(["/venv/bin/python3", "/venv/bin/sglang", "serve", "/m"], ENTRY_MODULE, ["/m"])


def test_start_stop_daemon_of_a_forking_unit_is_unwrapped_not_kept():
    ssd = "/usr/sbin/start-stop-daemon --start --background --make-pidfile --pidfile /run/s.pid"
    la = r(f"{ssd} --output /var/log/s.log --chdir /srv --exec /opt/venv/bin/python3 -- -m sglang.launch_server "
           "--model-path /m --tp 2")
    assert (la.interpreter, la.server_argv, la.wrapper) == ("/opt/venv/bin/python3", ARGS, [])
    assert la.log_files == ["/var/log/s.log"] and la.cwd == "/srv" and la.forms[0] == "start-stop-daemon"
    la = r("start-stop-daemon -S -b -m -p /run/s.pid -C -a /opt/venv/bin/sglang -x /opt/venv/bin/python3 -- serve /m "
           "--tp 2")
    assert la.entry == ENTRY_SERVE and la.script == "/opt/venv/bin/sglang" and la.log_files == []
    with pytest.raises(LaunchError, match="sends the server's log to /dev/null"):
        r(f"{ssd} --exec /opt/venv/bin/python3 -- -m sglang.launch_server --tp 2")
    with pytest.raises(LaunchError, match="option --chuid is not one orch reads"):
        r(f"{ssd} -C --chuid sglang --exec /opt/venv/bin/python3 -- -m sglang.launch_server")
    with pytest.raises(LaunchError, match="option --stop is not one orch reads"):
        r("start-stop-daemon --stop --pidfile /run/s.pid")
    with pytest.raises(LaunchError, match="without --start"):
        r("start-stop-daemon --exec /opt/venv/bin/python3 -- -m sglang.launch_server")
