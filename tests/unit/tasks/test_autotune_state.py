"""FlashInfer's autotune state as ``orch doctor`` reports it (``orchestrator.host.autotune``,
``Engine.autotune_state``: ``remote.engines.sglang.autotune.server_state``), the cache root the
probe and the runner trial share, and the probe's listing of cache folders."""

from __future__ import annotations

import argparse
import os

import pytest

from orchestrator.cli.doctor import backend_cell
from orchestrator.facts.probe import ProbeFacts
from orchestrator.facts.schema import from_dict
from orchestrator.facts.unit import UnitFacts
from orchestrator.host.autotune import autotune_state, workdir_of
from remote.engines import MoeLogReport, engine_named
from orchestrator.tasks.diagnose import autotune_why
from remote import probe as payload_probe
from remote.engines.sglang import autotune
from remote.engines.sglang.runner import moe_runner, probe_inputs, resolved_server_args
from remote.engines.sglang.server_args import parse_server_args

MODEL = "/models/DeepSeek-V3"
ROOT = "/var/cache/sglang"


def server(*flags: str):
    return parse_server_args(["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", MODEL, *flags])


def probe(caches=(), version="0.6.9", capability="10.0", model_type="deepseek_v3"):
    return from_dict(ProbeFacts, {
        "capability": capability, "flashinfer_version": version, "autotune_cache_root": ROOT,
        "autotune_caches": list(caches),
        "model": {"architecture": "DeepseekV3ForCausalLM", "checkpoint_quant_method": "fp8", "E": 256, "N": 256,
                  "config_dtype": "bfloat16", "model_type": model_type}})


def unit(env=None):
    return from_dict(UnitFacts, {"unit": "sglang", "environment": dict(env or {})})


def key_for(sv):
    return autotune.cache_key(model_path=MODEL, dtype="torch.bfloat16", quantization="fp8",
                              backend="flashinfer_trtllm", tp=sv.tp, pp=sv.pp, attn_dp=sv.attn_dp_size, ep=sv.ep,
                              config_class="DeepseekV3Config")


def derived_key(sv, pr, resolved):
    """``(key, why not)``: :func:`remote.engines.sglang.autotune.server_key` of the probe's model."""
    return autotune.server_key(sv, pr.to_dict()["model"], resolved)


def cache_root(u):
    """The unit's cache root when the engine's rule needs no home lookup (its ``HOME`` or its
    ``$SGLANG_CACHE_DIR``): ``Engine.autotune_cache_root``, relative to :func:`workdir_of`."""
    return engine_named(None).autotune_cache_root(u.environment, workdir_of(u), u.environment.get("HOME"))


def state(sv, pr, env=None, log=None):
    runner = moe_runner(backend=sv.moe_runner_backend, quantization=sv.quantization, **probe_inputs(pr.to_dict()))
    return autotune_state(engine_named(None), unit(env), sv, pr, runner, MoeLogReport(autotune=log))


def cache(key, version="0.6.9", sm="sm100", files=("rank_tp0_pp0_dp0.json",)):
    return {"version": version, "sm": sm, "key": key, "path": f"{ROOT}/flashinfer/autotune/{version}/{sm}/{key}",
            "files": list(files), "runs": 0}


def test_deepseek_fp8_on_b200_resolves_and_hashes_as_sglang_does():
    sv = server("--tp", "8")
    assert resolved_server_args(architecture="DeepseekV3ForCausalLM", checkpoint_quant="fp8",
                                capability="10.0") == ("flashinfer_trtllm", "fp8")
    key, why = derived_key(sv, probe(), ("flashinfer_trtllm", "fp8"))
    assert why is None and key == key_for(sv)


def test_present_missing_and_stale():
    sv = server("--tp", "8")
    key = key_for(sv)
    present = state(sv, probe([cache(key)]))
    assert (present.enabled, present.cache, present.other_versions) == (True, "present", [])
    assert present.path == f"{ROOT}/flashinfer/autotune/0.6.9/sm100/{key}"
    assert state(sv, probe([cache(key, files=())])).cache == "missing"  # folder without a rank file
    assert state(sv, probe([cache("0" * 16)])).cache == "missing"  # another server's key
    stale = state(sv, probe([cache(key, version="0.5.3")]))
    assert stale.cache == "missing" and stale.other_versions == [cache(key, version="0.5.3")["path"]]
    assert "another FlashInfer version" in autotune_why(stale)
    assert state(sv, probe([cache(key, sm="sm90")])).cache == "missing"


def test_disabled_and_not_reused():
    off = state(server("--tp", "8", "--disable-flashinfer-autotune"), probe())
    assert off.enabled is False and "--disable-flashinfer-autotune" in off.why
    fresh = state(server("--tp", "8"), probe(), env={"SGLANG_FLASHINFER_AUTOTUNE_CACHE": "0"})
    assert fresh.enabled is True and fresh.cache == "not-reused"


def test_not_a_flashinfer_runner_has_no_state():
    assert state(server(), probe(capability="9.0")) is None  # auto resolves to triton on sm90


def test_unknown_config_class_is_not_guessed_but_the_log_tells():
    sv = server("--tp", "8")
    pr = probe(model_type="my_new_moe")
    assert state(sv, pr).cache == "unknown"
    logged = f"{ROOT}/flashinfer/autotune/0.6.9/sm100/abcdef0123456789/rank_tp0_pp0_dp0.json"
    st = state(sv, probe([cache("abcdef0123456789")], model_type="my_new_moe"),
               log=autotune.AutotuneLog(logged, True, True))
    assert (st.key, st.key_source, st.cache) == ("abcdef0123456789", "log", "present")


def test_deprecated_dp_attention_counts_as_attn_dp():
    sv = server("--tp", "8", "--dp-size", "4", "--enable-dp-attention")
    key, _ = derived_key(sv, probe(), ("flashinfer_trtllm", "fp8"))
    assert key == autotune.cache_key(model_path=MODEL, dtype="torch.bfloat16", quantization="fp8",
                                     backend="flashinfer_trtllm", tp=8, attn_dp=4, config_class="DeepseekV3Config")


def test_cache_root_of_the_unit():
    assert cache_root(unit({"SGLANG_CACHE_DIR": "/srv/c"})) == "/srv/c"
    assert cache_root(unit({"HOME": "/home/svc"})) == "/home/svc/.cache/sglang"
    u = from_dict(UnitFacts, {"unit": "s", "environment": {"SGLANG_CACHE_DIR": "cache"}, "working_directory": "/opt"})
    assert cache_root(u) == "/opt/cache"
    assert cache_root(unit()) is None


def test_probe_lists_cache_folders(tmp_path):
    key_dir = tmp_path / "flashinfer" / "autotune" / "0.6.9" / "sm100" / "0123456789abcdef"
    (key_dir / "runs").mkdir(parents=True)
    (key_dir / "rank_tp0_pp0_dp0.json").write_text("{}")
    (key_dir / "runs" / "rank_tp0_pp0_dp0.x.json").write_text("{}")
    (tmp_path / "flashinfer" / "autotune" / "0.6.9" / "notes.txt").write_text("")
    found = payload_probe.autotune_caches(str(tmp_path), [])
    assert found == [{"version": "0.6.9", "sm": "sm100", "key": "0123456789abcdef", "path": str(key_dir),
                      "files": ["rank_tp0_pp0_dp0.json"], "runs": 1}]
    assert payload_probe.autotune_caches(str(tmp_path / "none"), []) == []


def test_probe_answer_carries_flashinfer_and_caches(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    payload_probe.add_arguments(parser)
    args = parser.parse_args(["--autotune-cache-root", str(tmp_path)])
    data = payload_probe.run(args)
    assert data["autotune_cache_root"] == str(tmp_path) and data["autotune_caches"] == []
    assert "flashinfer_version" in data
    ProbeFacts.parse(data, "probe")  # the controller's record takes the new fields
    assert os.path.isdir(tmp_path)


def test_doctor_cell_shows_runner_and_autotune():
    row = {"backend": "auto", "runner": {"runner": "flashinfer_trtllm"},
           "autotune": {"enabled": True, "cache": "missing", "other_versions": ["/x"]}}
    assert backend_cell(row) == "auto\nrunner flashinfer_trtllm\nautotune on, cache missing, stale cache"
    assert backend_cell({"backend": "triton", "runner": {"runner": "triton"}, "autotune": None}) == "triton\nrunner triton"


# --- one cache folder: the probe (orch doctor) and the runner trial's backup give SGLang's answer ---

def _unit_ctx(tmp_path, env, probe_answer=None):
    from tests.fakes import FakePayload, ScriptedConnection, make_ctx

    unit = from_dict(UnitFacts, {"unit": "sglang-qwen", "environment": env, "user": "svc", "working_directory": "/srv",
                                 "server": {"model_path": "/models/q"}})
    conn = ScriptedConnection([(r"^getent passwd svc$", "svc:x:998:998::/home/svc:/usr/sbin/nologin\n")])
    payload = FakePayload({"probe": probe_answer or {}})
    return make_ctx(tmp_path, {"orch_unit": unit, "orch_engine": "sglang"}, connection=conn, payload=payload), payload


@pytest.mark.parametrize("env, root", [
    # issue 28: SGLANG_CACHE_DIR=~/c on a unit with User=svc and WorkingDirectory=/srv. SGLang reads the
    # value as written (srt/environ.py EnvStr) and flashinfer_autotune_cache_path takes Path(value):
    # a folder named "~" in the working directory, not svc's home
    ({"SGLANG_CACHE_DIR": "~/c"}, "/srv/~/c"),
    ({"SGLANG_CACHE_DIR": "cache"}, "/srv/cache"),
    ({}, "/home/svc/.cache/sglang"),  # unset: ~/.cache/sglang of User=, expanded in the server
])
def test_doctor_and_the_runner_trial_find_one_cache_folder(tmp_path, env, root):
    from orchestrator.host.autotune import autotune_cache_root
    from orchestrator.host.runner_trial import autotune_cache_dir
    from orchestrator.tasks import TASKS

    ctx, payload = _unit_ctx(tmp_path, env)
    assert autotune_cache_root(ctx) == root
    assert autotune_cache_dir(ctx, "sglang-qwen") == root + "/flashinfer/autotune"
    with pytest.raises(Exception):  # the scripted probe answer is empty: what matters is what was asked
        TASKS["probe"].fn(ctx)
    (command, args, _request), = payload.calls
    assert command == "probe" and args[args.index("--autotune-cache-root") + 1] == root
