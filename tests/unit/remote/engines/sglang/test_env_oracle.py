"""The real SGLang releases are the judge of the rules that moved into SGLang's home from the
controller and the payload (issue 28): the environment variables, the deprecated DP-attention
rule, the flags that change FlashInfer's autotune, the ``--config`` key of the runner backend, the
HTTP requests and the processes' names.

Each test reads (with :mod:`ast`) or runs the wheel's own code (``tests/sglang_releases.py``): a
constant orch writes must be the one the release defines, a rule orch applies must give what the
release's function gives.
"""

from __future__ import annotations

import ast
import argparse
import importlib.util
import itertools
import re
import sys
import types

import pytest
import yaml

from remote.engines import engine_named
from remote.engines.sglang import autotune, env, http, launcher, lookup, server_args, server_config
from remote.engines.sglang.lookup import RELEASE_RULES, version_key
from tests.sglang_loader import ORACLE_RELEASES
from tests.sglang_releases import source_tree
from tests.unit.remote.engines.sglang.test_runner_oracle import extract
from tests.unit.remote.engines.sglang.test_server_args_oracle import release_options

NEWEST = "0.5.23"


def srt(version: str = NEWEST):
    return source_tree(version) / "sglang" / "srt"


def envs_fields(version: str = NEWEST) -> dict[str, str]:
    """``name -> EnvField class`` of the ``Envs`` class of the release's ``srt/environ.py``."""
    tree = ast.parse((srt(version) / "environ.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Envs")
    out = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name):
            out.update({t.id: stmt.value.func.id for t in stmt.targets if isinstance(t, ast.Name)})
    return out


# ----------------------------------------------------------------------------- environment variables

def test_the_variables_orch_names_are_the_releases():
    fields = envs_fields()
    assert fields[env.CACHE_DIR_ENV] == "EnvStr"  # read as written: cache_root does not expand it
    assert fields[env.AUTOTUNE_CACHE_ENV] == "EnvBool"
    assert fields[env.USE_MODELSCOPE_ENV] == "EnvBool"
    assert set(env.PAYLOAD_ENV_KEYS) == set(env.SERVER_ENV_KEYS) - {env.CACHE_DIR_ENV}
    assert engine_named("sglang").env_keys == env.SERVER_ENV_KEYS


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_config_dir_variable_is_read_from_the_release_the_note_names(version):
    """``SGLANG_MOE_CONFIG_DIR`` is in the release's MoE config loader exactly from
    ``config_dir_since()`` on (the "SGLang 0.5.3+" of the container hint, host/container.py)."""
    module = next(m for release, m, _rules in RELEASE_RULES if release == version)
    text = (srt(version) / "layers" / "moe" / module).read_text()
    reads = env.CONFIG_DIR_ENV in text
    assert reads == (version_key(version) >= version_key(lookup.config_dir_since())), version
    assert lookup.config_dir_note() == f"SGLang {lookup.config_dir_since()}+ reads {env.CONFIG_DIR_ENV}"


# ----------------------------------------------------------------------------- the DP-attention rule

class _View(types.SimpleNamespace):
    pass


def test_deprecated_dp_attention_is_the_releases_rule():
    """``handle_deprecated_dp_attention`` of 0.5.23 ``srt/arg_groups/parallel_hook.py``, run with
    stand-ins for its view and its resolution record, against :func:`server_args.attention_dp`."""
    declared: list[dict] = []
    state: dict = {}
    ns = {"resolving_view": lambda _sa: state["view"], "Any": object,
          "declare_resolution": lambda _sa, _source, **fields: declared.append(fields)}
    extract(srt() / "arg_groups" / "parallel_hook.py", {"handle_deprecated_dp_attention"}, ns)
    assert server_args.DP_ATTENTION_FLAG in release_options(NEWEST)
    for attn, dp, flag in itertools.product((1, 2, 4), (1, 2, 8), (False, True)):
        declared.clear()
        state["view"] = _View(attn_dp_size=attn, dp_size=dp, enable_dp_attention=flag)
        ns["handle_deprecated_dp_attention"](object())
        theirs = {"attn_dp_size": attn, "dp_size": dp}
        for fields in declared:
            theirs.update({k: v for k, v in fields.items() if k in theirs})
        args = ["--attn-dp-size", str(attn), "--dp-size", str(dp)] + ([server_args.DP_ATTENTION_FLAG] if flag else [])
        ours = server_args.attention_dp(server_args.parse_launch_args(args))
        assert ours == (theirs["attn_dp_size"], theirs["dp_size"]), (attn, dp, flag)


# ----------------------------------------------------------------------------- autotune and trial flags

def test_the_autotune_key_flags_are_the_releases():
    options = release_options(NEWEST)
    assert autotune.SKIP_OPS_FLAG in options
    assert set(autotune.UNMODELLED_KEY_FLAGS) <= set(options)
    spec = [o for o in options if o.startswith(autotune.SPECULATIVE_PREFIXES[0])]
    assert "--speculative-moe-runner-backend" in spec and "--speculative-moe-a2a-backend" in spec
    # every key flag autotune.trial_flags keeps is one the release registers
    assert all(f in options for f in autotune.TRIAL_FLAGS)


# ----------------------------------------------------------------------------- the --config YAML key

def _real_merger(version: str = NEWEST):
    from tests.testbed.standin_tree import CONFIG_PARSER_PATHS

    root = source_tree(version)
    path = next(root / rel for rel in CONFIG_PARSER_PATHS if (root / rel).is_file())
    spec = importlib.util.spec_from_file_location(f"sglang_{version.replace('.', '_')}_config_parser_env", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_runner_key_of_a_config_file_is_the_flag_sglang_honours(tmp_path):
    """SGLang's merger turns the YAML key ``moe-runner-backend`` into the runner flag its parser
    reads; ``moe_runner_backend`` would be an unknown flag (``host/runner_source.py``)."""
    assert server_config.CONFIG_FLAG in release_options(NEWEST)
    assert server_args.RUNNER_FLAG in next(f for f in server_args.FLAGS if f.field == "moe_runner_backend").options
    merger = _real_merger()
    parser = argparse.ArgumentParser()
    parser.add_argument(server_config.CONFIG_FLAG)
    parser.add_argument(server_args.RUNNER_FLAG)
    for key, runs in ((server_config.RUNNER_CONFIG_KEY, True), ("moe_runner_backend", False)):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({key: "flashinfer_cutlass"}))
        merged = merger.ConfigArgumentMerger(parser).merge_config_with_args([server_config.CONFIG_FLAG, str(cfg)])
        ns, unknown = parser.parse_known_args(merged)
        assert (ns.moe_runner_backend == "flashinfer_cutlass") is runs and bool(unknown) is not runs, (key, merged)
        assert engine_named("sglang").runner_config_key == server_config.RUNNER_CONFIG_KEY


# ----------------------------------------------------------------------------- HTTP requests

def _api_types():
    """The 0.5.23 wheel's generated API types (``sglang/api/v1/api_types.py``), with a stand-in for
    ``msgspec.Struct`` (the decoders are the generated Python; only the base class is msgspec's)."""
    stub = types.ModuleType("msgspec")

    class Struct:
        def __init_subclass__(cls, **_kw):
            pass

        def __init__(self, **kw):
            for k, v in kw.items():
                object.__setattr__(self, k, v)

    stub.Struct = Struct
    saved = sys.modules.get("msgspec")
    sys.modules["msgspec"] = stub
    try:
        spec = importlib.util.spec_from_file_location("sglang_0_5_23_api_types",
                                                      source_tree(NEWEST) / "sglang" / "api" / "v1" / "api_types.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if saved is None:
            sys.modules.pop("msgspec", None)
        else:
            sys.modules["msgspec"] = saved
    return mod


def test_the_requests_pass_the_releases_generate_contract():
    """The ``/generate`` bodies orch sends (readiness, the output check, the benchmark) pass 0.5.23's
    contract gate (``srt/entrypoints/api_contract.py`` ``generate_contract_error``: the generated
    ``GenerateRequest.from_json_value``), as a greedy request of the asked length."""
    api = _api_types()
    engine = engine_named("sglang")
    for req, tokens in ((engine.generate_request("ping", 1), 1), (engine.generate_request("Hello", 32), 32),
                        (engine.bench_request([11, 12, 13], 8), 8)):
        parsed = api.GenerateRequest.from_json_value(req.body)
        assert req.path == http.GENERATE_PATH and req.method == "POST"
        assert parsed.sampling_params.max_new_tokens == tokens and parsed.sampling_params.temperature == 0
    with pytest.raises(api.JsonContractError):  # the gate is real: a wrong body is refused
        api.GenerateRequest.from_json_value({"text": 1})


def test_the_paths_are_the_releases_routes():
    tree = ast.parse((srt() / "entrypoints" / "http_server.py").read_text())
    routes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "post", "api_route") and node.args and isinstance(node.args[0], ast.Constant):
            routes.add(node.args[0].value)
    assert {http.GENERATE_PATH, http.HEALTH_PATH, http.LIVENESS_PATH} <= routes, routes


def test_an_answer_is_read_as_the_release_writes_it():
    """``meta_info.completion_tokens`` is what 0.5.23's tokenizer manager reports (``output_ids``
    beside it); a batched request answers a list."""
    text = (srt() / "managers" / "tokenizer_manager.py").read_text()
    assert '"completion_tokens"' in text and '"output_ids"' in text
    gen = http.parse_generation({"text": " hi", "output_ids": [5, 6], "meta_info": {"completion_tokens": 2}})
    assert (gen.text, gen.output_ids, gen.tokens) == (" hi", [5, 6], 2)
    assert http.parse_generation([{"text": "a", "output_ids": [1]}]).to_dict() == {"text": "a", "output_ids": [1]}


# ----------------------------------------------------------------------------- process names

def test_its_processes_are_named_as_the_release_names_them():
    """The workers 0.5.23 names with ``setproctitle`` (``sglang::scheduler_TP0``, ...) are SGLang's
    own processes for the reaper (``Engine.is_own_process``)."""
    titles = set()
    for path in (srt() / "managers").glob("*.py"):
        titles |= set(re.findall(r'setproctitle\(f?"(sglang::[a-z_]+)', path.read_text()))
    assert {"sglang::scheduler", "sglang::detokenizer"} <= titles, titles
    assert all(launcher.is_sglang_process(t + "_TP0") for t in titles)
    assert launcher.is_sglang_process(f"/venv/bin/python3 -m {launcher.ENTRY_MODULE} --model-path /m")
    assert not launcher.is_sglang_process("/usr/bin/nvidia-persistenced --user nvidia-persistenced")
