"""Issue 32 row 11: ``journalctl --invocation`` exists only from systemd 257 (systemd #33794); Debian 12
and RHEL 9 have 252. orch reads one start's log by cursor and by the ``_SYSTEMD_INVOCATION_ID`` field of
``-o json`` (orchestrator/facts/journal.py), which 252 has: no code of the controller or the payload
may pass ``--invocation`` (tests/e2e/test_lost_link.py runs a tune on a bed host whose journalctl
refuses it)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_code_asks_journalctl_for_an_invocation():
    found = [f"{p.relative_to(REPO)}:{line}: {text!r}"
             for root in ("orchestrator", "remote") for p in sorted((REPO / root).rglob("*.py"))
             for line, text in _strings(p)
             if text.strip().startswith("--invocation")]
    assert not found, "journalctl --invocation (systemd 257+) is not on Debian 12 / RHEL 9:\n" + "\n".join(found)

