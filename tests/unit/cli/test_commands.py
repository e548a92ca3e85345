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
