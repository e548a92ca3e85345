"""The import rules between the payload (``remote/``) and the controller (``orchestrator/``).

- (a) nothing under ``remote/`` imports ``orchestrator`` (the payload runs alone on a host);
- (b) ``orchestrator/`` imports from ``remote`` only the engines' facade (the ``remote.engines``
  package itself, never a module below it), the GPU vendors' facade (``remote.gpus``, never a
  vendor's own module) and ``remote.protocol``;
- (b') no SGLang name or rule outside ``remote/engines/sglang/`` in ``orchestrator/`` and ``remote/``
  (:func:`engine_name_findings`: identifiers and string literals naming it, its flags, its log
  lines), but for :data:`ENGINE_NAME_ALLOWED`; the engine interface (``remote/engines/interface.py``,
  ``records.py``, ``launch.py``, ``errors.py``) names no engine even in its docstrings;
- (c) the stdlib-only parts of ``remote`` import with torch and triton blocked;
- (d) at most 6 modules at the top of ``remote/`` (the rest lives in role folders);
- (e) no import cycle inside ``remote/`` (:func:`import_cycles`, reusable for any package);
- commands (``COMMANDS`` of ``remote/__main__.py``) never import one another;
- the controller's layers (:func:`controller_layer_violations`): task modules
  (``orchestrator/tasks/*``) never import one another, and nothing outside ``orchestrator/tasks/``
  imports a task module (only the package, whose ``TASKS`` registers them all): what tasks share
  lives in ``orchestrator/host/`` or ``orchestrator/facts/``; the terminal UI
  (``orchestrator/ui.py``) never reaches the HTML report (``orchestrator/report.py``);
- the generic tuner (``remote/tuning/tuner/``) imports no provider module: what is timed and
  compiled is the provider's (``remote/tuning/providers/``), reached through the registry;
- the GPU measurements in ``bench/`` import from ``remote`` only the modules of
  :data:`BENCH_MAY_IMPORT`, only public names, and only names those modules define.

(a), (b) and (e) read the source with :mod:`ast`: every ``import``/``from ... import``, at module
level, inside functions and under ``if TYPE_CHECKING:`` alike, relative imports resolved.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.waiting import run_watched

REPO = Path(__file__).resolve().parents[1]
REMOTE = REPO / "remote"
ORCH = REPO / "orchestrator"

#: Where the controller may import the payload's code (docs/protocol.md, docs/architecture.md): the
#: engines' facade (the package, whose ``ENGINES``/``engine_for`` hand out an ``Engine``), the GPU
#: vendors' facade (``remote.gpus``: ``remote/gpus/nvidia.py`` is reached through it) and the
#: protocol's names, nothing below them.
ALLOWED_FROM_CONTROLLER = ("remote.engines", "remote.protocol", "remote.gpus")

#: What the GPU measurement scripts of ``bench/`` may import from the payload, and why: they time
#: and check the kernels, the search and its parts on a real GPU, below the ``tune`` command.
BENCH_MAY_IMPORT = {
    "remote.engines.sglang.naming": "SGLang's file and folder names",
    "remote.engines.triton_moe.configfile": "writing config files as SGLang reads them",
    "remote.tuning.kernel.fused_moe": "orch's Triton kernel, timed and checked",
    "remote.tuning.kernel.quant": "its fp8 quantization",
    "remote.tuning.kernel.formats": "quantized weights in SGLang's layouts and their float64 reference",
    "remote.engines.sglang.model_flags": "loading a model config as the tune command does",
    "remote.engines.sglang.shape": "the MoE shape and selectors a model config gives (section quant)",
    "remote.tuning.support": "the tuner spec's quant entry for those selectors",
    "remote.tuning.kernel.reference": "the float64 reference the kernels are checked against",
    "remote.tuning.providers.builtin": "the builtin provider: what the tuner times",
    "remote.engines.sglang.provider": "SGLang's kernel, as the sglang provider drives it",
    "remote.engines.vllm.engine": "vLLM's engine, whose on-disk check of compiled ops the vLLM bench answers "
                                  "(its compiled ops are stand-ins there)",
    "remote.protocol": "orch tune's default GPU-timing budget (DEFAULT_TUNE_BUDGET_S)",
    "remote.tuning.tuner.space": "the search spaces and their pruning",
    "remote.tuning.tuner.search": "the search, run below the tune command",
    "remote.tuning.tuner.timing": "the GPU timer",
    "remote.tuning.tuner.compile": "ahead-of-time compilation",
    "remote.tuning.tuner.driver": "the per-device steps (comparison, the device's shared memory)",
    "remote.tuning.tuner.events": "the events the per-device steps emit (bench/vllm_kernel_h200.py)",
    "remote.engines.vllm.provider": "vLLM's kernel, as the vllm provider drives it",
    "remote.engines.vllm.lookup": "writing config files as vLLM reads them",
}
BENCH = REPO / "bench"

#: Parts of the payload that must import without torch or triton (commands read-only or stdlib).
#: An engine's kernel provider (``remote.engines.<engine>.provider``, :data:`ENGINE_PROVIDERS`)
#: is the one exception: it drives the engine's Triton kernel for the tuner.
TORCH_FREE = ("remote.engines", "remote.host", "remote.bench", "remote.probe", "remote.names", "remote.protocol",
              "remote.tuning.support", "remote.tuning.command", "remote.__main__")


# ----------------------------------------------------------------------------- the AST scan

def module_name(path: Path, package_root: Path) -> str:
    """Dotted name of the module at ``path`` inside the package folder ``package_root``
    (``remote/host/fs.py`` -> ``remote.host.fs``; ``remote/host/__init__.py`` -> ``remote.host``)."""
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_of(package_root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (``__pycache__`` left out)."""
    return {module_name(p, package_root): p for p in sorted(package_root.rglob("*.py"))
            if "__pycache__" not in p.parts}


def imported_names(path: Path, module: str) -> list[tuple[str, tuple[str, ...], int]]:
    """The imports of one file as ``(absolute module, imported names, line)``.

    ``import a.b`` gives ``("a.b", (), line)``; ``from .x import y, z`` inside ``pkg.m`` gives
    ``("pkg.x", ("y", "z"), line)``. Every import statement counts, wherever it sits (module
    level, function body, ``if TYPE_CHECKING:``). Raises SyntaxError for a file that does not parse.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]  # a module's package
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, tuple(a.name for a in node.names), node.lineno))
    return out


def import_graph(package_root: Path) -> dict[str, set[str]]:
    """``module -> modules of the same package it imports`` (see :func:`imported_names`).

    ``from p import x`` is an edge to ``p.x`` when that is a module of the package, else to
    ``p``. ``import a.b.c`` is an edge to the deepest of ``a.b.c``, ``a.b``, ``a`` that is a
    module of the package. Importing a submodule is not counted as importing its parent
    packages' ``__init__`` (Python runs those first, but they cannot close a cycle through it).
    """
    mods = modules_of(package_root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, names, _line in imported_names(path, mod):
            if names:
                hits = {f"{target}.{n}" for n in names if f"{target}.{n}" in mods}
                if len(hits) < len(names) and target in mods:
                    hits.add(target)
                graph[mod] |= hits
            else:
                parts = target.split(".")
                for k in range(len(parts), 0, -1):
                    if ".".join(parts[:k]) in mods:
                        graph[mod].add(".".join(parts[:k]))
                        break
    for mod, edges in graph.items():
        edges.discard(mod)  # a package __init__ importing its own names is no cycle
    return graph


def import_cycles(package_root: Path | str) -> list[list[str]]:
    """Import cycles inside the package at ``package_root`` (a folder with ``__init__.py``).

    Builds :func:`import_graph` (module-level and function-level imports, relative imports
    resolved) and returns one cycle per strongly connected component that has one, as a path
    that starts and ends at the same module (``["a.x", "a.y", "a.x"]``), sorted; ``[]`` when the
    graph is acyclic.
    """
    graph = import_graph(Path(package_root))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def connect(v: str) -> None:  # Tarjan's algorithm, iterative over each node's edges
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            advanced = False
            for w in edges:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(_cycle_in(graph, comp) for comp in components)


def _cycle_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One cycle through the first module of a strongly connected component (breadth-first,
    so the shortest one back to it)."""
    start, members = comp[0], set(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {comp}")  # cannot happen for an SCC


def imports_of_tree(package_root: Path):
    """``(file, line, absolute module, names)`` for every import in the package's files."""
    for mod, path in modules_of(package_root).items():
        for target, names, line in imported_names(path, mod):
            yield path, line, target, names


# ----------------------------------------------------------------------------- the rules

def test_payload_never_imports_the_controller():
    bad = [f"{p.relative_to(REPO)}:{line}: {target}" for p, line, target, _ in imports_of_tree(REMOTE)
           if target == "orchestrator" or target.startswith("orchestrator.")]
    # importlib.import_module("orchestrator...") / __import__ with a literal name count too
    for path in REMOTE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                arg = node.args[0].value
                if fn in ("import_module", "__import__") and isinstance(arg, str) and arg.startswith("orchestrator"):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {fn}({arg!r})")
    assert not bad, "remote/ must not import orchestrator:\n" + "\n".join(bad)


def _allowed(module: str) -> bool:
    return module in ALLOWED_FROM_CONTROLLER


def test_controller_imports_only_the_shared_rules_of_the_payload():
    bad = []
    for path, line, target, names in imports_of_tree(ORCH):
        if target != "remote" and not target.startswith("remote."):
            continue
        # `from remote import protocol` names the module through its parent
        reached = [f"{target}.{n}" for n in names] if target == "remote" and names else [target]
        bad += [f"{path.relative_to(REPO)}:{line}: {m}" for m in reached if not _allowed(m)]
    assert not bad, f"orchestrator/ may import only {ALLOWED_FROM_CONTROLLER} from remote:\n" + "\n".join(bad)
    # and it does use them (the rule is about something real)
    used = {t for _, _, t, _ in imports_of_tree(ORCH) if t.startswith("remote.")}
    assert {"remote.protocol", "remote.engines", "remote.gpus"} <= used, used


# ----------------------------------------------------------------------------- SGLang stays in its home

#: What names SGLang or states one of its rules: its name in any identifier, module path or string;
#: its launch flags orch reads that no other engine shares; its server-argument names.
ENGINE_NAME = re.compile(r"sglang|moe[-_]runner[-_]backend|moe[-_]a2a[-_]backend|enable[-_]dp[-_]attention|"
                         r"flashinfer[-_]autotune[-_]skip[-_]ops|--speculative-", re.IGNORECASE)


def _sglang_log_lines() -> tuple[str, ...]:
    """SGLang's own log lines orch reads (its log model and FlashInfer autotune's): a string holding
    one of them outside the home is SGLang's rule written again."""
    from remote.engines.sglang import autotune, moe_log

    # (their own words only: "Config file not found at ..." is vLLM's wording too)
    return (*moe_log.START_MARKERS, moe_log.READY_LINE, "Using MoE kernel config", "Fallback to triton version",
            "Using default MoE kernel config", "Down MoE config file not found", autotune.LOG_WITH_CACHE.strip(),
            autotune.LOG_DONE)


#: Files outside ``remote/engines/sglang/`` that may name SGLang, and why a neutral name is impossible.
ENGINE_NAME_ALLOWED = {
    "remote/engines/__init__.py": "the engine registry (ENGINES) imports each engine's ENGINE from its folder",
    "remote/protocol.py": "ENGINE_NAMES: the engine names both sides spell (orch_engine, --engine, and the "
                          "--provider/--tool named after each engine), below the engines' floor",
    "orchestrator/facts/legacy.py": "the names older run records, store keys and inventories used (read, "
                                    "never written), spelled after the engine they named",
}
#: The engine interface and its records: no engine's name at all, docstrings included.
NEUTRAL_INTERFACE = ("remote/engines/interface.py", "remote/engines/records.py", "remote/engines/launch.py",
                     "remote/engines/errors.py")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """``id()`` of the string constants that are docstrings (module, class, function) or attribute
    docstrings (a string statement right after an assignment)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                out.add(id(stmt.value))
    return out


def engine_name_findings(text: str, path: str, lines: tuple[str, ...] = ()) -> list[str]:
    """``path:line: what`` for each identifier (name, attribute, definition, argument, keyword,
    imported module or alias) and each string literal (docstrings and comments excepted) of the
    Python source ``text`` that matches :data:`ENGINE_NAME`, and each string literal holding one of
    ``lines`` (an engine's log lines). Pure."""
    tree = ast.parse(text)
    docs = _docstring_nodes(tree)
    out = []
    for node in ast.walk(tree):
        words: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words = [node.value]
            hit = next((ln for ln in lines if ln in node.value), None)
            if hit:
                out.append(f"{path}:{node.lineno}: the log line {hit!r}")
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            words = [node.arg]
        elif isinstance(node, ast.alias):
            words = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom) and node.module:
            words = [node.module]
        out += [f"{path}:{node.lineno}: {w[:80]!r}" for w in words if ENGINE_NAME.search(w)]
    return sorted(set(out))


def test_no_sglang_name_or_rule_outside_its_home():
    """The controller and the payload reach SGLang only through the engine interface: its name, its
    flags, its server arguments and its log lines are written only in ``remote/engines/sglang/``
    (and the few places of :data:`ENGINE_NAME_ALLOWED`, each with its reason)."""
    lines = _sglang_log_lines()
    home = REMOTE / "engines" / "sglang"
    bad = []
    for root in (ORCH, REMOTE):
        for path in sorted(root.rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if home in path.parents or rel in ENGINE_NAME_ALLOWED or "__pycache__" in path.parts:
                continue
            bad += engine_name_findings(path.read_text(encoding="utf-8"), rel, lines)
    assert not bad, ("SGLang's names and rules belong in remote/engines/sglang/ (reach them through "
                     "remote.engines' Engine); found:\n" + "\n".join(bad))
    for rel in ENGINE_NAME_ALLOWED:
        assert (REPO / rel).exists() and ENGINE_NAME.search((REPO / rel).read_text()), f"{rel}: allowed, but names none"


def test_the_engine_interface_names_no_engine():
    from remote.protocol import ENGINE_NAMES

    for rel in NEUTRAL_INTERFACE:
        text = (REPO / rel).read_text(encoding="utf-8").lower()
        named = [n for n in ENGINE_NAMES if n in text]
        assert not named, f"{rel} names {named}: the interface is every engine's"


def test_engine_name_scanner_finds_each_kind(tmp_path):
    src = '''"""Docstrings may cite SGLang 0.5.23 (where a rule comes from)."""
from remote.engines.sglang import naming            # 2: a module path
import x as sglang_x                                # 3: an alias


def f(sglang_url, **kw):                            # 6: an argument
    """SGLang's rule, cited."""
    y = kw.get("orch_sglang_url")                   # 8: a string
    z = server.moe_runner_backend                   # 9: an attribute
    g(moe_a2a_backend=1)                            # 10: a keyword
    if line == "The server is fired up and ready to roll!":   # 11: a log line
        pass
    return ["--moe-runner-backend", "--tp"]         # 13: a flag (and one every engine shares)
'''
    found = engine_name_findings(src, "x.py", ("The server is fired up",))
    assert [f.split(":")[1] for f in found] == ["10", "11", "13", "2", "3", "6", "8", "9"], found
    assert engine_name_findings('"""SGLang, cited."""\nx = "--tp"\n# sglang in a comment\n', "y.py") == []


# ----------------------------------------------------------------------------- vLLM stays in its home

#: What names vLLM or states one of its rules: its name (but an issue or pull request cited as
#: ``vllm #N``, ``vllm PR #N``, ``vllm issue #N`` or ``vllm-project/...``), its MoE backend flag.
VLLM_NAME = re.compile(r"vllm(?! #\d)(?! (?:PR|issue) #\d)(?!-project/)|--moe-backend(?![-_])", re.IGNORECASE)


def _vllm_log_lines() -> tuple[str, ...]:
    """vLLM's own log lines orch reads (its lookup's and its log model's)."""
    from remote.engines.vllm import moe_log

    return (*moe_log.START_MARKERS, moe_log.READY_LINE, "Using configuration from ", "Using default MoE config.")


#: Files outside ``remote/engines/vllm/`` that may name vLLM, and why.
VLLM_NAME_ALLOWED = {
    "remote/engines/__init__.py": "the engine registry (ENGINES) imports each engine's ENGINE from its folder",
    "remote/protocol.py": "ENGINE_NAMES: the engine names both sides spell (orch_engine, --engine, and the "
                          "--provider/--tool named after each engine), below the engines' floor",
    "remote/engines/sglang/quantization.py": "a note that compares SGLang's int4 file names with vLLM's",
}


def test_no_vllm_name_or_rule_outside_its_home(monkeypatch):
    """vLLM's name, its backend flag and its log lines are written only in ``remote/engines/vllm/``
    (and the few places of :data:`VLLM_NAME_ALLOWED`): the controller and the payload reach vLLM
    through the engine interface, as they reach SGLang."""
    monkeypatch.setattr(sys.modules[__name__], "ENGINE_NAME", VLLM_NAME)
    lines = _vllm_log_lines()
    home = REMOTE / "engines" / "vllm"
    bad = []
    for root in (ORCH, REMOTE):
        for path in sorted(root.rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if home in path.parents or rel in VLLM_NAME_ALLOWED or "__pycache__" in path.parts:
                continue
            bad += engine_name_findings(path.read_text(encoding="utf-8"), rel, lines)
    assert not bad, ("vLLM's names and rules belong in remote/engines/vllm/ (reach them through "
                     "remote.engines' Engine); found:\n" + "\n".join(bad))
    for rel in VLLM_NAME_ALLOWED:
        assert (REPO / rel).exists() and VLLM_NAME.search((REPO / rel).read_text()), f"{rel}: allowed, but names none"


def test_vllm_name_scanner_finds_its_names_and_lines(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ENGINE_NAME", VLLM_NAME)
    src = ('"""Docstrings may cite vLLM 0.34.0."""\nfrom remote.engines.vllm import naming\n'
           'x = ["--moe-backend", "--moe-backend-x"]\ny = "see vllm #41871 and vllm PR #54618"\n'
           'z = "Using configuration from /p for MoE layer."\n')
    found = engine_name_findings(src, "x.py", _vllm_log_lines())
    assert [f.split(":")[1] for f in found] == ["2", "3", "5"], found


#: The engines' kernel providers: torch and triton, loaded only by the tuner's registry.
ENGINE_PROVIDERS = ("remote.engines.sglang.provider", "remote.engines.vllm.provider")


def _torch_free_modules() -> list[str]:
    return [m for m in modules_of(REMOTE) if any(m == p or m.startswith(p + ".") for p in TORCH_FREE)
            and m not in ENGINE_PROVIDERS]


def test_stdlib_parts_of_the_payload_import_without_torch_or_triton():
    mods = _torch_free_modules()
    assert {"remote.engines.sglang.naming", "remote.engines.sglang.lookup", "remote.host.fs", "remote.host.changes",
            "remote.probe", "remote.names", "remote.protocol", "remote.tuning.support"} <= set(mods)
    code = (
        "import importlib, json, sys\n"
        "sys.modules['torch'] = None; sys.modules['triton'] = None  # any `import torch` now fails\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in ('torch', 'triton', 'numpy') if sys.modules.get(m) is not None)))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = run_watched([sys.executable, "-c", code], cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_payload_top_level_stays_small():
    top = sorted(p.name for p in REMOTE.glob("*.py"))
    assert len(top) <= 6, f"{len(top)} modules at the top of remote/ (at most 6): {top}"
    assert {"__init__.py", "__main__.py", "protocol.py"} <= set(top)


def test_no_import_cycle_in_the_payload():
    cycles = import_cycles(REMOTE)
    assert cycles == [], "import cycles in remote/:\n" + "\n".join(" -> ".join(c) for c in cycles)


def command_modules() -> dict[str, str]:
    """``COMMANDS`` of ``remote/__main__.py`` (command -> absolute module), read from its source."""
    tree = ast.parse((REMOTE / "__main__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMANDS" for t in node.targets):
            table = ast.literal_eval(node.value)
            return {cmd: "remote" + mod for cmd, mod in table.items()}
    raise AssertionError("remote/__main__.py has no COMMANDS table")


def test_commands_never_import_one_another():
    cmds = command_modules()
    mods = modules_of(REMOTE)
    assert set(cmds) >= {"probe", "names", "tune", "install", "restore", "bench"} and set(cmds.values()) <= set(mods)
    graph = import_graph(REMOTE)
    bad = [f"{a} imports {b}" for a in cmds.values() for b in sorted(graph[a]) if b in cmds.values()]
    assert not bad, "what two commands share belongs in sglang/, host/, bench/common or tuning/support:\n" + \
        "\n".join(bad)


TASKS_PACKAGE = "orchestrator.tasks"


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def controller_layer_violations(graph: dict[str, set[str]], tasks: str = TASKS_PACKAGE,
                                ui: str = "orchestrator.ui", report: str = "orchestrator.report") -> list[str]:
    """The import edges of ``graph`` (:func:`import_graph` of the controller) that break its layers:
    a task module (``<tasks>.x``) importing another task module or the package; a module outside
    the package importing a task module (the package itself, the registry, is fine); ``ui``
    reaching ``report`` through any chain of imports."""
    prefix = tasks + "."
    bad = []
    for mod, edges in sorted(graph.items()):
        for target in sorted(edges):
            if mod.startswith(prefix) and (target == tasks or target.startswith(prefix)):
                bad.append(f"task module {mod} imports {target}")
            elif not mod.startswith(prefix) and mod != tasks and target.startswith(prefix):
                bad.append(f"{mod} imports the task module {target}")
    if report in _reachable(graph, ui):
        bad.append(f"{ui} reaches {report}")
    return bad


def test_controller_layers():
    bad = controller_layer_violations(import_graph(ORCH))
    assert not bad, ("what two tasks share belongs in orchestrator/host/ (it acts on a host's context) or "
                     "orchestrator/facts/ (typed facts and pure rules); the UI and the report share "
                     "orchestrator/facts/summary.py:\n" + "\n".join(bad))
    assert set(modules_of(ORCH)) >= {"orchestrator.host.endpoint", "orchestrator.host.records"}


def test_controller_layer_check_finds_each_kind_of_violation(tmp_path):
    pkg = _write(tmp_path, {
        "orch/__init__.py": "",
        "orch/tasks/__init__.py": "from . import a, b\n",        # the registry: fine
        "orch/tasks/a.py": "def f():\n    from .b import g\n",  # task -> task (inside a function)
        "orch/tasks/b.py": "from ..host import shared\n",        # task -> shared helper: fine
        "orch/host/__init__.py": "",
        "orch/host/shared.py": "from orch.tasks.a import f\n",    # helper -> task module
        "orch/cli.py": "from .tasks import b\n",                  # outside -> a task module
        "orch/ui.py": "from . import stats\n",
        "orch/stats.py": "from .report import x\n",               # ui reaches report through stats
        "orch/report.py": "x = 1\n",
    })
    bad = controller_layer_violations(import_graph(pkg), tasks="orch.tasks", ui="orch.ui", report="orch.report")
    assert bad == ["orch.cli imports the task module orch.tasks.b", "orch.host.shared imports the task module orch.tasks.a",
                   "task module orch.tasks.a imports orch.tasks.b", "orch.ui reaches orch.report"], bad
    for rel, text in {"orch/tasks/a.py": "from ..host import shared\n", "orch/host/shared.py": "x = 1\n",
                      "orch/cli.py": "from . import tasks\n", "orch/stats.py": "x = 1\n"}.items():
        (tmp_path / rel).write_text(text)
    assert controller_layer_violations(import_graph(pkg), tasks="orch.tasks", ui="orch.ui",
                                       report="orch.report") == []

def test_the_generic_tuner_imports_no_provider():
    graph = import_graph(REMOTE)
    tuner = [m for m in graph if m.startswith("remote.tuning.tuner.")]
    assert "remote.tuning.tuner.driver" in tuner
    bad = [f"{m} imports {t}" for m in tuner for t in sorted(graph[m]) if t.startswith("remote.tuning.providers.")]
    assert not bad, "provider-specific code belongs in remote/tuning/providers/:\n" + "\n".join(bad)
    # the compile job of each provider is its own, and it names one
    from remote.tuning.providers import builtin
    from remote.engines.sglang import provider as sglang
    assert builtin.BuiltinProvider.compile_target == "remote.tuning.providers.builtin:compile_one"
    assert sglang.SglangProvider.compile_target == "remote.engines.sglang.provider:compile_one"


def _defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def bench_imports() -> list[tuple[str, int, str, tuple[str, ...]]]:
    """``(file, line, module, names)`` of each import of the payload in ``bench/*.py``; ``from
    remote.x import submodule`` counts as importing ``remote.x.submodule``."""
    mods = modules_of(REMOTE)
    out = []
    for path in sorted(BENCH.glob("*.py")):
        for target, names, line in imported_names(path, f"bench.{path.stem}"):
            if target != "remote" and not target.startswith("remote."):
                continue
            subs = [n for n in names if f"{target}.{n}" in mods]
            out += [(path.name, line, f"{target}.{n}", ()) for n in subs]
            if not subs or len(subs) < len(names):
                out.append((path.name, line, target, tuple(n for n in names if n not in subs)))
    return out


def test_bench_imports_only_the_listed_payload_modules():
    mods = modules_of(REMOTE)
    found = bench_imports()
    assert {m for _, _, m, _ in found} >= {"remote.tuning.kernel.fused_moe", "remote.tuning.tuner.search"}
    bad = []
    for file, line, module, names in found:
        where = f"bench/{file}:{line}: {module}"
        if module not in BENCH_MAY_IMPORT:
            bad.append(f"{where} is not in BENCH_MAY_IMPORT")
            continue
        defined = _defined_names(mods[module])
        bad += [f"{where}: {n} is private" for n in names if n.startswith("_")]
        bad += [f"{where}: {n} is not defined there" for n in names if n not in defined]
    assert not bad, "\n".join(bad)
    assert set(BENCH_MAY_IMPORT) <= set(mods), "a listed module does not exist"


# ----------------------------------------------------------------------------- the scanner itself

def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / next(iter(files)).split("/")[0]


def test_import_cycles_finds_function_level_and_relative_cycles(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .sub import b\n",                        # a -> pkg.sub.b
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..c import x\n",        # b -> pkg.c (inside a function)
        "pkg/c.py": "import pkg.a\nx = 1\n",                       # c -> a: a -> b -> c -> a
        "pkg/d.py": "from . import e\n",                           # d <-> e through the package
        "pkg/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg/f.py": "from .a import nothing_here\nfrom . import c\n",  # only outgoing edges
    })
    assert import_cycles(pkg) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"], ["pkg.d", "pkg.e", "pkg.d"]]
    (pkg / "c.py").write_text("x = 1\n")
    (pkg / "e.py").write_text("import os\n")
    assert import_cycles(pkg) == []


def test_import_graph_resolves_relative_imports_in_packages_and_modules(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from .x import y\n",                 # the package itself: level 1 = pkg
        "pkg/x/__init__.py": "from .. import z\nfrom ..w import v\n",  # package pkg.x: level 2 = pkg
        "pkg/x/y.py": "from . import q\n",                       # module: level 1 = its package pkg.x
        "pkg/z.py": "",
        "pkg/w.py": "",
    })
    g = import_graph(pkg)
    assert g["pkg"] == {"pkg.x.y"} and g["pkg.x"] == {"pkg.z", "pkg.w"} and g["pkg.x.y"] == {"pkg.x"}


@pytest.mark.parametrize("rel", ["remote/host/fs.py", "remote/host/__init__.py"])
def test_module_name(rel):
    assert module_name(REPO / rel, REMOTE) == ("remote.host.fs" if rel.endswith("fs.py") else "remote.host")


# ----------------------------------------------------------------------------- the bundle

def test_bundle_carries_every_payload_module_and_runs_alone(tmp_path):
    """The tarball pushed to hosts holds every module of ``remote/`` (subpackages included), and
    the stdlib commands run from an unpacked copy with nothing else on the path (``python -S``:
    no site-packages, so neither this checkout nor torch can be reached)."""
    import io
    import json
    import tarfile

    from orchestrator.payload.bundle import build_bundle
    from remote import PAYLOAD_VERSION

    b = build_bundle(REMOTE)
    with tarfile.open(fileobj=io.BytesIO(b.data), mode="r:gz") as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "payload", filter="data")
    want = {str(p.relative_to(REPO)) for p in REMOTE.rglob("*.py") if "__pycache__" not in p.parts}
    assert want <= names and {"remote/engines/sglang/lookup.py", "remote/host/changes.py", "remote/bench/common.py",
                              "remote/tuning/support.py", "remote/tuning/kernel/fused_moe.py"} <= names
    assert b.version == PAYLOAD_VERSION

    def run(*argv):
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path / "payload")}
        r = run_watched([sys.executable, "-S", "-m", "remote", *argv], cwd=tmp_path, env=env)
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        assert r.returncode == 0 and lines[-1]["type"] == "result", r.stdout + r.stderr
        return lines[-1]["data"]

    assert run("version") == {"payload_version": PAYLOAD_VERSION, "proto": 1}
    model = REPO / "tests" / "data" / "models" / "Qwen3-30B-A3B.json"
    names_data = run("names", "--model-config", str(model), "--device-name", "NVIDIA H200")
    assert names_data["file_names"]["up"] == "E=128,N=768,device_name=NVIDIA_H200.json"
    probe = run("probe", "--model-config", str(model), "--device-name", "NVIDIA H200")
    assert probe["torch_version"] is None and probe["file_names"] == names_data["file_names"]
    assert probe["tuner_provider"]["auto"] == "builtin"
    lock = run("lock", "status", "--state-dir", str(tmp_path / "state"))
    assert lock["held"] is False and lock["lock"] is None


def test_no_import_cycle_in_the_controller():
    """Issue 10: no cycle in orchestrator/ either (function-level imports count)."""
    cycles = import_cycles(ORCH)
    assert cycles == [], "import cycles in orchestrator/:\n" + "\n".join(" -> ".join(c) for c in cycles)


#: NVIDIA's names in code: its tool, its device files, its kernel log errors, the processes that hold
#: its device files, its visible-devices variable and its partitions. Outside ``remote/gpus/`` a GPU
#: vendor's knowledge is reached through :class:`remote.gpus.GpuVendor` (``ctx.facts.vendor``).
VENDOR_NAMES = ("nvidia-smi", "/dev/nvidia", "Xid", "nvidia-persistenced", "nv-hostengine", "CUDA_VISIBLE_DEVICES",
                "MIG-")
#: where a vendor's name may stay in code outside ``remote/gpus/``, and why
VENDOR_NAME_ALLOWED = {
    ("remote/tuning/tuner/aot.py", "CUDA_VISIBLE_DEVICES"):
        "the tuner's compile workers hide every GPU from torch (CUDA's variable; ROCm's HIP honours it too)",
}


def _code_strings(path: Path):
    """``(line, text)`` of every string constant of a module that is not a docstring (prose may
    name a vendor's tools; code may not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def vendor_name_uses(roots=(ORCH, REMOTE)) -> list[tuple[str, int, str]]:
    """``(file, line, name)`` of each of :data:`VENDOR_NAMES` in a string of code outside
    ``remote/gpus/`` (docstrings left out)."""
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith("remote/gpus/"):
                continue
            for line, text in _code_strings(path):
                out += [(rel, line, n) for n in VENDOR_NAMES if n in text]
    return out


def test_nvidia_names_live_in_the_gpu_vendor_module():
    uses = vendor_name_uses()
    bad = [f"{f}:{line}: {n!r}" for f, line, n in uses if (f, n) not in VENDOR_NAME_ALLOWED]
    assert not bad, ("NVIDIA's names belong in remote/gpus/nvidia.py; reach them through remote.gpus.GpuVendor "
                     "(ctx.facts.vendor):\n" + "\n".join(bad))
    stale = sorted(set(VENDOR_NAME_ALLOWED) - {(f, n) for f, _, n in uses})
    assert not stale, f"allowed uses that are gone (drop them from VENDOR_NAME_ALLOWED): {stale}"
    # the scan finds what it looks for: NVIDIA's own module is full of them
    nvidia = {n for _, text in _code_strings(REMOTE / "gpus" / "nvidia.py") for n in VENDOR_NAMES if n in text}
    assert {"nvidia-smi", "/dev/nvidia", "Xid"} <= nvidia, nvidia


def test_vendor_name_scan_skips_docstrings_and_finds_code(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""nvidia-smi in the module docstring"""\n\ndef g():\n    """/dev/nvidia0 in prose"""\n'
                 '    return ["nvidia-smi", "-L"]\n')
    assert list(_code_strings(f)) == [(5, "nvidia-smi"), (5, "-L")]


#: Modules of the controller whose ``run(..., check=False)`` calls are all of one kind, and why; every
#: other ``check=False`` outside ``orchestrator/facts/`` (the fact helpers: a read's failure is an
#: answer they turn into a value) carries its reason in a comment on its line or the two above.
CHECK_FALSE_MODULES = {
    "orchestrator/payload/client.py": "the payload's own processes: a command's exit is its answer, read "
                                      "from its JSON lines; cleanup (pkill, reset-failed) is best effort",
    "orchestrator/payload/deploy.py": "staging the payload's folder: each step's result is checked by the next "
                                      "(test -f, tree_mismatch); cleanup is best effort",
    "orchestrator/payload/transient.py": "orch's own transient unit: its state is read, stop and reset-failed "
                                         "of a unit that may have ended are best effort",
    "orchestrator/connection/base.py": "removing the login user's staging folder is best effort",
    "orchestrator/connection/ssh.py": "a checksum the copy's check reads: its failure is a failed copy",
}


def check_false_sites(root: Path = ORCH, base: Path = REPO) -> list[tuple[str, int, bool]]:
    """``(file, line, has_reason)`` of every call with ``check=False`` under ``root`` (``file``
    relative to ``base``): ``has_reason`` when a comment is on one of the call's lines or the two
    lines above it."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Call) and any(k.arg == "check" and isinstance(k.value, ast.Constant)
                                                  and k.value.value is False for k in node.keywords):
                near = lines[max(0, node.lineno - 3):node.end_lineno]
                out.append((path.relative_to(base).as_posix(), node.lineno, any("#" in x for x in near)))
    return out


def test_a_plain_run_raises_and_check_false_is_an_exception_with_a_reason():
    sites = check_false_sites()
    bad = [f"{f}:{line}" for f, line, why in sites
           if not f.startswith("orchestrator/facts/") and f not in CHECK_FALSE_MODULES and not why]
    assert not bad, ("a failed command raises (check=True); a read whose failure is an answer belongs in a "
                     "fact helper (orchestrator/facts/), else say why in a comment:\n" + "\n".join(bad))
    assert all(any(f == m for f, _, _ in sites) for m in CHECK_FALSE_MODULES), "an allowed module has none left"
    helpers = [s for s in sites if s[0].startswith("orchestrator/facts/")]
    assert len(helpers) >= 5 and len(sites) - len(helpers) < 45, (len(helpers), len(sites))


def test_check_false_scan_sees_comments_above_and_on_the_line(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f(c):\n    c.run(['y'],\n          check=False)\n    c.run(['z'])\n"
                              "    # the exit is the answer\n    c.run(['x'], check=False)\n")
    assert check_false_sites(pkg, tmp_path) == [("p/m.py", 2, False), ("p/m.py", 6, True)]
