"""Where a runner trial changes a unit's MoE runner (:mod:`orchestrator.host.runner_source`): the
choice of file and key, and the one-value edit (every other byte kept)."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.facts.systemd_env import parse_env_file
from orchestrator.host.runner_source import RunnerSource, configured_runner, edited_text, runner_source
from orchestrator.tasks import TASKS
from tests.fakes import FakePayload, ScriptedConnection, make_ctx

PY = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"]
ENV = ("# the MoE runner\nMODEL=/m\nMOE_RUNNER=triton\n\n# later lines\nOTHER='a b'\n")
YAML = ("# server flags\nmodel-path: /m\nmoe-runner-backend: flashinfer_cutlass   # fastest on B200\n"
        "tp-size: 2\nchunked-prefill-size: 4096\n")


@pytest.mark.parametrize("flag", [["--moe-runner-backend", "${MOE_RUNNER}"], ["--moe-runner-backend", "$MOE_RUNNER"],
                                  ["--moe-runner-backend=${MOE_RUNNER}"]])
def test_a_variable_set_in_an_environment_file_is_changed_there(flag):
    src = runner_source(PY + flag, [("/etc/default/a", "X=1\n"), ("/etc/default/b", ENV)])
    assert src == RunnerSource("env_file", "/etc/default/b", "MOE_RUNNER")


def test_the_last_environment_file_that_sets_the_variable_wins():
    # systemd reads the files in order, a later one overriding an earlier one (systemd.exec(5))
    src = runner_source(PY + ["--moe-runner-backend", "${MOE_RUNNER}"],
                        [("/etc/default/a", ENV), ("/etc/default/b", "MOE_RUNNER=cutlass\n"), ("/etc/default/c", "Y=2\n")])
    assert src.path == "/etc/default/b"


def test_a_config_yaml_key_is_changed_there_when_the_command_line_has_no_flag():
    words = PY + ["--config", "/etc/sglang/q.yaml"]
    assert runner_source(words, [], "/etc/sglang/q.yaml", YAML) == RunnerSource("config", "/etc/sglang/q.yaml",
                                                                                 "moe-runner-backend")


@pytest.mark.parametrize("words,env,cfg", [
    (PY + ["--moe-runner-backend", "triton"], [("/e", ENV)], None),           # a literal flag
    (PY + ["--moe-runner-backend", "${MOE_RUNNER}"], [("/e", "X=1\n")], None),  # Environment= only
    (PY + ["--moe-runner-backend", "triton", "--config", "/q.yaml"], [], YAML),  # the command line wins
    (PY + ["--config", "/q.yaml"], [], "tp-size: 2\n"),                        # the YAML does not set it
    (PY + ["--config", "/q.yaml"], [], YAML.replace("moe-runner-backend", "moe_runner_backend")),  # not SGLang's key
    (PY, [("/e", ENV)], None),                                                   # auto, nothing to edit
])
def test_every_other_unit_gets_the_drop_in(words, env, cfg):
    assert runner_source(words, env, "/q.yaml" if cfg else None, cfg).kind == "dropin"


def test_env_edit_changes_only_that_value():
    src = RunnerSource("env_file", "/e", "MOE_RUNNER")
    new = edited_text(src, ENV, "flashinfer_cutlass")
    assert new == ENV.replace("MOE_RUNNER=triton", "MOE_RUNNER=flashinfer_cutlass")
    assert parse_env_file(new) == dict(parse_env_file(ENV), MOE_RUNNER="flashinfer_cutlass")


def test_env_edit_keeps_quotes_and_crlf_and_edits_the_last_assignment():
    text = 'MOE_RUNNER=triton\r\n# note\r\n  MOE_RUNNER = "cutlass"\r\nZ=1\r\n'
    new = edited_text(RunnerSource("env_file", "/e", "MOE_RUNNER"), text, "flashinfer_trtllm")
    assert new == 'MOE_RUNNER=triton\r\n# note\r\n  MOE_RUNNER = "flashinfer_trtllm"\r\nZ=1\r\n'


def test_env_edit_refuses_a_value_continued_on_the_next_line():
    text = "MOE_RUNNER=tri\\\nton\nZ=1\n"
    assert edited_text(RunnerSource("env_file", "/e", "MOE_RUNNER"), text, "cutlass") is None
    assert runner_source(PY + ["--moe-runner-backend", "$MOE_RUNNER"], [("/e", text)]).kind == "dropin"


def test_yaml_edit_changes_only_that_value_comments_and_order_kept():
    new = edited_text(RunnerSource("config", "/q.yaml", "moe-runner-backend"), YAML, "triton")
    assert new == YAML.replace("moe-runner-backend: flashinfer_cutlass", "moe-runner-backend: triton")
    assert yaml.safe_load(new) == dict(yaml.safe_load(YAML), **{"moe-runner-backend": "triton"})
    quoted = 'a: 1\n"moe-runner-backend": "cutlass"\nb: [1, 2]\n'
    assert edited_text(RunnerSource("config", "/q.yaml", "moe-runner-backend"), quoted, "triton") == \
        'a: 1\n"moe-runner-backend": "triton"\nb: [1, 2]\n'


def test_yaml_edit_refuses_a_key_it_cannot_change_alone():
    src = RunnerSource("config", "/q.yaml", "moe-runner-backend")
    flow = "{moe-runner-backend: triton, tp-size: 2}\n"
    twice = "moe-runner-backend: triton\ntp-size: 2\nmoe-runner-backend: cutlass\n"
    block = "moe-runner-backend: >\n  triton\n"
    for text in (flow, twice, block):
        assert edited_text(src, text, "cutlass") is None, text
        assert runner_source(PY + ["--config", "/q.yaml"], [], "/q.yaml", text).kind == "dropin"
    # a nested key of the same name is not SGLang's flag: only the top-level line changes
    nested = "extra:\n  moe-runner-backend: x\nmoe-runner-backend: triton\n"
    assert edited_text(src, nested, "cutlass") == "extra:\n  moe-runner-backend: x\nmoe-runner-backend: cutlass\n"


def test_bad_runner_name_is_refused():
    with pytest.raises(ValueError):
        edited_text(RunnerSource("env_file", "/e", "MOE_RUNNER"), ENV, "a b; rm -rf /")


def test_configured_runner_reads_the_files_as_they_are_now():
    words = PY + ["--moe-runner-backend", "${MOE_RUNNER}"]
    assert configured_runner(words, [("/e", ENV)]) == "triton"
    assert configured_runner(words, [], environment={"MOE_RUNNER": "cutlass"}) == "cutlass"
    assert configured_runner(PY + ["--config", "/q.yaml"], [], "/q.yaml", YAML) == "flashinfer_cutlass"
    assert configured_runner(PY + ["--moe-runner-backend=deep_gemm", "--config", "/q.yaml"], [], "/q.yaml", YAML) == \
        "deep_gemm"
    assert configured_runner(PY, []) == "auto"


def test_the_trial_rescue_reloads_systemd_only_after_a_drop_in(tmp_path):
    """A trial that changed only the unit's own file: its rescue's ``daemon_reload`` (``only_if_dropin``)
    is skipped, so a reload the NVIDIA container toolkit check would refuse cannot stop the rescue."""
    conn = ScriptedConnection([("systemctl daemon-reload", "")])
    payload = FakePayload({"runner_change": {"toolkit": [], "gpu_containers": [], "risky": False}})
    ctx = make_ctx(tmp_path, connection=conn, payload=payload)
    ctx.run.install_attempted = True  # the unit's EnvironmentFile= was changed
    got = TASKS["daemon_reload"].fn(ctx, only_if_changed=True, only_if_dropin=True)
    assert got.status == "skipped" and not conn.calls
    ctx.run.dropin_written = True
    got = TASKS["daemon_reload"].fn(ctx, only_if_changed=True, only_if_dropin=True)
    assert got.status == "changed" and any("daemon-reload" in " ".join(a) for a, _b in conn.calls)
