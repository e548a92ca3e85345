"""Jinja2 templating, set up once for the inventory's variables and the playbooks.

One environment serves both (:data:`ENV`): sandboxed (no attribute tricks reach Python
internals), native (``"{{ orch_tune_batch_sizes }}"`` renders to a list, not its text) and
strict (an undefined variable is an error naming it, :class:`TemplateError`).

The tests Ansible users write on registered results work as in Ansible
(``lib/ansible/plugins/test/core.py``): ``x is changed``, ``x is failed``, ``x is skipped``,
``x is success`` / ``x is succeeded``, ``x is unreachable`` / ``x is reachable``. They read the
``changed``/``failed``/``skipped``/``unreachable`` booleans the engine registers with every
result (:mod:`orchestrator.engine.runner`).
"""

from __future__ import annotations

from typing import Any, Mapping

import jinja2
import jinja2.meta
import jinja2.sandbox
from jinja2.nativetypes import NativeEnvironment

from .errors import OrchError


class TemplateError(OrchError):
    """A template or condition could not be rendered; the message names the expression."""


class _SandboxedNativeEnvironment(jinja2.sandbox.SandboxedEnvironment, NativeEnvironment):
    """Sandboxed and native at once."""


def _result_flag(name: str):
    def test(value: Any) -> bool:
        if not isinstance(value, Mapping) or name not in value:
            raise jinja2.UndefinedError(f"the '{name}' test needs a registered task result, got {value!r}")
        return bool(value[name])
    test.__name__ = name
    return test


def _success(value: Any) -> bool:
    return not (_result_flag("failed")(value) or bool(value.get("unreachable")))


ENV = _SandboxedNativeEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
ENV.tests.update({
    "changed": _result_flag("changed"),
    "failed": _result_flag("failed"),
    "skipped": _result_flag("skipped"),
    "unreachable": _result_flag("unreachable"),
    "reachable": lambda v: not _result_flag("unreachable")(v),
    "success": _success,
    "succeeded": _success,
})


def is_template(value: Any) -> bool:
    """True when ``value`` holds a Jinja2 expression or statement (``{{`` or ``{%``) anywhere:
    a string, or strings inside lists, tuples and dicts."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, (list, tuple)):
        return any(is_template(v) for v in value)
    if isinstance(value, dict):
        return any(is_template(v) for v in value.values())
    return False


def referenced_names(text: str) -> set[str]:
    """Variable names a template reads (Jinja2's undeclared variables)."""
    return set(jinja2.meta.find_undeclared_variables(ENV.parse(text)))


def render_text(text: str, variables: Mapping[str, Any]) -> Any:
    """Render one template string to its native value; raises jinja2 errors as they are
    (callers name the place: a playbook task, an inventory assignment)."""
    out = ENV.from_string(text).render(**variables)
    if isinstance(out, jinja2.Undefined):
        # a single-expression template returns Undefined instead of raising in the native env
        str(out)
    return out


def render(value: Any, variables: Mapping[str, Any]) -> Any:
    """Render every string inside ``value`` (dicts and lists walked recursively).

    Raises :class:`TemplateError` naming the template."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        try:
            return render_text(value, variables)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {value!r}: {exc}") from None
    if isinstance(value, dict):
        return {k: render(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, variables) for v in value]
    return value


def evaluate(expression: str | bool | None, variables: Mapping[str, Any]) -> bool:
    """Evaluate a ``when`` condition (a bare Jinja2 expression); ``None`` is true.

    Raises :class:`TemplateError` naming the condition."""
    if expression is None:
        return True
    if isinstance(expression, bool):
        return expression
    try:
        return bool(ENV.compile_expression(str(expression), undefined_to_none=False)(**variables))
    except jinja2.TemplateError as exc:
        raise TemplateError(f"condition {expression!r}: {exc}") from None


def check_syntax(text: str) -> str | None:
    """The syntax error of a template or ``when`` expression, or None when it parses."""
    try:
        if "{{" in text or "{%" in text:
            ENV.parse(text)
        else:
            ENV.compile_expression(text)
    except jinja2.TemplateSyntaxError as exc:
        return str(exc)
    return None
