"""The model flags read by vLLM's rules: the payload's ``--model-config``, ``--tp``, ``--ep``, ...
as a vLLM server runs the model (standard library only).

The flags are one table shared by every engine (declared by the default engine,
``remote.engines.add_model_flags``); this module reads the parsed flags with vLLM's rules:

- the model config: a folder (its ``config.json``), a ``config.json`` path, or a Hugging Face repo
  id found offline in the cache vLLM reads (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``; ``refs/main``'s snapshot, else the newest);
- the shape: :func:`remote.engines.vllm.shape.model_shape`: ``--ep`` greater than 1 is the unit's
  expert-parallel size (``--enable-expert-parallel``: TP x DP ranks, ``ServerArgs.ep``), so the
  experts are split over it and N stays whole; otherwise N is split over ``--tp`` x ``--dp``
  (``FusedMoEParallelConfig.make`` flattens the experts' TP across the DP ranks);
- the record: the shared :class:`~remote.engines.triton_moe.shape.MoeShape` with vLLM's file names
  (:class:`VllmMoeShape`).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...protocol import DEFAULT_ENGINE, BadInput, PayloadError
from ..triton_moe.shape import MoeShape
from .naming import DOWN_FILE_RELEASES, config_file_name, reads_down_file
from .shape import model_shape

#: the model files of the architectures :data:`remote.engines.vllm.shape.ARCHITECTURES` names
SOURCE = "vllm/model_executor/layers/fused_moe/layer.py FusedMoE"


@dataclass
class VllmMoeShape(MoeShape):
    """The shared MoE shape record with vLLM's config file names (``get_config_file_name``)."""

    def file_names(self, device_name: str, release: str | None = None, **_ignored: Any) -> dict[str, str]:
        """``{"up": name, "down": name_down}``: the one file vLLM reads for both GEMMs, and the
        ``_down.json`` name (read only by 0.34.0 for fp8 block [128,128]: the probe says whether,
        :func:`remote.engines.vllm.naming.reads_down_file`). ``release`` is unused (the names do not
        depend on it)."""
        return {"up": config_file_name(self.E, self.N, device_name, self.dtype_selector, self.block_shape),
                "down": config_file_name(self.E, self.N, device_name, self.dtype_selector, self.block_shape,
                                         down=True)}

    def reads_down(self, release: str) -> bool:
        """Whether vLLM ``release`` reads the ``_down.json`` of this shape."""
        return reads_down_file(release, self.dtype_selector, self.block_shape)


def hf_hub_dir(hf_home: str | None) -> Path:
    """The Hugging Face hub cache vLLM's loader reads (``huggingface_hub``'s rule)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = hf_home or os.environ.get("HF_HOME") or "~/.cache/huggingface"
    return Path(home).expanduser() / "hub"


def resolve_model_config_path(spec: str, hf_home: str | None = None) -> Path:
    """The ``config.json`` that ``spec`` names (module docstring). Raises ``PayloadError``:
    ``bad_input`` for an empty spec, ``not_found`` naming what was tried."""
    if not isinstance(spec, str) or not spec.strip():
        raise PayloadError("bad_input", "model config: empty --model-config")
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise PayloadError("not_found", f"model config: folder {p} has no config.json")
        return p / "config.json"
    if p.is_file():
        return p
    parts = spec.split("/")
    if len(parts) != 2 or not all(parts) or spec.startswith(("/", ".", "~")):
        raise PayloadError("not_found", f"model config: {p} does not exist")
    repo = hf_hub_dir(hf_home) / ("models--" + spec.replace("/", "--"))
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        raise PayloadError("not_found", f"model config: {spec!r} is neither a local path nor in the Hugging Face "
                                        f"cache ({snaps} does not exist; offline lookup only)")
    ref = repo / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8", errors="replace").strip()
        if rev and "/" not in rev and (snaps / rev / "config.json").is_file():
            return snaps / rev / "config.json"
    cands = sorted((d / "config.json" for d in snaps.iterdir() if (d / "config.json").is_file()),
                   key=lambda c: c.stat().st_mtime)
    if not cands:
        raise PayloadError("not_found", f"model config: no snapshot of {spec!r} under {snaps} has a config.json")
    return cands[-1]


def load_model_config(path: str) -> dict[str, Any]:
    """The JSON object of a ``config.json``. Raises ``PayloadError('bad_input')`` naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise PayloadError("bad_input", f"model config {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise PayloadError("bad_input", f"model config {path}: not a JSON object")
    return cfg


_WEIGHT_DTYPES = {"fp8_w8a8": "fp8_e4m3", "mxfp4": "mxfp4", "int8_w8a16": "int8", "int4_w4a16": "int4"}


def _act_dtype(cfg: Mapping[str, Any], dtype: str | None) -> str:
    """The activation dtype vLLM runs (``--dtype``, else the config's ``dtype``/``torch_dtype``; a
    float32 checkpoint runs bfloat16 with ``auto``, ``vllm/config/model.py`` ``_get_and_verify_dtype``)."""
    if dtype and dtype != "auto":
        return {"half": "float16", "bf16": "bfloat16", "float": "float32"}.get(dtype, dtype)
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    raw = str(tc.get("dtype") or tc.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16")
    return "float16" if raw == "float16" else "bfloat16"


def vllm_moe_shape(cfg: dict[str, Any], *, tp: int = 1, ep: int = 1, dp: int = 1, quantization: str | None = None,
                   dtype: str | None = None, source: str = "config.json") -> VllmMoeShape:
    """The :class:`VllmMoeShape` of ``cfg`` run with the model flags (module docstring): ``ep`` > 1
    splits the experts over ``ep`` ranks (``--enable-expert-parallel``: TP x DP); otherwise N is split
    over ``tp`` x ``dp`` (vLLM's ``FusedMoEParallelConfig.make`` flattens the experts' TP across DP).
    ``per_channel_quant`` is set for ``experts_int8`` (one scale per output row, no group). Raises
    ``PayloadError('bad_input')`` (a :class:`~remote.protocol.BadInput`) from the shape rules."""
    ep_split = ep > 1
    vs = model_shape(cfg, tp=ep if ep_split else tp, dp=1 if ep_split else dp, enable_expert_parallel=ep_split,
                     quantization=quantization, source=source)
    act = _act_dtype(cfg, dtype)
    notes = []
    if vs.weight_format == "mxfp4":
        notes.append("mxfp4 MoE weights: vLLM runs no Triton config file for them")
    if not ep_split and dp > 1:
        notes.append(f"data parallel {dp} without expert parallelism: vLLM splits N over TP x DP = {tp * dp} ranks")
    per_channel = vs.quant_method == "experts_int8"
    return VllmMoeShape(E=vs.E, N=vs.N, hidden=vs.hidden, topk=vs.topk, runtime_topk=vs.topk,
                        num_experts=vs.experts, shared_fused=False, dtype_selector=vs.dtype,
                        block_shape=vs.block_shape, per_channel_quant=per_channel,
                        weight_dtype=_WEIGHT_DTYPES.get(vs.weight_format or "", act), moe_layers=None,
                        architecture=vs.architecture, act_dtype=act, intermediate_size=vs.intermediate,
                        tp=tp, ep=ep, quant_method=vs.weight_format, notes=notes,
                        family=f"vllm:{vs.architecture}", source=SOURCE,
                        group_size=max(0, vs.group_size), has_zp=vs.has_zp)


def _shape_from_spec(args: argparse.Namespace) -> VllmMoeShape:
    """``--shape E=..,N=..,hidden=..,topk=..`` (per-rank N), with ``--quantization fp8`` and
    ``--block-shape BN,BK``."""
    vals: dict[str, int] = {}
    for part in str(args.shape).split(","):
        k, _, v = part.partition("=")
        if k.strip() not in ("E", "N", "hidden", "topk") or not v.strip().isdigit() or int(v) <= 0:
            raise PayloadError("bad_input", f"--shape: expected E=..,N=..,hidden=..,topk=.. positive, got {args.shape!r}")
        vals[k.strip()] = int(v)
    if set(vals) != {"E", "N", "hidden", "topk"}:
        raise PayloadError("bad_input", f"--shape needs E, N, hidden and topk, got {args.shape!r}")
    fp8 = (args.quantization or "").lower() == "fp8"
    block = None
    if getattr(args, "block_shape", None):
        try:
            block = [int(x) for x in str(args.block_shape).split(",")]
        except ValueError:
            raise PayloadError("bad_input", f"--block-shape: 'BN,BK', got {args.block_shape!r}") from None
    act = _act_dtype({}, args.dtype)
    return VllmMoeShape(E=vals["E"], N=vals["N"], hidden=vals["hidden"], topk=vals["topk"], runtime_topk=vals["topk"],
                        num_experts=vals["E"], shared_fused=False, dtype_selector="fp8_w8a8" if fp8 else None,
                        block_shape=block if fp8 else None, per_channel_quant=False,
                        weight_dtype="fp8_e4m3" if fp8 else act, moe_layers=None, architecture="--shape",
                        act_dtype=act, intermediate_size=vals["N"], tp=int(args.tp or 1), ep=int(args.ep or 1),
                        quant_method="fp8_w8a8" if fp8 else None, family="vllm:--shape", source=SOURCE)


def shape_from_args(args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[VllmMoeShape, str]:
    """``(shape, source)`` of the parsed model flags: ``source`` the ``config.json`` found, or
    ``"--shape"``. ``capability`` is not read (vLLM's shape does not depend on the GPU). Raises
    ``PayloadError`` (``bad_input``, ``not_found``)."""
    if getattr(args, "shape", None):
        return _shape_from_spec(args), "--shape"
    if not args.model_config:
        raise PayloadError("bad_input", "--model-config or --shape is required")
    path = resolve_model_config_path(args.model_config, getattr(args, "hf_home", None))
    cfg = load_model_config(str(path))
    try:
        shape = vllm_moe_shape(cfg, tp=int(args.tp or 1), ep=int(args.ep or 1), dp=int(getattr(args, "dp", 1) or 1),
                               quantization=args.quantization, dtype=args.dtype, source=str(path))
    except BadInput:
        raise
    except (ValueError, TypeError) as exc:
        raise PayloadError("bad_input", f"model shape: {exc}") from None
    return shape, str(path)


#: Commands that take model flags (the shared table's: the payload's ``tune``, ``names``, ``probe``
#: and the controller's ``orch config-names``).
COMMANDS = ("tune", "names", "probe", "config-names")
#: The model flags as vLLM's rules read them: ``(flag, help, type, default, commands, required_in)``,
#: the same flags and defaults as the default engine's table (``remote.engines.add_model_flags``), so
#: one argv parses the same under either; ``tests/unit/remote/engines/vllm/test_engine.py`` holds that.
MODEL_FLAGS: tuple[tuple[str, str, Any, Any, tuple[str, ...], tuple[str, ...]], ...] = (
    ("--engine", "the inference engine that serves the model (remote.protocol.ENGINE_NAMES)", str, DEFAULT_ENGINE,
     COMMANDS, ()),
    ("--model-config", "model folder, config.json path, or Hugging Face repo id (offline cache lookup)", str, None,
     COMMANDS, ("names",)),
    ("--hf-home", "HF_HOME of the cache (default $HF_HOME or ~/.cache/huggingface)", str, None, COMMANDS, ()),
    ("--download-dir", "server --download-dir", str, None, COMMANDS, ()),
    ("--tp", "server --tensor-parallel-size", int, 1, COMMANDS, ()),
    ("--ep", "expert-parallel size: TP x DP with --enable-expert-parallel (1: none)", int, 1, COMMANDS, ()),
    ("--dp", "server --data-parallel-size: without expert parallelism vLLM splits N over TP x DP", int, 1,
     COMMANDS, ()),
    ("--dtype", "server --dtype (auto, bfloat16, float16, float32)", str, None, COMMANDS, ()),
    ("--quantization", "server --quantization (default: from the checkpoint)", str, None, COMMANDS, ()),
    ("--disable-shared-experts-fusion", "not read by vLLM's rules (its shared experts are never fused on CUDA)",
     None, False, COMMANDS, ()),
    ("--device-name", "GPU name as torch.cuda.get_device_name() gives it (e.g. 'NVIDIA H200') or vLLM's form",
     str, None, COMMANDS, ("names",)),
    ("--shape", "instead of --model-config: E=..,N=..,hidden=..,topk=.. (per-rank N)", str, None, ("tune",), ()),
    ("--block-shape", "with --shape --quantization fp8: the weight block 'BN,BK'", str, None, ("tune",), ()),
)


def add_model_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the model flags of ``command`` (one of :data:`COMMANDS`) to ``parser``."""
    for flag, help_text, kind, default, commands, required in MODEL_FLAGS:
        if command not in commands:
            continue
        if kind is None:
            parser.add_argument(flag, action="store_true", default=default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=default, help=help_text, required=command in required)


def model_argv(values: Mapping[str, Any]) -> list[str]:
    """The argv of the shared model-flag table for ``values`` (flag dest -> value): ``--dest-name
    VALUE`` for a value, ``--dest-name`` alone for True, nothing for None/False."""
    out: list[str] = []
    for dest, value in values.items():
        if value is None or value is False:
            continue
        flag = "--" + dest.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def model_facts(config_path: str) -> dict[str, Any]:
    """``checkpoint_quant_method`` (``quantization_config.quant_method``), ``config_dtype`` and
    ``model_type`` of the model config at ``config_path``, as vLLM's ``ModelConfig`` reads them."""
    cfg = load_model_config(config_path)
    tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    qc = cfg.get("quantization_config") if isinstance(cfg.get("quantization_config"), dict) else {}
    raw = tc.get("dtype") or tc.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")
    return {"checkpoint_quant_method": qc.get("quant_method"), "config_dtype": str(raw) if raw else None,
            "model_type": tc.get("model_type") or cfg.get("model_type")}


__all__ = ["DOWN_FILE_RELEASES", "VllmMoeShape", "add_model_flags", "model_argv", "model_facts", "shape_from_args", "vllm_moe_shape"]
