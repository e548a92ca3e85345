"""orchestrator.records.layout: every file name of a controller run record is spelled there only, and
everything it lists is written or read by someone."""

from __future__ import annotations

import ast

import yaml

from orchestrator.records import layout
from tests.paths import REPO
from tests.test_architecture import imports_of_tree

ORCH = REPO / "orchestrator"
#: The store's entries (key.json, provenance.json, report.json) are another layout, not a run record.
NOT_RUN_RECORDS = {ORCH / "store.py"}


def _names() -> dict[str, str]:
    """Layout constant -> its file name (the values that end in an extension)."""
    return {k: v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) and "." in v}


def _literals(path):
    """``(line, text)`` of the string constants of a module that are not docstrings; an f-string
    gives its constant parts joined with ``{}``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    parts_of_f = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            parts_of_f |= {id(v) for v in node.values}
            yield node.lineno, "".join(parts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | parts_of_f:
            yield node.lineno, node.value


def test_run_record_file_names_are_spelled_in_the_layout_only():
    names = set(_names().values())
    assert {"probe.json", "events.jsonl", "report.json", "install_manifest.json", "run.json"} <= names
    bad = []
    for path in sorted(ORCH.rglob("*.py")):
        if path == ORCH / "records" / "layout.py" or path in NOT_RUN_RECORDS:
            continue
        for line, text in _literals(path):
            base = text.rsplit("/", 1)[-1]
            if base in names or (base.startswith("bench_") and base.endswith(".json")):
                bad.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not bad, "use orchestrator.records.layout:\n" + "\n".join(bad)


def test_everything_the_layout_lists_is_used():
    """A name nothing imports (like the ``unit.json`` the old list named) is not part of a record."""
    public = {k for k, v in vars(layout).items()
              if (k.isupper() and isinstance(v, str)) or (callable(v) and getattr(v, "__module__", "") == layout.__name__)}
    used = set()
    for path, _line, target, names in imports_of_tree(ORCH):
        if target == "orchestrator.records.layout" and path.name != "layout.py":
            used |= set(names)
    assert public - used == set(), f"listed in orchestrator/records/layout.py, used nowhere: {sorted(public - used)}"
    assert "unit.json" not in (ORCH / "records" / "layout.py").read_text()


def test_bench_playbook_writes_the_file_orch_bench_reads():
    book = yaml.safe_load((REPO / "playbooks" / "bench.yaml").read_text())
    labels = [t["bench"]["label"] for play in book for t in play["tasks"] if "bench" in t]
    assert labels == [layout.BENCH_LABEL]
    assert layout.bench_file(layout.BENCH_LABEL) == "bench_bench.json"
    assert layout.host_dir(REPO, "h1") == REPO / "hosts" / "h1"
