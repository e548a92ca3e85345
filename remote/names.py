"""names: print a model's MoE shape and its two SGLang config file names (no GPU needed).

Flags: ``--model-config`` (folder, config.json or offline HF repo id), ``--tp``, ``--ep``,
``--dtype``, ``--quantization``, ``--disable-shared-experts-fusion``, ``--hf-home`` and the
required ``--device-name`` (``torch.cuda.get_device_name()`` form, e.g. "NVIDIA H200", or
the SGLang form "NVIDIA_H200").

Result ``data``: ``{"device_name": "NVIDIA_H200", "model": MoeShape.to_dict(),
"file_names": {"up": ..., "down": ...}, "model_config_path": ...}``.
Imports neither torch nor triton.
"""

from __future__ import annotations

import argparse

from .sglang.model import MoeShape, load_model_config, moe_shape, resolve_model_config_path
from .sglang.naming import sglang_device_name
from .protocol import PayloadError


def add_model_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add the model/server flags shared by ``names``, ``probe`` and ``tune``."""
    parser.add_argument("--model-config", required=required,
                        help="model folder, config.json path, or HF repo id (offline cache lookup)")
    parser.add_argument("--hf-home", default=None, help="HF_HOME of the cache (default $HF_HOME or ~/.cache/huggingface)")
    parser.add_argument("--tp", type=int, default=1, help="server --tp-size")
    parser.add_argument("--ep", type=int, default=1, help="server --ep-size")
    parser.add_argument("--dtype", default=None, help="server --dtype (auto, bfloat16, float16, float32)")
    parser.add_argument("--quantization", default=None, help="server --quantization (default: from the checkpoint)")
    parser.add_argument("--disable-shared-experts-fusion", action="store_true",
                        help="server --disable-shared-experts-fusion")


def shape_from_args(args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[MoeShape, str]:
    """Load the model config named by ``args`` and return ``(MoeShape, config path)``.

    Raises PayloadError (not_found/bad_input) from :mod:`remote.sglang.model`.
    """
    path = resolve_model_config_path(args.model_config, args.hf_home)
    cfg = load_model_config(str(path))
    shape = moe_shape(cfg, tp=args.tp, ep=args.ep, quantization=args.quantization, dtype=args.dtype,
                      disable_shared_experts_fusion=args.disable_shared_experts_fusion, capability=capability)
    return shape, str(path)


def checked_device_name(name: str) -> str:
    """SGLang form of a device name; PayloadError('bad_input') for a hostile one."""
    try:
        return sglang_device_name(name)
    except ValueError as exc:
        raise PayloadError("bad_input", f"--device-name: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``names`` command."""
    add_model_arguments(parser, required=True)
    parser.add_argument("--device-name", required=True, help='torch device name, e.g. "NVIDIA H200"')


def run(args: argparse.Namespace) -> dict:
    """Compute the shape and file names; see the module docstring for ``data``."""
    dev = checked_device_name(args.device_name)
    shape, path = shape_from_args(args)
    return {
        "device_name": dev,
        "model": shape.to_dict(),
        "file_names": shape.file_names(dev),
        "model_config_path": path,
    }
