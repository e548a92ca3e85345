"""orch's vLLM runtime rules held against the real code of vLLM 0.32.0, 0.33.0 and 0.34.0: the log
lines that open a start and say the server is ready, the process titles vLLM's processes set, the
cache root (``VLLM_CACHE_ROOT``, ``XDG_CACHE_HOME``), the generation request without ``model`` and
the readiness answers of ``/health``.

Where the rule is a function of the release (``log_version_and_model``, ``set_process_title``, the
``envs`` entries), that function is compiled from the release's source and run; the rest is read
with ``ast`` or as text.
"""

from __future__ import annotations

import ast
import logging
import string
import sys
import types

import pytest

from remote.engines.vllm import autotune, http, launcher, moe_log
from tests.vllm_releases import ORACLE_RELEASES, source_tree


def _src(version: str, rel: str) -> str:
    return (source_tree(version) / rel).read_text()


def _compile_function(version: str, rel: str, name: str, namespace: dict):
    """The release's function ``name`` from ``rel``, compiled alone into ``namespace`` (its
    module is not imported: it needs vLLM's server)."""
    tree = ast.parse(_src(version, rel))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    mod = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(mod, f"{version}/{rel}", "exec"), namespace)
    return namespace[name]


def _startup_module(version: str) -> str:
    for rel in ("vllm/entrypoints/common/startup.py", "vllm/entrypoints/serve/utils/api_utils.py"):
        path = source_tree(version) / rel
        if path.is_file() and "def log_version_and_model(" in path.read_text():
            return rel
    raise AssertionError(f"vLLM {version}: no log_version_and_model")


@pytest.mark.parametrize("version", ORACLE_RELEASES)
@pytest.mark.parametrize("logo,formatter", [(True, None), (False, "plain"), (False, "color"), (False, None)])
def test_start_line_opens_a_start(version, logo, formatter):
    """``log_version_and_model`` of the release (0.32.0: ``serve/utils/api_utils.py``, 0.33.0 and
    0.34.0: ``common/startup.py``), run with ``VLLM_DISABLE_LOG_LOGO`` and each formatter kind: orch
    finds the start at the line that opens it, after an earlier start's lines."""
    out: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            out.append(self.format(record))

    lgr = logging.Logger(f"vllm.startup.{version}")
    h = Collect()
    h.setFormatter(logging.Formatter("(APIServer pid=7) %(levelname)s 12-04 08:00:00 [startup.py:38] %(message)s"))
    lgr.addHandler(h)
    ns = {"envs": types.SimpleNamespace(VLLM_DISABLE_LOG_LOGO=logo), "current_formatter_type": lambda _l: formatter,
          "Template": string.Template, "Logger": logging.Logger}
    fn = _compile_function(version, _startup_module(version), "log_version_and_model", ns)
    fn(lgr, version, "/models/qwen3")
    earlier = "(APIServer pid=3) INFO 12-04 07:00:00 [x.py:1] an earlier start\n"
    text = earlier + out[-1] + "\n(APIServer pid=7) INFO 12-04 08:00:01 [x.py:2] after\n"
    at = moe_log.last_start_at(text)
    assert at == len(earlier), (version, logo, formatter, text)
    assert text[at:].startswith("(APIServer pid=7) INFO")


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_ready_line_is_the_releases(version):
    """``Starting vLLM server on <address>`` (``launchers/api_server/entry.py``), logged at INFO once
    the engine is up: orch's ready marker."""
    tree = ast.parse(_src(version, "vllm/entrypoints/launchers/api_server/entry.py"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "logger.info"
             and n.args and isinstance(n.args[0], ast.Constant)]
    fmt = next(c.args[0].value for c in calls if str(c.args[0].value).startswith("Starting vLLM server"))
    line = "(APIServer pid=7) INFO 12-04 08:00:02 [entry.py:139] " + fmt % "http://0.0.0.0:8000"
    assert fmt.startswith(moe_log.READY_LINE)
    assert moe_log.parse_moe_log(line + "\n").ready


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_process_titles_are_the_releases(version, monkeypatch):
    """The release's ``set_process_title`` (``utils/system_utils.py``) with the default prefix of its
    ``envs.py`` (``VLLM_PROCESS_NAME_PREFIX``) and the names its processes pass (engine core, DP
    engine cores, workers, API servers, the DP coordinator): each title is one orch counts as vLLM's."""
    envs_src = _src(version, "vllm/envs.py")
    assert '"VLLM_PROCESS_NAME_PREFIX": lambda: os.getenv("VLLM_PROCESS_NAME_PREFIX", "VLLM")' in envs_src
    titles: list[str] = []
    monkeypatch.setitem(sys.modules, "setproctitle", types.SimpleNamespace(setproctitle=titles.append))
    ns = {"envs": types.SimpleNamespace(VLLM_PROCESS_NAME_PREFIX="VLLM")}
    set_title = _compile_function(version, "vllm/utils/system_utils.py", "set_process_title", ns)
    core = _src(version, "vllm/v1/engine/core.py")
    assert 'process_title = f"EngineCore_DP{dp_rank}"' in core and 'process_title = "EngineCore"' in core
    assert 'set_process_title("DPCoordinator")' in _src(version, "vllm/v1/engine/coordinator.py")
    assert 'set_process_title("APIServer", str(server_index))' in _src(version, "vllm/v1/utils.py")
    assert 'process_name += f"_TP{tp_rank}"' in _src(version, "vllm/v1/executor/multiproc_executor.py")
    set_title("EngineCore")
    set_title("EngineCore_DP1")
    set_title("DPCoordinator")
    set_title("APIServer", "0")
    set_title(name="Worker_TP3")
    assert titles == ["VLLM::EngineCore", "VLLM::EngineCore_DP1", "VLLM::DPCoordinator", "VLLM::APIServer_0",
                      "VLLM::Worker_TP3"]
    assert all(t.startswith(launcher.PROCESS_PREFIX) and launcher.is_vllm_process(t) for t in titles)
    assert not launcher.is_vllm_process("SGLANG::scheduler")


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_cache_root_is_the_releases(version, monkeypatch, tmp_path):
    """``VLLM_CACHE_ROOT`` as the release's ``envs`` resolves it (``get_default_cache_root``: the
    variable expanded, else ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``) equals orch's
    :func:`autotune.cache_root` for the same environment, and the autotune folder's name is the
    release's."""
    # the release's files first: the release cache's own folder follows XDG_CACHE_HOME
    warm = _src(version, "vllm/model_executor/warmup/flashinfer_autotune_cache.py")
    assert f'"{autotune.AUTOTUNE_FOLDER}"' in warm
    tree = ast.parse(_src(version, "vllm/envs.py"))
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("get_default_cache_root",)]
    table = next(n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                 and ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target) == "environment_variables")
    entry = next(v for k, v in zip(table.value.keys, table.value.values)
                 if isinstance(k, ast.Constant) and k.value == "VLLM_CACHE_ROOT")
    ns: dict = {"os": __import__("os")}
    exec(compile(ast.fix_missing_locations(ast.Module(body=keep, type_ignores=[])), "envs.py", "exec"), ns)
    resolve = eval(compile(ast.Expression(entry), "envs.py", "eval"), ns)
    home = str(tmp_path / "home")
    monkeypatch.setenv("HOME", home)
    cases = [{}, {"XDG_CACHE_HOME": "/xdg"}, {"VLLM_CACHE_ROOT": "/srv/vllm-cache"},
             {"VLLM_CACHE_ROOT": "~/vc", "XDG_CACHE_HOME": "/xdg"}]
    for env in cases:
        for var in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT"):
            monkeypatch.delenv(var, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert autotune.cache_root(env, None, home) == resolve(), (version, env)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_generation_without_model_and_health(version):
    """orch's readiness and trial generation names no ``model``: the release's ``CompletionRequest``
    makes it optional and ``_is_model_supported`` accepts none; ``/health`` answers 200 once the
    engine runs and 503 when it died."""
    req = http.greedy_request("hi", 4)
    assert "model" not in req.body and req.path == http.COMPLETIONS_PATH
    proto = _src(version, "vllm/entrypoints/openai/completion/protocol.py")
    assert "class CompletionRequest(" in proto and "    model: str | None = None" in proto
    serving = ast.parse(_src(version, "vllm/entrypoints/serve/engine/serving.py"))
    fn = next(n for n in ast.walk(serving) if isinstance(n, ast.FunctionDef) and n.name == "_is_model_supported")
    first = fn.body[0]
    assert ast.unparse(first) == "if not model_name:\n    return True"
    health = _src(version, "vllm/entrypoints/serve/instrumentator/health.py")
    assert f'"{http.HEALTH_PATH}"' in health
    assert "except EngineDeadError:\n        return Response(status_code=503)" in health


def _fake_flashinfer(monkeypatch, workspace):
    """``flashinfer.jit.env`` with ``FLASHINFER_WORKSPACE_DIR`` (the release's code imports it for the
    default folder): modules made here, nothing of FlashInfer installed."""
    for name in ("flashinfer", "flashinfer.jit", "flashinfer.jit.env"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["flashinfer.jit.env"].FLASHINFER_WORKSPACE_DIR = workspace
    sys.modules["flashinfer"].jit = sys.modules["flashinfer.jit"]
    sys.modules["flashinfer.jit"].env = sys.modules["flashinfer.jit.env"]


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_flashinfer_autotune_folder_is_the_releases(version, monkeypatch, tmp_path):
    """vLLM persists FlashInfer's autotune results on disk in every oracle release: the release's own
    ``resolve_flashinfer_autotune_file`` (with ``flashinfer_autotune_root`` where the release has it),
    run with ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` unset, absolute, ``~/...`` and relative, writes under
    :func:`autotune.autotune_dir` of the same environment: ``<dir>[/<workspace parent>/<workspace>]/
    <hash>/autotune_configs.json``. From 0.33.0 a single-rank server may use FlashInfer's managed store
    instead, whose root vLLM leaves to FlashInfer when the variable is unset (None)."""
    import os
    from pathlib import Path

    rel = "vllm/model_executor/warmup/flashinfer_autotune_cache.py"
    home, work, cache_root = tmp_path / "home", tmp_path / "work", tmp_path / "vllm-cache"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    workspace = Path("/fi-workspace/0.6.9/90a")
    _fake_flashinfer(monkeypatch, workspace)
    envs = types.SimpleNamespace(VLLM_CACHE_ROOT=str(cache_root), VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=None)
    ns: dict = {"Path": Path, "envs": envs, "flashinfer_autotune_cache_hash": lambda runner: "HASH", "os": os}
    if "def flashinfer_autotune_root(" in _src(version, rel):
        _compile_function(version, rel, "flashinfer_autotune_root", ns)
    resolve = _compile_function(version, rel, "resolve_flashinfer_autotune_file", ns)
    for value in (None, str(tmp_path / "fi-abs"), "~/fi-home", "fi-rel"):
        envs.VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR = value
        env = {"VLLM_CACHE_ROOT": str(cache_root)} | ({} if value is None else {autotune.AUTOTUNE_DIR_ENV: value})
        path = resolve(None)
        assert path.name == "autotune_configs.json" and path.parent.name == "HASH", (version, path)
        top = path.parents[1] if value else path.parents[3]
        if not value:
            assert path.parents[1] == top / workspace.parent.name / workspace.name, (version, path)
        root = autotune.cache_root(env, str(work), str(home))
        assert autotune.autotune_dir(env, root, str(work), str(home)) == str(top.resolve()), (version, value, path)
    assert autotune.autotune_dir({autotune.AUTOTUNE_DIR_ENV: "~/x"}, "/r", "/w", None) is None
    assert autotune.autotune_dir({autotune.AUTOTUNE_DIR_ENV: ""}, "/r", "/w", None) == "/r/flashinfer_autotune_cache"
    text = _src(version, rel)
    if tuple(map(int, version.split("."))) >= (0, 33, 0):  # FlashInfer's managed store: vLLM names its root only through the variable
        v2 = _compile_function(version, rel, "resolve_flashinfer_autotune_v2_root", ns)
        envs.VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR = None
        assert v2() is None
        envs.VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR = str(tmp_path / "fi-abs")
        assert str(v2()) == str(tmp_path / "fi-abs")
    else:
        assert "autotune_v2" not in text
