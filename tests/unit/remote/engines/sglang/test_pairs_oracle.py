"""The real SGLang releases are the judge of ``remote.engines.sglang.pairs`` (issue 32 row 14).

For every covered release that reads ``_down`` files, its own ``try_get_optimal_moe_config`` runs
unchanged (``tests/sglang_loader.py``) on up/down pairs whose entries disagree on BLOCK_SIZE_M at some
batch sizes (keys that differ between the files, a tie between two keys, a last key past which both
choices stay fixed), for every M from 1 past the largest key: it fails (``assert``) or runs the down
entry with the up BLOCK_SIZE_M (``override``) exactly at the M ``block_m_mismatches`` names, as
``MISMATCH_RULES`` says for that release. The tuner's own pairs (``remote/tuning/command.py``: one
BLOCK_SIZE_M per batch size, the same keys) never disagree.
"""

from __future__ import annotations

import json

import pytest

from remote.engines.sglang import naming
from remote.engines.sglang.pairs import MISMATCH_RULES, block_m_mismatches, describe, mismatch_rule
from tests.sglang_loader import ORACLE_RELEASES, release_loader


def _entry(bm: int, marker: int) -> dict:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": marker, "num_warps": 4,
            "num_stages": 3}


PAIRS = {
    "same_keys_one_differs": ({"1": 16, "8": 32, "64": 64}, {"1": 16, "8": 64, "64": 64}),
    "different_keys": ({"1": 16, "16": 32, "256": 128}, {"1": 16, "4": 16, "64": 32, "128": 128}),
    "tie_between_keys": ({"2": 16, "6": 32}, {"6": 32, "2": 16, "4": 64}),
    "agree": ({"1": 16, "8": 32}, {"1": 16, "8": 32}),
}


def test_rules_table_lists_every_covered_release():
    assert [r for r, _ in MISMATCH_RULES] == list(ORACLE_RELEASES)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_release_fails_or_overrides_exactly_where_orch_says(version, pair, tmp_path):
    up_bm, down_bm = PAIRS[pair]
    up = {k: _entry(v, 100 + i) for i, (k, v) in enumerate(up_bm.items())}
    down = {k: _entry(v, 200 + i) for i, (k, v) in enumerate(down_bm.items())}
    rule, release = mismatch_rule(version)
    assert release == version
    with release_loader(version, tmp_path, triton_version="3.6.0") as rel:
        m = rel.module
        if "return_down_config" not in __import__("inspect").signature(m.try_get_optimal_moe_config).parameters:
            assert rule is None
            return
        folder = rel.configs / naming.sglang_version_dir("3.6.0")
        folder.mkdir(parents=True)
        (folder / m.get_config_file_name(8, 64, None)).write_text(json.dumps(up))
        (folder / m.get_config_file_name(8, 64, None, down_moe=True)).write_text(json.dumps(down))
        expected = block_m_mismatches(json.loads(json.dumps(up)), json.loads(json.dumps(down)))
        last = max(int(k) for k in list(up) + list(down)) + 3
        bad = set()
        for x in expected:
            bad.update(range(x["m_from"], (x["m_to"] or last) + 1))
        for M in range(1, last + 1):
            try:
                config, (down_config, _) = m.try_get_optimal_moe_config((8, 128, 128), (8, 128, 64), 2, None, M,
                                                                       return_down_config=True)
            except AssertionError:
                assert rule == "assert" and M in bad, (version, pair, M)
                continue
            file_down = down[str(min((int(k) for k in down), key=lambda k: abs(k - M)))]
            overridden = down_config["BLOCK_SIZE_M"] != file_down["BLOCK_SIZE_M"]
            assert down_config["GROUP_SIZE_M"] == file_down["GROUP_SIZE_M"]  # the entry orch says SGLang picks
            assert overridden == (M in bad), (version, pair, M)
            assert not overridden or rule == "override"
            assert down_config["BLOCK_SIZE_M"] == config["BLOCK_SIZE_M"]
    assert (pair == "agree") == (expected == [])


def test_runs_are_merged_and_the_last_is_open():
    up = {"1": _entry(16, 1), "64": _entry(64, 2)}
    down = {"1": _entry(32, 1), "64": _entry(64, 2)}
    assert block_m_mismatches(up, down) == [{"m_from": 1, "m_to": 32, "up_key": 1, "down_key": 1, "up_block_m": 16,
                                             "down_block_m": 32}]
    down["64"] = _entry(128, 2)
    found = block_m_mismatches(up, down)
    assert found[-1]["m_to"] is None and found[-1]["up_key"] == 64
    text = describe(found, "0.5.23")
    assert "M=1..32" in text and "M=33.." in text and "never measured" in text
    assert "dies" in describe(found, "0.5.8")
    assert block_m_mismatches({}, down) == [] and block_m_mismatches({"1": {}}, down) == []
