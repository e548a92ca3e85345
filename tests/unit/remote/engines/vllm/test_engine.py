"""vLLM as an ``Engine`` (``remote/engines/vllm/engine.py``): it implements the whole interface, the
registry recognises it from a unit's command line, and each method answers as the module of
``remote/engines/vllm/`` that holds the rule (CPU only, no vLLM installed)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from remote.engines import ENGINES, Engine, LaunchError, MoeLogReport, engine_for, engine_named
from remote.engines.interface import satisfies
from remote.engines.vllm import engine as vllm_engine
from remote.engines.vllm import lookup, model_flags, moe_log, runner, server_args
from remote.protocol import ENGINE_NAMES, PROVIDER_NAMES, PayloadError

ENGINE = vllm_engine.ENGINE
PY = "/opt/venv/bin/python3"
MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "data", "models")
NAME = "E=128,N=768,device_name=NVIDIA_H200.json"


def test_it_implements_the_interface_and_is_registered():
    assert satisfies(ENGINE) == [] and isinstance(ENGINE, Engine)
    assert ENGINES["vllm"] is ENGINE and engine_named("vllm") is ENGINE and "vllm" in ENGINE_NAMES
    assert ENGINE.provider_name in PROVIDER_NAMES and ENGINE.display_name == "vLLM"


@pytest.mark.parametrize("argv, entry, server_argv", [
    (["/srv/vllm/bin/vllm", "serve", "/m", "-tp", "2"], server_args.ENTRY_SERVE, ["serve", "/m", "-tp", "2"]),
    ([PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], server_args.ENTRY_MODULE, ["--model", "/m"]),
    (["/usr/bin/numactl", "-N", "0", PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"],
     server_args.ENTRY_MODULE, ["--model", "/m"]),
])
def test_the_registry_recognises_vllm_from_the_command_line(argv, entry, server_argv):
    found, launch = engine_for(argv)
    assert found is ENGINE and launch.engine == "vllm" and launch.entry == entry
    assert launch.server_argv == server_argv
    again, _ = engine_for(argv, name="vllm")
    assert again is ENGINE
    with pytest.raises(LaunchError):  # SGLang's rules alone do not start it
        engine_for(argv, name="sglang")


def test_a_vllm_subcommand_that_serves_nothing_is_refused():
    with pytest.raises(LaunchError, match="'vllm bench' does not start a server"):
        engine_for(["/usr/bin/vllm", "bench", "serve"])


def test_processes_and_console_script():
    assert ENGINE.is_console_script("#!/v/bin/python\nimport re\nfrom vllm.entrypoints.cli.main import main\n")
    assert not ENGINE.is_console_script("from sglang.cli.main import main\n")
    assert ENGINE.is_own_process("VLLM::EngineCore") and ENGINE.is_own_process("VLLM::Worker_TP0")
    assert ENGINE.is_own_process("/v/bin/python /v/bin/vllm serve /m --port 8000")
    assert ENGINE.is_own_process(f"{PY} -m vllm.entrypoints.openai.api_server --model /m")
    assert not ENGINE.is_own_process("/usr/bin/nvidia-persistenced") and not ENGINE.is_own_process("vllm-exporter")
    assert ENGINE.is_server_process(["/v/bin/python", "/v/bin/vllm", "serve", "/m"], ["/m"])
    assert ENGINE.is_server_process([PY, "-m", server_args.ENTRY_MODULE, "--model", "/m"], ["--model", "/m"])
    assert not ENGINE.is_server_process([PY, "-m", server_args.ENTRY_MODULE, "--model", "/x"], ["--model", "/m"])


def test_server_args_and_config_merge(tmp_path):
    sa = ENGINE.parse_server_args(["serve", "/m", "-tp", "2", "--enable-expert-parallel", "--moe-backend",
                                   "FlashInfer-Cutlass"])
    assert (sa.model_path, sa.tp, sa.ep, sa.moe_backend, sa.port) == ("/m", 2, 2, "flashinfer_cutlass", 8000)
    assert ENGINE.config_file(["serve", "/m", "--config", "c.yaml"]) == "c.yaml"
    merged = ENGINE.merge_config(["serve", "/m", "--config", "c.yaml", "-tp", "4"], "c.yaml",
                                 lambda: {"tensor-parallel-size": 2, "port": 9000})
    assert ENGINE.parse_server_args(merged).tp == 4 and ENGINE.parse_server_args(merged).port == 9000
    calls = []
    with pytest.raises(ValueError, match="yaml/yml"):  # refused by its name, before the file is read
        ENGINE.merge_config(["serve", "/m", "--config", "c.json"], "c.json", lambda: calls.append(1))
    assert calls == []


def _args(**kw):
    base = dict(engine="vllm", model_config=None, hf_home=None, download_dir=None, tp=1, ep=1, dtype=None,
                quantization=None, disable_shared_experts_fusion=False, device_name=None)
    return argparse.Namespace(**dict(base, **kw))


def test_shape_and_file_names_follow_vllms_rules():
    shape, src = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "Qwen3-30B-A3B.json")))
    assert (shape.E, shape.N, shape.topk, shape.dtype_selector) == (128, 768, 8, None)
    assert src.endswith("Qwen3-30B-A3B.json")
    assert shape.file_names("NVIDIA_H200") == {"up": NAME, "down": NAME.replace(".json", "_down.json")}
    tp2, _ = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "Qwen3-30B-A3B.json"), tp=2))
    assert (tp2.E, tp2.N) == (128, 384)
    ep4, _ = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "Qwen3-30B-A3B.json"), tp=4, ep=4))
    assert (ep4.E, ep4.N) == (32, 768)  # --enable-expert-parallel: experts split, N whole
    ds, _ = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "DeepSeek-V3.json"), tp=8))
    assert ds.E == 256 and ds.dtype_selector == "fp8_w8a8" and ds.block_shape == [128, 128]  # no fused shared expert
    assert ds.file_names("NVIDIA_H200")["up"].endswith(",dtype=fp8_w8a8,block_shape=[128,128].json")
    assert json.loads(json.dumps(shape.to_dict()))["E"] == 128  # the probe sends it as JSON
    with pytest.raises(PayloadError, match="--model-config or --shape"):
        ENGINE.shape_from_args(_args())


@pytest.mark.parametrize("command", model_flags.COMMANDS)
def test_vllms_model_flags_are_the_shared_tables(command):
    from remote.engines import add_model_flags

    mine, shared = argparse.ArgumentParser(), argparse.ArgumentParser()
    ENGINE.add_model_flags(mine, command)
    add_model_flags(shared, command)
    assert sorted((a.dest, a.default, a.required) for a in mine._actions) == \
        sorted((a.dest, a.default, a.required) for a in shared._actions)


def test_model_argv_parses_back_with_the_shared_model_flags():
    from remote.engines import add_model_flags

    values = {"engine": "vllm", "model_config": "/m", "download_dir": None, "tp": 2, "ep": 1, "dtype": None,
              "quantization": "fp8", "disable_shared_experts_fusion": False, "device_name": "NVIDIA H200"}
    argv = ENGINE.model_argv(values)
    p = argparse.ArgumentParser()
    add_model_flags(p, "probe")
    got = vars(p.parse_args(argv))
    assert {k: got[k] for k in values} == values


def test_device_names_and_config_file_names():
    assert ENGINE.device_name("NVIDIA H200 NVL") == "NVIDIA_H200"
    assert ENGINE.device_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert ENGINE.device_name_hint("NVIDIA_H200") == "NVIDIA H200" and ENGINE.device_name_hint("NVIDIA H200") is None
    parts = ENGINE.parse_config_file_name("E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
    assert parts == {"E": 256, "N": 256, "device_name": "NVIDIA_H200", "dtype": "fp8_w8a8",
                     "block_shape": [128, 128], "per_channel_quant": False, "down": False}
    assert ENGINE.parse_config_file_name("E=256,N=256,device_name=NVIDIA_H200,block_shape=[128, 128].json") is None


def _tree(tmp_path, release="0.33.0"):
    """A vLLM package as pip leaves it, found by find_spec (no code of it is run)."""
    pkg = tmp_path / "site" / "vllm"
    (pkg / lookup.PACKAGE_CONFIGS).mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('never imported by the probe')\n")
    (pkg / lookup.LOADER_MODULE).write_text("def get_moe_configs(): pass\n")
    dist = tmp_path / "site" / f"vllm-{release}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n")
    return pkg


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    importlib.invalidate_caches()
    return tmp_path


def test_lookup_reads_the_tuned_folder_first_and_no_down_file(tmp_path, on_path):
    pkg = _tree(tmp_path)
    shape, _ = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "Qwen3-30B-A3B.json")))
    (pkg / lookup.PACKAGE_CONFIGS / NAME).write_text("{}")
    warnings: list[str] = []
    found = ENGINE.lookup(config_dir=None, triton_version="3.5.1", device_name="NVIDIA_H200", shape=shape,
                          warnings=warnings)
    shipped = os.path.realpath(pkg / lookup.PACKAGE_CONFIGS)
    assert found["triton_folder"] is None and found["exact_folder"] is None and found["unparsable_folders"] == []
    assert found["engine"]["installed"] and found["engine"]["version"] == "0.33.0"
    assert found["install_dir"] == shipped and found["engine"]["shipped_configs_root"] == shipped
    assert found["existing"]["up"]["would_load"] == os.path.join(shipped, NAME)
    assert found["existing"]["down"]["read_by_engine"] is False and found["existing"]["down"]["would_load"] is None
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / NAME).write_text("{}")
    found = ENGINE.lookup(config_dir=str(tuned), triton_version=None, device_name="NVIDIA_H200", shape=shape,
                          warnings=warnings)
    assert found["install_dir"] == str(tuned) and found["engine"]["configs_root"] == str(tuned)
    assert found["existing"]["up"]["would_load"] == str(tuned / NAME)  # VLLM_TUNED_CONFIG_FOLDER wins
    assert found["existing"]["up"]["in_installed_folder"] and warnings == []


def test_0_34_reads_the_down_file_for_fp8_block_128(tmp_path, on_path):
    _tree(tmp_path, "0.34.0")
    shape, _ = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "DeepSeek-V3.json"), tp=8))
    found = ENGINE.lookup(config_dir=None, triton_version=None, device_name="NVIDIA_H200", shape=shape, warnings=[])
    assert found["existing"]["down"]["read_by_engine"] is True and found["engine"]["loader_rules"]["reads_down"]


def test_provider_missing_reads_the_disk(tmp_path, on_path):
    pkg = _tree(tmp_path)
    assert "compiled ops" in ENGINE.provider_missing()
    (pkg / "_C.abi3.so").write_bytes(b"")
    assert ENGINE.provider_missing() is None


START = "(APIServer pid=7) INFO 12-04 04:00:00 [api_utils.py:330] vLLM server version 0.33.0, serving model /m\n"


def test_the_log_model():
    shipped = "/v/vllm/model_executor/layers/fused_moe/configs"
    old = START + f"(APIServer pid=7) INFO 12-04 04:00:01 [fused_moe.py:1] Using configuration from /old/{NAME} for MoE layer.\n"
    new = (START.replace("pid=7", "pid=9")
           + "(EngineCore pid=10) INFO 12-04 04:01:00 [unquantized.py:1] Using TRITON Unquantized MoE backend out of "
             "potential backends: ['TRITON', 'BATCHED_TRITON'].\n"
           + f"(EngineCore pid=10) WARNING 12-04 04:01:01 [fused_moe.py:2] Using default MoE config. Performance might "
             f"be sub-optimal! Config file not found at /t/{NAME}, {shipped}/{NAME}\n"
           + "(APIServer pid=9) INFO 12-04 04:01:05 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000\n")
    text = old + new
    assert text[ENGINE.last_start_at(text):] == new and ENGINE.last_start_at("nothing") == -1
    rep = ENGINE.parse_log(new)
    assert rep.ready and rep.default == [f"/t/{NAME}"] and rep.overall == "default"
    assert rep.runner_lines[0].runner == "TRITON" and rep.start_runner == "triton"
    # what a runner trial compares with the --moe-backend it set (the log names the backend its own way)
    fi = ENGINE.parse_log("INFO [unquantized.py:1] Using FlashInfer CUTLASS Unquantized MoE backend out of potential "
                          "backends: ['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS'].\n")
    assert fi.start_runner == "flashinfer_cutlass" and ENGINE.parse_log(old).start_runner is None
    from remote.engines.vllm.runner import backend_flag
    assert [backend_flag(n) for n in ("FLASHINFER_TRTLLM", "DEEPGEMM", "VLLM_CUTLASS", "'TRITON'", "ROCm AITER")] == [
        "flashinfer_trtllm", "deep_gemm", "cutlass", "triton", None]
    assert ENGINE.verify_loaded(rep, [f"/t/{NAME}"]) == [
        f"log does not show 'Using configuration from /t/{NAME} for MoE layer.'",
        f"server used vLLM's default MoE config; not found: /t/{NAME}"]
    ok = ENGINE.parse_log(old)
    assert ok.loaded == [f"/old/{NAME}"] and ENGINE.verify_loaded(ok, [f"/old/{NAME}"]) == []
    assert ENGINE.role_of(f"/t/{NAME}") == "up" and ENGINE.role_of("/t/x_down.json") == "down"
    assert ENGINE.hidden_load_lines(server_args.parse_server_args(["serve", "/m", "--log-level", "warning"]))
    assert ENGINE.hidden_load_lines(server_args.parse_server_args(["serve", "/m"])) is None


def test_the_logo_start_line_opens_a_start():
    logo = ("(APIServer pid=3) INFO 12-04 04:00:00 [startup.py:40] \n"
            "       █     █     █▄   ▄█\n"
            " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.34.0\n"
            "  █▄█▀ █     █     █     █  model   /m\n")
    text = START + "x\n" + logo + "later\n"
    assert text[ENGINE.last_start_at(text):].startswith("(APIServer pid=3)")


def _probe(model=None, capability="9.0"):
    return {"capability": capability, "model": model or {"quant_method": None, "block_shape": None}}


def test_the_moe_runner():
    sa = server_args.parse_server_args(["serve", "/m"])
    r = ENGINE.moe_runner(sa, _probe())
    assert r.reads_triton_configs is True and r.source == "derived" and r.runner == "triton"
    fi = server_args.parse_server_args(["serve", "/m", "--moe-backend", "flashinfer_cutlass"])
    r = ENGINE.moe_runner(fi, _probe())
    assert r.reads_triton_configs is False and r.source == "flag" and r.runner == "flashinfer_cutlass"
    assert ENGINE.moe_runner(sa, _probe(capability="10.0")).known is False  # Blackwell: FlashInfer may come first
    log = MoeLogReport()
    log.runner_lines.append(runner_line := __import__("remote.engines", fromlist=["RunnerLine"]).RunnerLine(
        "FlashInfer CUTLASS", "oracle", "Using FlashInfer CUTLASS Unquantized MoE backend."))
    r = ENGINE.moe_runner(sa, _probe(), log=log)
    assert r.source == "log" and r.reads_triton_configs is False and "FlashInfer CUTLASS" in r.reason
    assert r.disagreement and runner_line.runner == r.runner
    assert ENGINE.moe_runner(sa, _probe(), backend="triton").reads_triton_configs is True


def test_runner_candidates_and_the_flag():
    assert ENGINE.with_runner(["serve", "/m", "--moe-backend=marlin", "-tp", "2"], "triton") == [
        "serve", "/m", "-tp", "2", "--moe-backend", "triton"]
    assert ENGINE.runner_candidates("triton,flashinfer_cutlass", "0.33.0", lambda n: n) == ["triton",
                                                                                            "flashinfer_cutlass"]
    assert ENGINE.runner_candidates("auto", None, lambda n: None) == ["triton"]
    with pytest.raises(PayloadError, match="not a vLLM --moe-backend"):
        ENGINE.runner_candidates("flashinfer_trtllm_gen", None, lambda n: n)
    assert (ENGINE.runner_flag, ENGINE.triton_runner, ENGINE.runner_field) == ("--moe-backend", "triton", "moe_backend")


def test_requests():
    req = ENGINE.generate_request("hello", 1)
    assert (req.method, req.path) == ("POST", "/v1/completions") and "model" not in req.body
    assert req.body["max_tokens"] == 1 and req.body["temperature"] == 0 and req.body["return_token_ids"] is True
    gen = ENGINE.parse_generation({"choices": [{"text": " a", "token_ids": [5]}], "usage": {"completion_tokens": 1}})
    assert (gen.text, gen.output_ids, gen.tokens) == (" a", [5], 1)
    assert (ENGINE.liveness_path, ENGINE.health_path) == ("/v1/models", "/health")
    b = ENGINE.bench_request([1, 2, 3], 4)
    assert b.body["prompt"] == [1, 2, 3] and b.body["max_tokens"] == 4 and b.body["ignore_eos"] and b.body["stream"]
    assert ENGINE.bench_chunk({"choices": [{"text": "x"}]}) == (True, {})
    assert ENGINE.bench_chunk({"choices": [], "usage": {"completion_tokens": 4}}) == (False, {"completion_tokens": 4})
    assert ENGINE.bench_tool == "vllm"
    # bound to remote.engines.vllm.bench_tool.run_vllm: without vLLM on this Python, not_found
    with pytest.raises(PayloadError, match="import vllm") as exc:
        ENGINE.run_bench_tool(url="http://127.0.0.1:8000", levels=[1], input_len=4, output_len=4)
    assert exc.value.kind == "not_found"


def test_the_cache_root_as_vllm_resolves_it():
    assert ENGINE.autotune_cache_root({}, None, "/home/u") == "/home/u/.cache/vllm"
    assert ENGINE.autotune_cache_root({"XDG_CACHE_HOME": "/x"}, None, None) == "/x/vllm"
    assert ENGINE.autotune_cache_root({"VLLM_CACHE_ROOT": "~/c"}, None, "/home/u") == "/home/u/c"
    assert ENGINE.autotune_cache_root({"VLLM_CACHE_ROOT": "rel"}, "/srv", None) == "/srv/rel"
    assert ENGINE.autotune_cache_root({}, None, None) is None
    assert ENGINE.autotune_cache_dir("/r") == "/r/flashinfer_autotune_cache"
    fi = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "~/fi"}
    assert ENGINE.autotune_cache_dir("/r", environment=fi, home="/home/u") == "/home/u/fi"
    assert ENGINE.autotune_cache_dir("/r", environment=fi) is None  # needs the home
    sa = server_args.parse_server_args(["serve", "/m", "--moe-backend", "triton"])
    assert ENGINE.trial_key(sa)["moe_backend"] == "triton"
    assert ENGINE.autotune_state(sa, _probe(), ENGINE.moe_runner(sa, _probe()), {}, None) is None


def test_environment_keys():
    assert ENGINE.config_dir_env == "VLLM_TUNED_CONFIG_FOLDER" and ENGINE.config_dir_env in ENGINE.payload_env_keys
    assert "VLLM_CACHE_ROOT" in ENGINE.env_keys and "VLLM_CACHE_ROOT" not in ENGINE.payload_env_keys
    assert "VLLM_TUNED_CONFIG_FOLDER" in ENGINE.config_dir_note()


def test_model_facts_reads_the_checkpoint():
    facts = ENGINE.model_facts(os.path.join(MODELS, "DeepSeek-V3.json"))
    assert facts["checkpoint_quant_method"] == "fp8" and "model_type" in facts
    assert model_flags.model_facts(os.path.join(MODELS, "Qwen3-30B-A3B.json"))["checkpoint_quant_method"] is None


def test_the_interface_binds_to_the_modules():
    assert ENGINE.parse_log.__doc__ and moe_log.START_MARKERS and ENGINE.runner_flag == runner.MOE_BACKEND_FLAG


def test_hazards_bypass_and_pairs():
    sa = server_args.parse_server_args(["serve", "/m"])
    assert ENGINE.files_bypassed(sa, "0.34.0") is None
    none = ENGINE.root_hazards(configs_root="/c", unparsable=[], misses={}, loader_rules={},
                               environment={"VLLM_TUNED_CONFIG_FOLDER": "/abs"}, working_directory=None,
                               folder_exists=lambda p: True)
    assert none.entries == [] and none.config_dir is None and none.will_crash == []
    rel = ENGINE.root_hazards(configs_root="/c", unparsable=[], misses={}, loader_rules={},
                              environment={"VLLM_TUNED_CONFIG_FOLDER": "moe"}, working_directory="/srv",
                              folder_exists=lambda p: p == "/srv/moe")
    assert rel.config_dir["configs_root"] == "/srv/moe" and rel.config_dir["state"] == "not-loaded"
    assert rel.config_dir["exists"] is True and rel.will_crash == []  # a missing file, never a crash
    assert ENGINE.pair_mismatch({"1": {"BLOCK_SIZE_M": 16}}, {"1": {"BLOCK_SIZE_M": 64}}, "0.34.0") is None
    with pytest.raises(ValueError, match="no routing file"):
        ENGINE.load_recorded_routing("/r.pt")


def test_the_vllm_image_runs_its_entry_point():
    from remote.engines import container_command, in_image

    # the image's ENTRYPOINT: `vllm serve` since 0.11.1, the api_server module before (test_image_oracle.py)
    assert container_command("docker.io/vllm/vllm-openai:v0.34.0", None, ["/m"]) == ["vllm", "serve", "/m"]
    assert container_command("vllm/vllm-openai:v0.10.2", None, ["--model", "/m"]) == [
        "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert container_command("vllm/vllm-openai", "vllm", ["serve", "/m"]) == ["vllm", "serve", "/m"]
    assert container_command("lmsysorg/sglang:v0.5.23", None, ["python3", "-m", "sglang.launch_server"]) == [
        "python3", "-m", "sglang.launch_server"]
    found, launch = engine_for(container_command("vllm/vllm-openai:latest", None, ["/m", "-tp", "2"]))
    assert found is ENGINE and launch.server_argv == ["serve", "/m", "-tp", "2"] and launch.script == "vllm"
    # the console script is in the image, not on the host: the image's python3 runs it (the payload's interpreter)
    assert launch.needs_shebang and not in_image(launch).needs_shebang and launch.interpreter == "python3"
    hooked = engine_for(["docker", "run", "--name", "v", "vllm/vllm-openai", "/m"],
                        container=lambda argv: (container_command(argv[-2], None, argv[-1:]), "run"))[1]
    assert hooked.container == "run" and hooked.interpreter == "python3" and not hooked.needs_shebang
    old = engine_for(container_command("vllm/vllm-openai:v0.11.0", None, ["--model", "/m"]))[1]
    assert old.server_argv == ["--model", "/m"] and old.interpreter == "python3"


def test_lookup_without_vllm_here_still_reads_no_down_file(tmp_path, monkeypatch):
    """A probe that finds no vLLM package (a container's image path, a broken install) still answers
    every role: the _down file is not read (no shipped folder to search)."""
    monkeypatch.setattr(lookup, "package_dirs", lambda: [])
    shape, _ = ENGINE.shape_from_args(_args(model_config=os.path.join(MODELS, "Qwen3-30B-A3B.json")))
    (tmp_path / NAME).write_text("{}")
    warnings: list[str] = []
    found = ENGINE.lookup(config_dir=str(tmp_path), triton_version=None, device_name="NVIDIA_H200", shape=shape,
                          warnings=warnings)
    assert found["existing"]["down"]["read_by_engine"] is False and found["existing"]["up"]["read_by_engine"]
    assert found["existing"]["up"]["would_load"] == str(tmp_path / NAME)
    assert "vllm is not installed for this interpreter" in warnings


@pytest.mark.parametrize("model,tp,dp,ep,want", [
    # (E, N) per rank: without EP vLLM splits N over TP x DP (FusedMoEParallelConfig.make); with EP
    # (--enable-expert-parallel: the unit's EP is TP x DP) the experts are split and N stays whole
    ("Qwen3-30B-A3B.json", 1, 2, 1, (128, 384)),
    ("Qwen3-30B-A3B.json", 1, 4, 1, (128, 192)),
    ("Qwen3-30B-A3B.json", 2, 4, 1, (128, 96)),
    ("Qwen3-30B-A3B.json", 1, 8, 8, (16, 768)),
    ("DeepSeek-V3.json", 1, 2, 1, (256, 1024)),
    ("DeepSeek-V3.json", 2, 4, 1, (256, 256)),
    ("DeepSeek-V3.json", 1, 8, 1, (256, 256)),
    ("DeepSeek-V3.json", 1, 8, 8, (32, 2048)),
])
def test_data_parallel_without_expert_parallel_splits_n(model, tp, dp, ep, want):
    """A vLLM unit's -dp reaches the payload's model flags (``--dp``, passed when > 1), parses back
    with the shared table, and names the file of N / (TP x DP)."""
    from remote.engines import add_model_flags

    from tests.paths import DATA

    path = DATA / "models" / model
    values = {"engine": "vllm", "model_config": str(path), "tp": tp, "ep": ep, "dp": dp,
              "device_name": "NVIDIA H200"}
    p = argparse.ArgumentParser()
    add_model_flags(p, "probe")
    args = p.parse_args(ENGINE.model_argv(values))
    assert (args.tp, args.ep, args.dp) == (tp, ep, dp)
    shape, _ = ENGINE.shape_from_args(args)
    assert (shape.E, shape.N) == want
    assert shape.file_names("NVIDIA_H200")["up"].startswith(f"E={want[0]},N={want[1]},")
    if ep == 1:
        assert any("TP x DP" in n for n in shape.notes)


def test_the_controller_passes_a_units_data_parallel_size(tmp_path):
    """orchestrator.payload.model_args: a vLLM unit with -dp 4 and no --enable-expert-parallel gives
    ``--dp 4`` and ``--ep 1``; with EP the unit's EP (TP x DP) and the same ``--dp``."""
    from orchestrator.payload.model_args import model_flags
    from remote.engines.vllm.server_args import parse_server_args
    from tests.fakes import make_ctx

    for words, want in ((["--model", "/m", "-tp", "2", "-dp", "4"], (2, 1, 4)),
                        (["--model", "/m", "-tp", "2", "-dp", "4", "--enable-expert-parallel"], (2, 8, 4)),
                        (["--model", "/m", "-tp", "2"], (2, 1, 1))):
        server = parse_server_args(words)
        ctx = make_ctx(tmp_path, {"orch_engine": "vllm", "orch_unit": {"server": {
            "model_path": "/m", "tp": server.tp, "ep": server.ep, "dp": server.dp}}})
        assert ctx.facts.engine.name == "vllm"
        argv = model_flags(ctx)
        assert ("--dp" in argv) == (want[2] > 1)
        p = argparse.ArgumentParser()
        from remote.engines import add_model_flags
        add_model_flags(p, "tune")
        args = p.parse_args(argv)
        assert (args.tp, args.ep, args.dp) == want
