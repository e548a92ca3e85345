"""docs/runners.md's runner table is orch's answer (``scripts.sglang_docs.runner_table_markdown``), and
every SGLang 0.5.23 line it cites is where the wheel defines that function."""

from __future__ import annotations

import ast
import re

from scripts.sglang_docs import SOURCE_LINES, runner_table_markdown
from tests.paths import REPO
from tests.sglang_releases import source_tree

START, END = "<!-- runner table: generated, do not edit by hand -->\n", "<!-- end of runner table -->"


def test_page_holds_the_rendered_table():
    page = (REPO / "docs" / "runners.md").read_text()
    table = page.split(START, 1)[1].split(END, 1)[0]
    assert table == runner_table_markdown(), (
        "docs/runners.md's runner table differs from orch's rules; regenerate it with "
        "python -c 'from scripts.sglang_docs import runner_table_markdown as t; print(t(), end=\"\")'")


def test_cited_lines_are_the_wheels():
    root = source_tree("0.5.23") / "sglang"
    for cited, line in SOURCE_LINES.items():
        path, name = cited.split(" ")
        body = ast.parse((root / path).read_text()).body
        node = None
        for part in name.split("."):
            node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
            body = node.body
        assert node.lineno == line, (cited, node.lineno)


def test_every_cited_function_has_its_line():
    for path, name in re.findall(r"(srt/[\w/]+\.py):(\d+) ", runner_table_markdown()):
        assert int(name) in SOURCE_LINES.values(), path
    bare = re.findall(r"\| (srt/[\w/]+\.py [A-Za-z_][\w.]*)", runner_table_markdown())
    assert not bare, bare  # every cited function is in SOURCE_LINES (so it carries its line)
