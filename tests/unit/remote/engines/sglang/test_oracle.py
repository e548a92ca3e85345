"""The real code of SGLang releases is the judge of orch's config-lookup rules.

For every release of :data:`tests.sglang_loader.ORACLE_RELEASES`, the release's own lookup
module (``get_config_file_name``, ``get_moe_configs``, ``try_get_optimal_moe_config``) runs
unchanged from its wheel, on a stand-in tree (``tests/testbed/standin_tree.py``: GPU name,
Triton version and the deterministic flag are the only stand-ins it reads), and orch must agree:

* file names: ``remote.engines.sglang.naming.config_file_name`` for every selector combination the release has,
  and the dtype selector precedence of ``get_config_dtype_str``;
* the folder search: ``remote.engines.sglang.lookup.find_sglang`` / ``loader_rules`` / ``simulate_lookup`` on
  folder trees built here (exact Triton folder, fallback order, unparsable folders, missing
  root, ``SGLANG_MOE_CONFIG_DIR``, ``_down`` files);
* the log lines: every line the release logs for a lookup parses with
  ``remote.engines.sglang.moe_log`` to the file, role and action that really happened, and the
  wording is the one recorded in ``tests/unit/facts/test_moe_log.py``;
* the config files the release ships pass ``remote.engines.triton_moe.configfile``'s validator.

A release that cannot be fetched fails the test (CI has network to PyPI; the wheels are cached).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from remote.engines.sglang.moe_log import parse_line, parse_moe_log, verify_loaded
from remote.engines.sglang import naming
from remote.engines.sglang import lookup as rprobe
from remote.engines.triton_moe.configfile import load_config_file
from tests.sglang_loader import ORACLE_RELEASES, ReleaseLoader, release_loader
from tests.sglang_releases import source_tree
from tests.unit.facts.test_moe_log import RELEASE_WORDING, WORDING_LINES
from tests.testbed import standin_tree
from tests.paths import REPO as _REPO

REPO = _REPO
DOC = REPO / "docs" / "sglang-releases.md"
E, N, K, TOPK = 8, 64, 128, 2
TRITON = "3.6.0"
TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "num_warps": 4, "num_stages": 3}


@pytest.fixture(params=ORACLE_RELEASES)
def rel(request, tmp_path) -> ReleaseLoader:
    with release_loader(request.param, tmp_path, triton_version=TRITON) as loader:
        yield loader


def rules_of(rel: ReleaseLoader) -> dict:
    return rprobe.loader_rules((rel.tree / rel.module_path).read_text())


def kwargs_supported(fn, **kw) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


# ------------------------------------------------------------------------------ the module itself
def test_probe_finds_the_module_and_reads_its_rules(rel):
    """find_sglang locates the release's lookup module and layout; loader_rules agrees with the
    real signatures and with what the release's kernel code asks for."""
    m = rel.module
    sg = rprobe.find_sglang(None)
    assert sg["version"] == rel.version
    assert sg["loader_module"] == os.path.realpath(rel.tree / rel.module_path)
    assert sg["layout"] == standin_tree.layout_of(rel.version)
    assert sg["configs_root"] == str(rel.configs)
    rules = rules_of(rel)
    assert sg["loader_rules"] == rules and rules is not None
    name_params = inspect.signature(m.get_config_file_name).parameters
    assert ("per_channel_quant" in rules["name_selectors"]) == ("per_channel_quant" in name_params)
    assert ("down" in rules["name_selectors"]) == ("down_moe" in name_params)
    assert rules["reads_down"] == ("down_moe" in inspect.signature(m.get_moe_configs).parameters)
    assert rules["reads_down"] == ("return_down_config" in inspect.signature(m.try_get_optimal_moe_config).parameters)
    # the fused MoE of the release asks for the down config exactly when the rules say it reads one
    callers = [p for p in source_tree(rel.version).joinpath("sglang/srt/layers/moe").rglob("fused_moe.py")
               if "return_down_config=True" in p.read_text()]
    assert bool(callers) == rules["reads_down"], callers


# ------------------------------------------------------------------------------------ file names
DEVICES = ("NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA A100-SXM4-80GB",
           "NVIDIA H100 80GB HBM3")
BLOCKS = (None, [], [0, 0], [128, 128], [0, 128], [128, 0], [64, 128])


def test_file_names_match_for_every_selector(rel, monkeypatch):
    f = rel.module.get_config_file_name
    params = inspect.signature(f).parameters
    pcs = (False, True) if "per_channel_quant" in params else (False,)
    downs = (False, True) if "down_moe" in params else (False,)
    n = 0
    for dev in DEVICES:
        monkeypatch.setenv("ORCH_STANDIN_GPU_NAME", dev)
        for dtype in (None,) + naming.DTYPE_SELECTORS:
            for block in BLOCKS:
                for pc in pcs:
                    for down in downs:
                        real = f(257, 256, dtype, block, **kwargs_supported(f, per_channel_quant=pc, down_moe=down))
                        ours = naming.config_file_name(257, 256, naming.sglang_device_name(dev), dtype, block,
                                                       per_channel_quant=pc, down=down)
                        assert real == ours, (dev, dtype, block, pc, down)
                        n += 1
    assert n >= len(DEVICES) * 6 * len(BLOCKS)


def test_dtype_selector_precedence(rel):
    """get_config_dtype_str picks the first selector of naming.DTYPE_SELECTORS whose flag is set."""
    import torch

    flags = {"fp8_w8a8": "use_fp8_w8a8", "int8_w8a8": "use_int8_w8a8", "int4_w4a16": "use_int4_w4a16",
             "int8_w8a16": "use_int8_w8a16"}
    for mask in range(16):
        on = [sel for i, sel in enumerate(flags) if mask >> i & 1]
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            got = rel.module.get_config_dtype_str(dt, **{flags[s]: True for s in on})
            want = next((s for s in naming.DTYPE_SELECTORS if s in on), "float32" if dt == torch.float32 else None)
            assert got == want, (on, dt)
    assert naming.DTYPE_SELECTORS[-1] == "float32"


# -------------------------------------------------------------------------------- folder search
EXACT = "@exact"
UP_SCENARIOS = {
    "nothing": {},
    "exact": {"files": [EXACT]},
    "exact_and_others": {"files": [EXACT, "triton_3_1_0", "triton_3_8_0"]},
    "only_3_1_0": {"files": ["triton_3_1_0"]},
    "fixed_list_order": {"files": ["triton_3_2_0", "triton_3_3_1"]},
    "only_3_4_0": {"files": ["triton_3_4_0"]},
    "only_3_5_1": {"files": ["triton_3_5_1"]},
    "numeric_not_text_order": {"files": ["triton_3_4_0", "triton_3_10_0"]},
    "newer_than_installed": {"files": ["triton_3_8_0", "triton_3_1_0"]},
    "two_part_folder": {"files": ["triton_3_7"]},
    "unparsable_folder": {"files": ["triton_3_1_0"], "dirs": ["triton_foo"]},
    "unparsable_rc_folder": {"files": ["triton_3_2_0"], "dirs": ["triton_3_6_0rc1"]},
    "unparsable_but_exact": {"files": [EXACT], "dirs": ["triton_latest"]},
    "no_configs_root": {"no_root": True},
    "plain_file_named_like_a_folder": {"files": ["triton_3_1_0"], "plain": ["triton_3_9_0"]},
    "dotted_folder_name": {"files": ["triton_3.5.1"]},
    "local_version_triton": {"files": ["triton_3_6_0"], "triton": "3.6.0+git1a2b"},
    "installed_is_in_fixed_list": {"files": ["triton_3_3_1", "triton_3_2_0"], "triton": "3.3.1"},
    "installed_in_list_but_missing": {"files": ["triton_3_2_0"], "triton": "3.3.1"},
}


def put_files(root: Path, folders: list[str], file_name: str, base_marker: int,
              triton: str = TRITON) -> dict[int, str]:
    """Write ``file_name`` into each of ``folders`` under ``root`` (``@exact``: the installed
    Triton's folder); each is a one-entry config whose batch-size key and GROUP_SIZE_M are its
    marker (``base_marker``, +1, ...). Returns ``{marker: path}``."""
    written = {}
    for i, folder in enumerate(folders):
        folder = naming.sglang_version_dir(triton) if folder == EXACT else folder
        marker = base_marker + i
        (root / folder).mkdir(parents=True, exist_ok=True)
        path = root / folder / file_name
        path.write_text(json.dumps({str(marker): dict(TILE, GROUP_SIZE_M=marker)}))
        written[marker] = str(path)
    return written


def build(root: Path, spec: dict, file_name: str, base_marker: int) -> dict[int, str]:
    """Empty ``root`` and lay out ``spec`` (files, dirs, plain files, no_root) under it."""
    shutil.rmtree(root, ignore_errors=True)
    if spec.get("no_root"):
        return {}
    root.mkdir(parents=True)
    for d in spec.get("dirs", []):
        (root / d).mkdir()
    for p in spec.get("plain", []):
        (root / p).write_text("not a folder\n")
    return put_files(root, spec.get("files", []), file_name, base_marker, spec.get("triton", TRITON))


def marker_of(configs) -> int | None:
    if configs is None:
        return None
    (key,) = configs
    return key


@pytest.mark.parametrize("scenario", sorted(UP_SCENARIOS))
def test_up_lookup_and_its_log_line(rel, scenario):
    spec = UP_SCENARIOS[scenario]
    triton = spec.get("triton", TRITON)
    rel.set_triton(triton)
    name = rel.module.get_config_file_name(E, N, None)
    written = build(rel.configs, spec, name, 100)
    rules = rules_of(rel)
    exact = os.path.join(str(rel.configs), naming.sglang_version_dir(triton), name)
    sim = rprobe.simulate_lookup(str(rel.configs), naming.sglang_version_dir(triton), name, rules)
    try:
        got = rel.module.get_moe_configs(E, N, None)
    except (ValueError, FileNotFoundError) as exc:
        assert sim["would_load"] is None and sim["fallback_error"], (scenario, exc, sim)
        assert type(exc).__name__ in sim["fallback_error"], (exc, sim)
        return
    assert sim["fallback_error"] is None, (scenario, sim)
    loaded = written.get(marker_of(got))
    assert sim["would_load"] == loaded, (scenario, sim, loaded)
    # the one line this lookup logged, parsed
    lines = rel.lines()
    assert len(lines) == 1, lines
    ln = parse_line(lines[0])
    assert ln is not None and ln.role == "up" and ln.wanted == exact, (lines, ln)
    if loaded is None:
        assert ln.action == "default" and ln.used is None
    elif loaded == exact:
        assert (ln.action, ln.used) == ("loaded", loaded)
    else:
        folder = os.path.basename(os.path.dirname(loaded))
        assert (ln.action, ln.used) == ("fallback", loaded)
        assert "triton_" + ln.triton_version.replace(".", "_") == folder


def test_moe_config_dir_where_the_release_reads_it(rel, tmp_path, monkeypatch):
    """With SGLANG_MOE_CONFIG_DIR set, find_sglang's configs root is the one the release reads."""
    name = rel.module.get_config_file_name(E, N, None)
    shipped = build(rel.configs, {"files": [EXACT]}, name, 100)
    override = tmp_path / "override"
    mine = build(override / "configs", {"files": [EXACT]}, name, 200)
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(override))
    sg = rprobe.find_sglang(str(override))
    sim = rprobe.simulate_lookup(sg["configs_root"], naming.sglang_version_dir(TRITON), name, sg["loader_rules"])
    loaded = {**shipped, **mine}[marker_of(rel.module.get_moe_configs(E, N, None))]
    assert sim["would_load"] == loaded
    assert (loaded in mine.values()) == sg["loader_rules"]["config_dir_env"]


DOWN_SCENARIOS = {  # up folders, down folders, what the start ran (MoeLogReport.overall)
    "both_exact": ([EXACT], [EXACT], "loaded"),
    "down_missing": ([EXACT], [], "fallback"),
    "neither": ([], [], "default"),  # issue 11: 0.5.8 logged down_moe=False and doctor said restart-needed
    "down_only": ([], [EXACT], "fallback"),
    "down_in_other_folder": ([EXACT], ["triton_3_1_0"], "fallback"),
    "up_fallback_down_missing": (["triton_3_1_0"], [], "fallback"),
}


@pytest.mark.parametrize("scenario", sorted(DOWN_SCENARIOS))
def test_down_lookup_and_its_log_lines(rel, scenario):
    """What the down GEMM runs (the _down file, else the up GEMM's config: ``down_config or
    config`` in every release's fused_moe.py) agrees with orch's simulation and log model."""
    up_folders, down_folders, overall = DOWN_SCENARIOS[scenario]
    m = rel.module
    rules = rules_of(rel)
    up_name = m.get_config_file_name(E, N, None)
    root = rel.configs
    up = build(root, {"files": up_folders}, up_name, 100)
    args = ((E, 2 * N, K), (E, K, N), TOPK, None, 1)
    exact = naming.sglang_version_dir(TRITON)
    sim_up = rprobe.simulate_lookup(str(root), exact, up_name, rules)
    if not rules["reads_down"]:  # such a release never looks for a _down file, even one that is there
        put_files(root, down_folders, naming.config_file_name(E, N, "NVIDIA_H200", down=True), 300)
        config = m.try_get_optimal_moe_config(*args)
        assert up.get(config["GROUP_SIZE_M"]) == sim_up["would_load"]
        assert [parse_line(x).role for x in rel.lines()] == ["up"], rel.lines()
        return
    down_name = m.get_config_file_name(E, N, None, down_moe=True)
    down = put_files(root, down_folders, down_name, 300)
    rel.reset()
    config, (down_config, _) = m.try_get_optimal_moe_config(*args, return_down_config=True)
    sim_down = rprobe.simulate_lookup(str(root), exact, down_name, rules)
    files = {**up, **down}

    def source(cfg) -> str | None:
        return files.get(cfg["GROUP_SIZE_M"])

    assert source(config) == sim_up["would_load"]
    assert source(down_config or config) == (sim_down["would_load"] or sim_up["would_load"])
    rep = parse_moe_log("\n".join(rel.lines()))
    assert len(rep.lines) == len(rel.lines()) == 2, rel.lines()
    up_line, down_line = rep.lines
    assert (up_line.role, down_line.role) == ("up", "down")
    assert down_line.wanted == os.path.join(str(root), exact, down_name)
    if sim_down["would_load"]:
        assert down_line.used == sim_down["would_load"]
        assert down_line.action == ("loaded" if down_line.used == down_line.wanted else "fallback")
    else:
        assert down_line.action == "reuse_up" and down_line.used is None
    assert rep.overall == overall
    assert (verify_loaded(rep, [up_line.wanted, down_line.wanted]) == []) == (overall == "loaded")


def test_deterministic_inference_line(rel, monkeypatch):
    """Releases with --enable-deterministic-inference log one line per lookup and read no file."""
    source = (rel.tree / rel.module_path).read_text()
    if "enable_deterministic_inference" not in source:
        assert rel.version in ("0.4.10.post2", "0.5.0rc2", "0.5.2", "0.5.3", "0.5.4")
        return
    name = rel.module.get_config_file_name(E, N, None)
    build(rel.configs, {"files": [EXACT]}, name, 100)
    monkeypatch.setenv("ORCH_STANDIN_DETERMINISTIC", "1")
    assert rel.module.get_moe_configs(E, N, None) is None
    (line,) = rel.lines()
    ln = parse_line(line)
    assert (ln.role, ln.action, ln.wanted, ln.wording) == (None, "default", None, "deterministic")
    rep = parse_moe_log(line)
    assert rep.overall == "default" and verify_loaded(rep, [str(rel.configs / name)])


# ------------------------------------------------------------------------------ recorded wording
def outcome_lines(rel: ReleaseLoader) -> dict[str, str]:
    """The line of each lookup outcome this release logs, paths as ``<configs>/...``."""
    m = rel.module
    rules = rules_of(rel)
    up = m.get_config_file_name(E, N, None)
    out = {}

    def run(key, up_folders, down_folders=None):
        build(rel.configs, {"files": up_folders}, up, 100)
        if down_folders is not None:
            put_files(rel.configs, down_folders, m.get_config_file_name(E, N, None, down_moe=True), 300)
        rel.reset()
        m.get_moe_configs(E, N, None)
        if down_folders is not None:
            m.get_moe_configs(E, N, None, down_moe=True)
        out[key] = rel.lines()[-1].replace(str(rel.configs), "<configs>")

    run("found", [EXACT])
    run("fallback", ["triton_3_1_0"])
    run("default", [])
    if rules["reads_down"]:
        run("down_missing_up_found", [EXACT], [])
        run("down_missing_up_missing", [], [])
        run("down_found", [EXACT], [EXACT])
    return out


def test_recorded_wording_is_the_release_wording(rel):
    """tests/unit/facts/test_moe_log.py keeps each release's real lines as cases; they must be what the
    release logs today, and the doc table's last column must name the same wording."""
    assert outcome_lines(rel) == WORDING_LINES[RELEASE_WORDING[rel.version]]


# ----------------------------------------------------------------------------------- shipped files
@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_every_shipped_config_passes_the_validator(version):
    root = source_tree(version) / standin_tree.lookup_module_path(version).rsplit("/", 1)[0] / "configs"
    files = sorted(root.glob("triton_*/*.json"))
    assert len(files) > 100, root
    for f in files:
        load_config_file(f)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_every_shipped_device_name_is_in_torchs_form(version):
    """The device names of a release's shipped files are torch's names of real GPUs (spaces as
    ``_``): orch's torch-form check (``orch config-names``, ``orch_device_name``) flags none of them."""
    root = source_tree(version) / standin_tree.lookup_module_path(version).rsplit("/", 1)[0] / "configs"
    names = {naming.parse_config_file_name(f.name)["device_name"] for f in root.glob("triton_*/*.json")
             if naming.parse_config_file_name(f.name)} - {""}  # 0.5.11-0.5.16 ship an int4 file for an empty name
    assert len(names) > 3, names
    assert {n: naming.torch_form_hint(n) for n in names if naming.torch_form_hint(n)} == {}


def test_issue_11_shipped_files_are_accepted():
    """The 8 files of SGLang 0.5.23 that orch refused: entries without num_warps/num_stages, num_ctas."""
    root = source_tree("0.5.23") / standin_tree.CURRENT_LOADER_DIR / "configs"
    cfg = load_config_file(root / "triton_3_7_1" / "E=256,N=512,device_name=NVIDIA_H200_down.json")
    assert "num_warps" not in cfg["256"] and "num_stages" not in cfg["256"]
    cfg = load_config_file(root / "triton_3_1_0" / "E=8,N=3584,device_name=NVIDIA_L40S.json")
    assert any("num_ctas" in e for e in cfg.values())


# ------------------------------------------------------------------------------- the release table
def doc_table() -> dict[str, dict[str, str]]:
    """Rows of the supported-releases table in docs/sglang-releases.md: ``{release: {column: cell}}``."""
    text = DOC.read_text()
    section = text.split("## Supported releases", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    out = {}
    for ln in rows[2:]:
        cells = [c.strip().strip("`") for c in ln.strip("|").split("|")]
        out[cells[0]] = dict(zip(head, cells))
    return out


def table_row(rel: ReleaseLoader) -> dict[str, str]:
    """The table row of a release, computed from its real code."""
    rules = rules_of(rel)
    lines = outcome_lines(rel)
    missing = parse_line(lines["down_missing_up_found"].replace("<configs>", "/c")) if rules["reads_down"] else None
    return {
        "Release": rel.version,
        "Lookup module": rel.module_path.removeprefix("sglang/srt/layers/moe/"),
        "File-name selectors": ", ".join(rules["name_selectors"]),
        "Fallback": ("scan" if rules["fallback"] == "scan" else "list " + " ".join(rules["fallback_versions"])),
        "SGLANG_MOE_CONFIG_DIR": "yes" if rules["config_dir_env"] else "no",
        "Reads _down": "yes" if rules["reads_down"] else "no",
        "Missing _down logs": missing.wording if missing else "-",
    }


def test_release_rules_table_is_what_each_release_reads(rel):
    """``lookup.RELEASE_RULES`` (what a probe falls back to when a host's loader cannot be read) holds
    each release's module and the rules its real loader gives."""
    release, module, rules = next(r for r in rprobe.RELEASE_RULES if r[0] == rel.version)
    assert (module, rules) == (rel.module_path.removeprefix("sglang/srt/layers/moe/"), rules_of(rel))


def test_release_rules_table_lists_exactly_the_covered_releases_in_order():
    assert [r[0] for r in rprobe.RELEASE_RULES] == list(ORACLE_RELEASES)
    assert [rprobe.version_key(v) for v in ORACLE_RELEASES] == sorted(rprobe.version_key(v) for v in ORACLE_RELEASES)


def test_doc_table_lists_exactly_the_covered_releases():
    assert list(doc_table()) == list(ORACLE_RELEASES)


def test_doc_table_row_is_what_the_release_does(rel):
    assert doc_table()[rel.version] == table_row(rel)


def test_doc_names_each_wording_as_the_parser_does():
    """Every wording id in the table is one the log model knows."""
    text = DOC.read_text()
    for wording in {row["Missing _down logs"] for row in doc_table().values()} - {"-"}:
        assert f"`{wording}`" in text
    assert re.search(r"tests/unit/remote/engines/sglang/test_oracle\.py", text)
