"""The command line: bad playbooks fail before any host is contacted; flags offered are used."""

from __future__ import annotations

import pytest

from orchestrator.cli import build_parser, main
from orchestrator.engine.playbook import builtin_playbook

INVENTORY = """all:
  hosts:
    gpu-a:
      ansible_connection: local
      orch_state_dir: {state}
"""


def _inventory(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(INVENTORY.format(state=tmp_path / "host-state"))
    return inv


@pytest.mark.parametrize("check", [True, False])
def test_misspelt_argument_fails_at_load_before_any_host(tmp_path, capsys, check):
    """Issue 10: `service: {unitt: ...}` used to run under --check as "would run" and exit 0, and
    to fail on a real run only when reached (in a rescue: after the unit was stopped)."""
    pb = tmp_path / "my-tune.yaml"
    pb.write_text(builtin_playbook("tune").read_text().replace(
        "        - name: Start the unit again\n          register: rescue_start\n          service:\n"
        "            name: \"{{ service }}\"",
        "        - name: Start the unit again\n          register: rescue_start\n          service:\n"
        "            unitt: \"{{ service }}\"").replace("          service:\n                    name:",
                                                        "          service:\n                    unitt:", 1))
    assert "unitt" in pb.read_text()
    state = tmp_path / "controller"
    argv = ["tune", str(_inventory(tmp_path)), "--service", "sglang-qwen", "--playbook", str(pb),
            "--state-dir", str(state)] + (["--check"] if check else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"orch: error: {pb}: play 1 tasks[3].block[")
    assert "unknown argument 'unitt'" in err and "service accepts: name (alias unit, service)" in err
    assert len(err.splitlines()) == 1
    assert not state.exists() and not (tmp_path / "host-state").exists(), "nothing ran, nothing was recorded"


def test_read_only_commands_offer_no_batching_flags():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in ("doctor", "runs"):
        opts = {o for a in sub.choices[name]._actions for o in a.option_strings}
        assert not opts & {"--serial", "--max-fail-percentage", "--any-errors-fatal", "--order"}, name
    for name in ("tune", "rollback", "recover", "bench"):
        opts = {o for a in sub.choices[name]._actions for o in a.option_strings}
        assert {"--serial", "--max-fail-percentage", "--any-errors-fatal", "--order"} <= opts, name


def test_bad_flag_values_are_one_line_exit_2(tmp_path, capsys):
    inv = _inventory(tmp_path)
    assert main(["tune", str(inv), "--serial", "0%,x", "--state-dir", str(tmp_path / "s")]) == 2
    assert "--serial" in capsys.readouterr().err
    assert main(["bench", str(inv), "--concurrency", "1,x", "--state-dir", str(tmp_path / "s")]) == 2
    assert "--concurrency: expected positive integers" in capsys.readouterr().err
    assert main(["config-names", "--model-config", str(tmp_path / "nope.json"), "--device-name", "NVIDIA H200"]) == 2
    assert "nope.json" in capsys.readouterr().err


def _misspelt(option: str) -> str:
    """``option`` with its second-to-last letter dropped (``--check`` -> ``--chek``): no prefix of
    any option, so argparse's abbreviations do not accept it."""
    return option[:-2] + option[-1]


def _long_options() -> list[tuple[str, str]]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return [(name, o) for name, p in sub.choices.items() for a in p._actions for o in a.option_strings
            if o.startswith("--") and len(o) > 5]


@pytest.mark.parametrize("command, option", _long_options(), ids=[f"{c} {o}" for c, o in _long_options()])
def test_a_misspelt_option_gets_did_you_mean(tmp_path, capsys, command, option):
    """Every long option of every command, misspelt, is refused in one line that names the
    command's help and the option meant (``--chek``: did you mean --check?)."""
    argv = {"config-names": [command], "report": [command, "latest"], "configs": [command, "list"]}.get(
        command, [command, str(tmp_path / "hosts.yaml")])
    assert main([*argv, _misspelt(option)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orch: error: unrecognized arguments: "), err
    assert f"(did you mean {option}?)" in err and f"see 'orch {command} --help'" in err, err


def test_a_misspelt_command_or_choice_gets_did_you_mean(capsys):
    assert main(["tunee", "x"]) == 2
    assert "(did you mean tune?)" in capsys.readouterr().err
    assert main(["configs", "lsit"]) == 2
    assert "(did you mean list?)" in capsys.readouterr().err
    assert main(["tune", "x", "--nothing-like-it"]) == 2
    assert "did you mean" not in capsys.readouterr().err  # no guess when nothing is close


def test_runs_host_names_host_not_limit(tmp_path, capsys):
    """`orch runs --host gpu-z`: the error names the flag given (--host) and the closest host,
    before anything runs; with --limit too, the two are intersected."""
    from orchestrator.cli.runs import host_limit

    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  hosts:\n    gpu-a: {ansible_connection: local}\n    gpu-b: {ansible_connection: local}\n")
    assert main(["runs", str(inv), "--host", "gpu-z", "--state-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orch: error: --host 'gpu-z': no host of that name in ") and "--limit" not in err
    assert "did you mean 'gpu-a'?" in err or "did you mean 'gpu-b'?" in err
    assert not (tmp_path / "s").exists()
    assert host_limit(str(inv), "gpu-a", None) == "gpu-a"
    assert host_limit(str(inv), "gpu-a", "all") == "all,&gpu-a"
    assert host_limit(str(inv), None, "gpu-b") == "gpu-b"
