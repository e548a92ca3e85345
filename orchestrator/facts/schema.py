"""Typed records for what tasks pass each other: strict parsing of a host's JSON, lenient reading
of older run records, and the JSON form written to run records.

A record is a dataclass (subclass :class:`Record` for the ``parse``/``from_dict``/``to_dict``
methods; the functions below accept any dataclass, e.g. :class:`orchestrator.facts.unit.UnitFacts`).
Its field annotations drive the conversion: a nested dataclass, ``list[X]``, ``dict[str, X]``,
``X | None``, ``str``, ``int``, ``float`` (an int is accepted), ``bool``, ``dict``, ``list`` and
``Any``.

- :func:`parse` (strict, for a host's answer): every field must be present, except those declared
  with :func:`optional`; a key the record does not declare, or a value of another type, is a
  :class:`FactError` naming the path (``probe: missing field 'sglang.configs_root'``). The payload
  ships with the controller (same version), so a key one side has and the other lacks is a bug
  to report, never a value to guess.
- :func:`from_dict` (lenient, for run records written by earlier releases and for tests' partial
  facts): a missing field takes its default, else the empty value of its type (None, ``""``,
  0, False, ``[]``, ``{}``, an empty nested record); unknown keys are dropped; values are not
  type-checked.
- :func:`to_dict`: the JSON-ready form (nested records converted); a field declared
  :func:`optional` is left out while it is None, so a record keeps the keys it was read with.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from ..errors import OrchError

#: field metadata key: the field may be absent from a host's answer (its default applies)
OPTIONAL = "orch_optional"


class FactError(OrchError):
    """A host's answer does not fit its typed record; the message names the field (its path)."""


def optional(default: Any = None) -> Any:
    """A dataclass field that a host's answer may leave out (``default`` applies), and that
    :func:`to_dict` leaves out while it is None."""
    return dataclasses.field(default=default, metadata={OPTIONAL: True})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _inner(tp: Any) -> Any:
    """``X`` of ``X | None``; ``tp`` itself otherwise (a wider union stays as it is)."""
    if _is_optional(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
    return tp


def _type_name(tp: Any) -> str:
    """An annotation as an error message shows it (``list[str]``, ``Plan or null``)."""
    if _is_optional(tp):
        return f"{_type_name(_inner(tp))} or null"
    origin = typing.get_origin(tp)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _empty(tp: Any) -> Any:
    """The empty value of annotation ``tp`` (what :func:`from_dict` gives a missing field
    without a default): None for ``X | None`` and ``Any``, an empty nested record, ``[]``,
    ``{}``, ``""``, 0, 0.0 or False."""
    if tp is Any or _is_optional(tp):
        return None
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin):
        return from_dict(origin, {})
    return {list: list, dict: dict, str: str, int: int, float: float, bool: bool}.get(origin, lambda: None)()


# ----------------------------------------------------------------------------- strict

def parse(cls: type, data: Any, what: str) -> Any:
    """``data`` (decoded JSON) as a ``cls`` instance, checked strictly (see the module
    docstring). ``what`` names the answer in messages (``probe``). Raises :class:`FactError`."""
    return _check(cls, data, what, "")


def _check(tp: Any, value: Any, what: str, path: str) -> Any:
    where = f"'{path}'" if path else "the answer"

    def bad(expected: str) -> FactError:
        return FactError(f"{what}: {where} must be {expected}, got {type(value).__name__} {value!r:.80}")

    if tp is Any:
        return value
    if _is_optional(tp):
        return None if value is None else _check(_inner(tp), value, what, path)
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin):
        if not isinstance(value, dict):
            raise bad("an object")
        hints = _hints(origin)
        known = {f.name for f in _fields(origin)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise FactError(f"{what}: unknown field {_join(path, str(unknown[0]))!r} (known: {', '.join(sorted(known))})")
        out = {}
        for f in _fields(origin):
            if f.name not in value:
                if f.metadata.get(OPTIONAL):
                    continue
                raise FactError(f"{what}: missing field {_join(path, f.name)!r}")
            out[f.name] = _check(hints[f.name], value[f.name], what, _join(path, f.name))
        return origin(**out)
    if origin is list:
        if not isinstance(value, list):
            raise bad(_type_name(tp))
        (item,) = typing.get_args(tp) or (Any,)
        return [_check(item, v, what, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad(_type_name(tp))
        _key, item = typing.get_args(tp) or (str, Any)
        return {k: _check(item, v, what, _join(path, str(k))) for k, v in value.items()}
    if origin is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return value
    if origin is int and isinstance(value, bool):
        raise bad("an integer")
    if isinstance(origin, type) and not isinstance(value, origin):
        raise bad(_type_name(tp))
    return value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# ----------------------------------------------------------------------------- lenient

def from_dict(cls: type, data: Any) -> Any:
    """``data`` as a ``cls`` instance, leniently (see the module docstring): for run records of
    earlier releases and partial facts in tests. ``data`` that is not a mapping counts as ``{}``.
    A :class:`Record`, or a dataclass with a ``from_dict`` of its own, is asked for it."""
    if isinstance(cls, type) and (issubclass(cls, Record) or "from_dict" in vars(cls)):
        return cls.from_dict(data)
    return fields_from_dict(cls, data)


def fields_from_dict(cls: type, data: Any) -> Any:
    """:func:`from_dict` field by field (what a ``from_dict`` of its own builds on)."""
    data = data if isinstance(data, dict) else {}
    hints = _hints(cls)
    out = {}
    for f in _fields(cls):
        tp = hints[f.name]
        if f.name in data:
            out[f.name] = _convert(tp, data[f.name])
        else:
            out[f.name] = _default(f) if _has_default(f) else _empty(tp)
    return cls(**out)


def _convert(tp: Any, value: Any) -> Any:
    if value is None or tp is Any:
        return value
    tp = _inner(tp)
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin):
        return from_dict(origin, value)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v) for v in value]
    if origin is dict and isinstance(value, dict):
        _key, item = typing.get_args(tp) or (str, Any)
        return {k: _convert(item, v) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------------- JSON form

def to_dict(obj: Any) -> Any:
    """The JSON-ready form of a record (or of a list/dict holding records); fields declared
    :func:`optional` are left out while None. A :class:`Record` that defines its own ``to_dict``
    (such as :class:`orchestrator.facts.summary.RunSummary`) is asked for it."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return obj.to_dict() if isinstance(obj, Record) else _fields_dict(obj)
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _fields_dict(obj: Any) -> dict[str, Any]:
    return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)
            if not (f.metadata.get(OPTIONAL) and getattr(obj, f.name) is None)}


class Record:
    """Base of the typed facts: :meth:`parse`, :meth:`from_dict` and :meth:`to_dict` as methods
    (see the module docstring). Subclasses are dataclasses."""

    __slots__ = ()

    @classmethod
    def parse(cls, data: Any, what: str):
        """Strictly, from a host's answer (:func:`parse`); raises :class:`FactError`."""
        return parse(cls, data, what)

    @classmethod
    def from_dict(cls, data: Any):
        """Leniently, from a run record or a test's partial facts (:func:`from_dict`)."""
        return fields_from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (:func:`to_dict`)."""
        return _fields_dict(self)
