"""names: print a model's MoE shape and its two config file names as its engine names them (no GPU needed).

Flags: ``--engine`` and the model flags of :data:`remote.engines.sglang.model_flags.MODEL_FLAGS` for ``names``:
``--model-config`` (folder, config.json or offline HF repo id), ``--tp``, ``--ep``, ``--dtype``,
``--quantization``, ``--disable-shared-experts-fusion``, ``--hf-home``, ``--download-dir`` and the
required ``--device-name`` (``torch.cuda.get_device_name()`` form, e.g. "NVIDIA H200", or the
SGLang form "NVIDIA_H200").

Result ``data``: ``{"device_name": "NVIDIA_H200", "model": MoeShape.to_dict(),
"file_names": {"up": ..., "down": ...}, "model_config_path": ...}``.
Imports neither torch nor triton. The model flags and the shape they give are
:func:`remote.engines.add_model_flags` and :func:`remote.engines.shape_from_args`
(the probe, ``tune`` and ``orch config-names`` use the same ones).
"""

from __future__ import annotations

import argparse

from .engines import add_model_flags, device_name_arg, engine_named, shape_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``names`` command."""
    add_model_flags(parser, "names")


def run(args: argparse.Namespace) -> dict:
    """Compute the shape and file names; see the module docstring for ``data``."""
    dev = device_name_arg(engine_named(args.engine), args.device_name)
    shape, path = shape_from_args(args)
    return {
        "device_name": dev,
        "model": shape.to_dict(),
        "file_names": shape.file_names(dev),
        "model_config_path": path,
    }
