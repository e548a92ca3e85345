"""Where a unit's settings really come from (issue 13): EnvironmentFile= (systemd's precedence),
``$VAR`` in ExecStart, SGLang's ``--config`` YAML (merged as the real release merges it), the
running process's environment. ``gather_unit`` runs against a scripted host."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from orchestrator.facts.sglang_config import ConfigFileError, config_path, merge_config
from orchestrator.facts.systemd_env import EnvFileRef, effective_environment, env_file_refs, parse_show_env_files
from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.unit import (BOOL_FLAGS, UnitError, environment_differences, gather_unit,
                                     parse_server_args, parse_unit_settings)
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


def _real_merger(release: str = "0.5.23"):
    """The release's own ConfigArgumentMerger module (fetched SGLang source; skip when unavailable)."""
    from tests.sglang_releases import ReleaseUnavailable, source_tree
    from tests.testbed.standin_tree import CONFIG_PARSER_PATHS

    try:
        root = source_tree(release)
    except ReleaseUnavailable as exc:  # pragma: no cover - offline machine
        pytest.skip(str(exc))
    path = next(root / rel for rel in CONFIG_PARSER_PATHS if (root / rel).is_file())
    spec = importlib.util.spec_from_file_location(f"sglang_{release.replace('.', '_')}_config_parser", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("release", ["0.5.8", "0.5.23"])
@pytest.mark.parametrize("yaml_text, argv", [
    (YAML, ["--config", "/x/q.yaml", "--port", "30002"]),
    ("model-path: /m\ntp-size: 2\ndisable-shared-experts-fusion: false\nenable-metrics: true\n",
     ["--host", "0.0.0.0", "--config", "/x/q.yaml"]),
    ("cuda-graph-bs: [1, 2, 4]\njson-model-override-args: {\"a\": 1}\nmem-fraction-static: 0.8\n",
     ["--config", "/x/q.yml", "--model-path", "/m"]),
    ("", ["--model-path", "/m", "--config", "/x/q.yaml"]),
])
def test_merge_agrees_with_the_real_sglang_merger(release, yaml_text, argv, tmp_path):
    """orch's merge gives the argument list SGLang's own ConfigArgumentMerger gives (for a parser
    whose store_true flags are the ones orch knows plus enable-metrics, as in SGLang)."""
    mod = _real_merger(release)
    cfg = tmp_path / argv[argv.index("--config") + 1].rsplit("/", 1)[1]
    cfg.write_text(yaml_text)
    real_argv = [str(cfg) if a.startswith("/x/") else a for a in argv]
    parser = argparse.ArgumentParser()
    for flag in ("--model-path", "--tp-size", "--port", "--host", "--mem-fraction-static", "--config",
                 "--json-model-override-args"):
        parser.add_argument(flag)
    parser.add_argument("--cuda-graph-bs", nargs="+")
    for flag in ("--disable-shared-experts-fusion", "--enable-metrics"):
        parser.add_argument(flag, action="store_true")
    if release == "0.5.8" and "{" in yaml_text:
        pytest.skip("0.5.8 passes a mapping as str(dict), 0.5.23 as JSON; orch follows 0.5.23 (it reads no such flag)")
    real = mod.ConfigArgumentMerger(parser).merge_config_with_args(list(real_argv))
    ours = merge_config(real_argv, yaml_text, str(cfg), store_true=set(BOOL_FLAGS) | {"enable_metrics"})
    assert ours == real
    # and orch reads from the merged list what argparse reads from it
    ns = parser.parse_args(real)
    sa = parse_server_args([PY, "-m", "sglang.launch_server"], real)
    assert (sa.model_path, sa.tp, sa.port) == (ns.model_path, int(ns.tp_size or 1), int(ns.port or 30000))
    assert sa.disable_shared_experts_fusion == ns.disable_shared_experts_fusion


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
