"""serial batches, host order and the max-fail rule (orchestrator/engine/batching.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.engine.batching import (SerialError, batch_failed, batch_size, check_max_fail_percentage,
                                          order_hosts, parse_serial, parse_serial_flag, serial_batches)


def sizes(n: int, serial) -> list[int]:
    return [len(b) for b in serial_batches([f"h{i}" for i in range(n)], serial)]


@pytest.mark.parametrize("n, serial, expected", [
    (10, None, [10]),
    (10, 0, [10]),                       # Ansible's default serial 0: one batch
    (10, 1, [1] * 10),
    (10, 3, [3, 3, 3, 1]),
    (10, "3", [3, 3, 3, 1]),
    (2, 5, [2]),
    (10, "25%", [2, 2, 2, 2, 2]),        # int(2.5) = 2: rounds down
    (10, "30%", [3, 3, 3, 1]),
    (7, "50%", [3, 3, 1]),               # int(3.5) = 3
    (3, "10%", [1, 1, 1]),               # int(0.3) = 0 -> at least 1
    (4, "0%", [1, 1, 1, 1]),
    (4, "150%", [4]),
    (10, [1, 5, "25%"], [1, 5, 2, 2]),   # last value repeats; % of ALL hosts, not of those left
    (20, [1, 5, "25%"], [1, 5, 5, 5, 4]),
    (20, "1,5,25%", [1, 5, 5, 5, 4]),    # CLI form
    (3, [1, 5, "25%"], [1, 2]),
    (10, [2, 0], [2, 8]),                # 0 in a list: the rest in one batch
    (10, [], [10]),
    (0, 3, []),
])
def test_serial_math(n, serial, expected):
    assert sizes(n, serial) == expected


def test_batches_keep_order_and_every_host_once():
    hosts = [f"h{i}" for i in range(11)]
    batches = serial_batches(hosts, [1, "30%"])
    assert batches == [["h0"], ["h1", "h2", "h3"], ["h4", "h5", "h6"], ["h7", "h8", "h9"],
                       ["h10"]]
    assert hosts == [f"h{i}" for i in range(11)]  # input untouched


@pytest.mark.parametrize("bad", [-1, "-5%", "abc", "12.5%", True, [1, "x"], "1,,2", 2.5,
                                 {"a": 1}])
def test_bad_serial(bad):
    with pytest.raises(SerialError):
        serial_batches(["a", "b"], bad)


def test_parse_serial_and_batch_size():
    assert parse_serial(" 1, 5 ,25% ") == [1, 5, "25%"]
    assert parse_serial(None) == []
    assert batch_size("25%", 10) == 2 and batch_size("25%", 3) == 1 and batch_size(4, 100) == 4


@dataclass
class H:
    name: str


def test_order_hosts():
    hosts = [H("b"), H("c"), H("a")]
    assert [h.name for h in order_hosts(hosts, "inventory")] == ["b", "c", "a"]
    assert [h.name for h in order_hosts(hosts, "reverse_inventory")] == ["a", "c", "b"]
    assert [h.name for h in order_hosts(hosts, "sorted")] == ["a", "b", "c"]
    assert [h.name for h in order_hosts(hosts, "reverse_sorted")] == ["c", "b", "a"]
    many = [H(f"n{i:02d}") for i in range(30)]
    s1, s2 = order_hosts(many, "shuffle", seed=7), order_hosts(many, "shuffle", seed=7)
    assert s1 == s2 and s1 != many and sorted(h.name for h in s1) == [h.name for h in many]
    assert order_hosts(["y", "x"], "sorted") == ["x", "y"]
    with pytest.raises(SerialError, match="order must be one of"):
        order_hosts(hosts, "random")


@pytest.mark.parametrize("size, failed, pct, expected", [
    (4, 0, None, False),
    (4, 1, None, True),          # orch default: the first failed batch stops the run
    (4, 1, 25, False),           # 25 % is not EXCEEDED
    (4, 2, 25, True),
    (4, 1, 24.9, True),
    (3, 1, 33.3, True),          # 33.33.. > 33.3
    (3, 1, 34, False),
    (10, 3, 30, False),          # exact arithmetic: 0.3 is not > 0.3
    (4, 1, 0, True),             # 0 %: any failure aborts
    (4, 3, 100, False),
    (4, 4, 100, True),           # a whole batch failed: Ansible stops whatever the percentage
    (1, 1, 50, True),
    (5, ["a", "b", "c"], 50, True),  # a collection of failed hosts counts by length
    (0, 0, 10, False),
])
def test_batch_failed(size, failed, pct, expected):
    assert batch_failed(size, failed, pct) is expected


@pytest.mark.parametrize("size, failed, pct", [(4, 1, 101), (4, 1, -1), (4, 5, 10), (4, 1, True)])
def test_batch_failed_bad_input(size, failed, pct):
    with pytest.raises(SerialError):
        batch_failed(size, failed, pct)


@pytest.mark.parametrize("text, expected", [("1", [1]), ("25%", ["25%"]), ("1,5,25%", [1, 5, "25%"]),
                                            ("100%", ["100%"]), (None, [])])
def test_serial_flag_accepts(text, expected):
    assert parse_serial_flag(text) == expected


@pytest.mark.parametrize("text, says", [("0", "at least 1 host"), ("1,0", "item 2: a batch needs at least 1"),
                                        ("150%", "1-100%"), ("0%", "1-100%"), ("-1", "expected a host count"),
                                        ("1,x", "item 2")])
def test_serial_flag_refuses_what_a_play_may_say(text, says):
    """Issue 22: ``--serial 0`` and ``--serial 150%`` ran (one batch); a play keeps Ansible's values."""
    with pytest.raises(SerialError, match=says):
        parse_serial_flag(text)


@pytest.mark.parametrize("value", [120, -1, 100.5, float("nan"), "25", True])
def test_max_fail_percentage_bounds(value):
    with pytest.raises(SerialError, match="0-100"):
        check_max_fail_percentage(value)
    assert check_max_fail_percentage(0) == 0 and check_max_fail_percentage(100) == 100
    assert check_max_fail_percentage(None) is None
