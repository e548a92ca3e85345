"""SGLang's MoE-config log lines, every release's wording (remote.engines.sglang.moe_log).

:data:`WORDING_LINES` holds the real lines each release logs for each lookup outcome, captured
from the releases' own code (``<configs>`` stands for the configs root);
``tests/unit/remote/engines/sglang/test_oracle.py`` checks that each release of :data:`RELEASE_WORDING` still logs
exactly these. The tests here run without the wheels.
"""

from __future__ import annotations

import pytest

from remote.engines.sglang.moe_log import last_start_at, parse_line, parse_moe_log, parse_runner_line, verify_loaded

_NAME = "E=8,N=64,device_name=NVIDIA_H200"
_HINT = ", you can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton"
_FOUND = f"Using MoE kernel config from <configs>/triton_3_6_0/{_NAME}.json."
_FALLBACK = (f"Config file not found at <configs>/triton_3_6_0/{_NAME}.json. Fallback to triton version 3.1.0 and "
             f"use MoE kernel config from <configs>/triton_3_1_0/{_NAME}.json. Performance might be sub-optimal!")
_DEFAULT = ("Using default MoE kernel config. Performance might be sub-optimal! Config file not found at "
            f"<configs>/triton_3_6_0/{_NAME}.json" + _HINT)
_DEFAULT_DOWN = ("Using default MoE kernel config. Performance might be sub-optimal! Config file not found at "
                 f"<configs>/triton_3_6_0/{_NAME}_down.json" + _HINT)
_DOWN_MOE_FALSE = ("Using MoE kernel config with down_moe=False. Performance might be sub-optimal! Config file not "
                   f"found at <configs>/triton_3_6_0/{_NAME}_down.json" + _HINT)
_DOWN_REUSE = (f"Down MoE config file not found at <configs>/triton_3_6_0/{_NAME}_down.json; reusing the tuned "
               "up-projection config without TMA. Performance might be sub-optimal.")
_DOWN_FOUND = f"Using MoE kernel config from <configs>/triton_3_6_0/{_NAME}_down.json."

#: The real lines, by wording group: found (up exact), fallback (up only in triton_3_1_0, Triton
#: 3.6.0 installed), default (nothing), and for releases that read _down files: the down line
#: with the up file found / missing, and the down file found.
WORDING_LINES = {
    "no-down": {"found": _FOUND, "fallback": _FALLBACK, "default": _DEFAULT},
    "down-default": {"found": _FOUND, "fallback": _FALLBACK, "default": _DEFAULT, "down_found": _DOWN_FOUND,
                     "down_missing_up_found": _DEFAULT_DOWN, "down_missing_up_missing": _DEFAULT_DOWN},
    "down_moe=False": {"found": _FOUND, "fallback": _FALLBACK, "default": _DEFAULT, "down_found": _DOWN_FOUND,
                       "down_missing_up_found": _DOWN_MOE_FALSE, "down_missing_up_missing": _DOWN_MOE_FALSE},
    "down-reuse": {"found": _FOUND, "fallback": _FALLBACK, "default": _DEFAULT, "down_found": _DOWN_FOUND,
                   "down_missing_up_found": _DOWN_REUSE, "down_missing_up_missing": _DEFAULT_DOWN},
}
#: Which wording group each release covered by the oracle tests logs.
RELEASE_WORDING = {
    "0.4.10.post2": "no-down", "0.5.0rc2": "no-down", "0.5.2": "no-down", "0.5.3": "no-down", "0.5.4": "no-down",
    "0.5.5": "down-default",
    "0.5.6": "down_moe=False", "0.5.8": "down_moe=False", "0.5.11": "down_moe=False", "0.5.12": "down_moe=False",
    "0.5.16": "down-reuse", "0.5.23": "down-reuse",
}
DETERMINISTIC = "Deterministic inference is enabled, using default MoE kernel config."  # 0.5.5+

D = "/opt/sglang/sglang/srt/layers/moe/moe_runner/triton_utils/configs"
PFX = "[2026-11-29 10:00:00 TP0] "
#: What each outcome means: (role, action, used folder or None, fallback version).
MEANING = {
    "found": ("up", "loaded", "triton_3_6_0", None),
    "fallback": ("up", "fallback", "triton_3_1_0", "3.1.0"),
    "default": ("up", "default", None, None),
    "down_found": ("down", "loaded", "triton_3_6_0", None),
    "down_missing_up_found": ("down", "reuse_up", None, None),
    "down_missing_up_missing": ("down", "reuse_up", None, None),
}


def real(line: str, root: str = D) -> str:
    return line.replace("<configs>", root)


@pytest.mark.parametrize("group, outcome", [(g, o) for g, lines in WORDING_LINES.items() for o in lines])
def test_every_release_wording_parses_to_what_sglang_did(group, outcome):
    root = "/srv/moe dir/configs"  # a space in the path: never parsed with \S+
    ln = parse_line(PFX + real(WORDING_LINES[group][outcome], root))
    role, action, used_folder, version = MEANING[outcome]
    name = _NAME + ("_down" if role == "down" else "") + ".json"
    assert (ln.role, ln.action, ln.triton_version) == (role, action, version)
    assert ln.wanted == f"{root}/triton_3_6_0/{name}"
    assert ln.used == (f"{root}/{used_folder}/{name}" if used_folder else None)
    assert ln.text == PFX.strip() + " " + real(WORDING_LINES[group][outcome], root)


def test_release_table_names_known_groups():
    assert set(RELEASE_WORDING.values()) == set(WORDING_LINES)


def test_wording_ids():
    ids = {parse_line(real(lines["down_missing_up_found"])).wording
           for g, lines in WORDING_LINES.items() if "down_missing_up_found" in lines}
    assert ids == {"default", "down_moe=False", "down-reuse"}
    assert parse_line(real(_FALLBACK)).wording == "fallback" and parse_line(real(_FOUND)).wording == "found"


def test_deterministic_line_is_default_without_a_file():
    ln = parse_line(PFX + DETERMINISTIC)
    assert (ln.role, ln.action, ln.wanted, ln.used, ln.wording) == (None, "default", None, None, "deterministic")
    rep = parse_moe_log(DETERMINISTIC + "\n" + DETERMINISTIC)
    assert rep.deterministic and rep.overall == "default" and rep.default == []
    assert any("deterministic" in p for p in verify_loaded(rep, [f"{D}/triton_3_6_0/{_NAME}.json"]))


def test_issue_11_old_down_line_after_default_is_default():
    """SGLang 0.5.8, neither file: the up default line, then the down_moe=False line. The start ran
    the default config for both GEMMs (doctor said restart-needed before)."""
    log = PFX + real(_DEFAULT) + "\n" + PFX + real(_DOWN_MOE_FALSE) + "\n"
    rep = parse_moe_log(log)
    assert [(ln.role, ln.action) for ln in rep.lines] == [("up", "default"), ("down", "reuse_up")]
    assert rep.overall == "default"
    assert rep.default == [f"{D}/triton_3_6_0/{_NAME}.json"]
    assert rep.down_missing == [f"{D}/triton_3_6_0/{_NAME}_down.json"]
    # the same for 0.5.5 (the default wording for the down path) and 0.5.23 (likewise, up missing)
    assert parse_moe_log(real(_DEFAULT) + "\n" + real(_DEFAULT_DOWN)).overall == "default"


@pytest.mark.parametrize("lines, overall", [
    ([], "none"),
    ([_FOUND, _DOWN_FOUND], "loaded"),
    ([_FOUND, _DOWN_REUSE], "fallback"),
    ([_FOUND, _DOWN_MOE_FALSE], "fallback"),
    ([_FOUND, _DEFAULT_DOWN], "fallback"),  # 0.5.5: tuned up, down missing (the down GEMM reuses it)
    ([_FALLBACK, _DOWN_FOUND], "fallback"),
    ([_DEFAULT, _DOWN_FOUND], "fallback"),
    ([_DEFAULT], "default"),  # releases that read no _down file
    ([_FOUND], "loaded"),
])
def test_overall(lines, overall):
    assert parse_moe_log("\n".join(PFX + real(x) for x in lines)).overall == overall


UP = f"{D}/triton_3_6_0/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
DOWN = UP[:-5] + "_down.json"


def test_loaded_paths_with_spaces_and_brackets():
    log = f"{PFX}Using MoE kernel config from {UP}.\n{PFX}Using MoE kernel config from {DOWN}.\n" \
          f"{PFX}The server is fired up and ready to roll!\n"
    rep = parse_moe_log(log)
    assert rep.loaded == [UP, DOWN] and rep.ready and not rep.suboptimal
    assert [ln.role for ln in rep.lines] == ["up", "down"]
    assert verify_loaded(rep, [UP, DOWN]) == []


def test_default_fallback_and_down_missing_fail_verification():
    old = UP.replace("triton_3_6_0", "triton_3_5_1")
    log = (f"{PFX}Config file not found at {UP}. Fallback to triton version 3.5.1 and use MoE kernel config "
           f"from {old}. Performance might be sub-optimal!\n"
           f"{PFX}Down MoE config file not found at {DOWN}; reusing the tuned up-projection config without TMA. "
           "Performance might be sub-optimal.\n")
    rep = parse_moe_log(log)
    assert rep.fallback == [(UP, old, "3.5.1")] and rep.down_missing == [DOWN]
    problems = verify_loaded(rep, [UP, DOWN])
    assert any("fell back" in p for p in problems) and any("down config" in p for p in problems)
    log = (f"{PFX}Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {UP}, "
           "you can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n")
    rep = parse_moe_log(log)
    assert rep.default == [UP] and len(rep.suboptimal) == 1
    assert verify_loaded(rep, [UP]) and not rep.loaded
    # the old down line names its file: a missing expected down file is a problem
    rep = parse_moe_log(f"Using MoE kernel config from {UP}.\n" + real(_DOWN_MOE_FALSE).replace(
        f"{D}/triton_3_6_0/{_NAME}_down.json", DOWN))
    assert verify_loaded(rep, [UP, DOWN]) == [f"log does not show 'Using MoE kernel config from {DOWN}.'",
                                              f"server did not find the down config {DOWN}"]


def test_other_file_loaded_is_not_proof():
    other = UP.replace("E=257", "E=256")
    rep = parse_moe_log(f"Using MoE kernel config from {other}.\n")
    assert verify_loaded(rep, [UP]) == [f"log does not show 'Using MoE kernel config from {UP}.'"]


def test_other_lines_are_not_lookups():
    for line in ("Load weight end. type=Qwen3MoeForCausalLM", "Using MoE kernel config from nowhere",
                 "down_moe config BLOCK_SIZE_M=32 does not match up config BLOCK_SIZE_M=16 at M=4; "
                 "overriding down BLOCK_SIZE_M to match."):
        assert parse_line(line) is None
    assert not parse_moe_log("The server is fired up and ready to roll!").any_lookup


# ------------------------------------------------------------------- the start line and the runner

@pytest.mark.parametrize("line", [
    "server_args=ServerArgs(model_path='/m', speculative_moe_runner_backend='triton', moe_runner_backend='deep_gemm')",
    "server_args={'model_path': '/m', 'speculative_moe_runner_backend': 'triton', 'moe_runner_backend': 'deep_gemm'}",
])
def test_start_line_gives_the_resolved_runner_in_both_forms(line):
    text = f"{PFX}{line}\n{PFX}The server is fired up and ready to roll!\n"
    rep = parse_moe_log(text)
    assert rep.start_runner == "deep_gemm" and rep.chosen_runner == "deep_gemm" and rep.runner_lines == []
    assert last_start_at("old\n" + text) == len("old\n")


@pytest.mark.parametrize("line, runner, wording", [
    ("Use flashinfer_trtllm as MoE runner backend on sm100 for DeepseekV3ForCausalLM", "flashinfer_trtllm", "use"),
    ("auto set moe_runner_backend=`deep_gemm` for PPLX EP", "deep_gemm", "auto-set"),
    ("DeepEP v2 MoE: resolved --moe-runner-backend auto -> deep_gemm.", "deep_gemm", "resolved"),
    ("MiMoV2 on SM90: moe_runner_backend=marlin.", "marlin", "assigned"),
    ("Detected GPT-OSS model, enabling triton_kernels MOE kernel.", "triton_kernel", "gpt-oss"),
])
def test_runner_lines(line, runner, wording):
    parsed = parse_runner_line(PFX + line)
    assert (parsed.runner, parsed.wording) == (runner, wording)
    rep = parse_moe_log(PFX + line + "\n")
    assert rep.chosen_runner == runner and not rep.any_lookup


def test_lines_that_choose_no_runner():
    for line in ("server_args=ServerArgs(model_path='/m', moe_runner_backend='auto')",
                 "Use marlin as FP4 GEMM runner backend on SM120 for Muse Glimmer",
                 "Using MoE kernel config from /c/E=8.json."):
        assert parse_runner_line(line) is None
