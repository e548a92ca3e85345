"""Playbooks: YAML files of plays, each an ordered list of named tasks and blocks.

Format (a small subset of Ansible's)::

    - name: Retune fused-MoE kernels
      hosts: all
      serial: 1              # number, "25%", or a list; --serial overrides
      vars: {...}
      tasks:
        - name: Stop the unit
          service: {name: "{{ service }}", state: stopped}   # task name as the key, its args
          when: "not check_mode"        # Jinja2 expression
          register: stop                # later: "stop is changed", "stop.msg"
          timeout: 600                  # seconds for the whole task (its commands and waits)
          check_mode: false             # Ansible's meaning: run for real even under --check
        - block: [...]                   # tasks; on failure run rescue, then always
          rescue: [...]
          always: [...]

Every argument value is a Jinja2 template rendered against the host's variables
(inventory vars < play vars < facts and results registered by earlier tasks).

The file is checked when it is loaded, before any host is contacted, against the tasks'
declarations (:mod:`orchestrator.engine.task`): an unknown task, an unknown or missing
argument, a value of the wrong type, an unknown key, or a ``when``/template that does not parse
is one :class:`PlaybookError` naming the file, the task and what is accepted.

Task keywords, with Ansible's meanings: ``name``, ``when``, ``register`` (the result's data,
``status``, ``msg`` and ``changed``/``failed``/``skipped``/``unreachable``), ``ignore_errors``,
``check_mode`` (``true``: run this task in check mode even on a real run; ``false``: run it for
real even under ``--check``), ``timeout`` (seconds: the task fails when it has not ended by
then; every command it runs and every wait is cut to that).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from ..errors import OrchError
from ..templating import check_syntax, is_template
from .batching import SerialError, check_max_fail_percentage, check_order, parse_serial
from .task import TaskArgError, TaskSpec

TASK_KEYS = {"name", "when", "register", "ignore_errors", "check_mode", "timeout"}
BLOCK_KEYS = {"name", "block", "rescue", "always", "when"}
PLAY_KEYS = {"name", "hosts", "serial", "vars", "tasks", "max_fail_percentage", "any_errors_fatal", "order"}
_REGISTER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PlaybookError(OrchError):
    """A playbook that cannot be loaded; the message names the file and the task."""


@dataclass
class Task:
    """One task call: the task ``module`` (its playbook key), ``args`` bound to its parameter
    names (values templated later), and the task keywords."""

    name: str
    module: str
    args: dict[str, Any]
    when: str | None = None
    register: str | None = None
    ignore_errors: bool = False
    #: Ansible's ``check_mode``: True forces check mode for this task, False runs it for real
    #: even under --check, None follows --check
    check_mode: bool | None = None
    #: seconds the whole task may take (None: no limit of its own)
    timeout: float | None = None


@dataclass
class Block:
    """Tasks with ``rescue`` (run when one fails) and ``always`` (run in any case)."""

    name: str
    block: list["Step"]
    rescue: list["Step"] = field(default_factory=list)
    always: list["Step"] = field(default_factory=list)
    when: str | None = None


Step = Union[Task, Block]


@dataclass
class Play:
    """A play: which ``hosts`` (pattern), batching, play ``vars`` and its steps."""

    name: str
    hosts: str
    steps: list[Step]
    vars: dict[str, Any] = field(default_factory=dict)
    serial: Any = None
    max_fail_percentage: float | None = None
    any_errors_fatal: bool = False
    order: str = "inventory"


def _check_expr(text: Any, loc: str, what: str) -> None:
    """Refuse a ``when`` or template that does not parse (at load, not when the host reaches it)."""
    texts = [text] if isinstance(text, str) else (
        list(text.values()) if isinstance(text, dict) else list(text) if isinstance(text, list) else [])
    for t in texts:
        if isinstance(t, (dict, list)):
            _check_expr(t, loc, what)
        elif isinstance(t, str) and (what == "when" or is_template(t)):
            err = check_syntax(t)
            if err:
                raise PlaybookError(f"{loc}: {what} {t!r} does not parse: {err}")


def _task_keywords(item: dict, loc: str) -> dict[str, Any]:
    """The task keywords of ``item``, type-checked."""
    out: dict[str, Any] = {"when": item.get("when"), "register": item.get("register"),
                           "ignore_errors": item.get("ignore_errors", False),
                           "check_mode": item.get("check_mode"), "timeout": item.get("timeout")}
    if out["when"] is not None:
        if not isinstance(out["when"], (str, bool)):
            raise PlaybookError(f"{loc}: when must be an expression (a string) or a boolean")
        _check_expr(out["when"], loc, "when")
    if out["register"] is not None and not (isinstance(out["register"], str)
                                            and _REGISTER_NAME.match(out["register"])):
        raise PlaybookError(f"{loc}: register must be a variable name, got {out['register']!r}")
    for key in ("ignore_errors", "check_mode"):
        if out[key] is not None and not isinstance(out[key], bool):
            raise PlaybookError(f"{loc}: {key} must be true or false, got {out[key]!r}")
    t = out["timeout"]
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise PlaybookError(f"{loc}: timeout must be a positive number of seconds, got {t!r}")
        out["timeout"] = float(t)
    return out


def _steps(items: Any, where: str, tasks: dict[str, TaskSpec], renamed: dict[str, str]) -> list[Step]:
    if not isinstance(items, list):
        raise PlaybookError(f"{where}: expected a list of tasks")
    out: list[Step] = []
    for i, item in enumerate(items):
        loc = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise PlaybookError(f"{loc}: a task must be a mapping")
        name = str(item.get("name") or "")
        if "block" in item:
            extra = set(item) - BLOCK_KEYS
            if extra:
                raise PlaybookError(f"{loc} ({name or 'block'}): unknown keys {sorted(extra)}; a block accepts "
                                    f"{sorted(BLOCK_KEYS)}")
            if item.get("when") is not None:
                _check_expr(item["when"], f"{loc} ({name or 'block'})", "when")
            out.append(Block(
                name=name or "block",
                block=_steps(item["block"], f"{loc}.block", tasks, renamed),
                rescue=_steps(item.get("rescue") or [], f"{loc}.rescue", tasks, renamed),
                always=_steps(item.get("always") or [], f"{loc}.always", tasks, renamed),
                when=item.get("when"),
            ))
            continue
        modules = [k for k in item if k not in TASK_KEYS]
        if len(modules) != 1:
            raise PlaybookError(f"{loc} ({name or 'unnamed'}): expected exactly one task key besides the keywords "
                                f"{sorted(TASK_KEYS)}, got {modules}")
        module = modules[0]
        loc_named = f"{loc} ({name or module})"
        if module not in tasks:
            if module in renamed:
                hint = f"; it is called {renamed[module]!r} now" if renamed[module] else f"; {module} was removed"
            else:
                close = difflib.get_close_matches(module, sorted(tasks), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PlaybookError(f"{loc_named}: unknown task {module!r}{hint}")
        spec = tasks[module]
        try:
            args = spec.bind(item[module] or {})
        except TaskArgError as exc:
            raise PlaybookError(f"{loc_named}: {module}: {exc}") from None
        _check_expr(args, loc_named, "template")
        kw = _task_keywords(item, loc_named)
        out.append(Task(name=name or module, module=module, args=args, **kw))
    return out


def load_playbook(path: str | Path, tasks: dict[str, TaskSpec], renamed: dict[str, str] | None = None) -> list[Play]:
    """Load a playbook file and check it against ``tasks`` (name -> :class:`TaskSpec`); return
    its plays. ``renamed`` maps old task names to their new name (or "" when removed), for the
    error a copied older playbook gets.

    Raises :class:`PlaybookError`: file:line for YAML errors; the file, the task's path and name
    and what is accepted for an unknown task, argument or keyword, a missing argument, a value of
    the wrong type, or a ``when``/template that does not parse.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlaybookError(f"{path}: cannot read playbook: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise PlaybookError(f"{path}{line}: YAML error: {exc.problem}") from None
    if not isinstance(data, list) or not data:
        raise PlaybookError(f"{path}: a playbook is a non-empty list of plays")
    plays = []
    for i, p in enumerate(data):
        where = f"{path}: play {i + 1}"
        if not isinstance(p, dict):
            raise PlaybookError(f"{where}: a play must be a mapping")
        extra = set(p) - PLAY_KEYS
        if extra:
            raise PlaybookError(f"{where}: unknown keys {sorted(extra)}; a play accepts {sorted(PLAY_KEYS)}")
        try:  # the batching keywords, before any host is contacted (Ansible's values, as in a play)
            parse_serial(p.get("serial"))
            check_max_fail_percentage(p.get("max_fail_percentage"))
            check_order(p.get("order") or "inventory")
        except SerialError as exc:
            raise PlaybookError(f"{where}: {exc}") from None
        plays.append(Play(
            name=str(p.get("name") or f"play {i + 1}"),
            hosts=str(p.get("hosts") or "all"),
            steps=_steps(p.get("tasks") or [], f"{where} tasks", tasks, dict(renamed or {})),
            vars=dict(p.get("vars") or {}),
            serial=p.get("serial"),
            max_fail_percentage=p.get("max_fail_percentage"),
            any_errors_fatal=bool(p.get("any_errors_fatal", False)),
            order=str(p.get("order") or "inventory"),
        ))
    return plays


def builtin_playbook(name: str) -> Path:
    """Path of a playbook bundled with orch (``playbooks/<name>.yaml``).

    Looks beside the package (source checkout) and in the installed data folder.
    Raises :class:`PlaybookError` when it is absent.
    """
    here = Path(__file__).resolve().parent
    for cand in (here.parent.parent / "playbooks" / f"{name}.yaml", here.parent / "playbooks" / f"{name}.yaml"):
        if cand.exists():
            return cand
    raise PlaybookError(f"bundled playbook {name}.yaml not found")
