"""YAML reading with line numbers, on PyYAML's safe loader.

The file is composed into a node tree (``SafeLoader.get_single_node``) so that every
structural error can name the line of the offending node; values are then built from the
nodes with the same safe constructor (no arbitrary tags: ``!vault`` and Python tags are errors).
"""

from __future__ import annotations

from typing import Any, Iterator

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import InventoryError

_NULL_TAG = "tag:yaml.org,2002:null"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _one_line(*parts: Any) -> str:
    return " ".join(" ".join(str(p) for p in parts if p).split())


def _yaml_error(display: str, e: yaml.YAMLError) -> InventoryError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None)
    context = getattr(e, "context", None)
    text = _one_line(context, problem) if (problem or context) else _one_line(e)
    label = "YAML syntax error"
    if isinstance(e, yaml.constructor.ConstructorError):
        label = "YAML error"
        if "!vault" in text:
            text += " (Ansible Vault is not supported: keep secrets out of the inventory)"
    if mark is None:
        return InventoryError(f"{label}: {text}", display)
    return InventoryError(f"{label}: {text}", display, mark.line + 1, mark.column + 1)


class YamlFile:
    """One YAML file composed to nodes. ``root`` is the document node, or None if empty.

    ``display`` is the path used in error messages. Raises :class:`InventoryError` with
    file:line:col for syntax errors, and for unreadable or non-UTF-8 files.
    """

    def __init__(self, path: str, display: str | None = None) -> None:
        self.display = display or path
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise InventoryError("no such file", self.display) from None
        except IsADirectoryError:
            raise InventoryError("is a folder, expected a YAML file", self.display) from None
        except OSError as e:
            raise InventoryError(f"cannot read: {e.strerror}", self.display) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InventoryError(f"not UTF-8 text (byte {e.start})", self.display) from None
        self._loader = yaml.SafeLoader(text)
        self._flattened: set[int] = set()
        try:
            self.root: Node | None = self._loader.get_single_node()
        except yaml.YAMLError as e:
            raise _yaml_error(self.display, e) from None

    # -- locations
    @staticmethod
    def line(node: Node | None) -> int | None:
        """1-based line where ``node`` starts."""
        return None if node is None else node.start_mark.line + 1

    def where(self, node: Node | None) -> str:
        """``path:line`` of a node (used as the origin of a variable)."""
        line = self.line(node)
        return f"{self.display}:{line}" if line is not None else self.display

    def error(self, node: Node | None, msg: str) -> InventoryError:
        """An :class:`InventoryError` located at ``node``."""
        return InventoryError(msg, self.display, self.line(node))

    # -- node helpers
    @staticmethod
    def is_null(node: Node | None) -> bool:
        """True for a missing value, ``~``, ``null`` or an empty value."""
        return node is None or (isinstance(node, ScalarNode) and node.tag == _NULL_TAG)

    @staticmethod
    def kind(node: Node) -> str:
        """'a mapping', 'a list' or 'a scalar' (for messages)."""
        if isinstance(node, MappingNode):
            return "a mapping"
        if isinstance(node, SequenceNode):
            return "a list"
        return f"the scalar {node.value!r}"

    def construct(self, node: Node) -> Any:
        """The Python value of ``node`` (safe types only)."""
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            raise _yaml_error(self.display, e) from None

    def items(self, node: Node, what: str) -> Iterator[tuple[str, Node, Node]]:
        """(key text, key node, value node) of a mapping node, in document order.

        Keys must be scalars and unique (PyYAML would silently keep the last); ``<<`` merge
        keys are expanded first. ``what`` names the mapping in errors ("group 'h200' hosts").
        """
        if not isinstance(node, MappingNode):
            raise self.error(node, f"{what} must be a mapping, got {self.kind(node)}")
        if id(node) in self._flattened:  # an alias of a mapping already checked
            for knode, vnode in node.value:
                yield knode.value, knode, vnode
            return
        self._flattened.add(id(node))
        seen: dict[str, int] = {}
        for knode, _ in node.value:
            if knode.tag == _MERGE_TAG:
                continue
            if not isinstance(knode, ScalarNode):
                raise self.error(knode, f"{what}: keys must be plain names, got {self.kind(knode)}")
            key = knode.value
            if key in seen:
                raise self.error(knode, f"{what}: duplicate key {key!r} (first at line {seen[key]})")
            seen[key] = knode.start_mark.line + 1
        try:
            self._loader.flatten_mapping(node)
        except yaml.YAMLError as e:
            raise _yaml_error(self.display, e) from None
        for knode, vnode in node.value:
            yield knode.value, knode, vnode
