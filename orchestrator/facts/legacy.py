"""The names older run records, store entries and inventories used before orch named engines
(2026-12, issue 28), read and never written (but the doctor's row, which keeps them as aliases
for the readers of ``orch doctor --json``): one place, so every other module uses the
engine-neutral names.

Each table maps an old key to its new one; :func:`renamed` applies a table to a mapping read
from disk (a key present under its new name wins). ``tests/test_architecture.py`` allows the
engine's name here (the old keys are spelled after it).
"""

from __future__ import annotations

from typing import Any, Mapping

#: the payload probe's answer (``hosts/<host>/probe.json``, ``orch_probe``)
PROBE_KEYS = {"sglang": "engine", "sglang_exact_folder": "exact_folder"}
#: one ``existing`` entry of the probe's answer
EXISTING_KEYS = {"sglang_would_load": "would_load", "read_by_sglang": "read_by_engine"}
#: a store entry's ``key.json`` (the engine's release; the engine itself was not named)
STORE_KEY_KEYS = {"sglang_version": "engine_version"}
#: the doctor's row of a host (``summary.doctor`` of a run record)
DOCTOR_KEYS = {"sglang_version": "engine_version"}
#: one ``files`` entry of a doctor row
DOCTOR_FILE_KEYS = {"sglang_would_load": "would_load"}
#: inventory variables: old name -> new name (the old one is a documented alias, docs/inventory.md)
VARIABLES = {"orch_sglang_url": "orch_server_url"}
#: the engine every record that names none was written for
LEGACY_ENGINE = "sglang"


def with_old_names(data: dict, table: Mapping[str, str]) -> dict:
    """``data`` (a record about to be shown or written) with each new key of ``table`` also under its
    old name, for readers of the old form (``orch doctor --json`` consumers): aliases, never read
    back by orch."""
    return {**data, **{old: data[new] for old, new in table.items() if new in data}}


def renamed(data: Any, table: Mapping[str, str]) -> Any:
    """``data`` (a mapping read from disk) with the old keys of ``table`` under their new names; a
    key already present under its new name is kept. Anything but a dict is returned as it is."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for old, new in table.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out
