"""orch's vLLM rules held against the real code of vLLM 0.32.0, 0.33.0 and 0.34.0.

The release's ``fused_moe`` module is imported from its own source (``tests/vllm_releases.py``)
with ``tests/vllm_standins.py`` serving the package ``__init__`` files, the platform and the
compiled ops; ``get_config_file_name``, ``get_moe_configs``, ``envs`` and the logger are the
release's own. Where a rule lives in a module that does not import without vLLM's server
(the CLI flags, the backend oracles), the release's file is read with ``ast``.
"""

from __future__ import annotations

import os

# the interpreter before any Triton kernel is defined (vLLM's, and the stand-in activation)
os.environ.setdefault("TRITON_INTERPRET", "1")

import ast
import json
import re
import logging
import os
from pathlib import Path

import pytest

from remote.engines.vllm import lookup, naming, runner
from tests.vllm_releases import ORACLE_RELEASES, source_tree

FM = "vllm/model_executor/layers/fused_moe/fused_moe.py"
DEVICES = ["NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA GH200 480GB",
           "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA H20-3e", "AMD Instinct MI300X"]
CASES = [(128, 768, None, None), (128, 768, "fp8_w8a8", [128, 128]), (256, 256, "fp8_w8a8", [128, 128]),
         (64, 1280, "fp8_w8a8", None), (16, 3072, "int8_w8a16", [0, 128]), (128, 1536, "int4_w4a16", [0, 32]),
         (8, 14336, "float32", None), (32, 2048, "fp8_w8a16", [64, 64])]


@pytest.fixture(scope="module", params=ORACLE_RELEASES)
def release(request):
    """(version, the release's fused_moe module imported from its own source)."""
    from tests import vllm_standins as vs

    fm = vs.fused_moe_module(source_tree(request.param), cpu=True)
    yield request.param, fm
    vs.uninstall()


@pytest.fixture
def gpu(monkeypatch):
    import sys

    def clear_cached_name():
        pu = sys.modules.get("vllm.utils.platform_utils")
        clear = getattr(getattr(pu, "get_device_name_as_file_name", None), "cache_clear", None)
        if clear:  # vLLM caches the device name per process (a server sees one GPU kind)
            clear()

    def set_name(name):
        monkeypatch.setenv("ORCH_STANDIN_GPU_NAME", name)
        clear_cached_name()
    yield set_name
    # the release's modules outlive this test (the release fixture is shared): a later test of the
    # same worker must not read this test's GPU name from vLLM's cache
    clear_cached_name()


@pytest.mark.parametrize("device", DEVICES)
def test_file_names_match_get_config_file_name(release, gpu, device):
    version, fm = release
    gpu(device)
    for E, N, dtype, block in CASES:
        want = fm.get_config_file_name(E, N, dtype, block)
        assert naming.config_file_name(E, N, naming.vllm_device_name(device), dtype, block) == want
        assert naming.parse_config_file_name(want)["E"] == E


def test_every_shipped_file_name_parses(release):
    """Each file the release ships is a name orch's parser reads back (its own rule's output)."""
    version, _ = release
    folder = source_tree(version) / "vllm/model_executor/layers/fused_moe/configs"
    names = [p.name for p in folder.glob("*.json")]
    assert len(names) > 300
    unparsed = [n for n in names if naming.parse_config_file_name(n) is None]
    # the AMD FlyDSL files carry a backend selector that the Triton lookup never builds
    assert all(",backend=" in n for n in unparsed), unparsed


def test_dtype_selector_matches_get_config_dtype_str(release):
    import torch
    version, fm = release
    cfg = __import__("vllm.model_executor.layers.fused_moe.config", fromlist=["x"])
    flags = {"fp8_w8a8": dict(use_fp8_w8a8=True), "fp8_w8a16": dict(use_fp8_w8a16=True),
             "int8_w8a16": dict(use_int8_w8a16=True), "int4_w4a16": dict(use_int4_w4a16=True),
             "int8_w8a8": {}, None: {}}
    for fmt, kw in flags.items():
        for act, tdt in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
            assert naming.dtype_selector(fmt, act) == cfg._get_config_dtype_str(dtype=tdt, **kw), (fmt, act)


def _write(folder: Path, name: str, obj) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(json.dumps(obj))
    return p


def test_lookup_order_log_lines_and_triton_version_key(release, gpu, tmp_path, monkeypatch):
    version, fm = release
    gpu("NVIDIA H200")
    records = []

    class H(logging.Handler):
        def emit(self, r):
            records.append(r)

    log = logging.getLogger(fm.__name__)
    h = H(logging.DEBUG)
    log.addHandler(h)
    log.setLevel(logging.DEBUG)
    try:
        E, N = 3, 7  # a shape no release ships: only our folder can answer
        name = fm.get_config_file_name(E, N, None, None)
        package_dir = str(Path(fm.__file__).resolve().parents[3])
        entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
                 "num_stages": 3}
        # nothing anywhere: the default line at WARNING, listing what was tried
        monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path / "tuned"))
        fm.get_moe_configs.cache_clear()
        assert fm.get_moe_configs(E, N, None) is None
        r = records[-1]
        assert r.levelno == logging.WARNING
        parsed = lookup.parse_line(r.getMessage())
        assert parsed == {"kind": "default", "paths": lookup.search_paths(name, package_dir, str(tmp_path / "tuned"))}
        # the tuned folder: read, "triton_version" dropped, the loaded line at INFO naming the path
        p = _write(tmp_path / "tuned", name, {"triton_version": "3.6.0", "1": entry, "64": entry})
        fm.get_moe_configs.cache_clear()
        got = fm.get_moe_configs(E, N, None)
        assert got == {1: entry, 64: entry}
        r = records[-1]
        assert r.levelno == logging.INFO and lookup.parse_line(r.getMessage()) == {"kind": "loaded", "path": str(p)}
        assert lookup.resolve(name, package_dir, str(tmp_path / "tuned"))["path"] == str(p)
        assert lookup.validate({"triton_version": "3.6.0", "1": entry}, "x", version) == {"1": entry}
        # batch-invariant mode reads nothing
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        fm.get_moe_configs.cache_clear()
        assert fm.get_moe_configs(E, N, None) is None
        assert lookup.resolve(name, package_dir, str(tmp_path / "tuned"), batch_invariant=True)["path"] is None
    finally:
        log.removeHandler(h)
        fm.get_moe_configs.cache_clear()


def test_the_tuned_folder_wins_over_the_shipped_file(release, gpu, tmp_path, monkeypatch):
    version, fm = release
    gpu("NVIDIA H200")
    name = fm.get_config_file_name(128, 768, None, None)
    package_dir = str(Path(fm.__file__).resolve().parents[3])
    shipped = Path(package_dir) / lookup.PACKAGE_CONFIGS / name
    assert shipped.is_file()
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    fm.get_moe_configs.cache_clear()
    assert fm.get_moe_configs(128, 768, None) == {int(k): v for k, v in json.loads(shipped.read_text()).items()
                                                  if k != "triton_version"}
    assert lookup.resolve(name, package_dir)["source"] == "package"
    entry = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    _write(tmp_path, name, {"7": entry})
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    fm.get_moe_configs.cache_clear()
    assert fm.get_moe_configs(128, 768, None) == {7: entry}
    assert lookup.resolve(name, package_dir, str(tmp_path))["source"] == "tuned_folder"
    fm.get_moe_configs.cache_clear()


def test_down_file_rule(release, gpu, tmp_path, monkeypatch):
    """0.34.0 reads ``_down.json`` (fp8 block [128,128] only, in TritonExperts.apply); older never."""
    version, fm = release
    has_down = "down_moe" in ast.unparse(ast.parse((source_tree(version) / FM).read_text()))
    assert has_down == naming.reads_down_file(version, "fp8_w8a8", [128, 128])
    assert not naming.reads_down_file(version, None, None)
    if has_down:
        src = (source_tree(version) / "vllm/model_executor/layers/fused_moe/experts/triton_moe.py").read_text()
        assert "down_moe=True" in src and 'self.block_shape == [128, 128]' in src and "use_fp8_w8a8" in src
        gpu("NVIDIA H200")
        _write(tmp_path, naming.config_file_name(3, 7, "NVIDIA_H200", "fp8_w8a8", [128, 128], down=True),
               {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}})
        monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
        fm.get_moe_configs.cache_clear()
        assert fm.get_moe_configs(3, 7, "fp8_w8a8", 128, 128, down_moe=True)
        fm.get_moe_configs.cache_clear()


def test_closest_entry_matches_vllm(release, gpu, tmp_path, monkeypatch):
    version, fm = release
    gpu("NVIDIA H200")
    cfg = {str(m): {"BLOCK_SIZE_M": 16 * (i + 1), "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
           for i, m in enumerate((1, 4, 16, 64, 256))}
    _write(tmp_path, fm.get_config_file_name(3, 7, None, None), cfg)
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    fm.get_moe_configs.cache_clear()
    for M in (1, 2, 3, 10, 40, 100, 160, 5000):
        got = fm.try_get_optimal_moe_config((3, 14, 16), (3, 16, 7), 2, None, M)
        assert got == lookup.closest_entry(cfg, M), M
    fm.get_moe_configs.cache_clear()


def test_env_variables_and_defaults(release):
    version, _ = release
    import vllm.envs as envs
    tree = ast.parse((source_tree(version) / "vllm/envs.py").read_text())
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for var in (lookup.TUNED_FOLDER_ENV, lookup.BATCH_INVARIANT_ENV, lookup.LOGGING_LEVEL_ENV,
                lookup.CONFIGURE_LOGGING_ENV, "VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"):
        assert var in names, var
    os.environ.pop("VLLM_LOGGING_LEVEL", None)
    assert envs.VLLM_LOGGING_LEVEL == lookup.LOGGING_LEVEL_DEFAULT
    assert lookup.logs_loaded_line(None) and not lookup.logs_loaded_line("WARNING")
    assert not lookup.logs_loaded_line("INFO", configure_logging="0")


def test_usetma_is_popped_from_034_only(release):
    version, _ = release
    src = (source_tree(version) / FM).read_text()
    pops = 'config.pop("USE_TMA"' in src
    assert pops == naming.release_at_least(version, "0.34.0")
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "USE_TMA": False}
    if pops:
        assert lookup.validate({"1": entry}, "x", version)
    else:
        with pytest.raises(Exception, match="USE_TMA"):
            lookup.validate({"1": entry}, "x", version)
    assert 'config["SPLIT_K"] = 1' in src


def test_cli_flags_exist(release):
    """The server flags orch reads are spelled so in the release's ``EngineArgs.add_cli_args``."""
    version, _ = release
    src = (source_tree(version) / "vllm/engine/arg_utils.py").read_text()
    for flag in ("--tensor-parallel-size", "-tp", "--enable-expert-parallel", "--quantization", "--dtype",
                 runner.MOE_BACKEND_FLAG):
        assert f'"{flag}"' in src, flag
    kernel = (source_tree(version) / "vllm/config/kernel.py").read_text()
    assert f'moe_backend: MoEBackend = "{runner.MOE_BACKEND_DEFAULT}"' in kernel
    for b in runner.TRITON_BACKENDS:
        assert f'"{b}"' in kernel


def test_backend_log_line_format(release):
    """The oracle's log line (0.34.0 ``make_log_backend``; 0.32/0.33 ``_make_log_backend``)."""
    version, _ = release
    oracle = source_tree(version) / "vllm/model_executor/layers/fused_moe/oracle"
    text = (oracle / "base.py").read_text() + (oracle / "unquantized.py").read_text()
    assert "MoE {lora}backend{available}" in text or "Unquantized MoE backend out " in text
    line = ("(EngineCore pid=1) INFO 12-03 10:00:00 [unquantized.py:300] Using TRITON Unquantized MoE backend out "
            "of potential backends: ['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS'].")
    got = runner.parse_backend_line(line)
    assert got["reads_triton_files"] and got["kind"] == "Unquantized" and "FlashInfer TRTLLM" in got["available"]
    assert not runner.parse_backend_line(line.replace("Using TRITON", "Using FlashInfer CUTLASS"))["reads_triton_files"]


def test_a_named_backend_is_logged_with_the_priority_list(release):
    """``--moe-backend NAME`` on unquantized weights: the release logs the named backend with the
    priority list too (0.34.0 ``select_unquantized_moe_backend`` -> ``oracle.return_or_raise(requested,
    AVAILABLE_BACKENDS)`` -> ``make_log_backend``; 0.32.0/0.33.0 ``_return_or_raise`` ->
    ``_make_log_backend``, whose line always lists them); ``marlin``/``humming`` fall through to
    ``auto``. The stand-in server logs it so (``tests/testbed/standin_vllm``), and orch reads it."""
    version, _ = release
    unq = (source_tree(version) / "vllm/model_executor/layers/fused_moe/oracle/unquantized.py").read_text()
    if "return oracle.return_or_raise(requested_backend, AVAILABLE_BACKENDS)" in unq:
        base = (source_tree(version) / "vllm/model_executor/layers/fused_moe/oracle/base.py").read_text()
        assert "logger.info_once(self.make_log_backend(backend, available_backends, is_lora))" in base
    else:
        assert "return _return_or_raise(requested_backend, moe_config, activation_format)" in unq
        assert "logger.info_once(_make_log_backend(backend))" in unq
        assert "Unquantized MoE backend out " in unq and "of potential backends: {available_strs}." in unq
    assert 'runner_backend not in ["auto", "humming"' in unq
    line = ("(EngineCore pid=1) INFO 12-03 10:00:00 [base.py:237] Using FlashInfer CUTLASS Unquantized MoE backend "
            "out of potential backends: ['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS'].")
    got = runner.parse_backend_line(line)
    assert got["backend"] == "FlashInfer CUTLASS" and not got["reads_triton_files"]


def test_priority_rules_read_from_the_oracles(release):
    """The SM90 rules of :func:`runner.triton_verdict` stand in the release's priority functions."""
    version, _ = release
    oracle = source_tree(version) / "vllm/model_executor/layers/fused_moe/oracle"
    unq = (oracle / "unquantized.py").read_text()
    assert "is_device_capability_family(90)" in unq
    assert "_move_to_back(_AVAILABLE_BACKENDS, UnquantizedMoeBackend.FLASHINFER_TRTLLM)" in unq
    fp8 = (oracle / "fp8.py").read_text()
    assert "_move_to_front(_AVAILABLE_BACKENDS, Fp8MoeBackend.TRITON)" in fp8
    int8 = ast.parse((oracle / "int8.py").read_text())
    fn = next(n for n in ast.walk(int8) if isinstance(n, ast.FunctionDef) and n.name == "_get_priority_backends")
    assert "Int8MoeBackend.TRITON" in ast.unparse(fn).split(",")[0]
    assert runner.triton_verdict(None, capability=(9, 0))[0] is True
    assert runner.triton_verdict("fp8_w8a8", [128, 128], (9, 0))[0] is True
    assert runner.triton_verdict("fp8_w8a8", [128, 128], (9, 0), ep_size=8)[0] is None
    assert runner.triton_verdict(None, capability=(9, 0), moe_backend="flashinfer_cutlass")[0] is False


def test_default_config_the_provider_times_is_vllms(release):
    version, fm = release
    from remote.engines.vllm.provider import VllmProvider
    prov = VllmProvider()
    p = prov.make_problem(dict(E=8, N=64, hidden=128, topk=2), 16, "float16", "cpu", 0)
    want = dict(fm.get_default_config(16, 8, 64, 128, 2, None, None))
    want.pop("SPLIT_K", None)
    assert prov.default_config(p) == want
    assert prov.file_name(p, "NVIDIA H200") == fm.get_config_file_name(8, 64, None, None)
    prov.close()


@pytest.mark.parametrize("release", ORACLE_RELEASES, indirect=False, ids=str)
def test_every_cuda_backend_the_log_names_maps_to_its_moe_backend_value(release):
    """``runner.backend_flag``: the names the releases' backend enums log (``oracle/unquantized.py``,
    ``oracle/fp8.py``) that orch maps, and the ``--moe-backend`` values they map to, are the release's."""
    from remote.engines.vllm.runner import backend_flag

    root = source_tree(release) / "vllm/model_executor/layers/fused_moe/oracle"
    logged = set()
    for name in ("unquantized.py", "fp8.py"):
        logged |= set(re.findall(r'^\s+[A-Z0-9_]+ = "([^"]+)"', (root / name).read_text(), re.M))
    kernel = (source_tree(release) / "vllm/config/kernel.py").read_text()
    for want, log_name in (("triton", "TRITON"), ("flashinfer_cutlass", "FlashInfer CUTLASS"),
                           ("flashinfer_trtllm", "FlashInfer TRTLLM"), ("flashinfer_cutlass", "FLASHINFER_CUTLASS"),
                           ("deep_gemm", "DEEPGEMM"), ("cutlass", "VLLM_CUTLASS"), ("marlin", "MARLIN")):
        assert log_name in logged, (release, log_name)
        assert backend_flag(log_name) == want and f'"{want}"' in kernel, (release, log_name, want)
