"""The real SGLang releases are the judge of orch's server-flag table (``remote.engines.sglang.server_args.FLAGS``).

For every release of :data:`tests.sglang_loader.ORACLE_RELEASES`, the options the release registers
are read with :mod:`ast` from its own source (``srt/server_args.py``: ``parser.add_argument(...)``
calls up to 0.5.12 and annotated ``ServerArgs`` fields from 0.5.16; ``srt/arg_groups/fields/*.py``
in 0.5.23: a field ``tp_size: A[int, Arg(aliases=[...])] = 1`` is the option ``--tp-size`` with
those aliases, a ``bool`` field a ``store_true`` flag), and orch must agree:

* a flag exists exactly from the release its ``defaults`` names on;
* every spelling orch reads reaches the same argparse destination as the flag's own name, as
  argparse resolves it (exactly, or as the unique prefix of one option: ``--tp`` is ``--tp-size``),
  and every spelling the release registers for it is one orch reads;
* its kind (``store_true``, integer, string) and its default are the release's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from remote.engines.sglang.lookup import version_key
from remote.engines.sglang.server_args import FLAGS, Flag, parse_server_args
from tests.sglang_loader import ORACLE_RELEASES
from tests.sglang_releases import source_tree

_MISSING = object()


def _literal(node: ast.AST | None):
    if node is None:
        return _MISSING
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ("expr", ast.unparse(node))


def _field_option(stmt: ast.AnnAssign) -> tuple[list[str], str, str, object] | None:
    """``(options, dest, kind, default)`` of an annotated field with CLI metadata, else None."""
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) in ("A", "Annotated")):
        return None
    elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    meta = None
    for e in elts[1:]:
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            meta = {}
        elif isinstance(e, ast.Call) and getattr(e.func, "id", None) == "Arg":
            meta = {k.arg: _literal(k.value) for k in e.keywords}
    if meta is None or meta.get("no_cli") is True:
        return None
    name = stmt.target.id
    options = [meta.get("cli_name") or "--" + name.replace("_", "-")] + list(meta.get("aliases") or [])
    typ = ast.unparse(elts[0])
    kind = "bool" if typ == "bool" else "int" if typ in ("int", "Optional[int]") else "str"
    return options, name, kind, _literal(stmt.value)


def _argument_option(call: ast.Call, fields: dict) -> tuple[list[str], str, str, object] | None:
    """``(options, dest, kind, default)`` of a ``parser.add_argument(...)`` call with long options."""
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [o for o in options if o.startswith("--")]
    if not longs:
        return None
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    dest = _literal(kw["dest"]) if "dest" in kw else longs[0][2:].replace("-", "_")
    action = _literal(kw.get("action"))
    if action == "store_true":
        kind = "bool"
    else:
        kind = "int" if "type" in kw and ast.unparse(kw["type"]) == "int" else "str"
    default = kw.get("default")
    if isinstance(default, ast.Attribute) and getattr(default.value, "id", None) == "ServerArgs":
        value = fields.get(default.attr, _MISSING)
    else:
        value = _literal(default)
    return options, dest, kind, value


def release_options(version: str) -> dict[str, tuple[str, str, object]]:
    """Every option the release registers: ``option -> (argparse dest, kind, default)``."""
    srt = source_tree(version) / "sglang" / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups" / "fields").glob("*.py"))]
    trees = [ast.parse(f.read_text()) for f in files if f.is_file()]
    fields = {}
    for tree in trees:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    fields.setdefault(st.target.id, _literal(st.value))
    out: dict[str, tuple[str, str, object]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            found = None
            if isinstance(node, ast.ClassDef):
                for st in node.body:
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                        opt = _field_option(st)
                        if opt:
                            for o in opt[0]:
                                out.setdefault(o, opt[1:])
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                found = _argument_option(node, fields)
            if found:
                for o in found[0]:
                    out.setdefault(o, found[1:])
    assert len(out) > 150, f"{version}: only {len(out)} options read; the extractor no longer fits the release"
    return out


def argparse_dest(options: dict, spelling: str) -> str | None:
    """The destination argparse gives ``spelling``: its own when registered, else the one option it
    is a unique prefix of (``allow_abbrev``), else None (unknown or ambiguous)."""
    if spelling in options:
        return options[spelling][0]
    dests = {options[o][0] for o in options if o.startswith(spelling)}
    return dests.pop() if len(dests) == 1 else None


def default_in(flag: Flag, version: str):
    """orch's default of ``flag`` in release ``version`` (the last entry at or before it)."""
    return [v for since, v in flag.defaults if version_key(since) <= version_key(version)][-1]


@pytest.fixture(scope="module", params=ORACLE_RELEASES)
def release(request):
    return request.param, release_options(request.param)


def test_the_release_parses_abbreviations(release):
    version, _ = release
    text = (source_tree(version) / "sglang" / "srt" / "server_args.py").read_text()
    assert "allow_abbrev=False" not in text, "argparse prefixes (--tp) would no longer reach --tp-size"


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.field)
def test_flag_exists_from_its_first_release(release, flag):
    version, options = release
    assert (flag.options[0] in options) == (version_key(version) >= version_key(flag.since)), version


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.field)
def test_every_spelling_and_only_those_reach_the_flag(release, flag):
    version, options = release
    if flag.options[0] not in options:
        pytest.skip(f"SGLang {version} has no {flag.options[0]}")
    dest = options[flag.options[0]][0]
    assert {o: argparse_dest(options, o) for o in flag.options} == {o: dest for o in flag.options}
    assert {o for o, v in options.items() if v[0] == dest} <= set(flag.options)


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.field)
def test_kind_and_default_are_the_releases(release, flag):
    version, options = release
    if flag.options[0] not in options:
        pytest.skip(f"SGLang {version} has no {flag.options[0]}")
    _dest, kind, default = options[flag.options[0]]
    assert kind == flag.kind, version
    if kind == "bool" and default in (None, _MISSING):
        default = False  # store_true: absent means False
    if default is _MISSING or default == ("missing",):
        default = None  # a required field (--model-path) has no default
    assert default == default_in(flag, version)


def test_parse_reads_every_spelling_of_the_table():
    for flag in FLAGS:
        for spelling in flag.options:
            argv = ["/py", "-m", "sglang.launch_server", spelling] + ([] if flag.kind == "bool" else ["7"])
            sa = parse_server_args(argv)
            assert getattr(sa, flag.field) == (True if flag.kind == "bool" else 7 if flag.kind == "int" else "7")


def test_defaults_of_server_args_are_the_newest_release(tmp_path: Path):
    sa = parse_server_args(["/py", "-m", "sglang.launch_server"])
    for flag in FLAGS:
        if flag.field != "dtype":  # None: not given, the model config decides (SGLang's "auto")
            assert getattr(sa, flag.field) == flag.default, flag.field
