"""The README documents what the code does: its variable table, commands and playbooks."""

import os
import re
import shlex
import subprocess
import sys
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


def console_examples() -> list[tuple[str, str]]:
    """``(command, expected stdout)`` of every ``$ `` line in the README's ```console blocks: the
    lines after a command, up to the next ``$ `` line or the block's end, are its output."""
    out = []
    for block in re.findall(r"^```console\n(.*?)^```", README, re.S | re.M):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = part.partition("\n")
            out.append((command, output))
    return out


def test_readme_has_runnable_examples():
    commands = [c for c, _ in console_examples()]
    assert any(c.startswith(".venv/bin/orch config-names --model-config tests/data/models/") for c in commands)


def test_console_examples_print_what_the_readme_says():
    """Each documented command runs from the repo root as written (``.venv/bin/orch`` is this
    interpreter's ``python -m orchestrator`` when the repo has no .venv) and prints exactly the
    lines the README shows."""
    root = Path(__file__).resolve().parents[1]
    for command, expected in console_examples():
        argv = shlex.split(command)
        if argv[0] == ".venv/bin/orch" and not os.access(root / argv[0], os.X_OK):
            argv = [sys.executable, "-m", "orchestrator", *argv[1:]]
        r = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (command, r.stderr[-2000:])
        assert r.stdout == expected, (command, r.stdout, expected)


def test_supported_releases_and_architectures_are_what_the_tests_cover():
    """The README's releases table is docs/sglang-releases.md's (whose rows the oracle tests compute
    from each release's code), and its list of families is the model table's."""
    from remote.sglang.architectures import ARCHITECTURES

    doc = (Path(__file__).resolve().parents[1] / "docs" / "sglang-releases.md").read_text()
    i = doc.index("| Release | Lookup module |")
    assert doc[i:doc.index("\n\n", i)] in README
    families = "; ".join(dict.fromkeys(r.family for r in ARCHITECTURES)) + "."
    assert "<!-- generated: remote.sglang.architectures.ARCHITECTURES families -->\n" + families in README
