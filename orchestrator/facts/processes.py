"""Processes as facts: the process tree of a unit's main process (``ps -e -o pid=,ppid=``)."""

from __future__ import annotations


def parse_ps_tree(text: str) -> dict[int, list[int]]:
    """``ps -e -o pid=,ppid=`` output -> ``{ppid: [child pids]}`` (malformed lines ignored)."""
    children: dict[int, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    return children


def descendants(children: dict[int, list[int]], root: int) -> set[int]:
    """``root`` and every process below it in ``children`` (:func:`parse_ps_tree`)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(children.get(p, []))
    return seen


def unit_pids(connection, main_pid: int) -> set[int]:
    """PIDs of the unit's main process and all its descendants on the host (empty without a main PID)."""
    if not main_pid:
        return set()
    out = connection.run(["ps", "-e", "-o", "pid=,ppid="], check=False, timeout=30).stdout
    return descendants(parse_ps_tree(out), int(main_pid))
