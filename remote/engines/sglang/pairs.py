"""An up file and its ``_down`` file that disagree on BLOCK_SIZE_M at some batch size M (issue 32 row 14).

Both GEMMs of SGLang's fused MoE share one ``moe_align_block_size`` sort, so they must run the same
BLOCK_SIZE_M. ``try_get_optimal_moe_config`` picks, for the tokens M of a call, the up entry whose key
is closest to M (``min(configs.keys(), key=lambda x: abs(x - M))``: the first such key in the file's
order on a tie) and, separately, the down entry closest to M in the down file. When the two
BLOCK_SIZE_M differ, what happens depends on the release (:data:`MISMATCH_RULES`):

* ``assert`` (0.5.5 to 0.5.12): ``assert down_config is None or config["BLOCK_SIZE_M"] ==
  down_config["BLOCK_SIZE_M"]``: the server dies at that M;
* ``override`` (0.5.16 to 0.5.23, ``srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``):
  one warning (``down_moe config BLOCK_SIZE_M=%d does not match up config BLOCK_SIZE_M=%d at M=%d;
  overriding down BLOCK_SIZE_M to match.``) and the down config runs with the up BLOCK_SIZE_M: a
  tile nobody measured.

Releases before 0.5.5 read no ``_down`` file. :func:`block_m_mismatches` finds every M where a pair
disagrees (:func:`mismatch_warning`: ``Engine.pair_mismatch``); ``tests/unit/remote/engines/sglang/test_pairs_oracle.py`` holds it and the table against
each release's own ``try_get_optimal_moe_config``. Standard library only.
"""

from __future__ import annotations

from typing import Any

from .lookup import version_key

#: covered release -> what it does with a mismatched pair (None: it reads no ``_down`` file), oldest first
MISMATCH_RULES: tuple[tuple[str, str | None], ...] = (
    ("0.4.10.post2", None), ("0.5.0rc2", None), ("0.5.2", None), ("0.5.3", None), ("0.5.4", None),
    ("0.5.5", "assert"), ("0.5.6", "assert"), ("0.5.8", "assert"), ("0.5.11", "assert"), ("0.5.12", "assert"),
    ("0.5.16", "override"), ("0.5.23", "override"),
)


def mismatch_rule(sglang_version: str | None) -> tuple[str | None, str]:
    """``(rule, release)``: what SGLang ``sglang_version`` does with a mismatched pair, as the nearest
    covered release at or below it does (:data:`MISMATCH_RULES`; None or an unreadable version: the
    newest). Pure."""
    try:
        key = version_key(sglang_version) if sglang_version else None
    except ValueError:
        key = None
    rows = [r for r in MISMATCH_RULES if key is None or version_key(r[0]) <= key] or [MISMATCH_RULES[0]]
    release, rule = rows[-1]
    return rule, release


def _closest(keys: list[int], m: int) -> int:
    return min(keys, key=lambda x: abs(x - m))  # SGLang's choice: the first closest key in file order


def block_m_mismatches(up: dict[str, Any], down: dict[str, Any]) -> list[dict]:
    """Where the ``up`` and ``down`` config tables (as loaded: batch size key -> entry, in the files'
    order) run different BLOCK_SIZE_M: one ``{"m_from", "m_to", "up_key", "down_key", "up_block_m",
    "down_block_m"}`` per run of consecutive M with the same pair of entries (``m_to`` None: every
    larger M too). Every M from 1 up is covered: past the largest key both choices stay fixed.
    [] when they agree everywhere, or when a table is empty or has an entry without BLOCK_SIZE_M
    (the validator reports those). Pure."""
    try:
        ups = {int(k): v for k, v in up.items()}
        downs = {int(k): v for k, v in down.items()}
        bms = {("u", k): int(v["BLOCK_SIZE_M"]) for k, v in ups.items()}
        bms.update({("d", k): int(v["BLOCK_SIZE_M"]) for k, v in downs.items()})
    except (TypeError, ValueError, KeyError, AttributeError):
        return []
    if not ups or not downs:
        return []
    last = max(max(ups), max(downs)) + 1
    out: list[dict] = []
    for m in range(1, last + 1):
        uk, dk = _closest(list(ups), m), _closest(list(downs), m)
        ub, db = bms[("u", uk)], bms[("d", dk)]
        if ub == db:
            continue
        prev = out[-1] if out else None
        if prev and prev["m_to"] == m - 1 and (prev["up_key"], prev["down_key"]) == (uk, dk):
            prev["m_to"] = m
        else:
            out.append({"m_from": m, "m_to": m, "up_key": uk, "down_key": dk, "up_block_m": ub, "down_block_m": db})
    if out and out[-1]["m_to"] == last:
        out[-1]["m_to"] = None
    return out


def describe(mismatches: list[dict], sglang_version: str | None) -> str:
    """One sentence for :func:`block_m_mismatches`' answer under SGLang ``sglang_version``'s rule. Pure."""
    rule, release = mismatch_rule(sglang_version)
    where = "; ".join(
        f"M={x['m_from']}" + ("" if x["m_to"] == x["m_from"] else f"..{x['m_to'] if x['m_to'] else ''}")
        + f" (up entry {x['up_key']}: {x['up_block_m']}, down entry {x['down_key']}: {x['down_block_m']})"
        for x in mismatches[:4]) + ("; ..." if len(mismatches) > 4 else "")
    head = f"the up and _down files disagree on BLOCK_SIZE_M at {where}: "
    if rule == "assert":
        return head + f"SGLang {release} asserts they match, so the server dies at such a batch size"
    if rule == "override":
        return (head + f"SGLang {release} overrides the down BLOCK_SIZE_M with the up one, so the down config that "
                "runs there was never measured; re-tune to write a matching pair")
    return head + f"SGLang {release} reads no _down file"


def mismatch_warning(up: dict[str, Any], down: dict[str, Any], sglang_version: str | None) -> str | None:
    """:func:`describe` of :func:`block_m_mismatches` of the pair ``up``/``down`` under SGLang
    ``sglang_version``, or None when they agree (or a table is not one :func:`block_m_mismatches`
    reads). Pure."""
    found = block_m_mismatches(dict(up), dict(down))
    return describe(found, sglang_version) if found else None
