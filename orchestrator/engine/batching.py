"""Rolling batches as Ansible plays them: ``serial``, ``order`` and ``max_fail_percentage``.

Sources (Ansible ``lib/ansible``):

* ``serial`` — ``PlaybookExecutor._get_serialized_batches`` with ``utils.helpers.pct_to_int``:
  a value is a host count, or ``"N%"`` of the TOTAL number of hosts (not of those left),
  rounded down (``int()``) and at least 1; a list gives the successive batch sizes and its last
  value repeats until every host is placed; ``0`` (Ansible's default) or no value = all the
  remaining hosts in one batch.
* ``order`` — ``InventoryManager.get_hosts``: inventory, reverse_inventory, sorted,
  reverse_sorted (by host name), shuffle.
* ``max_fail_percentage`` — ``StrategyBase``/linear strategy: the batch aborts the run when
  ``failed / batch_size > max_fail_percentage / 100`` (it must be EXCEEDED: 25 % of failures with
  ``max_fail_percentage: 25`` goes on); and ``PlaybookExecutor`` stops when every host of a batch
  failed, whatever the percentage.

orch's default differs on purpose: with no ``max_fail_percentage`` a batch with any failed host
stops the run (Ansible would go on unless the whole batch failed).
"""

from __future__ import annotations

from ..errors import OrchError

import random
import re
from fractions import Fraction
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")

SerialItem = int | str
SerialSpec = int | str | Sequence[SerialItem] | None

ORDERS = ("inventory", "reverse_inventory", "sorted", "reverse_sorted", "shuffle")

_PCT = re.compile(r"^\s*(\d+)\s*%\s*$")
_INT = re.compile(r"^\s*(\d+)\s*$")


class SerialError(OrchError, ValueError):
    """A bad ``serial``/``order``/``max_fail_percentage`` value; ``str()`` says which and why."""


def _item(value: Any, where: str) -> SerialItem:
    if isinstance(value, bool):
        raise SerialError(f"serial {where}: expected a host count or a percentage, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SerialError(f"serial {where}: must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _INT.match(value)
        if m:
            return int(m.group(1))
        m = _PCT.match(value)
        if m:
            return f"{int(m.group(1))}%"
    raise SerialError(f"serial {where}: expected a host count (3) or a whole percentage "
                      f"('25%'), got {value!r}")


def parse_serial(serial: SerialSpec) -> list[SerialItem]:
    """Normalise a serial value to a list of ints and ``"N%"`` strings.

    Accepts an int, ``"3"``, ``"25%"``, a list/tuple of those, or the CLI form ``"1,5,25%"``.
    ``None`` gives ``[]`` (one batch of all hosts). Raises :class:`SerialError`.
    """
    if serial is None:
        return []
    if isinstance(serial, str) and "," in serial:
        parts = [p for p in serial.split(",")]
        if any(not p.strip() for p in parts):
            raise SerialError(f"serial {serial!r}: empty item in the list")
        serial = parts
    if isinstance(serial, (list, tuple)):
        if not serial:
            return []
        return [_item(v, f"item {i + 1}") for i, v in enumerate(serial)]
    return [_item(serial, "value")]


def parse_serial_flag(text: str | None) -> list[SerialItem]:
    """``--serial`` as an operator types it: :func:`parse_serial`, then every count at least 1 and
    every percentage 1-100 %. A play may say ``serial: 0`` (Ansible's default: all hosts in one
    batch) or ``150%`` (one batch too), as in Ansible; on the command line either is a slip (leave
    ``--serial`` out for one batch of every host), and so is ``0%`` (Ansible makes it one host a
    batch). Raises :class:`SerialError` naming the item."""
    items = parse_serial(text)
    for i, item in enumerate(items):
        where = f"item {i + 1}" if len(items) > 1 else "value"
        if isinstance(item, int) and item < 1:
            raise SerialError(f"serial {where}: a batch needs at least 1 host, got {item} "
                              "(leave --serial out for one batch of every host)")
        if isinstance(item, str) and not 1 <= int(item.rstrip("%")) <= 100:
            raise SerialError(f"serial {where}: a percentage of the hosts is 1-100%, got {item}")
    return items


def check_max_fail_percentage(value: Any) -> float | None:
    """``value`` when it is a ``max_fail_percentage`` Ansible accepts (a number 0-100) or None;
    raises :class:`SerialError` otherwise. Checked before a run starts (:func:`batch_failed`
    would raise the same only once a batch had failed)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise SerialError(f"max_fail_percentage must be a number 0-100, got {value!r}")
    return value


def check_order(order: Any) -> str:
    """``order`` when it is one of :data:`ORDERS`; raises :class:`SerialError` otherwise."""
    if order not in ORDERS:
        raise SerialError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    return order


def batch_size(item: SerialItem, total: int) -> int:
    """Hosts in one batch for one serial item (Ansible ``pct_to_int``): ``"N%"`` is
    ``int(N / 100 * total)`` or 1 when that is 0; an int is itself. ``total``: all hosts of the run.
    """
    if isinstance(item, str):
        return int((int(item.rstrip("%")) / 100.0) * total) or 1
    return int(item)


def serial_batches(hosts: Sequence[T], serial: SerialSpec) -> list[list[T]]:
    """Split ``hosts`` (already ordered) into successive batches, as Ansible's ``serial``.

    Examples with 10 hosts: ``3`` -> 3,3,3,1; ``"25%"`` -> 2,2,2,2,2; ``[1, 5, "25%"]`` ->
    1,5,2,2; ``"30%"`` with 2 hosts -> 1,1 (rounds down, at least 1); ``None`` or ``0`` -> 10.
    Returns ``[]`` for no hosts. Raises :class:`SerialError` for a bad serial value.
    """
    items = parse_serial(serial) or [0]
    left = list(hosts)
    total = len(left)
    batches: list[list[T]] = []
    i = 0
    while left:
        size = batch_size(items[i], total)
        if size <= 0:
            batches.append(left)
            break
        batches.append(left[:size])
        left = left[size:]
        i = min(i + 1, len(items) - 1)
    return batches


def server_batches(hosts: Sequence[T], serial: SerialSpec, server_of: Callable[[T], str | None]) -> list[list[T]]:
    """:func:`serial_batches` counting servers, not hosts: the hosts that are ranks of one
    multi-node server (``server_of(host)``: the same key, :func:`orchestrator.facts.server_group.server_key`;
    None for a single-node host) count as one item and always land in the same batch, at the place
    of the first of them in ``hosts``. ``serial`` 1 with two 2-rank servers: 2 batches of 2 hosts.
    Returns the batches of hosts (flattened). Raises :class:`SerialError` for a bad serial value."""
    units: list[list[T]] = []
    where: dict[str, list[T]] = {}
    for h in hosts:
        key = server_of(h)
        if key is None:
            units.append([h])
        elif key in where:
            where[key].append(h)
        else:
            where[key] = [h]
            units.append(where[key])
    return [[h for unit in batch for h in unit] for batch in serial_batches(units, serial)]


def servers_in(batch: Sequence[T], server_of: Callable[[T], str | None]) -> list[list[T]]:
    """The servers of a batch: each multi-node server's hosts together, each other host alone
    (order kept). :func:`batch_failed` counts these: a failed rank fails its whole server."""
    return server_batches(batch, [1], server_of)


def _name(host: Any) -> str:
    return host.name if hasattr(host, "name") else str(host)


def order_hosts(hosts: Sequence[T], order: str = "inventory", seed: int | None = None) -> list[T]:
    """Return a new list of ``hosts`` in Ansible play ``order``.

    ``sorted``/``reverse_sorted`` sort by ``host.name`` (or ``str(host)``); ``shuffle`` uses
    ``random.Random(seed)`` so a seed gives a repeatable order. Raises :class:`SerialError` for
    an unknown order.
    """
    check_order(order)
    if order == "inventory":
        return list(hosts)
    if order == "reverse_inventory":
        return list(hosts)[::-1]
    if order in ("sorted", "reverse_sorted"):
        return sorted(hosts, key=_name, reverse=order == "reverse_sorted")
    out = list(hosts)  # shuffle
    random.Random(seed).shuffle(out)
    return out


def batch_failed(batch_size: int, failed: int | Sequence[Any],
                 max_fail_percentage: float | None) -> bool:
    """True when a finished batch must stop the run.

    ``failed``: the number (or a collection) of failed or unreachable hosts of the batch.
    ``max_fail_percentage`` None (orch default): stop if any host failed. Otherwise Ansible's
    rule: stop when the failed share EXCEEDS the percentage (exact arithmetic, so 1 of 4 with 25
    goes on), or when every host of the batch failed. Raises :class:`SerialError` for a
    percentage outside 0-100 or counts that do not fit.
    """
    n_failed = failed if isinstance(failed, int) else len(failed)
    if batch_size < 0 or n_failed < 0 or n_failed > batch_size:
        raise SerialError(f"failed hosts ({n_failed}) must be between 0 and the batch size "
                          f"({batch_size})")
    if n_failed == 0:
        return False
    if max_fail_percentage is None:
        return True
    check_max_fail_percentage(max_fail_percentage)
    if n_failed == batch_size:
        return True
    return Fraction(n_failed, batch_size) > Fraction(str(max_fail_percentage)) / 100
