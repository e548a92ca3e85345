"""Where a unit's settings really come from (issue 13): EnvironmentFile= (systemd's precedence),
``$VAR`` in ExecStart, SGLang's ``--config`` YAML (merged as the real release merges it), the
running process's environment. ``gather_unit`` runs against a scripted host."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from orchestrator.facts.server_config import ConfigFileError, config_path, merge_config
from orchestrator.facts.systemd_env import EnvFileRef, effective_environment, env_file_refs, parse_show_env_files
from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.unit import (UnitError, environment_differences, gather_unit, parse_server_args,
                                     parse_unit_settings)
from tests.fakes import ScriptedConnection

PY = "/opt/venv/bin/python"
SHOW = "LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\nWorkingDirectory=/srv/sglang\n"


def unit_text(*lines: str, exec_start: str = f"{PY} -m sglang.launch_server --model-path /models/q --port 30000") -> str:
    return "\n".join(["# /etc/systemd/system/sglang-qwen.service", "[Service]", *lines, f"ExecStart={exec_start}", ""])


def host(unit: str, files: dict | None = None, environ: dict | None = None) -> ScriptedConnection:
    """A host answering systemctl for ``unit`` text, ``head -c`` for ``files`` (path -> text; a
    missing path: 'No such file'), and /proc/4242/environ from ``environ``."""
    files = files or {}

    def head(argv):
        path = argv[-1]
        if path in files:
            return (0, files[path], "") if files[path] is not None else (1, "", f"head: cannot open '{path}' for reading: Permission denied")
        return 1, "", f"head: cannot open '{path}' for reading: No such file or directory"

    env_raw = "\0".join(f"{k}={v}" for k, v in (environ or {}).items()) + "\0"
    return ScriptedConnection([
        (r"^systemctl show", SHOW), (r"^systemctl cat", unit), (r"^head -c", head),
        (r"^cat /proc/4242/environ", env_raw),
    ])


# --------------------------------------------------------------------------- EnvironmentFile


def test_environment_file_overrides_environment_and_optional_missing_file_is_skipped():
    text = unit_text('Environment="SGLANG_MOE_CONFIG_DIR=/srv/not-read" "HF_HOME=/data/hf"',
                     "EnvironmentFile=-/etc/default/sglang-qwen", "EnvironmentFile=-/etc/default/absent")
    conn = host(text, {"/etc/default/sglang-qwen": "SGLANG_MOE_CONFIG_DIR=/srv/moe\nCUDA_VISIBLE_DEVICES=0,1,2,3\n"},
                environ={"SGLANG_MOE_CONFIG_DIR": "/srv/moe", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "HF_HOME": "/data/hf"})
    f = gather_unit(conn, Unit("sglang-qwen"))
    assert f.environment["SGLANG_MOE_CONFIG_DIR"] == "/srv/moe"  # the file wins over Environment=
    assert f.environment["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and f.environment["HF_HOME"] == "/data/hf"
    assert f.env_files == [{"path": "/etc/default/sglang-qwen", "optional": True, "read": True},
                           {"path": "/etc/default/absent", "optional": True, "read": False}]
    assert f.warnings == []
    assert all(isinstance(a, list) for a, _ in conn.calls)


def test_later_environment_file_wins_and_empty_assignment_resets_the_list():
    st = parse_unit_settings(unit_text("EnvironmentFile=/a", "EnvironmentFile=", "EnvironmentFile=-/b", "EnvironmentFile=/c"))
    assert st.env_files == [EnvFileRef("/b", True), EnvFileRef("/c", False)]
    assert effective_environment({"X": "unit"}, [{"X": "b"}, {"X": "c", "Y": "1"}], ["Y"]) == {"X": "c"}
    assert env_file_refs(["  -/etc/x ", "/etc/y"]) == [EnvFileRef("/etc/x", True), EnvFileRef("/etc/y", False)]


def test_real_systemd_show_lists_environment_files():
    text = ("EnvironmentFiles=/etc/default/sglang-qwen (ignore_errors=yes)\n"
            "EnvironmentFiles=/etc/sglang/common.env (ignore_errors=no)\n")
    assert parse_show_env_files(text) == [EnvFileRef("/etc/default/sglang-qwen", True),
                                          EnvFileRef("/etc/sglang/common.env", False)]


def test_missing_environment_file_without_dash_is_refused():
    conn = host(unit_text("EnvironmentFile=/etc/default/sglang-qwen"))
    with pytest.raises(UnitError, match="EnvironmentFile=/etc/default/sglang-qwen does not exist and is not optional"):
        gather_unit(conn, Unit("sglang-qwen"))


def test_root_only_environment_file_is_read_through_sudo():
    calls = []

    def head(argv):
        calls.append(argv)
        return 1, "", "Permission denied"

    conn = ScriptedConnection([(r"^systemctl show", SHOW), (r"^systemctl cat", unit_text("EnvironmentFile=/etc/x")),
                               (r"^head -c", head), (r"^cat /proc", "")])
    with pytest.raises(UnitError, match="cannot read EnvironmentFile /etc/x"):
        gather_unit(conn, Unit("sglang-qwen"))
    assert [b for a, b in conn.calls if a[0] == "head"] == [False, True]


def test_exec_start_variables_come_from_the_environment_file():
    text = unit_text("EnvironmentFile=/etc/default/sglang-qwen",
                     exec_start=f"{PY} -m sglang.launch_server $SGLANG_ARGS --port ${{PORT}}")
    conn = host(text, {"/etc/default/sglang-qwen": "SGLANG_ARGS=--model-path /models/q --tp 4\nPORT=30001\n"})
    s = gather_unit(conn, Unit("sglang-qwen")).server
    assert (s.model_path, s.tp, s.port) == ("/models/q", 4, 30001)


def test_running_process_with_another_environment_is_reported():
    conn = host(unit_text("EnvironmentFile=/etc/default/q"), {"/etc/default/q": "SGLANG_MOE_CONFIG_DIR=/srv/new\n"},
                environ={"SGLANG_MOE_CONFIG_DIR": "/srv/old"})
    f = gather_unit(conn, Unit("sglang-qwen"))
    assert len(f.warnings) == 1 and "SGLANG_MOE_CONFIG_DIR: unit '/srv/new', running '/srv/old'" in f.warnings[0]
    assert environment_differences({"A": "1"}, None) == []


# --------------------------------------------------------------------------- --config YAML


YAML = "model-path: /models/qwen3\ntp-size: 4\nport: 30001\ndisable-shared-experts-fusion: true\n"


def test_config_file_supplies_model_tp_and_port_and_the_command_line_wins():
    text = unit_text(exec_start=f"{PY} -m sglang.launch_server --config /etc/sglang/qwen3.yaml --port 30002")
    s = gather_unit(host(text, {"/etc/sglang/qwen3.yaml": YAML}), Unit("sglang-qwen")).server
    assert (s.model_path, s.tp, s.port, s.disable_shared_experts_fusion) == ("/models/qwen3", 4, 30002, True)
    assert s.config_file == "/etc/sglang/qwen3.yaml"


def test_relative_config_path_is_read_from_the_working_directory():
    text = unit_text(exec_start=f"{PY} -m sglang.launch_server --config qwen3.yml")
    s = gather_unit(host(text, {"/srv/sglang/qwen3.yml": YAML}), Unit("sglang-qwen")).server
    assert s.config_file == "/srv/sglang/qwen3.yml" and s.tp == 4


@pytest.mark.parametrize("files, exec_args, message", [
    ({}, "--config /etc/sglang/q.yaml", "--config file /etc/sglang/q.yaml does not exist"),
    ({"/etc/sglang/q.json": "{}"}, "--config /etc/sglang/q.json", "reads only .yaml/.yml"),
    ({"/etc/sglang/q.yaml": "- a\n- b\n"}, "--config /etc/sglang/q.yaml", "must hold a mapping"),
    ({"/etc/sglang/q.yaml": "tp: [\n"}, "--config /etc/sglang/q.yaml", "not valid YAML"),
    ({"/etc/sglang/q.yaml": "tp_size: 4\n"}, "--config /etc/sglang/q.yaml", "SGLang refuses the flag --tp_size"),
    ({}, "--config /a.yaml --config /b.yaml", "more than once"),
    ({}, "--model-path /m --config", "last argument"),
])
def test_config_file_sglang_would_refuse_is_refused_naming_it(files, exec_args, message):
    text = unit_text(exec_start=f"{PY} -m sglang.launch_server {exec_args}")
    with pytest.raises(UnitError, match=message):
        gather_unit(host(text, files), Unit("sglang-qwen"))


def test_config_equals_spelling_is_not_merged_as_in_sglang():
    assert config_path(["--config=/etc/q.yaml", "--tp", "2"]) is None


def test_config_flags_spell_booleans_lists_and_mappings_like_sglang():
    out = merge_config(["--config", "/q.yaml"], "a: true\nb: false\nc: []\nd: {x: 1}\ne: null\n", "/q.yaml")
    assert out == ["--a", "true", "--b", "false", "--d", '{"x": 1}', "--e", "None"]
    with pytest.raises(ConfigFileError, match="mapping"):
        merge_config(["--config", "/q.yaml"], "3\n", "/q.yaml")


# --------------------------------------------------------------------------- template units


def test_template_unit_specifiers_in_environment_file_and_exec_start():
    text = unit_text("EnvironmentFile=/etc/sglang/%i.env",
                     exec_start=f"{PY} -m sglang.launch_server --served-model-name %p-%i --port ${{PORT}}")
    conn = ScriptedConnection([(r"^systemctl show", SHOW), (r"^systemctl cat", text),
                               (r"^head -c .* -- /etc/sglang/b\.env$", "PORT=30001\nCUDA_VISIBLE_DEVICES=4,5,6,7\n"),
                               (r"^cat /proc", "")])
    f = gather_unit(conn, Unit("sglang@b.service"))
    assert f.server.port == 30001 and f.server.served_model_name == "sglang-b"
    assert f.environment["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_unknown_specifier_is_refused():
    text = unit_text("EnvironmentFile=%h/sglang.env")
    with pytest.raises(UnitError, match="specifier %h"):
        gather_unit(host(text), Unit("sglang-qwen"))


def test_the_engine_is_recognised_or_named_by_orch_engine():
    """The unit's command line names its engine (``launch.engine``); ``orch_engine`` reads it by that
    engine's rules alone, and an engine orch does not know is refused naming the unit."""
    text = unit_text(exec_start=f"/usr/bin/numactl -N 0 {PY} -m sglang.launch_server --model-path /m --tp 2")
    facts = gather_unit(host(text), Unit("sglang-qwen"))
    assert facts.engine == "sglang" and facts.launch.forms == ["numactl", "python -m sglang.launch_server"]
    named = gather_unit(host(text), Unit("sglang-qwen"), engine="sglang")
    assert named.server == facts.server and named.engine == "sglang"
    with pytest.raises(UnitError, match="unit sglang-qwen: engine 'tgi' is not one orch knows"):
        gather_unit(host(text), Unit("sglang-qwen"), engine="tgi")
    # a stored unit fact reads its server back as its engine's record
    again = type(facts).from_dict(facts.to_dict())
    assert again.server == facts.server and again.engine == "sglang"
