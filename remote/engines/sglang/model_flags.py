"""The model flags: one declaration of how a command is told which model to name, run how (stdlib only).

The payload's ``tune``, ``names`` and ``probe`` and the controller's ``orch config-names`` take a
model the way the unit's SGLang server runs it (``--tp`` for the server's ``--tp-size``, ...).
:data:`MODEL_FLAGS` declares those flags once; :func:`add_model_flags` builds a command's argparse
flags from it, :func:`model_argv` the argv the controller passes to the payload, and
:func:`shape_from_args` turns the parsed flags into a :class:`~remote.engines.sglang.shape.MoeShape` (the
one place a command goes from flags to a shape). ``tests/unit/remote/engines/sglang/test_model_flags.py``
checks that every command takes the flags the table gives it and that the controller's argv parses
back to the same values.

This module must not import torch or triton (the ``names`` command and the controller use it
without them).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...protocol import DEFAULT_ENGINE, PayloadError
from .model_config import load_model_config, resolve_model_config_path
from .naming import sglang_device_name
from .quantization import activation_dtype
from .runner import checkpoint_quant_method
from .shape import MoeShape, moe_shape

#: Commands that take model flags: the payload's ``tune``, ``names``, ``probe`` and the
#: controller's ``orch config-names``.
COMMANDS = ("tune", "names", "probe", "config-names")


@dataclass(frozen=True)
class ModelFlag:
    """One model flag.

    ``flag``: the option (``--tp``); its argparse ``dest`` is :attr:`dest` (``tp``). ``help``: the
    text every command shows. ``type``: ``int`` or ``str`` for a valued flag, None for a switch
    (``store_true``). ``default``: the value when absent. ``commands``: the commands of
    :data:`COMMANDS` that take it. ``required_in``: those where it must be given.
    """

    flag: str
    help: str
    type: Callable[[str], Any] | None = str
    default: Any = None
    commands: tuple[str, ...] = COMMANDS
    required_in: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The argparse attribute (``--disable-shared-experts-fusion`` -> ``disable_shared_experts_fusion``)."""
        return self.flag[2:].replace("-", "_")


#: The model flags, in the order :func:`model_argv` writes them.
MODEL_FLAGS: tuple[ModelFlag, ...] = (
    ModelFlag("--engine", "the inference engine that serves the model, whose rules name its files "
                          "(remote.protocol.ENGINE_NAMES)", str, DEFAULT_ENGINE),
    ModelFlag("--model-config", "model folder, config.json path, or Hugging Face repo id (offline cache lookup)",
              required_in=("names",)),
    ModelFlag("--hf-home", "HF_HOME of the cache (default $HF_HOME or ~/.cache/huggingface)"),
    ModelFlag("--download-dir", "server --download-dir (where a ModelScope model may be; SGLANG_USE_MODELSCOPE)"),
    ModelFlag("--tp", "server --tp-size", int, 1),
    ModelFlag("--ep", "server --ep-size", int, 1),
    ModelFlag("--dp", "server --dp-size (not read by SGLang's MoE shape: its experts split over --tp-size/--ep-size)",
              int, 1),
    ModelFlag("--dtype", "server --dtype (auto, bfloat16, float16, float32)"),
    ModelFlag("--quantization", "server --quantization (default: from the checkpoint); with --shape: 'fp8' "
                                "tunes fp8_w8a8 (see --block-shape)"),
    ModelFlag("--disable-shared-experts-fusion", "server --disable-shared-experts-fusion", None, False),
    ModelFlag("--device-name", "GPU name as torch.cuda.get_device_name() gives it (e.g. 'NVIDIA H200') or "
                               "SGLang's form (NVIDIA_H200); default: GPU 0's, required without a GPU",
              required_in=("names",)),
    ModelFlag("--shape", "instead of --model-config: E=..,N=..,hidden=..,topk=.. (per-rank N)", commands=("tune",)),
    ModelFlag("--block-shape", "with --shape --quantization fp8: the weight block 'BN,BK' (e.g. 128,128); "
                               "none = per-tensor", commands=("tune",)),
)


def flags_of(command: str) -> tuple[ModelFlag, ...]:
    """The model flags ``command`` (one of :data:`COMMANDS`) takes. Raises ValueError for another name."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}: model flags are declared for {', '.join(COMMANDS)}")
    return tuple(f for f in MODEL_FLAGS if command in f.commands)


def add_model_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Add ``command``'s model flags (:func:`flags_of`) to ``parser``."""
    for f in flags_of(command):
        if f.type is None:
            parser.add_argument(f.flag, action="store_true", help=f.help)
        else:
            parser.add_argument(f.flag, type=f.type, default=f.default, required=command in f.required_in,
                                help=f.help)


def model_argv(values: Mapping[str, Any]) -> list[str]:
    """The argv that gives a command ``values`` (flag ``dest`` -> value), in :data:`MODEL_FLAGS`
    order: a switch appears when its value is true, a valued flag when its value is not None.
    Raises ValueError for a key that is no model flag's ``dest``."""
    known = {f.dest for f in MODEL_FLAGS}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"not model flags: {', '.join(unknown)}")
    argv: list[str] = []
    for f in MODEL_FLAGS:
        value = values.get(f.dest)
        if f.type is None:
            argv += [f.flag] if value else []
        elif value is not None:
            argv += [f.flag, str(value)]
    return argv


def parse_shape(text: str) -> dict:
    """``--shape`` ``"E=8,N=64,hidden=128,topk=2"`` -> ``{"E": 8, "N": 64, "hidden": 128, "topk": 2}``.

    Raises PayloadError('bad_input') unless it names exactly E, N, hidden and topk, all positive
    integers, with topk <= E.
    """
    out = {}
    try:
        for part in text.split(","):
            k, v = part.split("=")
            out[k.strip()] = int(v)
    except ValueError:
        raise PayloadError("bad_input", f"--shape: expected E=..,N=..,hidden=..,topk=..: {text!r}") from None
    if set(out) != {"E", "N", "hidden", "topk"} or min(out.values()) < 1 or out["topk"] > out["E"]:
        raise PayloadError("bad_input", f"--shape: need positive E, N, hidden, topk <= E: {text!r}")
    return out


def _block_shape(text: str | None) -> list[int] | None:
    """``--block-shape "BN,BK"`` -> ``[BN, BK]`` (two powers of two >= 16), None when absent."""
    if not text:
        return None
    try:
        block = [int(v) for v in text.split(",")]
    except ValueError:
        block = []
    if len(block) != 2 or min(block) < 16 or any(v & (v - 1) for v in block):
        raise PayloadError("bad_input", f"--block-shape: two powers of two >= 16, got {text!r}")
    return block


def _shape_from_spec(args: argparse.Namespace) -> MoeShape:
    """The :class:`MoeShape` that ``--shape`` (with ``--dtype``, ``--quantization fp8`` and
    ``--block-shape``) gives: no architecture, no shared expert, weights in the activation dtype
    or fp8 e4m3 (per-tensor, or block scales with ``--block-shape``)."""
    if args.model_config:
        raise PayloadError("bad_input", "give --model-config or --shape, not both")
    dims = parse_shape(args.shape)
    act = activation_dtype({}, {}, args.dtype, [])
    quant = args.quantization if args.quantization not in (None, "") else None
    block = _block_shape(args.block_shape)
    if quant is None and block is not None:
        raise PayloadError("bad_input", "--block-shape needs --quantization fp8")
    if quant not in (None, "fp8"):
        raise PayloadError("bad_input", f"--shape with --quantization {args.quantization!r}: only 'fp8'")
    fp8 = quant == "fp8"
    return MoeShape(E=dims["E"], N=dims["N"], hidden=dims["hidden"], topk=dims["topk"], runtime_topk=dims["topk"],
                    num_experts=dims["E"], shared_fused=False,
                    dtype_selector="fp8_w8a8" if fp8 else ("float32" if act == "float32" else None),
                    block_shape=block, per_channel_quant=False, weight_dtype="fp8_e4m3" if fp8 else act,
                    moe_layers=None, architecture="", act_dtype=act, intermediate_size=dims["N"],
                    quant_method="fp8" if fp8 else None)


def shape_from_args(args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[MoeShape, str]:
    """The :class:`MoeShape` the parsed model flags name, and where it came from: ``(shape, source)``.

    ``source`` is the config.json path found for ``--model-config`` (:func:`resolve_model_config_path`
    with ``--hf-home`` and ``--download-dir``), or ``"--shape"`` for a command that takes
    ``--shape`` (``tune``) when it was given. ``capability``: the GPU's CUDA capability when known
    (:func:`remote.engines.sglang.shape.moe_shape`). Raises PayloadError: ``not_found``/``bad_input`` from
    loading the config and from ``moe_shape``, ``bad_input`` when neither ``--model-config`` nor
    ``--shape`` is given or both are.
    """
    if getattr(args, "shape", None):  # only the commands whose flags include --shape have the attribute
        return _shape_from_spec(args), "--shape"
    if not args.model_config:
        raise PayloadError("bad_input", "--model-config or --shape is required")
    path = resolve_model_config_path(args.model_config, args.hf_home, args.download_dir)
    cfg = load_model_config(str(path))
    try:
        shape = moe_shape(cfg, tp=args.tp, ep=args.ep, quantization=args.quantization, dtype=args.dtype,
                          disable_shared_experts_fusion=args.disable_shared_experts_fusion, capability=capability)
    except ValueError as exc:  # a config value of the wrong kind the rules convert (e.g. int("x"))
        raise PayloadError("bad_input", f"model shape: {exc}") from None
    return shape, str(path)


def checked_device_name(name: str) -> str:
    """SGLang form of a ``--device-name`` (:func:`remote.engines.sglang.naming.sglang_device_name`);
    PayloadError('bad_input') for a name SGLang's rule rejects (empty, a path separator)."""
    try:
        return sglang_device_name(name)
    except ValueError as exc:
        raise PayloadError("bad_input", f"--device-name: {exc}") from None


def _checkpoint_quant(config_path: str) -> str | None:
    """The checkpoint's quantization method as SGLang names it (``remote.engines.sglang.runner.checkpoint_quant_method``),
    from the model config and, beside it, ModelOpt's ``hf_quant_config.json`` when present."""
    side = os.path.join(os.path.dirname(config_path), "hf_quant_config.json")
    try:
        with open(side, encoding="utf-8") as f:
            hf_quant = json.load(f)
    except (OSError, ValueError):
        hf_quant = None
    return checkpoint_quant_method(load_model_config(config_path), hf_quant)


def _dtype_inputs(config_path: str) -> dict:
    """``config_dtype`` (the text config's ``dtype``/``torch_dtype``, else the top level's) and
    ``model_type`` (the text config's), which SGLang's ``_get_and_verify_dtype`` reads
    (``configs/model_config.py``; :func:`remote.engines.sglang.autotune.torch_dtype`)."""
    cfg = load_model_config(config_path)
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    raw = None
    for src in (tc, cfg):
        raw = src.get("dtype") or src.get("torch_dtype")
        if raw:
            break
    return {"config_dtype": str(raw) if raw else None, "model_type": tc.get("model_type") or cfg.get("model_type")}


def model_facts(config_path: str) -> dict[str, Any]:
    """What the probe reports of the model config at ``config_path`` besides its shape:
    ``checkpoint_quant_method`` (:func:`_checkpoint_quant`), ``config_dtype`` and ``model_type``
    (:func:`_dtype_inputs`). Raises PayloadError as :func:`load_model_config`."""
    return {"checkpoint_quant_method": _checkpoint_quant(config_path), **_dtype_inputs(config_path)}
