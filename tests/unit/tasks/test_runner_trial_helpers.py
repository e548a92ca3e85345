"""The runner trial's pure parts (``orchestrator.host.runner_trial``): the drop-in text, read back as
systemd's and orch's unit parser read it, the check prompts, and where FlashInfer's cache is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.engine.results import TaskFailed
from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.unit import parse_unit_settings
from orchestrator.host.runner_trial import (SHIPPED_PROMPTS, agreement, autotune_cache_dir, dropin_text,
                                            has_answer, known_misses, load_checks, load_prompts, with_runner)

WORDS = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/My Model",
         "--moe-runner-backend", "triton", "--port", "$PORT", "--moe-runner-backend=cutlass", "--tp", "%i"]


def test_with_runner_replaces_every_form_of_the_flag():
    got = with_runner(WORDS, "flashinfer_cutlass")
    assert got.count("--moe-runner-backend") == 1 and got[-2:] == ["--moe-runner-backend", "flashinfer_cutlass"]
    assert "triton" not in got and not any(w.startswith("--moe-runner-backend=") for w in got)
    assert got[:5] == WORDS[:5] and "$PORT" in got and "%i" in got


def test_dropin_reads_back_as_the_unit_s_command_line_with_the_runner():
    unit = "[Service]\nExecStart=/usr/bin/false\n"
    text = dropin_text(WORDS, "flashinfer_cutlass", "20260101-000000-abcd")
    assert text.startswith("# written by orch") and "\n[Service]\nExecStart=\nExecStart=" in text
    # `systemctl cat` shows the unit file, then the drop-in: the drop-in's ExecStart wins
    settings = parse_unit_settings(unit + "\n# /etc/systemd/system/x.service.d/orch-moe-runner.conf\n" + text)
    assert settings.exec_start == with_runner(WORDS, "flashinfer_cutlass")
    assert "$PORT " in text  # a variable stays a bare word, for systemd to split as in the unit


def test_prompts_shipped_and_overridden(tmp_path):
    shipped = load_prompts(None)
    assert len(shipped) == 18 and all(p and not p.startswith("#") and not p.startswith("expect:") for p in shipped)
    assert SHIPPED_PROMPTS.exists()
    own = tmp_path / "p.txt"
    own.write_text("# mine\n\nHello\nWorld\n")
    assert load_prompts(str(own)) == ["Hello", "World"]
    own.write_text("# nothing\n")
    with pytest.raises(TaskFailed, match="no prompt"):
        load_prompts(str(own))
    with pytest.raises(TaskFailed, match="cannot read"):
        load_prompts(str(tmp_path / "missing.txt"))


def test_known_answers_are_read_and_checked(tmp_path):
    """Issue 32 row 3: the shipped set has arithmetic and extraction prompts with known answers; an
    answer holds one as a whole number or word."""
    prompts, expected = load_checks(None)
    known = {p: e for p, e in zip(prompts, expected) if e is not None}
    assert known["Question: What is 17 multiplied by 23? Answer:"] == "391"
    assert any(e == "1937" and p.startswith("Extract the year") for p, e in known.items())
    own = tmp_path / "p.txt"
    own.write_text("expect: 7 | Three plus four is\nHello\n")
    assert load_checks(str(own)) == (["Three plus four is", "Hello"], ["7", None])
    own.write_text("expect: | no answer\n")
    with pytest.raises(TaskFailed, match="line 1: want `expect: ANSWER"):
        load_checks(str(own))
    assert has_answer(" 391. The product", "391") and has_answer("17 x 23 = 391", "391")
    assert not has_answer(" 3910", "391") and not has_answer("1391", "391") and not has_answer("", "391")
    answers = [{"text": " 7 and"}, {"text": " the fox"}, {"text": " 8"}]
    assert known_misses(["7", None, "7"], answers) == [2]


def test_agreement_is_by_token_ids_then_text():
    assert agreement([{"output_ids": [1], "text": "a"}], [{"output_ids": [1], "text": "b"}]) == 1.0
    assert agreement([{"text": "a", "output_ids": None}], [{"text": "b", "output_ids": None}]) == 0.0


class _Conn:
    def __init__(self, user: str, passwd: str):
        self.user, self.passwd = user, passwd

    def run(self, argv, check=True, **kw):
        out = f"User={self.user}\n" if argv[0] == "systemctl" else self.passwd
        return SimpleNamespace(stdout=out, ok=True)


def _ctx(env, user="", passwd=""):
    from remote.engines import engine_named

    return SimpleNamespace(facts=SimpleNamespace(environment=env, unit=None, engine=engine_named(None)), vars={},
                           connection=_Conn(user, passwd))


@pytest.mark.parametrize("env,user,passwd,want", [
    ({"SGLANG_CACHE_DIR": "/data/sg/"}, "", "", "/data/sg/flashinfer/autotune"),
    # SGLang does not expand a "~" it is given (srt/environ.py EnvStr, flashinfer_autotune_cache_path
    # Path(value)): a folder named "~" in its working directory ("/" without one), not $HOME/c (issue 28)
    ({"SGLANG_CACHE_DIR": "~/c", "HOME": "/home/svc"}, "", "", "/~/c/flashinfer/autotune"),
    ({}, "", "", "/root/.cache/sglang/flashinfer/autotune"),
    ({}, "sglang", "sglang:x:998:998::/var/lib/sglang:/usr/sbin/nologin\n",
     "/var/lib/sglang/.cache/sglang/flashinfer/autotune"),
])
def test_autotune_cache_dir(env, user, passwd, want):
    assert autotune_cache_dir(_ctx(env, user, passwd), Unit("sglang-qwen")) == want


@pytest.mark.parametrize("env,user,passwd,want", [
    ({}, "", "", "/root/.cache/vllm/flashinfer_autotune_cache"),
    ({"VLLM_CACHE_ROOT": "/data/vc"}, "", "", "/data/vc/flashinfer_autotune_cache"),
    # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR names the folder itself (flashinfer_autotune_root), `~` expanded
    # with the server user's home (Path.expanduser), a relative value from its working directory ("/")
    ({"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "/data/fi", "VLLM_CACHE_ROOT": "/data/vc"}, "", "", "/data/fi"),
    ({"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "~/fi"}, "vllm", "vllm:x:997:997::/var/lib/vllm:/usr/sbin/nologin\n",
     "/var/lib/vllm/fi"),
    ({"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "fi"}, "", "", "/fi"),
])
def test_autotune_cache_dir_of_a_vllm_unit(env, user, passwd, want):
    """Issue 29: what a runner trial on a vLLM unit backs up (vLLM 0.32.0-0.34.0
    ``model_executor/warmup/flashinfer_autotune_cache.py``; held against the releases by
    ``test_runtime_oracle.py::test_flashinfer_autotune_folder_is_the_releases``)."""
    from remote.engines import engine_named

    ctx = _ctx(env, user, passwd)
    ctx.facts.engine = engine_named("vllm")
    assert autotune_cache_dir(ctx, Unit("vllm-qwen")) == want


class _Reload:
    """A context whose payload answers ``reload-check`` with ``risky`` and whose connection records commands."""

    def __init__(self, risky: bool, allow: bool = False):
        self.ran: list[list[str]] = []
        answer = {"risky": risky, "toolkit": ["/usr/bin/nvidia-ctk"] if risky else [],
                  "gpu_containers": [{"pid": 7, "cmdline": "python train.py", "cgroup": "docker-1"}] if risky else []}
        self.payload = SimpleNamespace(call=lambda *a, **k: answer)
        self.vars = {"orch_allow_daemon_reload": allow}
        self.connection = SimpleNamespace(run=lambda argv, **k: (self.ran.append(argv), SimpleNamespace(ok=True))[1])
        self.events: list[str] = []
        self.emit = lambda event, **f: self.events.append(event)
        self.say = lambda line: None


def test_daemon_reload_refused_next_to_gpu_containers_of_the_toolkit():
    from orchestrator.host.runner_trial import daemon_reload

    ctx = _Reload(risky=True)
    with pytest.raises(TaskFailed, match="nvidia-container-toolkit #48") as exc:
        daemon_reload(ctx, Unit("sglang-qwen"))
    assert "7 (python train.py)" in str(exc.value) and ctx.ran == []
    allowed = _Reload(risky=True, allow=True)
    daemon_reload(allowed, Unit("sglang-qwen"))
    assert allowed.ran == [["systemctl", "daemon-reload"]] and "daemon_reload_risky" in allowed.events
    safe = _Reload(risky=False)
    daemon_reload(safe, Unit("sglang-qwen"))
    assert safe.ran == [["systemctl", "daemon-reload"]] and "daemon_reload_risky" not in safe.events


# --- the trial group key (orchestrator.host.runner_trial.trial_group_key) -------------------------

def _key_ctx(*flags: str):
    from remote.engines.sglang.server_args import parse_server_args
    from orchestrator.host.runner_trial import trial_group_key

    server = parse_server_args(["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/q",
                                "--tp", "2", *flags])
    model = SimpleNamespace(E=128, N=768, hidden=2048, topk=8, dtype_selector=None, block_shape=None,
                            model_type="qwen3_moe")
    from remote.engines import engine_named

    probe = SimpleNamespace(device_name="NVIDIA_H200", capability="9.0", engine=SimpleNamespace(version="0.5.23"),
                            flashinfer_version="0.6.0", model=model)
    ctx = SimpleNamespace(facts=SimpleNamespace(probe=probe, server=server, engine=engine_named(None)))
    return trial_group_key(ctx, ["triton", "flashinfer_cutlass"], {"concurrency": [1, 8]})


@pytest.mark.parametrize("flags", [
    ["--pp-size", "2"], ["--pipeline-parallel-size", "2"],
    ["--dp-size", "2"], ["--dp-size", "2", "--enable-dp-attention"], ["--attn-dp-size", "2"],
    ["--speculative-algorithm", "EAGLE"], ["--speculative-moe-runner-backend", "triton"],
    ["--speculative-moe-a2a-backend=deepep"], ["--speculative-num-draft-tokens", "4"],
    ["--speculative-draft-model-quantization", "fp8"], ["--flashinfer-autotune-skip-ops", "moe"],
    ["--disable-flashinfer-autotune"], ["--enable-deterministic-inference"],
])
def test_group_key_changes_with_what_changes_the_runner_or_flashinfer_s_cache_key(flags):
    """Each of these changes the runner, FlashInfer's autotune cache hash (SGLang 0.5.23
    flashinfer_autotune_cache_path: tp, pp, attn_dp_size, ep, draft quantization, skip ops) or
    whether and for which shapes it autotunes: hosts that differ there measure apart."""
    assert _key_ctx(*flags) != _key_ctx()


def test_group_key_same_for_spellings_of_one_layout_and_for_flags_outside_it():
    # the deprecated spelling is the same attention-DP layout (parallel_hook._handle_deprecated_dp_attention)
    assert _key_ctx("--dp-size", "4", "--enable-dp-attention") == _key_ctx("--attn-dp-size", "4")
    assert _key_ctx("--pp-size", "2") == _key_ctx("--pipeline-parallel-size", "2")
    assert _key_ctx("--port", "30001", "--mem-fraction-static", "0.8") == _key_ctx()
    assert _key_ctx("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3") == \
        _key_ctx("--speculative-num-steps", "3", "--speculative-algorithm=EAGLE")


def test_trial_flags_reads_values_and_switches():
    from remote.engines.sglang.autotune import trial_flags

    got = trial_flags(["--tp", "2", "--speculative-algorithm", "EAGLE", "--no-speculative-enable-w4a4-mxfp4-megamoe",
                       "--speculative-moe-runner-backend=triton", "--flashinfer-autotune-skip-ops", "moe"])
    assert got == [["--flashinfer-autotune-skip-ops", "moe"], ["--no-speculative-enable-w4a4-mxfp4-megamoe", ""],
                   ["--speculative-algorithm", "EAGLE"], ["--speculative-moe-runner-backend", "triton"]]


def test_rollback_target_takes_a_trial_s_drop_in_and_its_triton_sub_run_together():
    from orchestrator.tasks.rollback import _with_sub_run

    done = {"state": {"state": "completed"}}
    run = dict(done, run_id="R", changed=[{"path": "/etc/systemd/system/u.service.d/orch-moe-runner.conf"}])
    sub = dict(done, run_id="R.triton", changed=[{"path": "/x/triton_3_6_0/E=8.json"}])
    older = dict(done, run_id="Q", changed=[{"path": "/x/E=8.json"}])
    runs = [sub, run, older]
    assert _with_sub_run(sub, runs, explicit=False) == dict(run, linked=["R.triton"])  # picked by default
    assert _with_sub_run(run, runs, explicit=True) == dict(run, linked=["R.triton"])  # --to R
    assert _with_sub_run(sub, runs, explicit=True) == sub  # --to R.triton: the files alone
    nodrop = dict(run, changed=[])  # Triton kept as the unit's own runner: only the sub-run changed
    assert _with_sub_run(sub, [sub, nodrop], explicit=False) == sub
    gone = dict(sub, state={"state": "restored"})  # the trial put the files back: nothing linked
    assert _with_sub_run(run, [gone, run], explicit=False) == run
    assert _with_sub_run(older, runs, explicit=False) == older


def test_a_drop_beyond_the_noise_threshold_is_not_called_within_it():
    """The fastest passing candidate not kept: "within the 3% noise threshold" only when its change
    is within ±3%; a 31% drop says it is slower than the unit's runner (the issue's trial printed
    "-31.3% output tok/s: within the 3% noise threshold")."""
    from orchestrator.tasks.runner_trial import not_kept_why

    assert not_kept_why(-31.3, 3.0, "auto") == "-31.3% output tok/s: slower than auto (the unit's runner)"
    assert not_kept_why(-3.0, 3.0, "auto") == "-3.0% output tok/s: within the 3% noise threshold"
    assert not_kept_why(2.9, 3.0, "triton") == "+2.9% output tok/s: within the 3% noise threshold"
    assert "within" not in not_kept_why(-3.1, 3.0, "triton")


def _trial_ctx(triton_folder, extra=(), call=None):
    engine = SimpleNamespace(config_extra_fields=tuple(extra))
    return SimpleNamespace(facts=SimpleNamespace(probe=SimpleNamespace(triton_folder=triton_folder), engine=engine),
                           payload=SimpleNamespace(call=call, state_dir="/var/lib/orch"),
                           options=SimpleNamespace(run_id="R"), run=SimpleNamespace(sub_runs=["R.triton"]),
                           emit=lambda *a, **k: None)


def test_install_rules_follow_the_engine_s_folder_and_entry_rules():
    """Issue 29: the Triton candidate's install takes ``orch tune``'s rules: any folder name where the
    engine keeps no folder per Triton release (vLLM's ``VLLM_TUNED_CONFIG_FOLDER``), the engine's extra
    entry fields (vLLM's ``SPLIT_K``); SGLang's ``triton_X_Y_Z`` folder: neither."""
    from orchestrator.host.runner_trial import install_rules

    assert install_rules(_trial_ctx(None, ("SPLIT_K",))) == {"any_dest_name": True, "extra_fields": ["SPLIT_K"]}
    assert install_rules(_trial_ctx("triton_3_4_0")) == {}


def test_restoring_a_triton_sub_run_whose_install_wrote_nothing_is_a_no_op():
    """An install refused before its first write leaves no manifest: the restore puts nothing back
    (and the trial goes on to its decision) instead of failing the run; any other failure is raised."""
    from orchestrator.host.runner_trial import restore_triton_files
    from orchestrator.payload.client import PayloadFailed

    from remote.host.fs import load_manifest
    from remote.protocol import PayloadError

    def missing(*a, **k):
        # what the payload's restore reports for a run without a manifest (its error line's detail)
        try:
            load_manifest("/nonexistent-state-dir", "R.triton")
        except PayloadError as err:
            raise PayloadFailed("restore", err.kind, err.msg, detail=err.detail) from None

    ctx = _trial_ctx(None, call=missing)
    assert restore_triton_files(ctx) == [] and ctx.run.sub_runs == []

    def other_not_found(*a, **k):  # the message alone does not make it "nothing to put back"
        raise PayloadFailed("restore", "not_found", "no manifest for run R.triton, backup missing")

    ctx = _trial_ctx(None, call=other_not_found)
    with pytest.raises(PayloadFailed, match="backup missing"):
        restore_triton_files(ctx)

    def broken(*a, **k):
        raise PayloadFailed("restore", "runtime", "backup of /x damaged")

    ctx = _trial_ctx(None, call=broken)
    with pytest.raises(PayloadFailed, match="damaged"):
        restore_triton_files(ctx)
    assert ctx.run.sub_runs == ["R.triton"]
