"""orch's vLLM launch forms, server flags and HTTP names held against vLLM 0.32.0, 0.33.0, 0.34.0.

The flag spellings are read with ``ast`` from each release's ``vllm/engine/arg_utils.py`` and its
front-end ``cli_args.py``; defaults from the config dataclasses (``vllm/config/*.py``). The command
lines are parsed by the release's own ``FlexibleArgumentParser`` (``vllm/utils/argparse_utils.py``,
imported from its source through ``tests/vllm_standins.py``: underscores, ``vllm serve``'s
``--model`` rewrite, ``--config`` merging are the release's code), given orch's flags with the
release's spellings, and compared with :func:`remote.engines.vllm.server_args.parse_server_args`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest

from remote.engines.launch import resolve
from remote.engines.vllm import http, server_args as sa
from tests.vllm_releases import ORACLE_RELEASES, source_tree


def _src(version: str, rel: str) -> str:
    return (source_tree(version) / rel).read_text()


def _front_args(version: str) -> Path:
    root = source_tree(version) / "vllm/entrypoints"
    for rel in ("common/cli_args.py", "launchers/cli_args.py", "openai/cli_args.py"):
        if (root / rel).is_file() and "class FrontendArgs" in (root / rel).read_text():
            return root / rel
    raise AssertionError(f"vLLM {version}: no FrontendArgs")


def _option_tuples(version: str) -> set[tuple[str, ...]]:
    out = set()
    for path in (source_tree(version) / "vllm/engine/arg_utils.py", _front_args(version),
                 source_tree(version) / "vllm/entrypoints/common/cli_args.py"):
        if not path.is_file():
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument":
                opts = tuple(a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
                if opts:
                    out.add(opts)
    return out


def _field_defaults(path: Path, cls: str) -> dict:
    """``{field: default}`` of dataclass ``cls`` (plain constants and ``Field(default=...)``)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    out = {}
    for st in node.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            v = st.value
            if isinstance(v, ast.Call) and getattr(v.func, "id", "") == "Field":
                kw = {k.arg: k.value for k in v.keywords}
                v = kw.get("default", v)
            if isinstance(v, ast.Constant):
                out[st.target.id] = v.value
    return out


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_flag_spellings_are_the_releases(version):
    opts = _option_tuples(version)
    front = _field_defaults(_front_args(version), "FrontendArgs")
    for f in sa.FLAGS:
        if f.source.startswith("cli_args.py FrontendArgs"):
            assert f.field in front, (version, f.field)  # FrontendArgs fields become --field-name
            continue
        assert f.options in opts, (version, f.options)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_defaults_are_the_releases(version):
    root = source_tree(version) / "vllm/config"
    par = _field_defaults(root / "parallel.py", "ParallelConfig")
    model = _field_defaults(root / "model.py", "ModelConfig")
    kernel = _field_defaults(root / "kernel.py", "KernelConfig")
    front = _field_defaults(_front_args(version), "FrontendArgs")
    want = {"tp": par["tensor_parallel_size"], "pp": par["pipeline_parallel_size"], "dp": par["data_parallel_size"],
            "pcp": par["prefill_context_parallel_size"], "enable_expert_parallel": par["enable_expert_parallel"], "enable_eplb": par["enable_eplb"],
            "nnodes": par["nnodes"], "node_rank": par["node_rank"], "model": model["model"],
            "dtype": model["dtype"], "moe_backend": kernel["moe_backend"], "port": front["port"],
            "host": front["host"]}
    for name, value in want.items():
        assert sa._BY_FIELD[name].default == value, (version, name)
    assert sa.DEFAULT_MODEL == model["model"]
    assert 'moe_backend_kwargs["type"] = lambda s: s.lower().replace("-", "_")' in _src(version, "vllm/engine/arg_utils.py")


@pytest.fixture(scope="module", params=ORACLE_RELEASES)
def flexible(request):
    """(version, the release's own FlexibleArgumentParser class)."""
    from tests import vllm_standins as vs

    vs.install(source_tree(request.param))
    mod = importlib.import_module("vllm.utils.argparse_utils")
    yield request.param, mod.FlexibleArgumentParser
    vs.uninstall()


def _add_flags(p):
    p.add_argument("model_tag", nargs="?")
    for f in sa.FLAGS:
        kw: dict = {"dest": f.field}
        if f.kind == "int":
            kw["type"] = int
        elif f.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif f.kind == "flag":
            kw["action"] = "store_true"
        elif f.kind == "list":
            kw["nargs"] = "+"
        if f.field == "moe_backend":
            kw["type"] = lambda s: s.lower().replace("-", "_")
        kw["default"] = f.default
        p.add_argument(*f.options, **kw)
    p.add_argument("--max-model-len", type=int)  # a flag orch does not read, with a value
    return p


def _release_parse(cls, args: list[str]) -> dict:
    if args[:1] == ["serve"]:
        top = cls()
        sub = top.add_subparsers(dest="subparser")
        _add_flags(sub.add_parser("serve"))
        ns = top.parse_args(list(args))
        model = ns.model_tag if ns.model_tag is not None else ns.model  # ServeSubcommand.cmd
    else:
        ns = _add_flags(cls()).parse_args(list(args))
        model = ns.model  # the api_server reads --model only
    return {"model": model, "tp": ns.tp, "pp": ns.pp, "dp": ns.dp, "ep": ns.enable_expert_parallel,
            "q": ns.quantization, "dtype": ns.dtype, "moe": ns.moe_backend, "port": ns.port, "host": ns.host,
            "names": ns.served_model_name, "nnodes": ns.nnodes}


def _orch_parse(args: list[str]) -> dict:
    s = sa.parse_server_args(list(args))
    return {"model": s.model_path, "tp": s.tp, "pp": s.pp, "dp": s.dp, "ep": s.enable_expert_parallel,
            "q": s.quantization, "dtype": s.dtype or "auto", "moe": s.moe_backend, "port": s.port,
            "host": s.host or None, "names": s.served_model_names or None, "nnodes": s.nnodes}


CASES = [
    ["serve", "/models/q", "--tensor-parallel-size", "2", "--port", "8001"],
    ["serve", "/models/q", "-tp", "4", "--enable-expert-parallel", "--data-parallel-size=2"],
    ["serve", "-tp", "2", "--model", "/models/q", "--host", "0.0.0.0"],
    ["serve", "--model=/models/q", "--tensor_parallel_size", "8", "--moe-backend", "FlashInfer-CUTLASS"],
    ["serve", "/models/q", "-ep", "--no-enable-expert-parallel", "-q", "fp8", "--dtype", "bfloat16"],
    ["serve", "/models/q", "--served-model-name", "qwen", "qwen-alias", "--max-model-len", "4096"],
    ["serve", "/models/q", "--max_model_len=4096", "--pipeline-parallel-size", "2", "--nnodes", "2"],
    ["--model", "/models/q", "--tensor-parallel-size", "2", "--port", "8000"],
    ["/models/positional-is-ignored", "--port", "8002"],
    ["--model=/models/q", "-tp=2", "--enable_expert_parallel", "--moe_backend", "triton"],
    ["--port", "9000"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a)[:60])
def test_parse_matches_flexible_argument_parser(flexible, args):
    version, cls = flexible
    assert _orch_parse(args) == _release_parse(cls, args), version


def test_serve_refusals_match(flexible):
    version, cls = flexible
    bad = ["serve", "--port", "8000", "--served-model-name", "x"]
    with pytest.raises(ValueError):
        _release_parse(cls, bad)
    with pytest.raises(sa.ServerArgsError):
        sa.parse_server_args(bad)


@pytest.mark.parametrize("args,yaml_text", [
    (["serve", "/models/q", "--config", "c.yaml", "-tp", "2"], "port: 8123\ntensor-parallel-size: 4\n"),
    (["serve", "--config", "c.yaml"], "model: /models/from-config\nenable_expert_parallel: true\n"),
    (["--config", "c.yaml", "--port", "8001"], "model: /models/q\nport: 8123\nserved-model-name: [a, b]\n"),
    (["serve", "/models/q", "--config", "c.yml"], "enable-expert-parallel: false\nmoe-backend: triton\n"),
])
def test_config_merge_matches_pull_args_from_config(flexible, tmp_path, args, yaml_text):
    import yaml

    version, cls = flexible
    name = args[args.index("--config") + 1]
    path = tmp_path / name
    path.write_text(yaml_text)
    real_args = [str(path) if a == name else a for a in args]
    parser = _add_flags(cls())
    want = parser._pull_args_from_config(list(real_args))
    got = sa.merge_config(real_args, yaml.safe_load(yaml_text), str(path))
    assert got == want, version
    assert sa.config_file(real_args) == str(path)
    assert _orch_parse(got) == _release_parse(cls, got)


def test_config_refusals():
    with pytest.raises(sa.ServerArgsError, match="yaml/yml"):
        sa.merge_config(["--config", "c.json"], {}, "c.json")
    with pytest.raises(sa.ServerArgsError, match="No model specified"):
        sa.merge_config(["serve", "--config", "c.yaml"], {"port": 1}, "c.yaml")
    with pytest.raises(sa.ServerArgsError, match="one --config"):
        sa.config_file(["--config", "a.yaml", "--config", "b.yaml"])


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_entry_points_are_the_releases(version):
    main = _src(version, "vllm/entrypoints/cli/main.py")
    assert "vllm.entrypoints.cli.serve" in main
    serve = _src(version, "vllm/entrypoints/cli/serve.py")
    assert 'name = "serve"' in serve and "args.model = args.model_tag" in serve
    api = _src(version, "vllm/entrypoints/openai/api_server.py")
    assert '__name__ == "__main__"' in api
    # the api_server's main never copies the positional model_tag to --model (ServeSubcommand does)
    entry = source_tree(version) / "vllm/entrypoints/launchers/api_server/entry.py"
    if entry.is_file():
        assert "model_tag" not in entry.read_text()


def test_launch_forms_resolve():
    ep = (sa.ENTRY_POINTS,)
    la = resolve(["/venv/bin/python3", "-m", sa.ENTRY_MODULE, "--model", "/m", "-tp", "2"], ep)
    assert la.engine == "vllm" and la.server_argv == ["--model", "/m", "-tp", "2"]
    lb = resolve(["numactl", "-N", "0", "/venv/bin/vllm", "serve", "/m", "--port", "8001"], ep)
    assert lb.entry == sa.ENTRY_SERVE and lb.server_argv == ["serve", "/m", "--port", "8001"] and lb.script
    assert sa.parse_server_args(lb.server_argv).port == 8001
    from remote.engines.launch import LaunchError
    with pytest.raises(LaunchError, match="vllm bench"):
        resolve(["/venv/bin/vllm", "bench", "serve"], ep)


def test_image_entrypoint():
    assert sa.image_entrypoint("vllm/vllm-openai:v0.34.0") == sa.IMAGE_ENTRYPOINT
    assert sa.image_entrypoint("docker.io/vllm/vllm-openai") == sa.IMAGE_ENTRYPOINT
    assert sa.image_entrypoint("lmsysorg/sglang:v0.5.23") is None
    assert sa.image_entrypoint("vllm/vllm-openai:v0.11.0") == sa.IMAGE_ENTRYPOINT_BEFORE
    assert sa.container_command("vllm/vllm-openai:latest", None, ["/m"]) == ["vllm", "serve", "/m"]
    assert sa.container_command("vllm/vllm-openai:v0.9.0-cu128", None, ["--model", "/m"]) == [
        "python3", "-m", sa.ENTRY_MODULE, "--model", "/m"]
    assert sa.container_command("vllm/vllm-openai", "vllm", ["serve", "/m"]) == ["vllm", "serve", "/m"]


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_http_names_are_the_releases(version):
    ep = source_tree(version) / "vllm/entrypoints"
    text = "\n".join(p.read_text() for p in ep.rglob("*.py"))
    for path in (http.HEALTH_PATH, http.MODELS_PATH, http.COMPLETIONS_PATH, http.VERSION_PATH):
        assert f'"{path}"' in text, (version, path)
    proto = next(p for p in sorted((ep / "openai").rglob("*.py"))
                 if "class CompletionRequest(" in p.read_text()).read_text()
    for name in ("return_token_ids", "ignore_eos", "max_tokens", "temperature", "token_ids"):
        assert f"    {name}:" in proto, (version, name)
    serve = _src(version, "vllm/benchmarks/serve.py")
    for name in http.BENCH_TOTALS:
        assert f'"{name}"' in serve, (version, name)
    for m in http.BENCH_LATENCIES:
        assert f'process_one_metric("{m}"' in serve, (version, m)
    assert 'result[f"p{p_word}_{metric_attribute_name}_ms"]' in serve and 'default="99"' in serve


def test_generation_request_and_answer():
    req = http.generate_request("qwen", "hi", 4, exact=True)
    assert req.path == "/v1/completions" and req.body["temperature"] == 0 and req.body["ignore_eos"]
    g = http.parse_generation({"choices": [{"text": " a b", "token_ids": [5, 6]}], "usage": {"completion_tokens": 2}})
    assert (g.text, g.output_ids, g.tokens) == (" a b", [5, 6], 2)
    assert http.parse_generation("nope").tokens == 0
    assert http.served_names({"object": "list", "data": [{"id": "qwen"}, {"id": 3}]}) == ["qwen"]


def test_log_level():
    s = sa.parse_server_args(["serve", "/m", "--logging-config.log_level", "WARNING"])
    assert sa.effective_log_level(s, {"VLLM_LOGGING_LEVEL": "DEBUG"}) == "WARNING"
    assert sa.effective_log_level(sa.parse_server_args(["serve", "/m", "--log-level", "debug"]), {}) == "DEBUG"
    assert sa.effective_log_level(sa.parse_server_args(["serve", "/m"]), {"VLLM_LOGGING_LEVEL": "warning"}) == "WARNING"
    assert sa.effective_log_level(sa.parse_server_args(["serve", "/m"]), {}) == "INFO"


def test_server_args_have_the_interfaces_fields():
    """vLLM's record carries every field the engine-neutral ServerArgs protocol names."""
    from remote.engines.interface import ServerArgs as Protocol

    s = sa.parse_server_args(["serve", "/m", "-tp", "4", "-dp", "2", "--enable-expert-parallel"])
    assert isinstance(s, Protocol)
    assert (s.ep, s.served_model_name, s.moe_backend, s.api_name) == (8, None, "auto", "/m")


def test_prefill_context_parallelism_is_refused_with_its_flag():
    """vLLM splits the experts over TP x DP x PCP (FusedMoEParallelConfig.make); orch's shape reads TP
    and DP only, so a -pcp unit is refused by name instead of tuned under a file name vLLM never reads."""
    assert sa.parse_server_args(["serve", "/m", "-pcp", "1"]).pcp == 1
    for words in (["serve", "/m", "-pcp", "2"], ["--model", "/m", "--prefill-context-parallel-size=4"]):
        with pytest.raises(sa.ServerArgsError, match="--prefill-context-parallel-size .*TP x DP x PCP"):
            sa.parse_server_args(words)


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_moe_split_covers_prefill_context_parallelism(version):
    """The rule behind that refusal, in each release's own MoE parallel config."""
    text = _src(version, "vllm/model_executor/layers/fused_moe/config.py")
    assert "pcp_size" in text and "flatten_tp_across_dp_and_pcp" in text, version
