"""The inventory's objects: :class:`Host`, :class:`Group` and :class:`Inventory` (as Ansible keeps
``inventory/host.py``, ``group.py`` and ``data.py`` apart from the loader). The loader builds them
(:mod:`orchestrator.inventory.loader`); ``--limit`` patterns select from them
(:mod:`orchestrator.inventory.patterns`).
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, field
from typing import Any

from .errors import InventoryError
from .patterns import select_hosts
from .variables import effective_vars, redact


@dataclass(frozen=True, eq=False)
class Host:
    """One inventory host.

    ``vars``: the host's variables merged by precedence (see module doc), validated, without
    defaults and with templates unrendered; use :func:`effective_vars` for the values to act on.
    ``groups``: every group the host is in, parents included, ``all`` excluded, sorted by name
    (Ansible's ``group_names``). ``origins``: variable -> ``"path:line"`` of the assignment that won.
    """

    name: str
    vars: dict[str, Any]
    groups: list[str]
    origins: dict[str, str] = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:
        return f"Host(name={self.name!r}, vars={redact(self.vars)!r}, groups={self.groups!r})"


@dataclass(frozen=True, eq=False)
class Group:
    """One inventory group.

    ``vars``: its own variables (inventory file, then group_vars files), validated.
    ``hosts``: every member host, descendants included, in inventory order; ``direct_hosts``:
    those listed under this group's own ``hosts:``. ``depth``: longest path from ``all`` (0).
    """

    name: str
    vars: dict[str, Any]
    children: list[str]
    parents: list[str]
    hosts: list[str]
    direct_hosts: list[str]
    depth: int
    priority: int


class Inventory:
    """A loaded inventory. Build it with :func:`load_inventory`.

    ``path``: the inventory file as given. ``hosts``: list of :class:`Host` in inventory order
    (first appearance in the file). ``groups``: name -> :class:`Group` (``all`` and
    ``ungrouped`` always present). ``warnings``: one-line messages (not errors) found while loading.
    """

    def __init__(self, path: str, hosts: list[Host], groups: dict[str, Group],
                 warnings: list[str]) -> None:
        self.path = path
        self.hosts = hosts
        self.groups = groups
        self.warnings = warnings
        self._by_name = {h.name: h for h in hosts}
        self._effective: dict[str, dict[str, Any]] = {}

    def get_host(self, name: str) -> Host:
        """The host called ``name``; raises :class:`InventoryError` (with a did-you-mean)."""
        try:
            return self._by_name[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._by_name), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InventoryError(f"no host {name!r} in the inventory{hint}", self.path) from None

    def host_vars(self, name: str) -> dict[str, Any]:
        """:func:`effective_vars` of host ``name`` (defaults applied, templates rendered); a copy."""
        if name not in self._effective:
            self._effective[name] = effective_vars(self.get_host(name))
        return copy.deepcopy(self._effective[name])

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching an Ansible ``--limit`` pattern, in inventory order (None: all hosts).

        See :mod:`orchestrator.inventory.patterns`; raises :class:`InventoryError` when a pattern
        matches nothing or the selection is empty.
        """
        return select_hosts(self, limit)

    def __repr__(self) -> str:
        return f"Inventory({self.path!r}, hosts={[h.name for h in self.hosts]!r})"
