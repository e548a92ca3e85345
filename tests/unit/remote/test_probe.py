"""The ``probe`` command run as a subprocess against fake SGLang trees (no GPU).

A fake ``sglang`` package whose ``__init__`` raises proves that probe finds it on disk
without importing it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from tests.paths import DATA, REPO as _REPO
from tests.waiting import run_watched

REPO = _REPO
MODELS = DATA / "models"
QWEN = MODELS / "Qwen3-30B-A3B.json"
UP = "E=128,N=768,device_name=NVIDIA_H200.json"
DOWN = "E=128,N=768,device_name=NVIDIA_H200_down.json"
CURRENT = ("srt", "layers", "moe", "moe_runner", "triton_utils")
OLD = ("srt", "layers", "moe", "fused_moe_triton")


def installed_triton_folder() -> str:
    """The folder for this machine's Triton, computed here from the environment."""
    import triton

    v = triton.__version__
    assert all(p.isdigit() for p in v.split(".")), f"test assumes a release Triton, got {v}"
    return "triton_" + "_".join(v.split("."))


def make_sglang(site: Path, layouts: tuple[tuple[str, ...], ...], version: str | None = "0.5.23") -> dict[tuple, Path]:
    """A fake ``sglang`` package (its loader modules unreadable as a release's: a vendored build);
    ``version``: its distribution's version (None: no metadata, as a source checkout on sys.path)."""
    pkg = site / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import pathlib, os\n"
        "pathlib.Path(os.environ['SGLANG_IMPORT_MARKER']).write_text('imported')\n"
        "raise RuntimeError('fake sglang must not be imported by probe')\n")
    if version is not None:
        dist = site / f"sglang-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    configs = {}
    for lay in layouts:
        d = pkg.joinpath(*lay)
        d.mkdir(parents=True)
        (d / "fused_moe_triton_config.py").write_text("raise RuntimeError('not to be imported')\n")
        (d / "configs").mkdir()
        configs[lay] = d / "configs"
    return configs


def put(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_text("{}\n")


def probe(tmp_path: Path, site: Path | None, *flags: str) -> tuple[int, dict]:
    marker = tmp_path / "imported.marker"
    pp = os.pathsep.join(([str(site)] if site else []) + [str(REPO)])
    env = {**os.environ, "PYTHONPATH": pp, "SGLANG_IMPORT_MARKER": str(marker), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("SGLANG_MOE_CONFIG_DIR", None)
    r = run_watched([sys.executable, "-m", "remote", "probe", *flags], cwd=tmp_path, env=env)
    assert not marker.exists(), "probe imported sglang"
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert lines and all(x["proto"] == 1 for x in lines), r.stdout + r.stderr
    return r.returncode, lines[-1]


def test_current_layout_fallback_folder_and_install_dir(tmp_path):
    site = tmp_path / "site"
    cfgs = make_sglang(site, (CURRENT,))
    root = cfgs[CURRENT]
    put(root / "triton_3_1_0", UP)
    put(root / "triton_3_2_0", UP, DOWN)
    (root / "README.md").write_text("not a folder of configs")
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200")
    assert rc == 0 and last["type"] == "result", last
    d = last["data"]
    tf = installed_triton_folder()
    assert d["gpus"] == [] and d["device_name"] == "NVIDIA_H200"
    assert d["triton_folder"] == tf and d["exact_folder"] == tf
    sg = d["engine"]
    assert sg["installed"] and sg["version"] == "0.5.23" and sg["layout"] == "current"
    assert sg["package_dir"] == str(site / "sglang")
    assert sg["loader_module"] == os.path.realpath(site.joinpath("sglang", *CURRENT, "fused_moe_triton_config.py"))
    assert sg["configs_root"] == os.path.realpath(root) and sg["other_layout_configs_root"] is None
    assert d["file_names"] == {"up": UP, "down": DOWN}
    assert d["install_dir"] == os.path.join(os.path.realpath(root), tf)
    assert d["install_dir_exists"] is False
    assert d["model"]["E"] == 128 and d["model"]["N"] == 768
    up, down = d["existing"]["up"], d["existing"]["down"]
    assert up["folders"] == ["triton_3_2_0", "triton_3_1_0"] and up["in_installed_folder"] is False
    assert up["would_load"] == os.path.join(os.path.realpath(root), "triton_3_2_0", UP)
    assert down["folders"] == ["triton_3_2_0"]
    assert d["unparsable_folders"] == []


def test_file_in_installed_folder_is_exact_hit(tmp_path):
    site = tmp_path / "site"
    root = make_sglang(site, (CURRENT,))[CURRENT]
    tf = installed_triton_folder()
    put(root / tf, UP)
    put(root / "triton_99_0_0", UP)  # newer folder: only reached when the exact file is missing
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200")
    d = last["data"]
    assert d["install_dir_exists"] is True
    assert d["existing"]["up"]["in_installed_folder"] is True
    assert d["existing"]["up"]["folders"] == ["triton_99_0_0", tf]
    assert d["existing"]["up"]["would_load"] == os.path.join(os.path.realpath(root), tf, UP)
    assert d["existing"]["down"]["in_installed_folder"] is False
    assert d["existing"]["down"]["would_load"] is None


def test_both_layouts_reports_the_stale_one(tmp_path):
    site = tmp_path / "site"
    cfgs = make_sglang(site, (CURRENT, OLD))
    put(cfgs[OLD] / "triton_3_1_0", UP)
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200")
    sg = last["data"]["engine"]
    assert sg["layout"] == "current"
    assert sg["configs_root"] == os.path.realpath(cfgs[CURRENT])
    assert sg["other_layout_configs_root"] == os.path.realpath(cfgs[OLD])
    # the old layout's file is not visible to this SGLang
    assert last["data"]["existing"]["up"]["folders"] == []
    assert any("another SGLang layout" in w for w in last["data"]["warnings"])


def test_old_layout_only(tmp_path):
    site = tmp_path / "site"
    cfgs = make_sglang(site, (OLD,), version="0.4.6")
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200")
    sg = last["data"]["engine"]
    assert (sg["layout"], sg["version"]) == ("old", "0.4.6")
    assert sg["configs_root"] == os.path.realpath(cfgs[OLD])
    assert sg["loader_module"].endswith(os.path.join("fused_moe_triton", "fused_moe_triton_config.py"))


def test_moe_config_dir_replaces_the_base(tmp_path):
    site = tmp_path / "site"
    cfgs = make_sglang(site, (CURRENT,))
    put(cfgs[CURRENT] / "triton_3_2_0", UP)  # shipped file: ignored when the env var is set
    custom = tmp_path / "custom"
    put(custom / "configs" / "triton_3_3_0", DOWN)
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200",
                     "--moe-config-dir", str(custom))
    d = last["data"]
    assert d["engine"]["configs_root"] == str(custom / "configs")
    assert d["engine"]["shipped_configs_root"] == os.path.realpath(cfgs[CURRENT])
    assert d["install_dir"] == str(custom / "configs" / installed_triton_folder())
    assert d["existing"]["up"]["folders"] == [] and d["existing"]["down"]["folders"] == ["triton_3_3_0"]


def test_missing_moe_config_dir_reports_sglang_crash(tmp_path):
    rc, last = probe(tmp_path, None, "--model-config", str(QWEN), "--device-name", "NVIDIA H200",
                     "--moe-config-dir", str(tmp_path / "nowhere"))
    d = last["data"]
    assert rc == 0 and d["engine"]["installed"] is False
    assert d["engine"]["configs_root_exists"] is False
    assert "FileNotFoundError" in d["existing"]["up"]["fallback_error"]


def test_unparsable_folder_reported(tmp_path):
    site = tmp_path / "site"
    root = make_sglang(site, (CURRENT,))[CURRENT]
    put(root / "triton_3_2_0", UP)
    put(root / "triton_3_4_0+git", "other.json")
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200")
    d = last["data"]
    assert d["unparsable_folders"] == ["triton_3_4_0+git"]
    assert d["existing"]["up"]["would_load"] is None
    assert "ValueError" in d["existing"]["up"]["fallback_error"]


def test_without_gpu_device_name_is_required(tmp_path):
    rc, last = probe(tmp_path, None, "--model-config", str(QWEN))
    assert rc == 2 and last["type"] == "error" and last["kind"] == "bad_input"
    assert "--device-name" in last["msg"]


@pytest.mark.parametrize("bad", ["../../etc"])
def test_hostile_device_name_refused(tmp_path, bad):
    rc, last = probe(tmp_path, None, "--model-config", str(QWEN), "--device-name", bad)
    assert rc == 2 and last["kind"] == "bad_input"


# ------------------------------------------------- which kernel `tune --provider auto` times

ENTRY = ("srt", "layers", "moe", "fused_moe_triton")  # the package of SGLang's fused-MoE entry


def test_tuner_provider_auto_is_builtin_without_sglangs_entry(tmp_path):
    rc, last = probe(tmp_path, None, "--device-name", "NVIDIA H200")
    assert rc == 0 and last["data"]["tuner_provider"] == {
        "auto": "builtin", "reason": "sglang is not installed for this interpreter"}
    # installed (current layout) but without fused_moe_triton/: still builtin, and sglang not imported
    site = tmp_path / "site"
    make_sglang(site, (CURRENT,))
    rc, last = probe(tmp_path, site, "--device-name", "NVIDIA H200")
    tp = last["data"]["tuner_provider"]
    assert last["data"]["engine"]["installed"] and tp["auto"] == "builtin"
    assert "sglang.srt.layers.moe.fused_moe_triton" in tp["reason"]


def test_tuner_provider_auto_is_sglang_when_its_entry_is_installed(tmp_path):
    site = tmp_path / "site"
    make_sglang(site, (CURRENT,))
    entry = site.joinpath("sglang", *ENTRY)
    entry.mkdir(parents=True)
    for f in ("__init__.py", "fused_moe.py"):
        (entry / f).write_text("raise RuntimeError('not to be imported')\n")
    rc, last = probe(tmp_path, site, "--device-name", "NVIDIA H200")  # asserts sglang was not imported
    assert rc == 0 and last["data"]["tuner_provider"] == {"auto": "sglang", "reason": None}
    (entry / "fused_moe.py").unlink()
    rc, last = probe(tmp_path, site, "--device-name", "NVIDIA H200")
    assert last["data"]["tuner_provider"]["auto"] == "builtin"
    assert "sglang.srt.layers.moe.fused_moe_triton.fused_moe" in last["data"]["tuner_provider"]["reason"]


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.8", "0.5.23"])
def test_tuner_provider_auto_on_real_sglang_releases(tmp_path, version):
    """Against the source of real releases of the three layouts (0.4.x: one
    ``fused_moe_triton/fused_moe.py``; 0.5.2-0.5.10: ``fused_moe_triton/`` split into modules;
    0.5.16+: ``sglang.kernels.ops.moe`` + ``moe_runner/triton_utils``): ``auto`` is sglang, and
    for every role the first candidate module on disk is one that holds the attribute."""
    from remote.engines.sglang.kernel_roles import SGLANG_KERNEL_ROLES, SGLANG_OPTIONAL_ROLES
    from tests.sglang_releases import source_tree

    tree = source_tree(version)
    rc, last = probe(tmp_path, tree, "--device-name", "NVIDIA H200")
    assert rc == 0 and last["data"]["tuner_provider"] == {"auto": "sglang", "reason": None}, last["data"]
    for role, cands in SGLANG_KERNEL_ROLES.items():
        for module, attr in cands:
            base = tree.joinpath(*module.split("."))
            src = (base / "__init__.py") if base.is_dir() else base.with_name(base.name + ".py")
            if src.is_file():
                assert attr in src.read_text(), (version, role, module, attr)
                break
        else:
            assert role in SGLANG_OPTIONAL_ROLES, f"{version}: no module of role {role}"


def test_release_rules_come_from_its_own_loader(tmp_path):
    """SGLang 0.5.0rc2 (real module, stand-in tree): the loader is fused_moe_triton/fused_moe.py;
    it reads no _down file and ignores SGLANG_MOE_CONFIG_DIR; its fallback is a fixed list."""
    from tests.testbed import standin_tree

    site = tmp_path / "site"
    ldir = standin_tree.make_tree(site, None, "0.5.0rc2")
    tf = installed_triton_folder()
    put(ldir / "configs" / tf, DOWN)  # there, but never read by this release
    put(ldir / "configs" / "triton_3_5_1", UP)  # not in its fallback list
    put(ldir / "configs" / "triton_foo", "x.json")  # harmless without a folder scan
    custom = tmp_path / "custom"
    put(custom / "configs" / tf, UP, DOWN)
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200",
                     "--moe-config-dir", str(custom))
    d = last["data"]
    sg = d["engine"]
    assert rc == 0 and (sg["version"], sg["layout"]) == ("0.5.0rc2", "old")
    assert sg["loader_module"] == str(ldir / "fused_moe.py")
    assert sg["loader_rules"] == {"name_selectors": ["dtype", "block_shape"], "reads_down": False,
                                  "config_dir_env": False, "fallback": "list",
                                  "fallback_versions": ["3.3.1", "3.2.0", "3.1.0"]}
    assert sg["configs_root"] == str(ldir / "configs")
    assert any("does not read it" in w for w in d["warnings"])
    assert not any("break SGLang's fallback" in w for w in d["warnings"])
    up, down = d["existing"]["up"], d["existing"]["down"]
    assert up["folders"] == ["triton_3_5_1"] and up["would_load"] is None and up["fallback_error"] is None
    assert down["in_installed_folder"] is True and down["read_by_engine"] is False
    assert down["would_load"] is None and up["read_by_engine"] is True


def test_fixed_list_release_falls_back_only_to_listed_folders(tmp_path):
    """SGLang 0.5.8 (real module): a file in triton_3_5_1 is never found, one in triton_3_1_0 is."""
    from tests.testbed import standin_tree

    site = tmp_path / "site"
    ldir = standin_tree.make_tree(site, "old")
    put(ldir / "configs" / "triton_3_5_1", UP, DOWN)
    put(ldir / "configs" / "triton_3_1_0", DOWN)
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200")
    d = last["data"]
    assert d["engine"]["version"] == "0.5.8" and d["engine"]["loader_rules"]["reads_down"] is True
    assert d["existing"]["up"]["would_load"] is None
    assert d["existing"]["down"]["would_load"] == str(ldir / "configs" / "triton_3_1_0" / DOWN)
    assert d["existing"]["down"]["folders"] == ["triton_3_5_1", "triton_3_1_0"]


def test_probe_names_an_issue_11_model_and_reports_non_gated_experts(tmp_path):
    """Llama 4 keeps its shared expert out of the routed GEMM (SGLang 0.5.23 models/llama4.py:120, :136);
    Nemotron-H's relu2 experts (models/nemotron_h.py:287 is_gated=False) are not what the tuner times."""
    site = tmp_path / "site"
    make_sglang(site, (CURRENT,))
    rc, last = probe(tmp_path, site, "--model-config", str(MODELS / "Llama-4-Scout-17B-16E.json"), "--tp", "4",
                     "--device-name", "NVIDIA B200")
    assert rc == 0 and last["type"] == "result", last
    d = last["data"]
    assert d["file_names"] == {"up": "E=16,N=2048,device_name=NVIDIA_B200.json",
                               "down": "E=16,N=2048,device_name=NVIDIA_B200_down.json"}
    assert d["model"]["shared_fused"] is False and d["model"]["tuner_unsupported"] is None
    rc, last = probe(tmp_path, site, "--model-config", str(MODELS / "architectures" / "Nemotron-H-MoE.json"),
                     "--tp", "2", "--device-name", "NVIDIA H200")
    assert rc == 0, last
    model = last["data"]["model"]
    assert (model["E"], model["N"], model["gated"]) == (128, 928, False)
    assert "not gated" in model["tuner_unsupported"]


def test_probe_refuses_an_unknown_architecture_by_name(tmp_path):
    site = tmp_path / "site"
    make_sglang(site, (CURRENT,))
    cfg = json.loads(QWEN.read_text())
    cfg["architectures"] = ["BrandNewMoeForCausalLM"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, last = probe(tmp_path, site, "--model-config", str(path), "--device-name", "NVIDIA H200")
    assert rc != 0 and last["type"] == "error" and last["kind"] == "bad_input"
    assert "BrandNewMoeForCausalLM" in last["msg"]


@pytest.mark.parametrize("layout, version, release, reads_down, env", [
    (CURRENT, "0.5.23+vendor.1", "0.5.23", True, True),
    (CURRENT, None, "0.5.11", True, True),
    (OLD, "0.5.4.post1", "0.5.4", False, True),
    (OLD, None, "0.5.2", False, False),
])
def test_unreadable_loader_takes_the_rules_of_what_the_tree_shows(tmp_path, layout, version, release, reads_down, env):
    """A patched or vendored loader whose rules cannot be read: the probe takes the nearest covered
    release at or below the tree's version with its loader module (lookup.RELEASE_RULES), says so,
    and names and plans files by those rules (no _down file where that release reads none)."""
    site = tmp_path / "site"
    cfgs = make_sglang(site, (layout,), version=version)
    custom = tmp_path / "custom"
    (custom / "configs").mkdir(parents=True)
    rc, last = probe(tmp_path, site, "--model-config", str(QWEN), "--device-name", "NVIDIA H200",
                     "--moe-config-dir", str(custom))
    assert rc == 0, last
    d = last["data"]
    sg = d["engine"]
    assert f"using the rules of SGLang {release}," in sg["loader_rules_inferred"]
    assert sg["loader_rules"]["reads_down"] is reads_down and sg["loader_rules"]["config_dir_env"] is env
    assert sg["configs_root"] == (str(custom / "configs") if env else os.path.realpath(cfgs[layout]))
    assert d["existing"]["down"]["read_by_engine"] is reads_down
    assert any("orch proves only the lookups the server's log shows" in w for w in d["warnings"])
