"""Ansible-compatible YAML inventory: groups, hosts, group_vars/ and host_vars/.

Format (Ansible's ``yaml`` inventory plugin): the top level maps group names to group bodies;
``all`` is the root group and any other top-level group becomes a child of ``all``. A body has
``hosts:`` (host name -> variables or null; a single host name string is accepted), ``children:``
(group name -> body or null) and ``vars:``. Host keys may carry ranges (``gpu-[01:04]``,
``node-[a:c]``, ``[1:9:2]``) and a ``:port`` suffix, as in Ansible. A host may sit in several
groups; its variables from every place it is listed are merged (later wins). A group body may
appear in several places; the definitions merge.

Decisions where Ansible only warns (orch refuses, because a silent skip could retune or kill the
wrong thing): an unknown key in a group body (e.g. ``host:``), ``hosts:``/``children:`` given as
a list, duplicate keys in one mapping, a group that is only ever referenced as ``name:`` (null)
and never defined with a body (``name: {}`` declares an empty group on purpose), a host and a
group of the same name, a child loop, host names with characters that have a meaning in
``--limit`` patterns (only letters, digits, ``.``, ``-``, ``_``; IPv6 addresses go in
``ansible_host``). Hosts listed only directly under ``all`` are in ``ungrouped``, as in Ansible.

Variable precedence, lowest to highest. This is Ansible's default order (docs: "Variable
precedence: Where should I put a variable?", items "inventory file or script group vars" <
"inventory group_vars/all" < "inventory group_vars/*" < "inventory file or script host vars" <
"inventory host_vars/*"; and ``VariableManager.get_vars`` with the default
``VARIABLE_PRECEDENCE`` = all_inventory, groups_inventory, all_plugins_inventory,
groups_plugins_inventory):

1. ``vars:`` of ``all`` in the inventory file
2. ``vars:`` of the host's other groups in the inventory file, in group order
3. ``group_vars/all``
4. ``group_vars/<group>`` of the host's other groups, in group order
5. the host's variables in the inventory file
6. ``host_vars/<host>``

Group order is Ansible's ``sort_groups``: by depth (longest path from ``all``: a child group is
deeper than its parents, so child beats parent), then ``ansible_group_priority`` (default 1,
higher wins), then name (alphabetical: for two sibling groups at the same depth and priority,
the one whose name sorts last wins). Note the consequence of Ansible's order: ``group_vars/``
files beat every group's ``vars:`` in the inventory file, even a deeper group's.
Values replace whole (Ansible's default ``hash_behaviour = replace``: no deep merge of dicts).
``ansible_group_priority`` is honoured only in the inventory file's group ``vars:``, as in
Ansible (its ``Group.set_variable`` is reached only from inventory sources); orch rejects it
elsewhere instead of ignoring it.

Vars files: for an entity ``NAME``, the first of ``NAME`` (file or folder), ``NAME.yml``,
``NAME.yaml``, ``NAME.json`` that exists is used, as Ansible's ``DataLoader.find_vars_files``
does (a folder's files are read recursively in name order, hidden and ``~`` files skipped).
A shadowed sibling, and a file naming no group/host of the inventory, give a warning.
"""

from __future__ import annotations

import difflib
import os
import re
import string
from dataclasses import dataclass, field
from typing import Any, Iterable

from yaml.nodes import MappingNode, Node, ScalarNode

from ._yaml import YamlFile
from .errors import InventoryError
from .model import Group, Host, Inventory
from .variables import KNOWN_VARS, BadValue, check_name, check_value

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_GROUP_KEYS = ("hosts", "children", "vars")
_VARS_EXTS = ("", ".yml", ".yaml", ".json")  # Ansible: '' then C.YAML_FILENAME_EXTENSIONS
_VARS_FILE_EXTS = (".yml", ".yaml", ".json")


@dataclass
class _Val:
    value: Any
    origin: str


@dataclass
class _G:
    name: str
    origin: str
    defined: bool = False
    vars: dict[str, _Val] = field(default_factory=dict)
    file_vars: dict[str, _Val] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    direct_hosts: list[str] = field(default_factory=list)
    priority: int = 1
    depth: int = 0


@dataclass
class _H:
    name: str
    origin: str
    line: int | None
    vars: dict[str, _Val] = field(default_factory=dict)
    file_vars: dict[str, _Val] = field(default_factory=dict)
    direct_groups: list[str] = field(default_factory=list)


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Load an Ansible YAML inventory and the group_vars/ and host_vars/ folders beside it.

    Every host's effective variables are computed once here, so a bad value or template anywhere
    fails at load time. Raises :class:`InventoryError` whose ``str()`` is one line naming the file
    and line (YAML syntax errors: file:line:col).
    """
    return _Builder(os.fspath(path)).build()


class _Builder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.base = os.path.dirname(path)
        self.groups: dict[str, _G] = {}
        self.hosts: dict[str, _H] = {}  # insertion order = inventory order
        self.warnings: list[str] = []

    # ------------------------------------------------------------ inventory file
    def build(self) -> Inventory:
        f = YamlFile(self.path)
        if YamlFile.is_null(f.root):
            raise InventoryError("the inventory is empty", self.path)
        if not isinstance(f.root, MappingNode):
            raise f.error(f.root, "the top level must be a mapping of groups ('all:' ...); INI "
                                  "inventories are not supported, use Ansible's YAML format")
        self._group(f, "all", f.root, None, None)  # placeholder so 'all' exists first
        self.groups["all"].defined = True
        for name, knode, vnode in f.items(f.root, "the top level"):
            self._group(f, name, knode, vnode, None)
        self._finish_structure(f)
        self._load_vars_files("group_vars", self.groups)
        self._load_vars_files("host_vars", self.hosts)
        return self._result()

    def _group(self, f: YamlFile, name: str, knode: Node, body: Node | None,
               parent: _G | None) -> _G:
        if not _NAME.match(name):
            raise f.error(knode, f"invalid group name {name!r} (letters, digits, '.', '-', '_')")
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = _G(name, f.where(knode))
        if parent is not None:
            self._link(f, knode, parent, g)
        if body is knode or YamlFile.is_null(body):
            return g
        assert body is not None
        if not isinstance(body, MappingNode):
            raise f.error(body, f"group {name!r} must be a mapping with hosts, children or vars, "
                                f"got {YamlFile.kind(body)}")
        g.defined = True
        for key, k2, v2 in f.items(body, f"group {name!r}"):
            if key == "hosts":
                self._hosts(f, g, v2)
            elif key == "children":
                self._children(f, g, v2)
            elif key == "vars":
                if not YamlFile.is_null(v2):
                    for var, vk, vv in f.items(v2, f"group {name!r} vars"):
                        self._set_var(f, vk, vv, var, f"group {name!r}", g.vars, g)
            else:
                close = difflib.get_close_matches(key, _GROUP_KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else \
                    " (a host goes under 'hosts:', a group under 'children:')"
                raise f.error(k2, f"group {name!r}: unknown key {key!r}, expected hosts, "
                                  f"children or vars{hint}")
        return g

    def _children(self, f: YamlFile, g: _G, node: Node) -> None:
        if YamlFile.is_null(node):
            return
        if isinstance(node, ScalarNode):  # Ansible accepts one name as a string
            self._group(f, str(node.value), node, None, g)
            return
        for child, ck, cv in f.items(node, f"group {g.name!r} children"):
            if child == "all":
                raise f.error(ck, "'all' cannot be a child group")
            self._group(f, child, ck, cv, g)

    def _link(self, f: YamlFile, knode: Node, parent: _G, child: _G) -> None:
        if child.name == parent.name or child.name in self._ancestors(parent.name):
            raise f.error(knode, f"group {child.name!r} as a child of {parent.name!r} makes a loop")
        if child.name not in parent.children:
            parent.children.append(child.name)
        if parent.name not in child.parents:
            child.parents.append(parent.name)

    def _ancestors(self, name: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.groups[name].parents)
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(self.groups[p].parents)
        return seen

    def _hosts(self, f: YamlFile, g: _G, node: Node) -> None:
        if YamlFile.is_null(node):
            return
        if isinstance(node, ScalarNode):  # Ansible accepts one host name as a string
            entries: Iterable[tuple[str, Node, Node | None]] = [(str(node.value), node, None)]
        elif isinstance(node, MappingNode):
            entries = f.items(node, f"group {g.name!r} hosts")
        else:
            raise f.error(node, f"group {g.name!r}: hosts must be a mapping of host names "
                                f"(each 'name:' on its own line), got {YamlFile.kind(node)}")
        for pattern, hk, hv in entries:
            for hname, port in self._expand(f, hk, pattern):
                h = self.hosts.get(hname)
                if h is None:
                    h = self.hosts[hname] = _H(hname, f.where(hk), YamlFile.line(hk))
                if g.name not in h.direct_groups:
                    h.direct_groups.append(g.name)
                if hname not in g.direct_hosts:
                    g.direct_hosts.append(hname)
                if port is not None:
                    h.vars["ansible_port"] = _Val(port, f.where(hk))
                if hv is not None and not YamlFile.is_null(hv):
                    for var, vk, vv in f.items(hv, f"host {hname!r} vars"):
                        self._set_var(f, vk, vv, var, f"host {hname!r}", h.vars)

    @staticmethod
    def _expand(f: YamlFile, knode: Node, pattern: str) -> list[tuple[str, int | None]]:
        """Ansible host key: optional ``:port`` suffix and ``[a:b(:step)]`` ranges."""
        port = None
        colon, bracket = pattern.rfind(":"), pattern.rfind("]")
        if colon > bracket and pattern[colon + 1:].isdigit():
            port = int(pattern[colon + 1:])
            if not 1 <= port <= 65535:
                raise f.error(knode, f"host {pattern!r}: port must be 1-65535")
            pattern = pattern[:colon]
        names = _expand_ranges(pattern)
        if names is None:
            raise f.error(knode, f"host {pattern!r}: bad range (use [01:10], [a:f] or [1:9:2])")
        for n in names:
            if not _NAME.match(n):
                raise f.error(knode, f"invalid host name {n!r}: use letters, digits, '.', '-', "
                                     f"'_' (put an IPv6 address in ansible_host)")
        return [(n, port) for n in names]

    def _set_var(self, f: YamlFile, knode: Node, vnode: Node, name: str, scope: str,
                 target: dict[str, _Val], group: _G | None = None) -> None:
        msg = check_name(name)
        if msg:
            raise f.error(knode, f"{scope}: {msg}")
        spec = KNOWN_VARS.get(name)
        value = f.construct(vnode)
        try:
            value = check_value(name, value)
        except BadValue as e:
            raise f.error(vnode, f"{scope}: {e}") from None
        if spec is not None and spec.group_only:
            if group is None:
                raise f.error(knode, f"{scope}: {name} is only honoured in the inventory file's "
                                     f"group vars (Ansible ignores it elsewhere)")
            if value is not None and not isinstance(value, int):
                raise f.error(vnode, f"{scope}: {name} cannot be a template")
            group.priority = 1 if value is None else value
            return
        warning = spec.warning(value) if spec is not None else None
        if warning:
            self.warnings.append(f"{f.where(knode)}: {scope}: {warning}")
        target[name] = _Val(value, f.where(knode))

    # ------------------------------------------------------------ structure
    def _finish_structure(self, f: YamlFile) -> None:
        allg = self.groups["all"]
        if "ungrouped" not in self.groups:
            self.groups["ungrouped"] = _G("ungrouped", allg.origin, defined=True)
        for g in self.groups.values():
            if not g.defined:
                close = [n for n in difflib.get_close_matches(g.name, list(self.groups), n=3)
                         if n != g.name and self.groups[n].defined]
                hint = f" (did you mean {close[0]!r}?)" if close else \
                    f" (write '{g.name}: {{}}' for an empty group)"
                path, _, line = g.origin.rpartition(":")
                raise InventoryError(f"group {g.name!r} is referenced but never defined{hint}",
                                     path, int(line))
            if g.name != "all" and not g.parents:
                g.parents.append("all")
                allg.children.append(g.name)
        for h in self.hosts.values():
            if h.name in self.groups:
                raise InventoryError(f"{h.name!r} is both a host and a group", self.path, h.line)
            if set(h.direct_groups) <= {"all", "ungrouped"}:
                h.direct_groups = [x for x in h.direct_groups if x != "ungrouped"] + ["ungrouped"]
                ug = self.groups["ungrouped"]
                if h.name not in ug.direct_hosts:
                    ug.direct_hosts.append(h.name)
            elif "ungrouped" in h.direct_groups:  # Ansible drops ungrouped when in a real group
                h.direct_groups.remove("ungrouped")
                self.groups["ungrouped"].direct_hosts.remove(h.name)
        if not self.hosts:
            raise InventoryError("the inventory defines no hosts", self.path)

        depth: dict[str, int] = {}

        def depth_of(name: str) -> int:
            if name not in depth:
                ps = self.groups[name].parents
                depth[name] = 0 if name == "all" else 1 + max(depth_of(p) for p in ps)
            return depth[name]

        for g in self.groups.values():
            g.depth = depth_of(g.name)

    def _member_groups(self, h: _H) -> list[_G]:
        """All groups of a host except 'all', in Ansible's sort_groups order."""
        names: set[str] = set()
        for d in h.direct_groups:
            names.add(d)
            names |= self._ancestors(d)
        names.discard("all")
        return sorted((self.groups[n] for n in names), key=lambda g: (g.depth, g.priority, g.name))

    # ------------------------------------------------------------ vars files
    def _load_vars_files(self, kind: str, entities: dict[str, Any]) -> None:
        folder = os.path.join(self.base, kind)
        if not os.path.isdir(folder):
            return
        for entry in sorted(os.listdir(folder)):
            if entry.startswith(".") or entry.endswith("~"):
                continue
            stem, ext = os.path.splitext(entry)
            stem = stem if ext in _VARS_FILE_EXTS else entry
            if stem not in entities:
                what = "group" if kind == "group_vars" else "host"
                close = difflib.get_close_matches(stem, list(entities), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.warnings.append(f"{os.path.join(folder, entry)}: no {what} {stem!r} in the "
                                     f"inventory, file ignored{hint}")
        for name, ent in entities.items():
            chosen: list[str] = []
            for ext in _VARS_EXTS:
                p = os.path.join(folder, name + ext)
                if not os.path.exists(p):
                    continue
                if chosen:
                    self.warnings.append(f"{p}: ignored, {chosen[0]} is read instead "
                                         f"(Ansible reads only the first of {name}, {name}.yml, "
                                         f"{name}.yaml, {name}.json)")
                    continue
                chosen.append(p)
            for p in _vars_files(chosen[0]) if chosen else []:
                self._vars_file(p, kind, ent)

    def _vars_file(self, p: str, kind: str, ent: Any) -> None:
        f = YamlFile(p)
        if YamlFile.is_null(f.root):
            return
        scope = f"{'group' if kind == 'group_vars' else 'host'} {ent.name!r}"
        for var, vk, vv in f.items(f.root, f"{scope}: {kind} file"):
            self._set_var(f, vk, vv, var, scope, ent.file_vars)

    # ------------------------------------------------------------ result
    def _result(self) -> Inventory:
        order = {name: i for i, name in enumerate(self.hosts)}
        hosts: list[Host] = []
        for h in self.hosts.values():
            groups = self._member_groups(h)
            allg = self.groups["all"]
            layers = [allg.vars, *(g.vars for g in groups), allg.file_vars,
                      *(g.file_vars for g in groups), h.vars, h.file_vars]
            merged: dict[str, _Val] = {}
            for layer in layers:
                merged.update(layer)
            hosts.append(Host(h.name, {k: v.value for k, v in merged.items()},
                              sorted(g.name for g in groups),
                              {k: v.origin for k, v in merged.items()}))
        groups_out: dict[str, Group] = {}
        for g in self.groups.values():
            members = set(g.direct_hosts)
            todo, seen = list(g.children), set()
            while todo:
                c = todo.pop()
                if c not in seen:
                    seen.add(c)
                    members |= set(self.groups[c].direct_hosts)
                    todo.extend(self.groups[c].children)
            if g.name == "all":
                members = set(self.hosts)
            v = {k: x.value for k, x in g.vars.items()}
            v.update({k: x.value for k, x in g.file_vars.items()})
            groups_out[g.name] = Group(g.name, v, list(g.children), list(g.parents),
                                       sorted(members, key=order.__getitem__),
                                       list(g.direct_hosts), g.depth, g.priority)
        inv = Inventory(self.path, hosts, groups_out, self.warnings)
        for h in hosts:
            inv.host_vars(h.name)  # validate templates and derived values now
        return inv


def _vars_files(path: str) -> list[str]:
    """``path`` itself, or the vars files under folder ``path`` (recursive, name order)."""
    if not os.path.isdir(path):
        return [path]
    out: list[str] = []
    for entry in sorted(os.listdir(path)):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        full = os.path.join(path, entry)
        ext = os.path.splitext(entry)[1]
        if os.path.isdir(full) and not ext:
            out.extend(_vars_files(full))
        elif os.path.isfile(full) and (not ext or ext in _VARS_FILE_EXTS):
            out.append(full)
    return out


_RANGE = re.compile(r"\[([^\]]*)\]")


def _expand_ranges(pattern: str) -> list[str] | None:
    """Expand Ansible host ranges; None when a range is malformed."""
    m = _RANGE.search(pattern)
    if m is None:
        return None if ("[" in pattern or "]" in pattern) else [pattern]
    parts = m.group(1).split(":")
    if len(parts) not in (2, 3) or not parts[1]:
        return None
    beg, end = parts[0] or "0", parts[1]
    step_txt = parts[2] if len(parts) == 3 else "1"
    if not step_txt.isdigit() or int(step_txt) < 1:
        return None
    step = int(step_txt)
    if beg.isdigit() and end.isdigit():
        if int(beg) > int(end):
            return None
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if width and len(end) != width:
            return None
        seq = [str(i).zfill(width) for i in range(int(beg), int(end) + 1, step)]
    elif len(beg) == 1 and len(end) == 1 and beg in string.ascii_letters \
            and end in string.ascii_letters:
        i, j = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if i > j:
            return None
        seq = list(string.ascii_letters[i:j + 1:step])
    else:
        return None
    out: list[str] = []
    for item in seq:
        rest = _expand_ranges(pattern[:m.start()] + item + pattern[m.end():])
        if rest is None:
            return None
        out.extend(rest)
    return out
