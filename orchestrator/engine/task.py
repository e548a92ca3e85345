"""Task modules, declared once: ``@task`` registers a function with its contract.

A task module is a function ``fn(ctx, **args) -> TaskResult`` (see
:mod:`orchestrator.engine.results`). Its declaration says, in one place, what Ansible spreads
over ``argument_spec``, ``supports_check_mode`` and ``RETURN``::

    @task("service", aliases={"unit": "name", "service": "name"})
    def service(ctx, name: str, state: Literal["stopped", "started", "restarted"], timeout: float,
                only_if_stopped_by_orch: bool = False) -> TaskResult: ...

- **name**: the playbook key (``service: {...}``).
- **arguments**: the function's keyword parameters after ``ctx``, with their annotations as
  types (``str``, ``int``, ``float``, ``bool``, ``list[int]``, ``list[str]``, ``dict``,
  ``Literal[...]``, ``X | None``, ``Any``); a parameter without a default is required.
  ``aliases`` maps other accepted spellings to a parameter.
- **check_mode**: :data:`SKIP` (it changes the host; under ``--check`` it is reported
  skipped, "check mode: would run"), :data:`READ_ONLY` (it changes nothing and runs as usual)
  or :data:`AWARE` (it runs under ``--check`` and changes nothing there itself, reading
  ``ctx.check``).
- **rerun**: the task may run again after a lost link (:class:`~orchestrator.connection.LinkLost`):
  it is idempotent, or reattaches to what its first run started (the tune in its transient unit).
  The engine then logs in again with a bounded backoff for at most ``orch_reconnect_timeout``
  seconds and runs it again (``ctx.attempt`` counts the runs); a task without it fails the host
  unreachable at once, as before (docs/reliability.md, "Lost link").
- **sets**: the facts (host variables) it returns in ``TaskResult.facts``; the engine merges
  them into the host's variables and refuses undeclared ones, and ones of another type than
  :class:`orchestrator.facts.catalog.HostFacts` declares (where later tasks read them, typed, as
  ``ctx.facts``). ``fnmatch`` patterns allowed (``orch_bench_*``).

Playbooks are checked against these declarations when they are loaded
(:func:`orchestrator.engine.playbook.load_playbook`), before any host is contacted;
argument values that are templates are checked again after rendering (:meth:`TaskSpec.coerce`).
:func:`reference_markdown` renders the README's task reference from the same declarations.
"""

from __future__ import annotations

import fnmatch
import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from ..errors import internal_error

SKIP, READ_ONLY, AWARE = "skip", "read_only", "aware"
CHECK_MODES = (SKIP, READ_ONLY, AWARE)
_CHECK_TEXT = {SKIP: "skipped (would run)", READ_ONLY: "runs (read-only)", AWARE: "runs, changes nothing"}

_MISSING = inspect.Parameter.empty


@internal_error("load_playbook turns it into a PlaybookError naming the file and the task; the Engine, "
                "for a value known only once rendered, into the task's failure")
class TaskArgError(ValueError):
    """An argument that does not fit a task's declaration; the message names the argument and
    what the task accepts (the caller adds the playbook and task)."""


@dataclass(frozen=True)
class Param:
    """One declared argument: ``name``, ``type`` (an annotation), ``default`` (``required`` when
    there is none) and the ``aliases`` that spell it too."""

    name: str
    type: Any
    default: Any = _MISSING
    aliases: tuple[str, ...] = ()

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def type_text(self) -> str:
        return type_text(self.type)


@dataclass(frozen=True)
class TaskSpec:
    """The declaration of one task module (see the module docstring)."""

    name: str
    fn: Callable[..., Any]
    params: dict[str, Param]
    check_mode: str = SKIP
    sets: tuple[str, ...] = ()
    summary: str = ""
    module: str = ""
    aliases: dict[str, str] = field(default_factory=dict)
    rerun: bool = False

    def accepted(self) -> str:
        """``a, b (alias c), d?`` — the accepted arguments as one line (``?`` marks optional)."""
        out = []
        for p in self.params.values():
            al = f" (alias {', '.join(p.aliases)})" if p.aliases else ""
            out.append(f"{p.name}{'' if p.required else '?'}{al}")
        return ", ".join(out) or "no arguments"

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        """Map ``args`` (as written in a playbook) to parameter names: aliases resolved, unknown
        and missing required arguments refused, values that are not templates type-checked.
        Raises :class:`TaskArgError`."""
        from ..templating import is_template

        if not isinstance(args, dict):
            raise TaskArgError(f"arguments must be a mapping, got {type(args).__name__}")
        out: dict[str, Any] = {}
        for key, value in args.items():
            name = key if key in self.params else self.aliases.get(str(key))
            if name is None:
                raise TaskArgError(f"unknown argument {key!r}{_did_you_mean(key, self._spellings())}; "
                                   f"{self.name} accepts: {self.accepted()}")
            if name in out:
                raise TaskArgError(f"argument {name!r} given twice (as {key!r} and another alias)")
            if not is_template(value):
                value = check_value(value, self.params[name].type, name)
            out[name] = value
        missing = [p.name for p in self.params.values() if p.required and p.name not in out]
        if missing:
            raise TaskArgError(f"missing required argument{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(map(repr, missing))}; {self.name} accepts: {self.accepted()}")
        return out

    def coerce(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """Type-check (and convert, e.g. ``"300"`` to 300.0 for a float) rendered arguments.
        Raises :class:`TaskArgError` naming the argument."""
        return {k: check_value(v, self.params[k].type, k) for k, v in rendered.items()}

    def allows_fact(self, name: str) -> bool:
        """True when ``name`` is one of the facts this task declares (``sets``)."""
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.sets)

    def _spellings(self) -> list[str]:
        return list(self.params) + list(self.aliases)


#: name -> TaskSpec of every task declared with :func:`task` (the bundled ones register when
#: :mod:`orchestrator.tasks` is imported)
REGISTRY: dict[str, TaskSpec] = {}


def task(name: str, *, check_mode: str = SKIP, sets: tuple[str, ...] = (), aliases: dict[str, str] | None = None,
         rerun: bool = False, registry: dict[str, TaskSpec] | None = None) -> Callable[[Callable], Callable]:
    """Declare a task module (see the module docstring). ``registry`` (default :data:`REGISTRY`)
    receives the :class:`TaskSpec`, which is also set as ``fn.spec``. Raises ``ValueError`` for
    a declaration that contradicts its function (an alias of no parameter, a name taken)."""
    if check_mode not in CHECK_MODES:
        raise ValueError(f"task {name}: check_mode must be one of {CHECK_MODES}, got {check_mode!r}")
    target = REGISTRY if registry is None else registry

    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        params: dict[str, Param] = {}
        al = dict(aliases or {})
        for i, (pname, p) in enumerate(sig.parameters.items()):
            if i == 0:
                continue  # ctx
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise ValueError(f"task {name}: parameter {pname} must be a plain keyword parameter")
            params[pname] = Param(pname, hints.get(pname, Any), p.default,
                                  tuple(a for a, target_name in al.items() if target_name == pname))
        for a, target_name in al.items():
            if target_name not in params:
                raise ValueError(f"task {name}: alias {a!r} names no parameter {target_name!r}")
        if name in target and target[name].fn is not fn:
            raise ValueError(f"task {name!r} is declared twice ({target[name].module} and {fn.__module__})")
        doc = inspect.getdoc(fn) or ""
        spec = TaskSpec(name=name, fn=fn, params=params, check_mode=check_mode, sets=tuple(sets),
                        summary=doc.split("\n\n")[0].replace("\n", " "), module=fn.__module__, aliases=al,
                        rerun=bool(rerun))
        target[name] = spec
        fn.spec = spec
        return fn

    return deco


# ----------------------------------------------------------------------------- types

def type_text(tp: Any) -> str:
    """An annotation as the reference table shows it (``list[int]``, ``stopped|started``, ``float?``)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return "any"
    if origin is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(type_text(a) for a in inner) + (" or null" if len(inner) < len(typing.get_args(tp)) else "")
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return f"list[{type_text(args[0])}]" if args else "list"
    if origin is dict or tp is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def check_value(value: Any, tp: Any, name: str) -> Any:
    """``value`` checked against annotation ``tp`` (and converted where Ansible converts: numeric
    strings to numbers, ``"yes"``/``"no"`` to booleans, numbers and lists to text for a string).
    Raises :class:`TaskArgError`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return check_value(value, opt, name)
            except TaskArgError as exc:
                errors.append(str(exc))
        raise TaskArgError(errors[0] if len(errors) == 1 else
                           f"argument {name!r} must be {type_text(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise TaskArgError(f"argument {name!r} must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TaskArgError(f"argument {name!r} must be a list, got {value!r}")
        args = typing.get_args(tp)
        return [check_value(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise TaskArgError(f"argument {name!r} must be a mapping, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise TaskArgError(f"argument {name!r} must be true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise TaskArgError(f"argument {name!r} must be a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise TaskArgError(f"argument {name!r} must be a number, got {value!r}") from None
        if not isinstance(value, (int, float)):
            raise TaskArgError(f"argument {name!r} must be a number, got {value!r}")
        if tp is int:
            if float(value) != int(value):
                raise TaskArgError(f"argument {name!r} must be a whole number, got {value!r}")
            return int(value)
        return float(value)
    if tp is str:
        # as Ansible's type='str': numbers and the lists a native template renders become their text
        if value is None or isinstance(value, bool) or not isinstance(value, (str, int, float, list, tuple, dict)):
            raise TaskArgError(f"argument {name!r} must be a string, got {value!r}")
        return value if isinstance(value, str) else str(value)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise TaskArgError(f"argument {name!r} must be {type_text(tp)}, got {value!r}")
    return value


def _did_you_mean(word: str, words: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(str(word), words, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ------------------------------------------------------------------------- reference

def reference_markdown(registry: dict[str, TaskSpec]) -> str:
    """The task reference as Markdown, one row per task in name order: task, arguments
    (type; default or ``required``; aliases), check mode, facts set, and what it does.
    The "Task reference" section of docs/playbooks.md is this text (tests/test_readme.py checks it)."""
    rows = ["| task | arguments | under `--check` | sets | what it does |", "|---|---|---|---|---|"]
    for name in sorted(registry):
        spec = registry[name]
        args = []
        for p in spec.params.values():
            dflt = "required" if p.required else f"default `{p.default!r}`"
            al = f", alias {', '.join(f'`{a}`' for a in p.aliases)}" if p.aliases else ""
            args.append(f"`{p.name}` ({p.type_text()}; {dflt}{al})")
        cells = [f"`{name}`", "<br>".join(args) or "-", _CHECK_TEXT[spec.check_mode],
                 ", ".join(f"`{s}`" for s in spec.sets) or "-", spec.summary]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
