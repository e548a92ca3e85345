"""SGLang as an ``Engine`` (``remote/engines/sglang/engine.py``): it implements the whole interface,
the registry recognises it from a unit's command line, and each method answers as the module that
holds the rule (the binding decides nothing of its own)."""

from __future__ import annotations

import pytest

from remote.engines import ENGINES, Engine, LaunchError, MoeRunner, engine_for, engine_named, launch_refusal
from remote.engines.interface import satisfies
from remote.engines.sglang import autotune, engine as sglang_engine, launcher, moe_log, naming, runner, server_args
from remote.protocol import DEFAULT_ENGINE, ENGINE_NAMES, PROVIDER_NAMES

ENGINE = sglang_engine.ENGINE
PY = "/opt/venv/bin/python3"


def test_it_implements_the_interface_and_is_registered():
    assert satisfies(ENGINE) == [] and isinstance(ENGINE, Engine)
    assert tuple(ENGINES) == ENGINE_NAMES and ENGINES["sglang"] is ENGINE and engine_named(None) is ENGINE
    assert DEFAULT_ENGINE == "sglang" and ENGINE.provider_name in PROVIDER_NAMES
    with pytest.raises(ValueError, match="engine 'trtllm' is not one orch knows"):
        engine_named("trtllm")


def test_satisfies_names_what_an_engine_lacks():
    class Half:
        name = "half"

        def parse_log(self, txt):  # another parameter name than the interface's
            return None

    missing = satisfies(Half())
    assert "parse_log: parameters ['txt'], the interface's ['text']" in missing
    assert "moe_runner: missing" in missing and "display_name: missing" in missing


@pytest.mark.parametrize("argv, forms", [
    ([PY, "-m", "sglang.launch_server", "--model-path", "/m"], ["python -m sglang.launch_server"]),
    (["/usr/bin/numactl", "-N", "0", PY, "-m", "sglang.launch_server", "--model-path", "/m"],
     ["numactl", "python -m sglang.launch_server"]),
    (["/opt/venv/bin/sglang", "serve", "/m", "--tp", "2"], ["sglang serve"]),
])
def test_the_registry_recognises_sglang_from_the_command_line(argv, forms):
    found, launch = engine_for(argv)
    assert found is ENGINE and launch.engine == "sglang" and launch.forms == forms
    assert launch.server_argv == launcher.resolve(argv).server_argv  # the same as SGLang's own resolver
    again, _ = engine_for(argv, name="sglang")  # the inventory's orch_engine asks that engine alone
    assert again is ENGINE


def test_a_command_no_engine_starts_is_refused_naming_every_engines_forms():
    with pytest.raises(LaunchError, match="python -m http.server is not SGLang's server"):
        engine_for([PY, "-m", "http.server"])
    with pytest.raises(LaunchError, match="is not a launch form orch knows"):
        engine_for(["/usr/bin/nohup", PY, "x.py"])
    msg = launch_refusal(["/usr/bin/nohup", "x"], "why")
    assert "does not start an SGLang server nor a vLLM server in a form orch knows: why" in msg
    assert "sglang serve" in msg and "vllm serve" in msg


def test_each_method_answers_as_its_module():
    sa = server_args.parse_launch_args(["--model-path", "/m", "--moe-runner-backend", "flashinfer_trtllm",
                                        "--dp-size", "2", "--enable-dp-attention"])
    assert ENGINE.parse_server_args(["--model-path", "/m"]) == server_args.parse_launch_args(["--model-path", "/m"])
    assert sa.moe_backend == "flashinfer_trtllm" and server_args.ServerArgs("", []).moe_backend == "auto"
    text = ("server_args=ServerArgs(model_path='/m', moe_runner_backend='auto')\n"
            "Using MoE kernel config from /c/triton_3_6_0/E=8,N=64,device_name=NVIDIA_H200.json.\n")
    assert ENGINE.parse_log(text) == moe_log.parse_moe_log(text) and ENGINE.last_start_at(text) == 0
    rep = ENGINE.parse_log(text)
    assert ENGINE.verify_loaded(rep, rep.loaded) == [] and ENGINE.role_of("/c/x_down.json") == "down"
    assert ENGINE.parse_config_file_name("E=8,N=64,device_name=NVIDIA_H200.json") == \
        naming.parse_config_file_name("E=8,N=64,device_name=NVIDIA_H200.json")
    assert ENGINE.device_name("NVIDIA H200") == "NVIDIA_H200" and ENGINE.device_name_hint("H200") == "NVIDIA H200"
    assert ENGINE.with_runner(["x", "--moe-runner-backend=a"], "triton") == ["x", "--moe-runner-backend", "triton"]
    assert ENGINE.trial_key(sa)["attn_dp_dp"] == [2, 1]
    assert ENGINE.is_own_process("sglang::scheduler_TP0") and not ENGINE.is_own_process("python -m vllm")


def test_the_runner_record_says_whether_it_reads_triton_files_and_autotunes():
    probe = {"model": {"architecture": "DeepseekV3ForCausalLM", "checkpoint_quant_method": "fp8"},
             "capability": "10.0", "triton_kernels": False}
    sa = server_args.parse_launch_args(["--model-path", "/m"])
    found = ENGINE.moe_runner(sa, probe)
    assert isinstance(found, MoeRunner) and found == runner.moe_runner(
        backend="auto", architecture="DeepseekV3ForCausalLM", checkpoint_quant="fp8", capability="10.0",
        triton_kernels=False)
    assert (found.runner, found.reads_triton_configs, found.autotunes) == ("flashinfer_trtllm", False, True)
    triton = ENGINE.moe_runner(sa, probe, backend=ENGINE.triton_runner)
    assert (triton.reads_triton_configs, triton.autotunes) == (True, False)
    assert all(autotune.runner_autotunes(b) for b in autotune.AUTOTUNE_BACKENDS)


@pytest.mark.parametrize("env, workdir, home, want", [
    # the case of issue 28: SGLang does not expand "~" in a value it is given (srt/environ.py EnvStr,
    # flashinfer_autotune_cache_path Path(value)): a folder "~" in the working directory
    ({"SGLANG_CACHE_DIR": "~/c"}, "/srv", "/home/svc", "/srv/~/c"),
    ({"SGLANG_CACHE_DIR": "cache"}, "/srv", None, "/srv/cache"),
    ({"SGLANG_CACHE_DIR": "/data/c"}, "/srv", None, "/data/c"),
    ({}, "/srv", "/home/svc", "/home/svc/.cache/sglang"),  # unset: the server user's home
    ({}, "/srv", None, None),  # unset and no home known: not guessed
])
def test_the_cache_root_is_sglangs(env, workdir, home, want):
    assert ENGINE.autotune_cache_root(env, workdir, home) == want
    if want:
        assert ENGINE.autotune_cache_dir(want) == want + "/flashinfer/autotune"


def test_the_hazard_methods_answer_as_their_modules():
    """``files_bypassed``, ``root_hazards`` and ``pair_mismatch`` hand the controller's facts to
    ``bypass.py``, ``config_root.py`` and ``pairs.py`` (issue 32 rows 12-14), whose oracle tests hold
    them against the real releases."""
    from remote.engines import RootHazards
    from remote.engines.sglang import bypass, config_root, pairs

    det = server_args.parse_launch_args(["--model-path", "/m", "--enable-deterministic-inference"])
    assert ENGINE.files_bypassed(det, "0.5.23") == bypass.files_bypassed(det.launch_args, True, "0.5.23")
    assert ENGINE.files_bypassed(det, "0.5.23").startswith("--enable-deterministic-inference is set")
    assert ENGINE.files_bypassed(det, "0.5.4") is None  # 0.5.4 takes the flag but still reads the files
    kt = server_args.parse_launch_args(["--model-path", "/m", "--kt-weight-path", "/w", "--kt-num-gpu-experts", "8"])
    assert "--kt-num-gpu-experts 8" in ENGINE.files_bypassed(kt, None)
    assert ENGINE.files_bypassed(server_args.parse_launch_args(["--model-path", "/m"]), None) is None

    asked = []

    def exists(path):
        asked.append(path)
        return False

    rules = {"fallback": "scan", "config_dir_env": True}
    got = ENGINE.root_hazards(configs_root="/c", unparsable=["triton_3_6_0.bak"], misses={"up": True, "down": False},
                              loader_rules=rules, environment={"SGLANG_MOE_CONFIG_DIR": ""}, working_directory="/srv",
                              folder_exists=exists)
    assert isinstance(got, RootHazards) and asked == ["/srv/configs"]
    assert got.entries == config_root.entry_states("/c", ["triton_3_6_0.bak"], {"up": True, "down": False}, rules)
    assert got.entries[0]["state"] == "will-crash" and got.config_dir["state"] == "will-crash"
    assert got.install_refusal.startswith("the configs root /c holds an entry SGLang's version sort cannot parse: "
                                          "/c/triton_3_6_0.bak (will-crash: ")
    assert got.will_crash[-1].startswith("/srv/configs does not exist: SGLANG_MOE_CONFIG_DIR is set but empty")
    # a folder that is there, or one that cannot be checked: the server reads elsewhere, it does not crash
    there = ENGINE.root_hazards(configs_root="/c", unparsable=[], misses={}, loader_rules=rules,
                                environment={"SGLANG_MOE_CONFIG_DIR": "rel"}, working_directory=None,
                                folder_exists=lambda path: None)
    assert there.entries == [] and there.install_refusal is None
    assert there.config_dir["configs_root"] == "/rel/configs" and there.config_dir["state"] == "not-loaded"
    asked.clear()
    clean = ENGINE.root_hazards(configs_root="/c", unparsable=[], misses={}, loader_rules=rules,
                                environment={"SGLANG_MOE_CONFIG_DIR": "/abs"}, working_directory=None,
                                folder_exists=exists)
    assert clean == RootHazards() and asked == []  # nothing to check: the host is not asked

    up = {"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 64}}
    down = {"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 32}}
    want = pairs.describe(pairs.block_m_mismatches(up, down), "0.5.8")
    assert ENGINE.pair_mismatch(up, down, "0.5.8") == want and "asserts they match" in want
    assert "overrides the down BLOCK_SIZE_M" in ENGINE.pair_mismatch(up, down, None)
    assert ENGINE.pair_mismatch(up, dict(up), "0.5.8") is None
