"""Jinja2 templating of task arguments and ``when`` conditions.

Uses Jinja2's native environment, so ``"{{ orch_tune_batch_sizes }}"`` renders to a
list, not its text. Undefined variables are errors (``StrictUndefined``), named in
:class:`TemplateError`.
"""

from __future__ import annotations

from typing import Any

import jinja2
from jinja2.nativetypes import NativeEnvironment

_env = NativeEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


class TemplateError(Exception):
    """A template or condition could not be rendered; the message names the expression."""


def render(value: Any, variables: dict[str, Any]) -> Any:
    """Render every string inside ``value`` (dicts and lists walked recursively)."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        try:
            out = _env.from_string(value).render(**variables)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {value!r}: {exc}") from None
        if isinstance(out, jinja2.Undefined):
            # a single-expression template returns Undefined instead of raising in the native env
            try:
                str(out)
            except jinja2.UndefinedError as exc:
                raise TemplateError(f"template {value!r}: {exc}") from None
        return out
    if isinstance(value, dict):
        return {k: render(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, variables) for v in value]
    return value


def evaluate(expression: str | bool | None, variables: dict[str, Any]) -> bool:
    """Evaluate a ``when`` condition (a bare Jinja2 expression); ``None`` is true."""
    if expression is None:
        return True
    if isinstance(expression, bool):
        return expression
    try:
        return bool(_env.compile_expression(str(expression), undefined_to_none=False)(**variables))
    except jinja2.TemplateError as exc:
        raise TemplateError(f"condition {expression!r}: {exc}") from None
