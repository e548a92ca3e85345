"""Ansible host patterns for ``--limit``.

Syntax (Ansible docs, "Patterns: targeting hosts and groups"; ``InventoryManager``):

* The limit is split on ``,`` when it has one, else on ``:`` (outside ``[...]``), as Ansible's
  ``split_host_pattern`` does. Blanks around terms are ignored.
* A term is a host name, a group name (its hosts, descendants included), ``all`` or ``*``, a glob
  (``gpu-*``, ``h?00``, ``node-[ab]*``; fnmatch, case-sensitive) over host and group names, or
  ``~regex`` (Python ``re.match`` over host and group names).
* A term may end in a subscript (``[digits]`` is always a subscript, as in Ansible, never a
  glob character class), taken from the hosts it matched in inventory order:
  ``gpus[0]``, ``gpus[-1]``, ``gpus[1:3]`` (Ansible's slices include the end), ``gpus[2:]``.
* ``&term`` intersects, ``!term`` excludes. Ansible applies all plain terms (union) first, then
  every ``&``, then every ``!``, whatever their order in the limit; a limit with only ``&``/``!``
  terms starts from ``all``.
* ``@file`` reads one pattern per line from a file (Ansible's retry files).

Differences from Ansible (safety first): a term that matches no host and no group name is an
error naming it (Ansible warns and ignores it: a typo in ``!gpu-07`` would silently retune
gpu-07), and so is a selection that ends up empty. The result is always in inventory order.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Any, Protocol

from .errors import InventoryError


class Host(Protocol):
    """What a pattern reads of an inventory host (:class:`orchestrator.inventory.model.Host`)."""

    name: str


class Inventory(Protocol):
    """What a pattern reads of an inventory (:class:`orchestrator.inventory.model.Inventory`):
    its ``hosts`` in inventory order and its ``groups`` (name -> group with ``hosts``)."""

    hosts: list[Any]
    groups: dict[str, Any]

_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?\d+)|(\d+):(\d*))\]$")
_GLOB_CHARS = ("*", "?", "[")


def split_patterns(limit: str) -> list[str]:
    """Split a limit into terms: on ``,`` if present, else on ``:`` outside brackets."""
    limit = limit.strip()
    if "," in limit:
        parts = limit.split(",")
    elif ":" not in limit:
        parts = [limit]
    else:
        parts = re.findall(r"(?:[^\s:\[\]]|\[[^\]]*\])+", limit)
    return [p.strip() for p in parts if p.strip()]


def _names_hint(inv: Inventory, body: str) -> str:
    names = [h.name for h in inv.hosts] + list(inv.groups)
    close = difflib.get_close_matches(body.lstrip("~"), names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _match_term(inv: Inventory, term: str, limit: str) -> list[Host]:
    """Hosts matched by one term without its ``&``/``!`` prefix, in inventory order."""
    body, subscript = term, None
    m = _SUBSCRIPT.match(term)
    if m and not m.group(1).startswith("~"):
        body = m.group(1)
        subscript = (int(m.group(2)), None, True) if m.group(2) is not None else \
            (int(m.group(3)), int(m.group(4)) if m.group(4) else None, False)

    matched: set[str] = set()
    found_name = False
    if body in ("all", "*"):
        matched = {h.name for h in inv.hosts}
        found_name = True
    elif body in inv.groups:
        matched = set(inv.groups[body].hosts)
        found_name = True
    elif body in {h.name for h in inv.hosts}:
        matched = {body}
        found_name = True
    elif body.startswith("~") or any(c in body for c in _GLOB_CHARS):
        if body.startswith("~"):
            try:
                rx = re.compile(body[1:])
            except re.error as e:
                raise InventoryError(f"--limit {limit!r}: bad regex in {term!r}: {e}") from None
            hit = lambda name: rx.match(name) is not None  # noqa: E731
        else:
            hit = lambda name: fnmatch.fnmatchcase(name, body)  # noqa: E731
        for gname, group in inv.groups.items():
            if hit(gname):
                found_name = True
                matched |= set(group.hosts)
        for h in inv.hosts:
            if hit(h.name):
                found_name = True
                matched.add(h.name)
    if not found_name:
        note = f" ({term[len(body):]} is read as a subscript, as in Ansible)" if subscript else ""
        raise InventoryError(f"--limit {limit!r}: pattern {term!r} matches no host or group"
                             f"{note}{_names_hint(inv, body)}")

    hosts = [h for h in inv.hosts if h.name in matched]
    if subscript is not None:
        start, end, single = subscript
        if single:
            if not -len(hosts) <= start < len(hosts):
                raise InventoryError(f"--limit {limit!r}: {term!r} is out of range "
                                     f"({body!r} has {len(hosts)} hosts)")
            hosts = [hosts[start]]
        else:
            if end is not None and end < start:
                raise InventoryError(f"--limit {limit!r}: {term!r}: the end is before the start")
            picked = hosts[start:None if end is None else end + 1]
            if not picked:
                raise InventoryError(f"--limit {limit!r}: {term!r} is out of range "
                                     f"({body!r} has {len(hosts)} hosts)")
            hosts = picked
    return hosts


def _expand_files(terms: list[str], limit: str) -> list[str]:
    out: list[str] = []
    for t in terms:
        if t.startswith("@"):
            try:
                with open(t[1:], encoding="utf-8") as fh:
                    lines = [ln.strip() for ln in fh.read().splitlines()]
            except OSError as e:
                raise InventoryError(f"--limit {limit!r}: cannot read {t[1:]!r}: "
                                     f"{e.strerror}") from None
            out.extend(ln for ln in lines if ln and not ln.startswith("#"))
        else:
            out.append(t)
    return out


def select_hosts(inv: Inventory, limit: str | None) -> list[Host]:
    """The hosts of ``inv`` selected by an Ansible ``--limit`` string, in inventory order.

    ``None`` selects every host. Raises :class:`InventoryError` naming the pattern when a term
    matches no host or group name, a subscript is out of range, or nothing is left selected.
    """
    if limit is None:
        return list(inv.hosts)
    terms = _expand_files(split_patterns(limit), limit)
    if not terms:
        raise InventoryError(f"--limit {limit!r} is empty")
    regular = [t for t in terms if t[0] not in "&!"]
    inter = [t[1:] for t in terms if t[0] == "&"]
    exclude = [t[1:] for t in terms if t[0] == "!"]
    for t in inter + exclude:
        if not t:
            raise InventoryError(f"--limit {limit!r}: '&' or '!' without a pattern")
    selected: set[str] = set()
    for t in regular or ["all"]:
        selected |= {h.name for h in _match_term(inv, t, limit)}
    for t in inter:
        selected &= {h.name for h in _match_term(inv, t, limit)}
    for t in exclude:
        selected -= {h.name for h in _match_term(inv, t, limit)}
    result = [h for h in inv.hosts if h.name in selected]
    if not result:
        raise InventoryError(f"--limit {limit!r} selects no hosts")
    return result
