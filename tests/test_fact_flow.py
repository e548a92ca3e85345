"""Facts flow from the one task that sets them to the code that reads them, typed (issue 17).

A fact is a host variable a task declares in ``@task(sets=...)`` and returns in
``TaskResult.facts``; code reads it through ``ctx.facts`` (:class:`orchestrator.facts.catalog.HostFacts`,
which gives each one's type). This test reads ``orchestrator/`` with :mod:`ast` and fails when:

- code reads ``ctx.facts.X`` where ``X`` is no declared fact;
- an attribute read or written on a typed value names no field, property or method of its type:
  chains from ``ctx.facts`` and ``ctx.run.summary``
  (:class:`orchestrator.facts.summary.RunSummary`), names bound to such a value in the same
  function, and parameters annotated with a record type (``server: ServerArgs``);
- code reads a fact as a plain variable (``ctx.vars.get("orch_plan")``) instead of typed;
- a declared fact is set by no task, or a task sets a fact that is not declared;
- a bundled playbook's template reads an ``orch_*`` name that is neither a fact nor an inventory
  variable.

The scanner is tested on synthetic code too (the last tests), so each rule can fail.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import importlib
import types
import typing
from pathlib import Path

import yaml

from orchestrator.engine.context import HostContext, HostRun
from orchestrator.facts.catalog import HostFacts
from orchestrator.inventory.variables import KNOWN_VARS
from orchestrator.tasks import TASKS
from orchestrator.templating import referenced_names

REPO = Path(__file__).resolve().parents[1]
ORCH = REPO / "orchestrator"
PLAYBOOKS = REPO / "playbooks"


# ----------------------------------------------------------------------------- types

@dataclasses.dataclass(frozen=True)
class Returns:
    """What calling a method gives (``ctx.facts.bench`` is ``Returns(BenchResult)``)."""

    type: typing.Any


def _unwrap(tp):
    """``X`` of ``X | None`` (or ``Optional[X]``); ``tp`` itself otherwise."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return rest[0] if len(rest) == 1 else None
    return tp


def _hints(obj) -> dict:
    try:
        return typing.get_type_hints(obj)
    except (NameError, TypeError):
        return {}


#: the context's attributes that lead to typed values (everything else on ``ctx`` is not checked)
CTX_MEMBERS = {"facts": HostFacts, "run": HostRun}


def member(tp, attr: str) -> tuple[bool, typing.Any]:
    """``(exists, type of tp.attr)`` for a typed value of type ``tp``: a field's annotation, a
    property's return type, a method as :class:`Returns`; ``(True, None)`` where nothing is known
    (a mapping's ``.get``, a value of a type that is no record)."""
    if tp is HostContext:
        return True, CTX_MEMBERS.get(attr)
    decl = HostFacts.declared().get(attr) if tp is HostFacts else None
    if decl is not None:
        return True, Returns(decl.type) if "*" in decl.name else decl.type
    if tp is not HostFacts and not (isinstance(tp, type) and (dataclasses.is_dataclass(tp) or _is_protocol(tp))):
        return True, None
    if dataclasses.is_dataclass(tp) and attr in {f.name for f in dataclasses.fields(tp)}:
        return True, _unwrap(_hints(tp).get(attr))
    if _is_protocol(tp) and attr in _hints(tp):  # an interface's declared attribute (remote.engines)
        return True, _unwrap(_hints(tp)[attr])
    if not hasattr(tp, attr):
        return False, None
    found = getattr(tp, attr)
    if isinstance(found, property):
        return True, _unwrap(_hints(found.fget).get("return"))
    if callable(found):
        return True, Returns(_unwrap(_hints(found).get("return")))
    return True, None


#: variables that match a fact's pattern but are plain variables: bench's URL override (a play's
#: ``vars:``; an inventory cannot set it, ``orch_*`` names outside the variable table are refused)
PLAIN_VARIABLES = {"orch_bench_url"}


def _is_protocol(obj) -> bool:
    """A ``typing.Protocol`` class (an interface the controller reads through: ``Engine``,
    ``ServerArgs`` of :mod:`remote.engines`): its declared attributes and methods are its members."""
    return isinstance(obj, type) and bool(getattr(obj, "_is_protocol", False))


def _is_record(obj) -> bool:
    return isinstance(obj, type) and (dataclasses.is_dataclass(obj) or _is_protocol(obj))


def module_records(tree: ast.AST, module: str) -> dict[str, type]:
    """Name -> dataclass for the names of ``module`` that are dataclasses: those it imports
    (``from ..facts.plan import Plan``, relative imports resolved) and, when it can be imported,
    those it defines. Names come from the module itself, so a class of the same name elsewhere
    (the connection's ``Endpoint``) is never taken for another."""
    out = {}
    try:  # (never a __main__: importing it runs it)
        own = vars(importlib.import_module(module)) if not module.endswith("__main__") else {}
    except ImportError:
        own = {}
    out.update({name: obj for name, obj in own.items() if _is_record(obj)})
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = module.split(".")[:-node.level] if node.level else []
        source = ".".join(base + ([node.module] if node.module else []))
        try:
            mod = importlib.import_module(source)
        except ImportError:
            continue
        for alias in node.names:
            obj = getattr(mod, alias.name, None)
            if _is_record(obj):
                out[alias.asname or alias.name] = obj
    return out


# ----------------------------------------------------------------------------- the scan

@dataclasses.dataclass
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


class _FunctionScan:
    """The attribute chains of one function, resolved against the types of the names it binds."""

    def __init__(self, fn: ast.AST, records: dict[str, type], path: str, out: list[Finding]):
        """``records``: the dataclasses the module's names stand for (:func:`module_records`)."""
        self.records, self.path, self.out = records, path, out
        self.params: dict[str, typing.Any] = {}
        for arg in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            tp = self.annotation(arg.annotation)
            if tp is not None:
                self.params[arg.arg] = tp
        self.env = dict(self.params)
        self.bind(fn)

    def annotation(self, node) -> type | None:
        """The record type an annotation names (``Plan``, ``ProbeFacts | None``, ``"Plan"``), else None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
            return self.annotation(sides[0]) if len(sides) == 1 else None
        return self.records.get(node.id) if isinstance(node, ast.Name) else None

    def bind(self, fn: ast.AST) -> None:
        """Names bound in ``fn`` to one typed value (a name bound to values of several types, or
        to one that is not known, is left out). Twice, so aliases of aliases resolve."""
        for _ in range(2):
            seen: dict[str, set] = {}
            for node in ast.walk(fn):
                pairs = []
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                            pairs += list(zip(target.elts, node.value.elts))
                        else:
                            pairs.append((target, node.value))
                elif isinstance(node, ast.AnnAssign):
                    tp = self.annotation(node.annotation)
                    if isinstance(node.target, ast.Name) and tp is not None:
                        seen.setdefault(node.target.id, set()).add(tp)
                    continue
                elif isinstance(node, (ast.For, ast.comprehension)):
                    item = self.resolve(node.iter, report=False)
                    item = _unwrap(typing.get_args(item)[0]) if typing.get_origin(item) is list else None
                    for name in ast.walk(node.target):
                        if isinstance(name, ast.Name):
                            seen.setdefault(name.id, set()).add(item if name is node.target else None)
                    continue
                elif isinstance(node, ast.With):
                    for i in node.items:
                        for name in ast.walk(i.optional_vars or ast.Pass()):
                            if isinstance(name, ast.Name):
                                seen.setdefault(name.id, set()).add(None)
                    continue
                for target, value in pairs:
                    if isinstance(target, ast.Name):
                        seen.setdefault(target.id, set()).add(self.resolve(value, report=False))
            env = dict(self.params)
            for name, tps in seen.items():
                tps |= {self.params[name]} if name in self.params else set()
                if len(tps) == 1 and None not in tps:
                    env[name] = next(iter(tps))
                else:
                    env.pop(name, None)
            self.env = env

    def resolve(self, node, report: bool = True):
        """The type of expression ``node`` when it is a chain from a typed name, else None;
        ``report``: record an attribute that does not exist."""
        if isinstance(node, ast.Name):
            return HostContext if node.id == "ctx" else self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value, report)
            if base is None or isinstance(base, Returns):
                return None
            ok, tp = member(base, node.attr)
            if not ok and report:
                self.out.append(Finding(self.path, node.lineno,
                                        f"{ast.unparse(node)}: {getattr(base, '__name__', base)} has no {node.attr!r}"))
            return tp
        if isinstance(node, ast.Call):
            called = self.resolve(node.func, report)
            return called.type if isinstance(called, Returns) else None
        if isinstance(node, ast.Subscript):
            base = self.resolve(node.value, report)
            args = typing.get_args(base) if base is not None else ()
            origin = typing.get_origin(base)
            return _unwrap(args[-1]) if origin in (dict, list) and args else None
        if isinstance(node, ast.BoolOp):  # ``a or b``: the one record type among its known operands
            tps = {self.resolve(v, report) for v in node.values} - {None}
            return next(iter(tps)) if len(tps) == 1 else None
        return None

    def scan(self, fn: ast.AST) -> None:
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
                self.resolve(node)


def _fact_name_reads(tree: ast.AST, path: str, out: list[Finding]) -> None:
    """``ctx.vars.get("N")`` / ``ctx.vars["N"]`` / ``var(ctx.vars, "N")`` of a declared fact."""
    def is_ctx_vars(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "vars" and isinstance(node.value, ast.Name)
                and node.value.id == "ctx")

    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr == "get" and is_ctx_vars(fn.value):
                name = node.args[0].value
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "var" and len(node.args) == 2
                and is_ctx_vars(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            name = node.args[1].value
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_ctx_vars(node.value)
                and isinstance(node.slice, ast.Constant)):
            name = node.slice.value
        if (isinstance(name, str) and name not in KNOWN_VARS and name not in PLAIN_VARIABLES
                and HostFacts.declaration(name) is not None):
            out.append(Finding(path, node.lineno, f"the fact {name} is read as a plain variable; "
                                                  f"read ctx.facts.{HostFacts.declaration(name).attr}"))


def scan_source(text: str, path: str, module: str) -> list[Finding]:
    """Every finding of the module docstring's first three rules in one module's source
    (``module``: its dotted name, for relative imports)."""
    tree = ast.parse(text, path)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent
    out: list[Finding] = []
    records = module_records(tree, module)
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _FunctionScan(fn, records, path, out).scan(fn)
    _fact_name_reads(tree, path, out)
    unique = {(f.path, f.line, f.what): f for f in out}
    return sorted(unique.values(), key=lambda f: (f.path, f.line, f.what))


def declaration_gaps(declared: list[str], registry: dict) -> list[str]:
    """Declared facts no task sets, and facts a task sets that are not declared (``registry``:
    task name -> TaskSpec, ``declared``: fact names and patterns)."""
    produced = {name: spec.name for spec in registry.values() for name in spec.sets}
    gaps = [f"declared fact {d} is set by no task" for d in declared if d not in produced]
    gaps += [f"task {task} sets {name}, which orchestrator/facts/catalog.py does not declare"
             for name, task in sorted(produced.items()) if name not in declared]
    return gaps


def playbook_reads(path: Path) -> set[str]:
    """The ``orch_*`` names the templates and conditions of a playbook file read."""
    names: set[str] = set()

    def walk(node, key=None):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str):
            text = node if ("{{" in node or "{%" in node) else (f"{{{{ {node} }}}}" if key == "when" else None)
            if text:
                names.update(n for n in referenced_names(text) if n.startswith("orch_"))

    walk(yaml.safe_load(path.read_text()))
    return names


# ----------------------------------------------------------------------------- the rules

def test_every_fact_read_is_declared_and_typed():
    findings = []
    for path in sorted(ORCH.rglob("*.py")):
        rel = path.relative_to(REPO)
        module = ".".join(rel.with_suffix("").parts)
        findings += scan_source(path.read_text(encoding="utf-8"), str(rel), module)
    assert not findings, "fact reads that no declaration backs:\n" + "\n".join(map(str, findings))


def test_every_declared_fact_is_set_by_a_task_and_every_set_fact_is_declared():
    declared = [d.name for d in HostFacts.declared().values()]
    assert declaration_gaps(declared, TASKS) == []
    assert {"orch_unit", "orch_probe", "orch_plan", "orch_endpoint", "orch_installed", "orch_bench_*"} <= set(declared)


def test_bundled_playbooks_read_only_facts_and_inventory_variables():
    for path in sorted(PLAYBOOKS.glob("*.yaml")):
        unknown = sorted(n for n in playbook_reads(path)
                         if n not in KNOWN_VARS and HostFacts.declaration(n) is None)
        assert not unknown, f"{path.name} reads {unknown}: neither a fact a task sets nor an inventory variable"
    assert {"orch_plan", "orch_unit", "orch_installed"} <= playbook_reads(PLAYBOOKS / "tune.yaml")


# ----------------------------------------------------------------------------- the scanner itself

SYNTHETIC = '''
from orchestrator.facts.unit import ServerArgs


@task("lookup", sets=("orch_lookup",))
def lookup(ctx, name: str):
    paths = ctx.facts.tuned_paths                   # no such fact
    probe = ctx.facts.probe
    folder = probe.install_folder                   # ProbeFacts has no install_folder
    up = probe.existing["up"].in_installed_folder   # fine: a field, through the mapping
    plan = ctx.vars.get("orch_plan")                # a fact read untyped
    url = ctx.vars.get("orch_sglang_url")           # fine: an inventory variable
    ctx.run.summary.plann = plan                    # RunSummary has no plann
    ctx.run.summary.plan = plan                     # fine
    before = ctx.facts.bench("before").levels       # fine: the pattern's record
    return port(ctx.facts.server)


def port(server: ServerArgs | None) -> int:
    return server.portt or server.port              # ServerArgs has no portt
'''


def test_scanner_finds_each_kind_of_bad_read():
    found = [f"{f.line}: {f.what}" for f in scan_source(SYNTHETIC, "synthetic.py", "orchestrator.tasks.synthetic")]
    assert found == [
        "7: ctx.facts.tuned_paths: HostFacts has no 'tuned_paths'",
        "9: probe.install_folder: ProbeFacts has no 'install_folder'",
        "11: the fact orch_plan is read as a plain variable; read ctx.facts.plan",
        "13: ctx.run.summary.plann: RunSummary has no 'plann'",
        "20: server.portt: ServerArgs has no 'portt'",
    ], found


def test_declaration_gaps_name_both_directions():
    @dataclasses.dataclass
    class Spec:
        name: str
        sets: tuple[str, ...]

    registry = {"lookup": Spec("lookup", ("orch_lookup",)), "probe": Spec("probe", ("orch_probe",))}
    assert declaration_gaps(["orch_probe", "orch_plan"], registry) == [
        "declared fact orch_plan is set by no task",
        "task lookup sets orch_lookup, which orchestrator/facts/catalog.py does not declare"]


def test_playbook_reads_templates_and_conditions(tmp_path):
    pb = tmp_path / "p.yaml"
    pb.write_text("- hosts: all\n  tasks:\n    - when: \"orch_plann.action == 'tune'\"\n"
                  "      install: {dest_dir: \"{{ orch_plan.install_dir }}\", names: \"{{ service }}\"}\n")
    assert playbook_reads(pb) == {"orch_plann", "orch_plan"}
    assert fnmatch.fnmatchcase("orch_bench_before", HostFacts.bench.name)
