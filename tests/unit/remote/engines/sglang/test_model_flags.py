"""remote.engines.sglang.model_flags: the model flags are declared once and every command takes them alike.

The payload's ``tune``, ``names`` and ``probe`` and the controller's ``orch config-names`` build
their model flags from :data:`MODEL_FLAGS`; the controller's probe and tune tasks write their argv
with :func:`model_argv`. These tests read each command's real argparse parser, so a flag added to
one command by hand (or a table entry one command skips) fails here, and the controller's argv is
parsed back by the payload's own parsers.
"""

from __future__ import annotations

import argparse
import json

import pytest

import remote.names
import remote.probe
import remote.tuning.command
from orchestrator.cli import build_parser
from orchestrator.payload.model_args import model_flags
from remote.protocol import PayloadError
from remote.engines.sglang.model_flags import COMMANDS, MODEL_FLAGS, flags_of, model_argv, shape_from_args
from remote.engines.sglang.shape import moe_shape
from tests.fakes import make_ctx
from tests.paths import DATA

MODEL = DATA / "models" / "Qwen3-30B-A3B.json"

#: Each command's flags that are not model flags (its own options).
OWN_FLAGS = {
    "tune": {"--batch-sizes", "--space", "--out", "--provider", "--gpus", "--seed", "--no-resume", "--no-check",
             "--shipped-config", "--compile-mode", "--screen", "--budget", "--routing-file", "--routing-skew",
             "--prepared"},
    "names": set(),
    "probe": {"--moe-config-dir", "--capability", "--work-dir", "--autotune-cache-root", "--server-triton-cache"},
    "config-names": {"--json", "--probe"},
}

#: The model flags only some commands take, and why: ``--shape`` names a GEMM without a model
#: config, which only the tuner can use (the other commands name a model's files).
PARTIAL = {"--shape": ("tune",), "--block-shape": ("tune",)}


def parser_of(command: str) -> argparse.ArgumentParser:
    """The real parser of ``command``: the payload module's ``add_arguments``, or the controller's
    ``orch config-names`` sub-parser."""
    if command == "config-names":
        sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        return sub.choices["config-names"]
    module = {"tune": remote.tuning.command, "names": remote.names, "probe": remote.probe}[command]
    p = argparse.ArgumentParser(prog=command)
    module.add_arguments(p)
    return p


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_exactly_the_model_flags_of_the_table(command):
    opts = options_of(parser_of(command))
    model = {f.flag for f in flags_of(command)}
    assert set(opts) - OWN_FLAGS[command] == model, "a model flag declared outside MODEL_FLAGS, or one missing"
    for f in flags_of(command):
        a = opts[f.flag]
        assert (a.dest, a.default, a.required, a.help) == (f.dest, f.default, command in f.required_in, f.help)
        assert (a.nargs == 0) == (f.type is None) and (f.type is None or a.type is f.type)


def test_model_flags_reach_every_command():
    """A model flag describes the model the same way everywhere: only the listed ones are partial."""
    partial = {f.flag: f.commands for f in MODEL_FLAGS if set(f.commands) != set(COMMANDS)}
    assert partial == PARTIAL
    common = [{f.flag for f in flags_of(c)} - set(PARTIAL) for c in COMMANDS]
    assert all(c == common[0] for c in common) and {"--model-config", "--tp", "--ep", "--dtype", "--quantization",
                                                     "--disable-shared-experts-fusion", "--device-name"} <= common[0]


def test_unknown_command_or_value_is_refused():
    with pytest.raises(ValueError, match="unknown command"):
        flags_of("bench")
    with pytest.raises(ValueError, match="tp_size"):
        model_argv({"tp_size": 2})


UNITS = [
    # (unit's server facts, inventory variables)
    ({"model_path": "/models/qwen3", "tp": 4, "ep": 2, "dtype": "bfloat16", "quantization": "fp8",
      "disable_shared_experts_fusion": True, "download_dir": "/data/dl"}, {"orch_device_name": "NVIDIA H200"}),
    ({"model_path": "Qwen/Qwen3-30B-A3B", "dtype": "auto"}, {}),
    ({"model_path": "Qwen/Qwen3-30B-A3B", "tp": 8, "download_dir": "/data/dl"}, {"orch_model_config": "/etc/m.json"}),
    ({"model_path": "/models/qwen3", "tp": 2, "dp": 4}, {}),
]


@pytest.mark.parametrize("server,variables", UNITS)
@pytest.mark.parametrize("command", ["tune", "probe"])
def test_controller_argv_parses_back_through_the_payload(tmp_path, server, variables, command):
    ctx = make_ctx(tmp_path, {"orch_unit": {"server": server}, **variables})
    args = parser_of(command).parse_args(model_flags(ctx))
    assert args.model_config == variables.get("orch_model_config", server["model_path"])
    assert (args.tp, args.ep, args.dp) == (server.get("tp", 1), server.get("ep", 1), server.get("dp", 1))
    assert args.dtype == (None if server.get("dtype") in (None, "auto") else server["dtype"])
    assert args.quantization == server.get("quantization")
    assert args.disable_shared_experts_fusion is bool(server.get("disable_shared_experts_fusion"))
    assert args.device_name == variables.get("orch_device_name")
    # the unit's --download-dir goes with the unit's own model, not with orch_model_config
    assert args.download_dir == (None if "orch_model_config" in variables else server.get("download_dir"))


@pytest.mark.parametrize("command", COMMANDS)
def test_model_argv_round_trips_every_flag(command):
    values = {"engine": "sglang", "model_config": "/m/config.json", "hf_home": "/hf", "download_dir": "/dl", "tp": 8, "ep": 4,
              "dp": 2, "dtype": "float16", "quantization": "fp8", "disable_shared_experts_fusion": True,
              "device_name": "NVIDIA H200", "shape": "E=8,N=64,hidden=128,topk=2", "block_shape": "128,128"}
    mine = {f.dest: values[f.dest] for f in flags_of(command)}
    args = parser_of(command).parse_args(model_argv(mine))
    assert {k: getattr(args, k) for k in mine} == mine
    assert model_argv({"tp": 1, "disable_shared_experts_fusion": False, "dtype": None}) == ["--tp", "1"]


@pytest.mark.parametrize("command", COMMANDS)
def test_one_shape_from_the_flags_of_every_command(command):
    argv = model_argv({"model_config": str(MODEL), "tp": 2, "device_name": "NVIDIA H200"})
    shape, path = shape_from_args(parser_of(command).parse_args(argv))
    assert path == str(MODEL)
    assert shape == moe_shape(json.loads(MODEL.read_text()), tp=2)
    assert (shape.E, shape.N) == (128, 384)


def tune_args(*argv: str) -> argparse.Namespace:
    return parser_of("tune").parse_args(list(argv))


def test_shape_flag_gives_a_moe_shape():
    s, source = shape_from_args(tune_args("--shape", "E=8,N=64,hidden=128,topk=2"))
    assert source == "--shape" and (s.E, s.N, s.hidden, s.topk, s.runtime_topk) == (8, 64, 128, 2, 2)
    assert (s.dtype_selector, s.weight_dtype, s.act_dtype, s.block_shape) == (None, "bfloat16", "bfloat16", None)
    s, _ = shape_from_args(tune_args("--shape", "E=8,N=256,hidden=128,topk=2", "--quantization", "fp8",
                                     "--block-shape", "128,128", "--dtype", "float16"))
    assert (s.dtype_selector, s.weight_dtype, s.act_dtype, s.block_shape) == ("fp8_w8a8", "fp8_e4m3", "float16",
                                                                              [128, 128])
    assert shape_from_args(tune_args("--shape", "E=8,N=64,hidden=128,topk=2", "--dtype", "float32"))[0] \
        .dtype_selector == "float32"


@pytest.mark.parametrize("argv,msg", [
    ((), "--model-config or --shape is required"),
    (("--shape", "E=8,N=64", "--model-config", str(MODEL)), "not both"),
    (("--shape", "E=8;N=64"), "expected E=..,N=..,hidden=..,topk=.."),
    (("--shape", "E=8,N=64"), "need positive E, N, hidden"),
    (("--shape", "E=2,N=64,hidden=128,topk=4"), "topk <= E"),
    (("--shape", "E=8,N=64,hidden=128,topk=2", "--block-shape", "128,128"), "needs --quantization fp8"),
    (("--shape", "E=8,N=64,hidden=128,topk=2", "--quantization", "int8"), "only 'fp8'"),
    (("--shape", "E=8,N=64,hidden=128,topk=2", "--quantization", "fp8", "--block-shape", "100,128"),
     "two powers of two"),
    (("--shape", "E=8,N=64,hidden=128,topk=2", "--dtype", "int4"), "--dtype 'int4'"),
])
def test_bad_shape_flags_are_bad_input(argv, msg):
    with pytest.raises(PayloadError) as ei:
        shape_from_args(tune_args(*argv))
    assert ei.value.kind == "bad_input" and msg in ei.value.msg
