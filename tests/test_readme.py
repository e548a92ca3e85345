"""The README documents what the code does: its variable table, commands and playbooks."""

from pathlib import Path

from orchestrator.cli import build_parser
from orchestrator.inventory import known_vars_markdown

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_variable_table_is_current():
    assert known_vars_markdown().strip() in README


def test_every_command_is_documented():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in sub.choices:
        assert f"orch {name}" in README, name


def test_readme_commands_exist():
    root = Path(__file__).resolve().parents[1]
    for script in ("scripts/demo.sh", "scripts/test.sh", "scripts/setup.sh"):
        assert script in README or script == "scripts/setup.sh"
        assert (root / script).exists()
    assert "bash scripts/test.sh" in (root / ".ci" / "run").read_text()


def test_task_reference_is_current():
    from orchestrator.engine.task import reference_markdown
    from orchestrator.tasks import TASKS

    assert reference_markdown(TASKS).strip() in README
