"""Playbooks: YAML files of plays, each an ordered list of named tasks and blocks.

Format (a small subset of Ansible's)::

    - name: Retune fused-MoE kernels
      hosts: all
      serial: 1              # number, "25%", or a list; --serial overrides
      vars: {...}
      tasks:
        - name: Stop the unit
          service: {state: stopped}     # module name as the key, its args as the value
          when: "not check_mode"        # Jinja2 expression
          register: stop
        - block: [...]                   # tasks; on failure run rescue, then always
          rescue: [...]
          always: [...]

Every argument value is a Jinja2 template rendered against the host's variables
(inventory vars < play vars < facts registered by earlier tasks). Errors raise
:class:`PlaybookError` naming the file and the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

TASK_KEYS = {"name", "when", "register", "ignore_errors", "check_mode", "timeout"}
BLOCK_KEYS = {"name", "block", "rescue", "always", "when"}
PLAY_KEYS = {"name", "hosts", "serial", "vars", "tasks", "max_fail_percentage", "any_errors_fatal", "order"}


class PlaybookError(Exception):
    """A playbook that cannot be loaded; the message names the file and the task."""


@dataclass
class Task:
    """One module call: ``module`` name, raw ``args`` (templated later), options."""

    name: str
    module: str
    args: dict[str, Any]
    when: str | None = None
    register: str | None = None
    ignore_errors: bool = False
    #: run this task in check mode too (read-only tasks); others are skipped there
    check_mode: bool | None = None


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


def _steps(items: Any, where: str, known_modules: set[str]) -> list[Step]:
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
                raise PlaybookError(f"{loc} ({name or 'block'}): unknown keys {sorted(extra)}")
            out.append(Block(
                name=name or "block",
                block=_steps(item["block"], f"{loc}.block", known_modules),
                rescue=_steps(item.get("rescue") or [], f"{loc}.rescue", known_modules),
                always=_steps(item.get("always") or [], f"{loc}.always", known_modules),
                when=item.get("when"),
            ))
            continue
        modules = [k for k in item if k not in TASK_KEYS]
        if len(modules) != 1:
            raise PlaybookError(f"{loc} ({name or 'unnamed'}): expected exactly one module key, got {modules}")
        module = modules[0]
        if module not in known_modules:
            import difflib

            hint = difflib.get_close_matches(module, sorted(known_modules), n=1)
            raise PlaybookError(f"{loc} ({name or module}): unknown module {module!r}"
                                + (f"; did you mean {hint[0]!r}?" if hint else ""))
        args = item[module] or {}
        if not isinstance(args, dict):
            raise PlaybookError(f"{loc} ({name or module}): arguments of {module} must be a mapping")
        out.append(Task(name=name or module, module=module, args=args, when=item.get("when"),
                        register=item.get("register"), ignore_errors=bool(item.get("ignore_errors", False)),
                        check_mode=item.get("check_mode")))
    return out


def load_playbook(path: str | Path, known_modules: set[str] | None = None) -> list[Play]:
    """Load and validate a playbook file; return its plays.

    Raises :class:`PlaybookError` (file:line for YAML errors; file and task path for
    structural errors such as an unknown module or key).
    """
    if known_modules is None:
        from ..tasks import MODULES

        known_modules = set(MODULES)
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
            raise PlaybookError(f"{where}: unknown keys {sorted(extra)}")
        plays.append(Play(
            name=str(p.get("name") or f"play {i + 1}"),
            hosts=str(p.get("hosts") or "all"),
            steps=_steps(p.get("tasks") or [], f"{where} tasks", known_modules),
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
