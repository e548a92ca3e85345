"""The real SGLang releases are the judge of ``remote.engines.sglang.config_root`` (issue 32 row 12).

For every covered release its own ``get_moe_configs`` runs unchanged (``tests/sglang_loader.py``):

* a configs root holding an unparsable ``triton_*`` entry (``triton_3_6_0.bak`` as a folder and as a
  plain file): with the exact file there the lookup reads it (``not-loaded``); without it a scanning
  release raises ValueError (``will-crash``) and a fixed-list release falls back without listing;
* ``SGLANG_MOE_CONFIG_DIR`` set but empty, or relative: the release that reads the variable looks in
  ``configs`` under its working directory (the path ``relative_config_dir`` names), and on a miss
  raises FileNotFoundError where that folder does not exist and the release lists the root.
"""

from __future__ import annotations

import json
import os

import pytest

from remote.engines.sglang import naming
from remote.engines.sglang.config_root import entry_states, relative_config_dir
from remote.engines.sglang.lookup import loader_rules
from tests.sglang_loader import ORACLE_RELEASES, release_loader

TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
EXACT = naming.sglang_version_dir("3.6.0")


@pytest.fixture(params=ORACLE_RELEASES)
def rel(request, tmp_path):
    with release_loader(request.param, tmp_path, triton_version="3.6.0") as loader:
        yield loader


def _rules(rel) -> dict:
    return loader_rules((rel.tree / rel.module_path).read_text())


@pytest.mark.parametrize("kind", ["folder", "file"])
@pytest.mark.parametrize("exact", [True, False])
def test_unparsable_entry_crashes_only_a_scanning_release_on_a_miss(rel, kind, exact):
    name = rel.module.get_config_file_name(8, 64, None)
    root = rel.configs
    (root / "triton_3_1_0").mkdir(parents=True, exist_ok=True)
    if exact:
        (root / EXACT).mkdir(exist_ok=True)
        (root / EXACT / name).write_text(json.dumps({"1": TILE}))
    bak = root / "triton_3_6_0.bak"
    bak.mkdir() if kind == "folder" else bak.write_text("{}")
    unparsable = naming.unparsable_triton_folders(sorted(os.listdir(root)))
    assert unparsable == ["triton_3_6_0.bak"]
    (state,) = entry_states(str(root), unparsable, {"up": not exact}, _rules(rel))
    assert state["path"] == str(bak)
    try:
        rel.module.get_moe_configs(8, 64, None)
        crashed = False
    except ValueError:
        crashed = True
    assert crashed == (state["state"] == "will-crash"), (rel.version, state)
    assert crashed == (not exact and _rules(rel)["fallback"] == "scan")


@pytest.mark.parametrize("value", ["", "moe"])
@pytest.mark.parametrize("present", [True, False])
def test_empty_or_relative_config_dir_resolves_against_the_working_directory(rel, tmp_path, monkeypatch, value,
                                                                            present):
    name = rel.module.get_config_file_name(8, 64, None)
    (rel.configs / EXACT).mkdir(parents=True, exist_ok=True)
    (rel.configs / EXACT / name).write_text(json.dumps({"2": TILE}))  # SGLang's own folder: key 2
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    rules = _rules(rel)
    found = relative_config_dir({"SGLANG_MOE_CONFIG_DIR": value}, rules, str(cwd))
    assert (found is not None) == rules["config_dir_env"], rel.version
    if found is None:
        return
    assert found["configs_root"] == os.path.normpath(os.path.join(cwd, value, "configs"))
    if present:
        folder = os.path.join(found["configs_root"], EXACT)
        os.makedirs(folder)
        with open(os.path.join(folder, name), "w") as f:
            json.dump({"7": TILE}, f)  # the working directory's: key 7
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", value)
    try:
        got = rel.module.get_moe_configs(8, 64, None)
    except FileNotFoundError:
        assert not present and rules["fallback"] == "scan", rel.version
        return
    assert got == ({7: TILE} if present else None), rel.version  # never SGLang's own folder
    if present:
        assert any(f"Using MoE kernel config from {os.path.join(value, 'configs', EXACT, name)}." in ln
                   for ln in rel.lines()), rel.lines()


def test_absolute_or_unset_variable_is_no_problem():
    rules = {"config_dir_env": True, "fallback": "scan"}
    assert relative_config_dir({}, rules, "/root") is None
    assert relative_config_dir({"SGLANG_MOE_CONFIG_DIR": "/srv/moe"}, rules, "/root") is None
    assert relative_config_dir({"SGLANG_MOE_CONFIG_DIR": ""}, dict(rules, config_dir_env=False), "/root") is None
    assert relative_config_dir({"SGLANG_MOE_CONFIG_DIR": ""}, rules, "")["configs_root"] == "/configs"
    assert "set but empty" in relative_config_dir({"SGLANG_MOE_CONFIG_DIR": ""}, rules, "/root")["why"]
