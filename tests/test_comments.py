"""Comments and docstrings point at what exists: every dotted module path (such as
``orchestrator.engine.batching``, ``remote.protocol.is_run_id``) and every backticked path under one of the repository's top folders
(``remote/host/fs.py``, ``tests/unit/facts/cases/``) in the comments and docstrings of
``orchestrator/``, ``remote/`` and ``tests/`` resolves in this checkout.

A dotted path resolves when its longest prefix that is a module or package is followed by a name
that module defines or imports (and, for a class, by one of its attributes). A slash path resolves
when it exists from the repository root or from a folder above the file that names it (``host/fs``
in ``remote/__init__.py``), with or without ``.py``; a path with a placeholder (``<host>``, ``*``,
``...``, ``{...}``) or one the repository ignores (``.gitignore``: files the demo writes) is not
checked, nor a dotted path with a one-letter part (``remote.x``), nor anything under a copied
SGLang tree."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path

from tests.paths import REPO

DOTTED = re.compile(r"(?<![\w./-])((?:orchestrator|remote|tests)(?:\.[A-Za-z_]\w*)+)")
SLASH = re.compile(r"`+([A-Za-z0-9_.~-]+(?:/[A-Za-z0-9_.<>*{}=,~-]+)+/?)`+")
TOP = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.")

#: Stale references in files that other work on issue 17 rewrites (SGLang's rules moving out of
#: ``orchestrator/facts/``, the split of the payload's SGLang model module), by the reference
#: (the files move): each must still be found somewhere, so an entry goes once it is fixed.
PENDING: set[str] = set()


def texts(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring of a Python file."""
    src = path.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


@lru_cache(maxsize=None)
def defined_names(module: Path) -> dict[str, ast.ClassDef | None]:
    """Names a module binds at its top level (defs, classes, assignments, imports, also under
    ``if``/``try``): name -> its ClassDef, or None."""
    names: dict[str, ast.ClassDef | None] = {}

    def visit(body):
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names[n.name] = None
            elif isinstance(n, ast.ClassDef):
                names[n.name] = n
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    names.update({e.id: None for e in ast.walk(t) if isinstance(e, ast.Name)})
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update({(a.asname or a.name).split(".")[0]: None for a in n.names})
            elif isinstance(n, (ast.If, ast.Try)):
                for part in (n.body, n.orelse, getattr(n, "finalbody", []), *[h.body for h in getattr(n, "handlers", [])]):
                    visit(part)
    visit(ast.parse(module.read_text()).body)
    return names


def class_attributes(cls: ast.ClassDef) -> set[str]:
    out = set()
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            out.update(e.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                       for e in ast.walk(t) if isinstance(e, ast.Name))
    return out


def dotted_resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    folder, module, i = REPO, None, 0
    while i < len(parts):
        if (folder / parts[i] / "__init__.py").exists() or (i == 0 and (folder / parts[i]).is_dir()):
            folder, module, i = folder / parts[i], folder / parts[i] / "__init__.py", i + 1
        elif (folder / f"{parts[i]}.py").exists():
            module, i = folder / f"{parts[i]}.py", i + 1
            break
        else:
            break
    rest = parts[i:]
    if not rest:
        return True
    if module is None or not module.exists() or rest[0] not in defined_names(module):
        return False
    cls = defined_names(module)[rest[0]]
    return cls is None or len(rest) == 1 or rest[1] in class_attributes(cls)


@lru_cache(maxsize=None)
def ignored() -> frozenset[str]:
    lines = (REPO / ".gitignore").read_text().splitlines()
    return frozenset(x.strip().strip("/") for x in lines if x.strip() and not x.startswith("#"))


def slash_resolves(text: str, source: Path) -> bool:
    rel = text.rstrip("/")
    if rel in ignored():
        return True
    bases = [REPO, *[p for p in source.parents if REPO in p.parents or p == REPO]]
    return any((b / rel).exists() or (b / f"{rel}.py").exists() for b in bases)


def stale_references() -> set[tuple[str, str]]:
    found = set()
    for top in ("orchestrator", "remote", "tests"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if "/standin/sglang/" in rel:  # the test bed's SGLang tree: SGLang's own paths
                continue
            for _, text in texts(path):
                found |= {(rel, m) for m in DOTTED.findall(text)
                          if min(len(p) for p in m.split(".")) > 1 and not dotted_resolves(m)}
                found |= {(rel, m) for m in SLASH.findall(text)
                          if m.split("/")[0] in TOP and not PLACEHOLDER.search(m) and not slash_resolves(m, path)}
    return found


def test_comments_and_docstrings_point_at_what_exists():
    stale = stale_references()
    assert sorted((f, ref) for f, ref in stale if ref not in PENDING) == []
    assert sorted(PENDING - {ref for _, ref in stale}) == [], "fixed: remove these from PENDING"


def test_the_check_finds_moved_modules(tmp_path):
    """Moved modules named as the issue found them: a path, a dotted module, a function of a module."""
    src = REPO / "orchestrator" / "cli" / "bench.py"
    assert not slash_resolves("remote/bench.py", src) and slash_resolves("remote/bench/command.py", src)
    assert not dotted_resolves("orchestrator.tasks.doctor") and dotted_resolves("orchestrator.tasks.diagnose")
    assert not dotted_resolves("remote.probe.loader_rules") and dotted_resolves("remote.engines.sglang.lookup.loader_rules")
    assert not dotted_resolves("orchestrator.cli.run.RunResult.nothing")
    assert dotted_resolves("orchestrator.cli.run.RunResult.failed")
    assert slash_resolves("host/fs", REPO / "remote" / "__init__.py")
