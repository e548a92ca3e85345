"""Model configs and the MoE shape SGLang's fused-MoE kernel sees (stdlib only).

``load_model_config`` reads a Hugging Face ``config.json`` (a folder, a file, or a repo
id resolved offline from the HF cache). ``moe_shape`` turns it, with the server's
``--tp-size``/``--ep-size``/``--quantization``/``--dtype``, into the per-rank E and N and
the dtype/block/per-channel selectors that make up SGLang's config file name.

Which config fields give E, N and top-k, and whether the shared expert runs inside the routed
GEMM (E + 1), differs per architecture: :data:`ARCHITECTURES` holds SGLang 0.5.23's rule for
every architecture whose model code (``sglang/srt/models/*.py``) builds a fused MoE, each citing
the file and line it comes from; ``moe_shape`` interprets it and refuses an architecture it does
not list. ``architecture_table_markdown`` renders the table for docs/sglang-models.md. At run
time SGLang reads ``E, _, N = w2.shape`` with ``N = expert intermediate size / (tp / ep)`` and
``E = experts // ep`` plus the fused shared experts.

This module must not import torch or triton (the ``names`` command and the controller
use it without them).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .naming import config_file_name, sglang_device_name
from ..protocol import PayloadError

#: Largest config.json read (bytes); real ones are a few KB.
MAX_CONFIG_BYTES = 16 * 1024 * 1024

_DTYPE_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}


# --------------------------------------------------------------------------- loading

def hf_hub_dir(hf_home: str | None = None) -> Path:
    """The Hugging Face hub cache folder.

    ``hf_home`` (if given) else ``$HF_HOME``, else ``~/.cache/huggingface``; the hub is its
    ``hub/`` subfolder. ``$HF_HUB_CACHE`` (huggingface_hub's override) wins when
    ``hf_home`` is not given. If ``hf_home`` itself holds ``models--*`` folders (it is a
    hub folder already) it is used as is.
    """
    if hf_home is None:
        env_hub = os.environ.get("HF_HUB_CACHE")
        if env_hub:
            return Path(env_hub).expanduser()
        hf_home = os.environ.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())
    base = Path(hf_home).expanduser()
    if not (base / "hub").is_dir() and base.is_dir() and any(p.name.startswith("models--") for p in base.iterdir()):
        return base
    return base / "hub"


def _looks_like_repo_id(spec: str) -> bool:
    if spec.startswith(("/", ".", "~")) or "\\" in spec or spec.count("/") > 1:
        return False
    parts = spec.split("/")
    ok = all(p and p not in (".", "..") and all(c.isalnum() or c in "-_." for c in p) for p in parts)
    return ok and ".." not in spec


def use_modelscope(env: dict | None = None) -> bool:
    """SGLang's ``SGLANG_USE_MODELSCOPE`` (0.5.23 ``environ.py``, an ``EnvBool``): true for
    ``true``, ``1``, ``yes``, ``y`` in any case; unset is false. ``env`` defaults to ``os.environ``."""
    value = (os.environ if env is None else env).get("SGLANG_USE_MODELSCOPE", "false")
    return value.strip().lower() in ("true", "1", "yes", "y")


def modelscope_model_root(env: dict | None = None) -> Path:
    """ModelScope's model cache root, which SGLang 0.5.23 asks modelscope for
    (``modelscope.utils.file_utils.get_model_cache_root``, modelscope 1.40):
    ``$MODELSCOPE_CACHE/models``, default ``~/.cache/modelscope/hub/models``."""
    env = os.environ if env is None else env
    cache = env.get("MODELSCOPE_CACHE") or str(Path("~/.cache/modelscope/hub").expanduser())
    return Path(cache).expanduser() / "models"


def modelscope_candidates(spec: str, download_dir: str | None = None, env: dict | None = None) -> list[Path]:
    """Folders where a ModelScope model ``spec`` (``ORG/NAME``) is found without a download, in
    SGLang 0.5.23's order (``handle_modelscope_paths``): ``<model cache root>/ORG/NAME``, then
    ``<--download-dir>/ORG/NAME``; also ``<model cache root>/ORG/NAME`` with the dots of NAME
    written ``___``, where modelscope's ``snapshot_download`` stores a model (modelscope
    ``get_model_masked_directory``; SGLang reaches it through that call)."""
    root = modelscope_model_root(env)
    org, _, name = spec.partition("/")
    out = [root / spec]
    if download_dir:
        out.append(Path(download_dir).expanduser() / spec)
    masked = root / org / name.replace(".", "___")
    if masked not in out:
        out.append(masked)
    return out


def resolve_model_config_path(spec: str, hf_home: str | None = None, download_dir: str | None = None,
                              modelscope: bool | None = None) -> Path:
    """Find the config.json that ``spec`` names; see :func:`load_model_config`.

    With ``modelscope`` (default: :func:`use_modelscope` of this process's environment, which the
    controller sets to the unit's) a repo id is looked up where SGLang looks for a ModelScope model
    (:func:`modelscope_candidates`, ``download_dir``: the server's ``--download-dir``), not in the
    Hugging Face cache. Raises PayloadError('not_found') naming every path tried,
    PayloadError('bad_input') for an empty spec.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PayloadError("bad_input", "model config: empty --model-config")
    p = Path(spec).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise PayloadError("not_found", f"model config: folder {p} has no config.json")
        return cfg
    if p.is_file():
        return p
    if not _looks_like_repo_id(spec):
        raise PayloadError("not_found", f"model config: {p} does not exist")
    if use_modelscope() if modelscope is None else modelscope:
        tried = [c / "config.json" for c in modelscope_candidates(spec, download_dir)]
        for cand in tried:
            if cand.is_file():
                return cand
        raise PayloadError(
            "not_found",
            f"model config: {spec!r} (SGLANG_USE_MODELSCOPE) is in no ModelScope cache: tried "
            + ", ".join(str(t) for t in tried)
            + "; SGLang would download it at start, orch does not download",
        )
    hub = hf_hub_dir(hf_home)
    repo_dir = hub / ("models--" + spec.replace("/", "--"))
    snaps = repo_dir / "snapshots"
    if not snaps.is_dir():
        raise PayloadError(
            "not_found",
            f"model config: {spec!r} is neither a local path nor in the Hugging Face cache "
            f"({snaps} does not exist; offline lookup only)",
        )
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8", errors="replace").strip()
        cand = snaps / rev / "config.json"
        if rev and "/" not in rev and cand.is_file():
            return cand
    cands = sorted(
        (d / "config.json" for d in snaps.iterdir() if (d / "config.json").is_file()),
        key=lambda c: (c.stat().st_mtime, c.parent.name),
        reverse=True,
    )
    if not cands:
        raise PayloadError("not_found", f"model config: no snapshot of {spec!r} under {snaps} has a config.json")
    return cands[0]  # no usable refs/main: the most recently written snapshot


def load_model_config(spec: str, hf_home: str | None = None) -> dict:
    """Load a model's ``config.json`` as a dict.

    ``spec`` is a folder holding ``config.json``, a path to a JSON file, or a Hugging Face
    repo id (``ORG/NAME``) resolved OFFLINE from the cache:
    ``<hub>/models--ORG--NAME/snapshots/<rev>/config.json`` where ``<rev>`` is
    ``refs/main`` when that snapshot has a config.json, else the newest snapshot that
    does (``<hub>`` from :func:`hf_hub_dir`); with ``SGLANG_USE_MODELSCOPE`` set in this
    process's environment, from the ModelScope cache instead (:func:`resolve_model_config_path`).
    Nothing is downloaded.

    Raises PayloadError('not_found') when no file is found and PayloadError('bad_input')
    when the file is larger than :data:`MAX_CONFIG_BYTES`, not JSON, or not an object;
    messages name the path.
    """
    path = resolve_model_config_path(spec, hf_home)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise PayloadError("bad_input", f"model config {path}: {size} bytes, more than {MAX_CONFIG_BYTES}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PayloadError("not_found", f"model config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PayloadError("bad_input", f"model config {path}: not UTF-8 ({exc.reason})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError("bad_input", f"model config {path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise PayloadError("bad_input", f"model config {path}: top level is {type(cfg).__name__}, not an object")
    return cfg


# --------------------------------------------------------------------------- shape

@dataclass
class MoeShape:
    """The fused-MoE GEMM shape of one rank and the selectors of its config file name.

    ``E``: experts on one rank incl. a fused shared expert (``w2.shape[0]``).
    ``N``: per-rank intermediate size used in the file name (``w2.shape[2]``; for
    int4_w4a16 the packed size, i.e. half the logical one, as SGLang 0.5.23 does).
    ``hidden``: model hidden size K (``w1.shape[2]``), elements.
    ``topk``: routed experts per token (``num_experts_per_tok``);
    ``runtime_topk``: top-k the kernel runs with (``topk + 1`` with a fused shared expert).
    ``num_experts``: global routed experts in the checkpoint.
    ``shared_fused``: a shared expert is fused into the routed GEMM (adds 1 to E).
    ``dtype_selector``: ``fp8_w8a8``/``int8_w8a8``/``int4_w4a16``/``int8_w8a16``/``float32``/None.
    ``block_shape``: ``[block_n, block_k]`` of block quantization, else None.
    ``per_channel_quant``: channel-wise weight scales.
    ``weight_dtype``: ``bfloat16``, ``float16``, ``float32``, ``fp8_e4m3``, ``int8``,
    ``int4``, ``mxfp4``.
    ``act_dtype``: activation dtype of the MoE input (``bfloat16``/``float16``/``float32``).
    ``moe_layers``: MoE layers in the model (MTP/NextN not counted), None if unknown.
    ``architecture``: ``architectures[0]``.
    ``notes``: human-readable caveats (e.g. the layer may not use Triton configs).
    ``family``: the :class:`ArchRule` family; ``sglang_source``: the SGLang 0.5.23 file:line that
    builds these experts. ``gated``: w1 is ``[E, 2N, K]`` (gate and up); False: ``[E, N, K]``.
    """

    E: int
    N: int
    hidden: int
    topk: int
    runtime_topk: int
    num_experts: int
    shared_fused: bool
    dtype_selector: str | None
    block_shape: list[int] | None
    per_channel_quant: bool
    weight_dtype: str
    moe_layers: int | None
    architecture: str
    act_dtype: str = "bfloat16"
    intermediate_size: int = 0
    tp: int = 1
    ep: int = 1
    quant_method: str | None = None
    notes: list[str] = field(default_factory=list)
    family: str = ""
    sglang_source: str = ""
    gated: bool = True

    def file_names(self, device_name: str, per_channel_selector: bool = True) -> dict[str, str]:
        """``{"up": ..., "down": ...}`` file names (SGLang 0.5.23 get_config_file_name).

        ``device_name`` may be the torch form (``"NVIDIA H200"``) or the SGLang form
        (``"NVIDIA_H200"``). ``per_channel_selector``: False for releases whose
        ``get_config_file_name`` has no ``,per_channel_quant=True`` selector (before SGLang
        0.5.4: ``remote.probe.loader_rules``). Raises ValueError for a hostile device name.
        """
        dev = sglang_device_name(device_name)
        kw = dict(dtype=self.dtype_selector, block_shape=self.block_shape,
                  per_channel_quant=self.per_channel_quant and per_channel_selector)
        return {
            "up": config_file_name(self.E, self.N, dev, **kw),
            "down": config_file_name(self.E, self.N, dev, down=True, **kw),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)




def _pos_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise PayloadError("bad_input", f"{what} must be a positive integer, got {v!r}")
    return v




def _act_dtype(tc: dict, cfg: dict, dtype: str | None, notes: list[str]) -> str:
    if dtype is not None and dtype != "auto":
        d = _DTYPE_ALIASES.get(str(dtype).lower())
        if d is None:
            raise PayloadError("bad_input", f"--dtype {dtype!r}: expected auto, bfloat16, float16/half or float32/float")
        return d
    raw = None
    for src in (tc, cfg):
        raw = src.get("torch_dtype") or src.get("dtype")
        if raw:
            break
    d = _DTYPE_ALIASES.get(str(raw).lower().replace("torch.", "")) if raw else None
    if d is None:
        if raw:
            notes.append(f"config dtype {raw!r} not understood; assumed bfloat16")
        return "bfloat16"
    if d == "float32":
        # --dtype auto never runs a float32 checkpoint in float32 (it is cast to 16 bits)
        notes.append("float32 checkpoint with --dtype auto runs in 16-bit; assumed bfloat16")
        return "bfloat16"
    return d


def _quant(qc: dict | None, flag: str | None, notes: list[str]) -> dict:
    """Quantization -> {method, selector, block, per_channel, weight_dtype, packed}."""
    none = dict(method=None, selector=None, block=None, per_channel=False, weight_dtype=None, packed=False)
    ck_method = str(qc.get("quant_method", "")).lower() if isinstance(qc, dict) else None
    flag = flag.lower() if flag else None
    if flag in ("none", ""):
        flag = None

    def fp8_ckpt() -> dict:
        wbs = qc.get("weight_block_size")
        fmt = str(qc.get("fmt") or "e4m3").lower()
        out = dict(method="fp8", selector="fp8_w8a8", block=None, per_channel=False,
                   weight_dtype=f"fp8_{fmt}", packed=False)
        if wbs:
            if not (isinstance(wbs, list) and len(wbs) == 2 and all(isinstance(x, int) and x > 0 for x in wbs)):
                raise PayloadError("bad_input", f"quantization_config.weight_block_size {wbs!r}: expected [block_n, block_k]")
            out["block"] = list(wbs)
        return out

    def compressed_tensors() -> dict:
        groups = qc.get("config_groups") or {}
        grp = next((g for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)), None)
        if grp is None:
            raise PayloadError("bad_input", "compressed-tensors quantization_config without config_groups[*].weights")
        w, a = grp["weights"], grp.get("input_activations")
        bits, typ, strat = w.get("num_bits"), str(w.get("type", "int")), str(w.get("strategy", "tensor"))
        if bits != 8:
            raise PayloadError("bad_input", f"compressed-tensors {bits}-bit weights run through Marlin/other kernels, not the Triton fused-MoE configs orch tunes")
        if typ == "float":
            sel, wd = "fp8_w8a8", "fp8_e4m3"
        else:
            sel, wd = ("int8_w8a8" if a else "int8_w8a16"), "int8"
        out = dict(method="compressed-tensors", selector=sel, block=None, per_channel=strat == "channel",
                   weight_dtype=wd, packed=False)
        if strat == "block":
            bs = w.get("block_structure")
            if not (isinstance(bs, list) and len(bs) == 2):
                raise PayloadError("bad_input", f"compressed-tensors block strategy without block_structure [n, k]: {bs!r}")
            out["block"] = [int(x) for x in bs]
        return out

    def wna16() -> dict:
        bits = qc.get("bits", qc.get("w_bit")) if isinstance(qc, dict) else None
        if bits not in (4, 8):
            raise PayloadError("bad_input", f"moe_wna16 needs a GPTQ/AWQ checkpoint with bits 4 or 8, got {bits!r}")
        notes.append("int4/int8 weight-only names are version-specific (SGLang uses the packed N for int4; vLLM does not)")
        return dict(method="moe_wna16", selector="int4_w4a16" if bits == 4 else "int8_w8a16", block=None,
                    per_channel=False, weight_dtype=f"int{bits}", packed=bits == 4)

    def mxfp4() -> dict:
        notes.append(
            "MXFP4 checkpoint: on Hopper/Blackwell SGLang 0.5.23 runs it with moe_runner_backend "
            "triton_kernel (or flashinfer_mxfp4), which does not read these config files; the names "
            "apply only when it runs through the Triton fused_moe path with bf16 weights")
        return dict(method="mxfp4", selector=None, block=None, per_channel=False, weight_dtype="mxfp4", packed=False)

    def from_checkpoint() -> dict:
        if not ck_method:
            return none
        if ck_method == "fp8":
            return fp8_ckpt()
        if ck_method == "compressed-tensors":
            return compressed_tensors()
        if ck_method == "mxfp4":
            return mxfp4()
        if ck_method in ("w8a8_fp8", "w8a8_int8"):
            sel = "fp8_w8a8" if ck_method == "w8a8_fp8" else "int8_w8a8"
            return dict(method=ck_method, selector=sel, block=None, per_channel=True,
                        weight_dtype="fp8_e4m3" if sel.startswith("fp8") else "int8", packed=False)
        if ck_method in ("modelopt", "modelopt_fp8") and "FP8" in str(qc.get("quant_algo", "FP8")).upper() \
                and "FP4" not in str(qc.get("quant_algo", "")).upper():
            return dict(method="modelopt_fp8", selector="fp8_w8a8", block=None, per_channel=False,
                        weight_dtype="fp8_e4m3", packed=False)
        raise PayloadError(
            "bad_input",
            f"checkpoint quantization {ck_method!r} is not supported by orch's naming (it may not use the "
            "Triton fused-MoE configs at all); for GPTQ/AWQ served with --quantization moe_wna16 pass that flag")

    if flag is None:
        return from_checkpoint()
    if flag == "fp8":
        if ck_method == "fp8":
            return fp8_ckpt()
        if ck_method:
            raise PayloadError("bad_input", f"--quantization fp8 on a {ck_method!r} checkpoint is not supported")
        notes.append("online FP8 quantization (per-tensor) of a 16-bit checkpoint")
        return dict(method="fp8", selector="fp8_w8a8", block=None, per_channel=False, weight_dtype="fp8_e4m3", packed=False)
    if flag in ("w8a8_fp8", "w8a8_int8"):
        sel = "fp8_w8a8" if flag == "w8a8_fp8" else "int8_w8a8"
        return dict(method=flag, selector=sel, block=None, per_channel=True,
                    weight_dtype="fp8_e4m3" if flag == "w8a8_fp8" else "int8", packed=False)
    if flag == "moe_wna16":
        if ck_method not in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
            raise PayloadError("bad_input", f"--quantization moe_wna16 needs a GPTQ/AWQ checkpoint, got {ck_method!r}")
        return wna16()
    if flag == "mxfp4":
        return mxfp4()
    if ck_method and flag.replace("_", "-") == ck_method.replace("_", "-"):
        return from_checkpoint()
    if flag in ("modelopt", "modelopt_fp8") and ck_method in ("modelopt", "modelopt_fp8"):
        return from_checkpoint()
    raise PayloadError("bad_input", f"--quantization {flag!r} is not supported by orch's naming")




# --------------------------------------------------------------------------- architecture table
#
# What SGLang 0.5.23 builds for each architecture, as data. Each rule names the config fields the
# model code reads (first present wins), where the MoE's config sits, whether the shared expert is
# run as extra slots of the routed GEMM (``Fusion``) and the SGLang file:line it comes from
# (paths relative to ``sglang/srt/``). ``moe_shape`` interprets the table; ``architecture_table_markdown``
# renders it for docs/sglang-models.md. Read it beside those files, not as a copy of them.

@dataclass(frozen=True)
class Fusion:
    """When SGLang 0.5.23 runs the shared expert(s) as extra slots of the routed fused-MoE GEMM.

    SGLang asks the model class's ``shared_experts_fusion_disable_reason`` and
    ``num_fusable_shared_experts`` hooks once, before the model is built
    (``resolve_shared_experts_config``, layers/moe/utils.py:600); Qwen-style blocks decide inside
    ``Qwen2MoeSparseMoeBlock`` (models/qwen2_moe.py:282). With fusion on, the MoE weights hold
    ``experts // ep + count`` experts on each rank (layers/moe/fused_moe_triton/layer.py:399-416)
    and the kernel runs top-k + count.

    ``gate``: SGLang file:line of the rule. ``count``: fields giving the shared-expert count,
    first present. ``count_rule``: ``"field"`` (that count; absent = 0), ``"qwen"``
    (``get_num_shared_experts``: the count, else 1 when the ``size`` field is > 0) or
    ``"bailing"`` (``_get_bailing_num_shared_experts``: with a ``size`` field, max(1, count) when it
    is > 0, else 0). ``size``: field of the shared expert's intermediate size. ``same_size``: fused
    only when that size equals the routed experts' (``qwen``: an absent size means no fusion;
    ``bailing``: an absent size counts as intermediate * count). ``arch``: ``architectures[0]`` of
    the config the MoE reads must be this name. ``routed_in``: allowed routed-expert counts.
    ``one``: what a count other than 1 does: ``"off"`` (no fusion), ``"error"`` (SGLang refuses to
    load the model), ``"any"`` (all of them fused). ``sm80``: needs compute capability 8.0+.
    ``ep_off``: expert parallelism (--ep-size > 1) turns it off. ``deepep_off``: a DeepEP-class
    all-to-all backend turns it off. ``quant_off``: quantization methods that turn it off.
    ``block_divides``: with block FP8 the per-rank N must be a multiple of the block's n and k.
    """

    gate: str
    count: tuple[str, ...] = ("n_shared_experts",)
    count_rule: str = "field"
    size: str | None = None
    same_size: bool = False
    arch: str | None = None
    routed_in: tuple[int, ...] | None = None
    one: str = "any"
    sm80: bool = True
    ep_off: bool = True
    deepep_off: bool = True
    quant_off: tuple[str, ...] = ()
    block_divides: bool = False


@dataclass(frozen=True)
class ArchRule:
    """How SGLang 0.5.23 builds the fused MoE of one architecture family.

    ``family``: display name. ``archs``: the ``architectures[0]`` names (SGLang ``EntryClass``).
    ``source``: SGLang file:line that builds the experts. ``config_at``: where the MoE's fields sit
    in config.json (``""`` top level, else the sub-config key path); SGLang finds it with
    ``get_hf_text_config`` (utils/hf_transformers/common.py:547, order thinker_config >
    llm_config > language_config > text_config) and also copies the text config's fields onto the
    top level (utils/hf_transformers/config.py:258), so a field is read from the sub-config first,
    then from the top level. ``experts``/``intermediate``/``topk``/``hidden``: field names, first
    present wins (later names: aliases the config class's ``attribute_map`` maps onto the first);
    ``a.b`` is a nested key, ``a[i]`` a list element; a per-layer list must hold one value.
    ``intermediate_div``: the field holds a multiple
    of the per-expert size (Zaya: gate+up). ``topk_default``: SGLang's default when no top-k
    field is set. ``expert_parallel``: False when each expert is a TP-sharded MLP packed into one
    tensor on every rank (E = all experts, N = size / TP; --ep-size has no effect).
    ``quantized``: False when SGLang calls ``fused_moe`` without quantization flags.
    ``moe_tp1``: the experts need MoE-TP 1 (--ep-size equal to --tp-size). ``gated``: w1 is
    ``[E, 2N, K]`` (gate and up); False: ``[E, N, K]``. ``fusion``: shared-expert fusion rule, None
    when the shared expert (if any) is a separate MLP. ``enabled_by``: a boolean field that must be
    true for the layers to be MoE. ``layers``: rule counting MoE layers (see ``_moe_layer_count``).
    ``when``: ``(field, value)``: the rule applies only when that field of the MoE config equals
    the value (branches of one architecture). ``delegate``: the MoE config's own
    ``architectures[0]`` names the language model whose rule applies. ``second``: ``(experts,
    intermediate, label)`` of a second expert group with files of its own. ``refuse``: SGLang builds
    a fused MoE but orch cannot name one shape for it (the reason). ``notes``: caveats copied
    into :attr:`MoeShape.notes`.
    """

    family: str
    archs: tuple[str, ...]
    source: str
    config_at: str = ""
    experts: tuple[str, ...] = ()
    intermediate: tuple[str, ...] = ()
    topk: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ("hidden_size",)
    intermediate_div: int = 1
    topk_default: int | None = None
    expert_parallel: bool = True
    quantized: bool = True
    moe_tp1: bool = False
    gated: bool = True
    fusion: Fusion | None = None
    enabled_by: str | None = None
    layers: str | None = "all"
    when: tuple[str, Any] | None = None
    delegate: bool = False
    second: tuple[str, str, str] | None = None
    refuse: str | None = None
    notes: tuple[str, ...] = ()


# Shared-expert fusion gates (SGLang 0.5.23).
_DEEPSEEK_V3_GATE = Fusion(
    gate="models/deepseek_v2.py:3325", arch="DeepseekV3ForCausalLM", routed_in=(256,), one="off",
    quant_off=("w4afp8",))
_GLM_DSA_GATE = Fusion(
    gate="models/deepseek_v2.py:3325 (fused_shared_experts_architecture, models/glm4_moe.py:1285)",
    arch="GlmMoeDsaForCausalLM", routed_in=(256,), one="off", quant_off=("w4afp8",))
_GLM4_MOE_GATE = Fusion(gate="models/glm4_moe.py:1012", quant_off=("w4afp8",))
_GLM4_MOE_LITE_GATE = Fusion(gate="models/glm4_moe_lite.py:732", arch="Glm4MoeLiteForCausalLM", one="off",
                             deepep_off=False)
_GLM4V_MOE_GATE = Fusion(gate="models/glm4v_moe.py:87", one="error")
_GLM5_NEXT_GATE = Fusion(gate="models/glm5_next.py:1352", one="off")
_MINIMAX_M3_GATE = Fusion(gate="models/minimax_m3.py:2023", one="error",
                          quant_off=("modelopt_mixed", "minimax_m3_nvfp4"))
_MINIMAX_M3_VL_GATE = Fusion(gate="models/minimax_m3_vl.py:166", one="error",
                             quant_off=("modelopt_mixed", "minimax_m3_nvfp4"))
_DOTS3_GATE = Fusion(gate="models/dots3_common/modeling.py:1628", arch="Dots3NoteForCausalLM", routed_in=(256,),
                     one="off", deepep_off=False, quant_off=("w4afp8",))
_QWEN3_NEXT_GATE = Fusion(
    gate="models/qwen2_moe.py:137,282 (enable_cuda_shared_expert_fusion=True, models/qwen3_next.py:557)",
    count_rule="qwen", size="shared_expert_intermediate_size", same_size=True, one="error", sm80=False,
    ep_off=False)
_BAILING_V3_GATE = Fusion(
    gate="models/bailing_moe_v3.py:1429", count=("num_shared_experts",), count_rule="bailing",
    size="moe_shared_expert_intermediate_size", same_size=True, arch="BailingMoeV3ForCausalLM", one="error",
    ep_off=False, quant_off=("w4afp8",), block_divides=True)

_DS_FIELDS = dict(experts=("n_routed_experts",), intermediate=("moe_intermediate_size",),
                  topk=("num_experts_per_tok",))
_QWEN_FIELDS = dict(experts=("num_experts",), intermediate=("moe_intermediate_size",),
                    topk=("num_experts_per_tok",))
#: transformers 5.19's Qwen3-MoE-style classes store the count as num_local_experts (attribute_map)
_QWEN3_FIELDS = dict(_QWEN_FIELDS, experts=("num_experts", "num_local_experts"))
_MIXTRAL_FIELDS = dict(experts=("num_local_experts",), intermediate=("intermediate_size",),
                       topk=("num_experts_per_tok",))
_NOT_V3 = ("SGLang's DeepSeek gate fuses the shared expert only when architectures[0] is "
           "DeepseekV3ForCausalLM (models/deepseek_v2.py:3358), unless --enforce-shared-experts-fusion",)
_PACKED = ("experts are TP-sharded MLPs packed into one tensor on every rank: --ep-size has no effect",)

#: Every architecture of SGLang 0.5.23 that builds a fused MoE (FusedMoE, get_moe_impl_class or a
#: direct fused_moe call), from ``sglang/srt/models/*.py``. Speculative-decoding drafts
#: (``*NextN``, ``*MTP``, DFlash/EAGLE heads) are left out: they are built from the target's config.
ARCHITECTURES: tuple[ArchRule, ...] = (
    # ---- DeepSeek MoE (DeepseekV2MoE) and the models that reuse it
    ArchRule("DeepSeek-V3 / R1, Kimi-K2", ("DeepseekV3ForCausalLM",), "models/deepseek_v2.py:753",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_DEEPSEEK_V3_GATE, layers="first_k_dense",
             notes=("384 routed experts (Kimi-K2.5) fuse only for a Quark MXFP4 checkpoint "
                    "(models/deepseek_v2.py:3359), which orch does not name",)),
    ArchRule("DeepSeek-V2 / V3.2, Mistral Large 3", ("DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM",
                                                    "MistralLarge3ForCausalLM"),
             "models/deepseek_v2.py:753", **_DS_FIELDS, layers="first_k_dense", notes=_NOT_V3),
    ArchRule("GLM-5 (GLM MoE DSA)", ("GlmMoeDsaForCausalLM",), "models/deepseek_v2.py:753",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM_DSA_GATE, layers="first_k_dense"),
    ArchRule("GLM-5-Next", ("Glm5NextForConditionalGeneration",),
             "models/glm5_next.py:748 -> models/deepseek_v2.py:753",
             config_at="text_config", **_DS_FIELDS, fusion=_GLM5_NEXT_GATE, layers="first_k_dense"),
    ArchRule("DeepSeek-V4", ("DeepseekV4ForCausalLM",),
             "models/deepseek_v4.py:3155 -> models/deepseek_v2.py:753 (DeepseekV2MoE)", **_DS_FIELDS,
             layers="first_k_dense",
             notes=("SGLang fuses DeepSeek-V4's shared expert only with --enforce-shared-experts-fusion "
                    "(models/deepseek_v4.py:4864)",)),
    ArchRule("Hunyuan V4", ("HYV4ForCausalLM",),
             "models/hunyuan_v4.py:625 -> models/deepseek_v2.py:753 (DeepseekV2MoE); configs/hy_v4.py:7",
             experts=("n_routed_experts", "num_local_experts"), intermediate=("moe_intermediate_size",),
             topk=("num_experts_per_tok",), layers="first_k_dense",
             notes=("fusion always off: the SwiGLU limit applies to routed experts only (models/hunyuan_v4.py:741)",)),
    ArchRule("GigaChat 3.5", ("GigaChat35ForCausalLM",),
             "models/gigachat35.py:350 -> models/deepseek_v2.py:753 (DeepseekV2MoE)", **_DS_FIELDS,
             layers="first_k_dense",
             notes=("SGLang forces --disable-shared-experts-fusion for it "
                    "(arg_groups/model_overrides/gigachat35.py:17)",)),
    ArchRule("Kimi-K2.5 (vision)", ("KimiK25ForConditionalGeneration",), "models/deepseek_v2.py:753",
             config_at="text_config", **_DS_FIELDS,
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/kimi_k25.py:653 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense",
             notes=("384 routed experts fuse only for a Quark MXFP4 checkpoint, which orch does not name",)),
    ArchRule("Kimi-VL", ("KimiVLForConditionalGeneration",), "models/deepseek_v2.py:753", config_at="text_config",
             **_DS_FIELDS, layers="first_k_dense",
             notes=("the text config is renamed DeepseekV2ForCausalLM before the DeepSeek gate "
                    "(models/kimi_vl.py:119): no fusion",)),
    ArchRule("dots.vlm1", ("DotsVLMForCausalLM",), "models/deepseek_v2.py:753", config_at="language_config",
             **_DS_FIELDS,
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/dots_vlm.py:50 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("Pixtral (Mistral Large 3 text)", ("PixtralForConditionalGeneration",), "models/deepseek_v2.py:753",
             config_at="text_config", **_DS_FIELDS, when=("model_type", "deepseek_v3"),
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/pixtral.py:83 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("DeepSeek-VL2", ("DeepseekVL2ForCausalLM",), "models/deepseek_vl2.py:217 -> models/deepseek_v2.py:753",
             config_at="language_config", **_DS_FIELDS, when=("use_mla", True),
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/deepseek_vl2.py:167 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("DeepSeek-VL2 (no MLA)", ("DeepseekVL2ForCausalLM",),
             "models/deepseek_vl2.py:220 -> models/deepseek.py:215",
             config_at="language_config", **_DS_FIELDS, expert_parallel=False, quantized=False,
             layers="first_k_dense", notes=_PACKED),
    ArchRule("DeepSeek-OCR (noaux_tc)", ("DeepseekOCRForCausalLM",),
             "models/deepseek_ocr.py:1485 -> models/deepseek_v2.py:753",
             config_at="language_config", **_DS_FIELDS, when=("topk_method", "noaux_tc"),
             fusion=replace(_DEEPSEEK_V3_GATE, gate="models/deepseek_ocr.py:1436 -> models/deepseek_v2.py:3325"),
             layers="first_k_dense"),
    ArchRule("DeepSeek-OCR (no MLA)", ("DeepseekOCRForCausalLM",),
             "models/deepseek_ocr.py:1491 -> models/deepseek.py:215",
             config_at="language_config", **_DS_FIELDS, when=("use_mla", False), expert_parallel=False,
             quantized=False, layers="first_k_dense", notes=_PACKED),
    ArchRule("DeepSeek-OCR (MLA)", ("DeepseekOCRForCausalLM",),
             "models/deepseek_ocr.py:1497 -> models/deepseek_v2.py:753",
             config_at="language_config", **_DS_FIELDS, layers="first_k_dense"),
    ArchRule("DeepSeek-MoE (V1)", ("DeepseekForCausalLM",), "models/deepseek.py:215 (fused_moe)", **_DS_FIELDS,
             expert_parallel=False, quantized=False, layers="first_k_dense", notes=_PACKED),
    ArchRule("dots.llm3 (Dots3 Note)", ("Dots3NoteForCausalLM",), "models/dots3_common/modeling.py:299", **_DS_FIELDS,
             fusion=_DOTS3_GATE, layers="first_k_dense"),
    ArchRule("LongCat-Flash", ("LongcatFlashForCausalLM",), "models/longcat_flash.py:300",
             experts=("n_routed_experts",), intermediate=("expert_ffn_hidden_size",), topk=("moe_topk",),
             notes=("SGLang's LongcatFlashConfig reads the expert size from expert_ffn_hidden_size "
                    "(configs/longcat_flash.py:87); zero experts are not GEMM experts",)),
    ArchRule("MiMo-V2", ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM"), "models/mimo_v2.py:452",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             layers="freq_list"),
    # ---- GLM-4 MoE
    ArchRule("GLM-4.5 / 4.6 / 4.7 (GLM-4 MoE)", ("Glm4MoeForCausalLM",), "models/glm4_moe.py:436",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM4_MOE_GATE, layers="first_k_dense"),
    ArchRule("GLM-4.5V (GLM-4 MoE vision)", ("Glm4vMoeForConditionalGeneration",), "models/glm4_moe.py:436",
             config_at="text_config", **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM4V_MOE_GATE, layers="first_k_dense"),
    ArchRule("GLM-4 MoE Lite", ("Glm4MoeLiteForCausalLM",), "models/glm4_moe_lite.py:209",
             **_DS_FIELDS | dict(experts=("n_routed_experts", "num_local_experts")),
             fusion=_GLM4_MOE_LITE_GATE, layers="first_k_dense"),
    # ---- Qwen MoE
    ArchRule("Qwen2-MoE / Qwen1.5-MoE", ("Qwen2MoeForCausalLM",), "models/qwen2_moe.py:318", **_QWEN_FIELDS,
             layers="qwen_sparse",
             notes=("the shared expert stays a separate MLP on CUDA (fusion only with ROCm aiter)",)),
    ArchRule("Qwen3-MoE", ("Qwen3MoeForCausalLM",), "models/qwen3_moe.py:265", **_QWEN3_FIELDS, layers="qwen_sparse"),
    ArchRule("Mellum", ("MellumForCausalLM",), "models/mellum.py:413 -> models/qwen3_moe.py:265", **_QWEN3_FIELDS,
             layers="mlp_layer_types"),
    ArchRule("Qwen3-VL-MoE, Intern-S1-Pro",
             ("Qwen3VLMoeForConditionalGeneration", "InternS1ProForConditionalGeneration"),
             "models/qwen3_moe.py:265", config_at="text_config", **_QWEN3_FIELDS, layers="qwen_sparse"),
    ArchRule("Qwen3-Omni-MoE (thinker)", ("Qwen3OmniMoeForConditionalGeneration",), "models/qwen3_moe.py:265",
             config_at="thinker_config.text_config", **_QWEN3_FIELDS, layers="qwen_sparse",
             notes=("SGLang serves the thinker only (models/qwen3_omni_moe.py:551)",)),
    ArchRule("Qwen3-Next", ("Qwen3NextForCausalLM",), "models/qwen2_moe.py:318", **_QWEN_FIELDS,
             fusion=_QWEN3_NEXT_GATE),
    ArchRule("Qwen3.5-MoE and its VLMs", ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                                         "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM",
                                         "InternS2PreviewForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
                                         "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration"),
             "models/qwen3_5.py:1148 -> models/qwen2_moe.py:318", config_at="text_config", **_QWEN_FIELDS,
             notes=("the shared expert stays a separate MLP on CUDA: qwen3_5.py never sets "
                    "enable_cuda_shared_expert_fusion; dense variants carry no num_experts",)),
    ArchRule("Intern-S2 Mobius", ("InternS2MobiusForConditionalGeneration",), "models/interns2_mobius.py:329",
             config_at="text_config", **_QWEN_FIELDS),
    # ---- Mixtral-style (num_local_experts / intermediate_size)
    ArchRule("Mixtral", ("MixtralForCausalLM",), "models/mixtral.py:100",
             **_MIXTRAL_FIELDS | dict(experts=("num_local_experts", "num_experts"))),
    ArchRule("Phi-3.5-MoE", ("PhiMoEForCausalLM",), "models/phimoe.py:208", **_MIXTRAL_FIELDS),
    ArchRule("Granite MoE", ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM", "GraniteMoeSWAForCausalLM",
                             "GraniteMoeHybridForCausalLM"),
             "models/granitemoe.py:142", **_MIXTRAL_FIELDS, layers=None,
             notes=("GraniteMoeShared's shared MLP is separate; hybrid variants without experts are dense",)),
    ArchRule("Grok-1", ("Grok1ForCausalLM", "Grok1ModelForCausalLM"), "models/grok.py:509",
             experts=("num_local_experts",), intermediate=("moe_intermediate_size", "intermediate_size"),
             topk=("num_experts_per_tok",)),
    ArchRule("gpt-oss", ("GptOssForCausalLM",), "models/gpt_oss.py:240",
             **_MIXTRAL_FIELDS | dict(experts=("num_local_experts", "num_experts"))),
    ArchRule("MiniMax-M2", ("MiniMaxM2ForCausalLM",), "models/minimax_m2.py:536",
             **_MIXTRAL_FIELDS | dict(experts=("num_local_experts", "num_experts"))),
    ArchRule("MiniMax-M3", ("MiniMaxM3SparseForCausalLM",), "models/minimax_m3.py:422", **_MIXTRAL_FIELDS,
             fusion=_MINIMAX_M3_GATE, layers=None),
    ArchRule("MiniMax-M3 (vision)", ("MiniMaxM3SparseForConditionalGeneration",), "models/minimax_m3.py:422",
             config_at="text_config", **_MIXTRAL_FIELDS, fusion=_MINIMAX_M3_VL_GATE, layers=None),
    ArchRule("Llama 4", ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"), "models/llama4.py:120",
             config_at="text_config", **_MIXTRAL_FIELDS, layers="interleave",
             notes=("the shared expert is a separate MLP (models/llama4.py:136): no E+1",)),
    ArchRule("Muse Spark", ("MuseSparkForConditionalGeneration",), "models/muse_spark.py:602",
             config_at="text_config", experts=("num_local_experts",), intermediate=("moe_intermediate_size",),
             topk=("num_experts_per_tok",), hidden=("moe_hidden_size",), moe_tp1=True, layers=None,
             notes=("bf16 experts run SGLang's Triton fused MoE only off SM10x; on SM10x FlashInfer TRT-LLM runs "
                    "them (layers/muse_spark/muse_spark_bf16_moe.py:191)",)),
    # ---- own field names
    ArchRule("Gemma 4", ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"), "models/gemma4_causal.py:287",
             config_at="text_config", experts=("num_experts",), intermediate=("moe_intermediate_size",),
             topk=("top_k_experts",), enabled_by="enable_moe_block"),
    ArchRule("ERNIE 4.5 MoE", ("Ernie4_5_MoeForCausalLM",), "models/ernie4.py:104",
             experts=("moe_num_experts", "num_experts"), intermediate=("moe_intermediate_size",),
             topk=("moe_k", "num_experts_per_tok"), layers="ernie_range",
             notes=("the shared experts are a separate MLP (models/ernie4.py:115): no E+1",)),
    ArchRule("ERNIE 4.5 VL MoE", ("Ernie4_5_VLMoeForConditionalGeneration",), "models/ernie45_moe_vl.py:218",
             experts=("moe_num_experts[0]",), intermediate=("moe_intermediate_size[0]",), topk=("moe_k",),
             second=("moe_num_experts[1]", "moe_intermediate_size[1]", "vision experts (models/ernie45_moe_vl.py:251)"),
             layers=None),
    ArchRule("DBRX", ("DbrxForCausalLM",), "models/dbrx.py:190 (fused_moe)",
             experts=("ffn_config.moe_num_experts",), intermediate=("ffn_config.ffn_hidden_size",),
             topk=("ffn_config.moe_top_k",), hidden=("d_model",), expert_parallel=False, quantized=False,
             notes=("every rank holds all experts (models/dbrx.py:110): --ep-size has no effect",)),
    ArchRule("Hunyuan MoE V1 (Hunyuan-A13B)", ("HunYuanMoEV1ForCausalLM",), "models/hunyuan.py:156",
             experts=("num_experts", "num_local_experts"), intermediate=("moe_intermediate_size", "intermediate_size"),
             topk=("moe_topk", "num_experts_per_tok"),
             notes=("moe_topk and moe_intermediate_size may be per-layer lists; they must hold one value",)),
    ArchRule("Hunyuan V3", ("HYV3ForCausalLM",), "models/hunyuan_v3.py:145", **_QWEN_FIELDS,
             layers="first_k_dense"),
    ArchRule("Ling / Bailing MoE (V1, V2), Sarvam-M MoE, Ming", ("BailingMoEForCausalLM", "BailingMoeForCausalLM",
                                                                "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM",
                                                                "BailingMMNativeForConditionalGeneration",
                                                                "BailingMM2NativeForConditionalGeneration"),
             "models/bailing_moe.py:312", config_at="llm_config (Ming only)", **_QWEN_FIELDS,
             layers="first_k_dense"),
    ArchRule("Ling V2.5 (linear attention)", ("BailingMoeV2_5ForCausalLM",), "models/bailing_moe_linear.py:302",
             **_QWEN_FIELDS, layers="first_k_dense"),
    ArchRule("Ling V3 (Bailing MoE V3)", ("BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration"),
             "models/bailing_moe_v3.py:568", config_at="text_config (VL only)", **_QWEN_FIELDS,
             fusion=_BAILING_V3_GATE, layers="first_k_dense"),
    ArchRule("Sarvam MLA", ("SarvamMLAForCausalLM",), "models/sarvam_moe.py:277", **_QWEN_FIELDS,
             layers="first_k_dense"),
    ArchRule("Beam", ("BeamForCausalLM",), "models/beam.py:334", **_QWEN_FIELDS, layers=None),
    ArchRule("Cohere2 MoE", ("Cohere2MoeForCausalLM", "Cohere2VisionForConditionalGeneration"),
             "models/cohere2_moe.py:285", config_at="text_config (vision only)", experts=("num_experts",),
             intermediate=("intermediate_size",), topk=("num_experts_per_tok",), layers=None),
    ArchRule("EXAONE MoE", ("ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM"), "models/exaone_moe.py:161",
             **_QWEN_FIELDS, layers="is_moe_layer"),
    ArchRule("Inkling", ("InklingForConditionalGeneration",), "models/inkling_common/moe.py:830",
             config_at="text_config", experts=("n_routed_experts",), intermediate=("intermediate_size",),
             topk=("num_experts_per_tok",), layers=None,
             notes=("shared 'sink' experts, when SGLang runs them as a FusedMoE, are a second expert group "
                    "(E = n_shared_experts, models/inkling_common/moe.py:648) with files of their own",)),
    ArchRule("IQuest Q1", ("IQuestQ1ForCausalLM",), "models/iquest_q1.py:215", experts=("num_experts",),
             intermediate=("intermediate_size",), topk=("num_experts_per_tok",), layers=None),
    ArchRule("Kimi Linear", ("KimiLinearForCausalLM",), "models/kimi_linear.py:115",
             experts=("num_experts",), intermediate=("moe_intermediate_size",),
             topk=("num_experts_per_token", "num_experts_per_tok"), layers="first_k_dense",
             notes=("SGLang's KimiLinearConfig (configs/kimi_linear.py:95) sets n_routed_experts from num_experts",)),
    ArchRule("Kimi K3", ("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM"), "models/kimi_k3.py:503",
             config_at="text_config (vision only)", experts=("num_experts",),
             intermediate=("moe_intermediate_size",), topk=("num_experts_per_token", "num_experts_per_tok"),
             hidden=("routed_expert_hidden_size", "hidden_size"), layers="first_k_dense",
             notes=("Latent MoE: the experts' K is routed_expert_hidden_size when set",)),
    ArchRule("Laguna", ("LagunaForCausalLM",), "models/laguna.py:154", **_QWEN_FIELDS, layers=None),
    ArchRule("LFM2-MoE", ("Lfm2MoeForCausalLM",), "models/lfm2_moe.py:155", **_QWEN_FIELDS, layers="dense_prefix"),
    ArchRule("LLaDA2 MoE", ("LLaDA2MoeModelLM",), "models/llada2.py:672", **_QWEN_FIELDS, layers="first_k_dense"),
    ArchRule("Nemotron-H (MoE)", ("NemotronHForCausalLM", "NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3",
                                  "NemotronH_Omni_Reasoning_V3"),
             "models/nemotron_h.py:276", config_at="llm_config (VL/Omni only)", **_DS_FIELDS,
             hidden=("moe_latent_size", "hidden_size"), gated=False, layers="pattern_E",
             notes=("relu2 experts; with moe_latent_size set the experts' K is that latent size "
                    "(models/nemotron_h.py:260)",)),
    ArchRule("Nemotron-H Puzzle", ("NemotronHPuzzleForCausalLM",), "models/nemotron_h.py:276", **_DS_FIELDS,
             gated=False,
             refuse="per-layer block_configs give each MoE layer its own expert count "
                    "(configs/nemotron_h.py:551): several fused-MoE shapes, not one"),
    ArchRule("OLMoE", ("OlmoeForCausalLM",), "models/olmoe.py:88", experts=("num_experts", "num_local_experts"),
             intermediate=("intermediate_size",), topk=("num_experts_per_tok",)),
    ArchRule("SDAR MoE", ("SDARMoeForCausalLM",), "models/sdar_moe.py:98", **_QWEN_FIELDS, layers="qwen_sparse"),
    ArchRule("Step3-VL", ("Step3VLForConditionalGeneration",), "models/step3_vl.py:139", config_at="text_config",
             experts=("moe_num_experts",), intermediate=("moe_intermediate_size",), topk=("moe_top_k",), layers=None,
             notes=("the shared expert is a separate MLP (num_fused_shared_experts = 0, models/step3_vl.py:301)",)),
    ArchRule("Step 3.5, Step 3.7", ("Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"), "models/step3p5.py:152",
             config_at="text_config (3.7 only)", experts=("moe_num_experts",), intermediate=("moe_intermediate_size",),
             topk=("moe_top_k",), layers=None),
    ArchRule("xLLM / K2 Horizon", ("XllmForCausalLM", "K2HorizonForCausalLM"), "models/xllm.py:934", **_QWEN_FIELDS,
             layers="qwen_sparse", notes=("MoVA value experts are not a fused MoE",)),
    ArchRule("Zaya", ("ZayaForCausalLM",), "models/zaya.py:1231", experts=("num_experts",),
             intermediate=("ffn_hidden_size",), intermediate_div=2,
             topk=("moe_router_topk",), topk_default=1, layers=None,
             notes=("ffn_hidden_size is gate + up: N = ffn_hidden_size / 2 / TP (models/zaya.py:1227)",)),
    ArchRule("AFMoE", ("AfmoeForCausalLM",), "models/afmoe.py:284 (fused_moe)", **_QWEN_FIELDS,
             expert_parallel=False, quantized=False, layers="dense_prefix", notes=_PACKED),
    ArchRule("XVERSE MoE", ("XverseMoeForCausalLM",), "models/xverse_moe.py:181 (fused_moe)", experts=("num_experts",),
             intermediate=("intermediate_size",), topk=("moe_top_k",), expert_parallel=False, quantized=False,
             notes=_PACKED),
    # ---- wrappers whose language model is named by the sub-config
    ArchRule("InternVL (chat)", ("InternVLChatModel",), "models/internvl.py:546", config_at="llm_config",
             delegate=True),
    ArchRule("Intern-S1", ("InternS1ForConditionalGeneration",), "models/interns1.py:63", config_at="text_config",
             delegate=True),
)


def _rules_by_arch() -> dict[str, tuple[ArchRule, ...]]:
    out: dict[str, list[ArchRule]] = {}
    for rule in ARCHITECTURES:
        for a in rule.archs:
            out.setdefault(a, []).append(rule)
    return {a: tuple(rs) for a, rs in out.items()}


#: ``architectures[0]`` -> its rules, in order (the first whose ``when`` holds applies).
RULES_BY_ARCH: dict[str, tuple[ArchRule, ...]] = _rules_by_arch()

_MISSING = object()


def _moe_config(cfg: dict) -> tuple[dict, str]:
    """The sub-config SGLang's ``get_hf_text_config`` picks (utils/hf_transformers/common.py:547)
    and its key path (``""`` for the top level)."""
    thinker = cfg.get("thinker_config")
    if isinstance(thinker, dict):
        text = thinker.get("text_config")
        return (text, "thinker_config.text_config") if isinstance(text, dict) else (thinker, "thinker_config")
    for key in ("llm_config", "language_config", "text_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict):
            return sub, key
    return cfg, ""


def _lookup(spec: str, mc: dict, cfg: dict) -> Any:
    """Value of one field spec (see :class:`ArchRule`) from the MoE config, then the top level."""
    name, index = spec, None
    if spec.endswith("]") and "[" in spec:
        name, index = spec[:-1].split("[", 1)
    for src in (mc, cfg) if mc is not cfg else (mc,):
        v: Any = src
        for part in name.split("."):
            v = v.get(part, _MISSING) if isinstance(v, dict) else _MISSING
        if v is _MISSING or v is None:
            continue
        if index is None:
            return v
        if not isinstance(v, list):
            raise PayloadError("bad_input", f"model config: {name} is {v!r}, not the list SGLang's model code indexes "
                                            f"({spec})")
        i = int(index)
        return v[i] if -len(v) <= i < len(v) else _MISSING
    return _MISSING


def _field(specs: tuple[str, ...], mc: dict, cfg: dict, where: str, arch: str, what: str,
           default: int | None = None) -> tuple[str, int]:
    """First present field of ``specs`` as a positive int -> (field name, value).

    A per-layer list must hold one value. Raises PayloadError('bad_input') naming the fields
    looked for (under ``where``) when none is set or the value is not a positive integer.
    """
    for spec in specs:
        v = _lookup(spec, mc, cfg)
        if v is _MISSING:
            continue
        if isinstance(v, list):
            vals = set(v) if all(isinstance(x, int) and not isinstance(x, bool) for x in v) else None
            if not vals or len(vals) != 1:
                raise PayloadError(
                    "bad_input",
                    f"model config ({arch}): {_qualified(spec, where)} differs between layers ({v!r}): "
                    f"SGLang builds one fused-MoE shape per value; orch names one")
            v = next(iter(vals))
        return spec, _pos_int(v, f"model config ({arch}): {_qualified(spec, where)}")
    if default is not None:
        return f"{specs[0]} (SGLang default)", default
    raise PayloadError(
        "bad_input",
        f"model config ({arch}): no {what}: none of {', '.join(_qualified(s, where) for s in specs)} is set")


def _qualified(spec: str, where: str) -> str:
    return f"{where}.{spec}" if where else spec


def _moe_layer_count(rule_name: str | None, mc: dict, cfg: dict) -> int | None:
    """MoE layers of the model (MTP/NextN not counted), None when unknown.

    Rules: ``all``; ``first_k_dense`` (layer i >= first_k_dense_replace and i % moe_layer_freq
    == 0, models/deepseek_v2.py); ``qwen_sparse`` (i not in mlp_only_layers and (i + 1) %
    decoder_sparse_step == 0, models/qwen3_moe.py); ``interleave`` ((i + 1) %
    interleave_moe_layer_step == 0, models/llama4.py:441); ``ernie_range`` (moe_layer_start_index
    <= i <= moe_layer_end_index, every moe_layer_interval, models/ernie4.py:184); ``freq_list``
    (moe_layer_freq[i] truthy, models/mimo_v2.py:1007); ``pattern_E`` ('E' in
    hybrid_override_pattern, configs/nemotron_h.py:38); ``dense_prefix`` (i >= num_dense_layers);
    ``is_moe_layer`` (the list's true entries); ``mlp_layer_types`` (its ``"sparse"`` entries,
    models/mellum.py:438).
    """
    def get(name: str, default: Any = None) -> Any:
        v = _lookup(name, mc, cfg)
        return default if v is _MISSING else v

    L = get("num_hidden_layers")
    if rule_name == "pattern_E":
        pat = get("hybrid_override_pattern")
        return pat.count("E") if isinstance(pat, str) else None
    if rule_name in ("freq_list", "is_moe_layer"):
        seq = get("moe_layer_freq" if rule_name == "freq_list" else "is_moe_layer")
        return sum(1 for x in seq if x) if isinstance(seq, list) else None
    if rule_name == "mlp_layer_types":
        seq = get("mlp_layer_types")
        return sum(1 for x in seq if x == "sparse") if isinstance(seq, list) else None
    if rule_name is None or isinstance(L, bool) or not isinstance(L, int) or L <= 0:
        return None
    try:
        if rule_name == "all":
            return L
        if rule_name == "first_k_dense":
            k, freq = int(get("first_k_dense_replace", 0)), int(get("moe_layer_freq", 1) or 1)
            return sum(1 for i in range(L) if i >= k and i % freq == 0)
        if rule_name == "qwen_sparse":
            step, dense = int(get("decoder_sparse_step", 1) or 1), set(get("mlp_only_layers", []) or [])
            return sum(1 for i in range(L) if i not in dense and (i + 1) % step == 0)
        if rule_name == "interleave":
            step = int(get("interleave_moe_layer_step", 1))
            return L if step == 0 else sum(1 for i in range(L) if (i + 1) % step == 0)
        if rule_name == "ernie_range":
            start, end = int(get("moe_layer_start_index", L)), int(get("moe_layer_end_index", L - 1))
            step = int(get("moe_layer_interval", 1) or 1)
            return sum(1 for i in range(L) if start <= i <= end and (i - start) % step == 0)
        if rule_name == "dense_prefix":
            return sum(1 for i in range(L) if i >= int(get("num_dense_layers", 0)))
    except (TypeError, ValueError):
        return None
    return None


def _select_rule(arch: str, cfg: dict, depth: int = 0) -> tuple[ArchRule, dict, str, str]:
    """(rule, MoE config, its key path, architecture) for a config; follows ``delegate`` rules.

    Raises PayloadError('bad_input') for an architecture not in :data:`ARCHITECTURES`.
    """
    mc, where = _moe_config(cfg)
    rules = RULES_BY_ARCH.get(arch)
    if not rules:
        raise PayloadError(
            "bad_input",
            f"model config: architecture {arch!r} is not one orch knows SGLang 0.5.23 to build a fused MoE for "
            f"(docs/sglang-models.md lists them); orch reads E, N and top-k per architecture from fields such as "
            f"num_experts / n_routed_experts / num_local_experts, moe_intermediate_size / intermediate_size and "
            f"num_experts_per_tok, and will not guess which apply to {arch}")
    for rule in rules:
        if rule.when is None or _lookup(rule.when[0], mc, cfg) == rule.when[1] or (
                _lookup(rule.when[0], mc, cfg) is _MISSING and rule.when[1] is None):
            break
    else:
        fields = ", ".join(f"{_qualified(r.when[0], where)} == {r.when[1]!r}" for r in rules if r.when)
        raise PayloadError("bad_input", f"model config ({arch}): SGLang builds no fused MoE unless {fields}")
    if rule.delegate:
        inner = mc.get("architectures") if mc is not cfg else None
        if not (isinstance(inner, list) and inner and isinstance(inner[0], str)) or depth:
            raise PayloadError(
                "bad_input", f"model config ({arch}): {_qualified('architectures', where)} does not name the "
                             f"language model ({rule.source} builds the one it names)")
        inner_rule, _, _, _ = _select_rule(inner[0], mc, depth + 1)
        return inner_rule, mc, where, f"{arch} ({inner[0]})"
    return rule, mc, where, arch


def _shared_count(f: Fusion, mc: dict, cfg: dict, inter: int) -> tuple[int, int | None]:
    """(shared-expert count, shared-expert size or None) per the fusion rule's count_rule."""
    n = next((v for v in (_lookup(c, mc, cfg) for c in f.count) if v is not _MISSING), None)
    size = _lookup(f.size, mc, cfg) if f.size else _MISSING
    size = None if size is _MISSING else size
    if f.count_rule == "qwen":  # models/qwen2_moe.py:125 get_num_shared_experts
        count = n if n is not None else (1 if isinstance(size, int) and size > 0 else 0)
    elif f.count_rule == "bailing":  # models/bailing_moe_v3.py:424 _get_bailing_num_shared_experts
        if size is None:
            count = n or 0
            size = inter * count
        else:
            count = max(1, n or 0) if size > 0 else 0
    else:
        count = n or 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise PayloadError("bad_input", f"shared-expert count {count!r} is not a non-negative integer")
    return count, size if isinstance(size, int) else None


def _fusion(f: Fusion, *, count: int, size: int | None, routed: int, inter: int, n_rank: int,
            moe_arch: str | None, ep: int, deepep: bool, capability: tuple[int, int] | None,
            quant: dict, disabled: bool) -> tuple[int, str]:
    """Shared experts fused into the routed GEMM (0 or ``count``) and why.

    Raises PayloadError('bad_input') where SGLang refuses to load (``one="error"``).
    """
    if count <= 0:
        return 0, "no shared expert in the config: nothing to fuse"
    if disabled:
        return 0, "--disable-shared-experts-fusion: the shared expert runs as a separate MLP"
    if f.arch is not None and moe_arch != f.arch:
        return 0, (f"shared-expert fusion off: SGLang's gate ({f.gate}) fuses only when architectures[0] is "
                   f"{f.arch}, not {moe_arch!r} (--enforce-shared-experts-fusion overrides)")
    if f.routed_in is not None and routed not in f.routed_in:
        return 0, f"shared-expert fusion off: {routed} routed experts is not in SGLang's allow-list {f.routed_in}"
    if f.same_size and size != inter:
        return 0, f"shared-expert fusion off: shared expert size {size!r} differs from the routed {inter}"
    if count != 1 and f.one == "off":
        return 0, f"shared-expert fusion off: {count} shared experts (SGLang fuses exactly one)"
    if ep > 1 and f.ep_off:
        return 0, "expert parallelism: shared-expert fusion off on NVIDIA"
    if deepep and f.deepep_off:
        return 0, "DeepEP all-to-all backend: shared-expert fusion off"
    if capability is not None and tuple(capability) < (8, 0) and f.sm80:
        return 0, f"compute capability {tuple(capability)}: shared-expert fusion needs sm80+"
    if quant.get("method") in f.quant_off:
        return 0, f"{quant['method']} quantization: shared-expert fusion off"
    if f.block_divides and quant.get("block") and any(n_rank % b for b in quant["block"]):
        return 0, f"block-FP8 {quant['block']} does not divide the per-rank N {n_rank}: shared-expert fusion off"
    if count != 1 and f.one == "error":
        raise PayloadError(
            "bad_input",
            f"{count} shared experts: SGLang 0.5.23 fuses exactly one for this architecture and refuses to load "
            f"with more ({f.gate}); serve it with --disable-shared-experts-fusion")
    return count, (f"shared expert fused into the routed GEMM (E + {count}, runtime top-k + {count}; {f.gate}); "
                   "off with --disable-shared-experts-fusion or the flashinfer_trtllm/cutedsl/LoRA MoE runners")


def _architecture(cfg: dict) -> str:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]:
        return archs[0]
    raise PayloadError(
        "bad_input",
        "model config has no architectures list: SGLang (and orch) pick the model code by architectures[0]")


def moe_shape(
    cfg: dict,
    tp: int = 1,
    ep: int = 1,
    quantization: str | None = None,
    dtype: str | None = None,
    disable_shared_experts_fusion: bool = False,
    *,
    capability: tuple[int, int] | None = None,
    deepep: bool = False,
) -> MoeShape:
    """The per-rank MoE shape and name selectors of a model served by SGLang 0.5.23.

    ``cfg``: a config.json dict. ``tp``/``ep``: the server's ``--tp-size``/``--ep-size``
    (moe_tp = tp / ep). ``quantization``: the server's ``--quantization`` (None: from the
    checkpoint's ``quantization_config``). ``dtype``: the server's ``--dtype`` (None/``auto``:
    from the config). ``disable_shared_experts_fusion``: the server flag. ``capability``: the
    GPU's CUDA capability when known (most fusion gates need sm80+). ``deepep``: a DeepEP-class
    all-to-all MoE backend.

    The architecture (``architectures[0]``) picks a rule of :data:`ARCHITECTURES`: which fields
    hold the routed-expert count, the expert intermediate size and top-k, where they sit, and when
    the shared expert is fused. E = experts // ep (+ the fused shared experts); N = expert
    intermediate size / (tp / ep), as ``E, _, N = w2.shape`` (SGLang
    ``try_get_optimal_moe_config``, layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py:284);
    int4_w4a16 halves N (packed). Block FP8 needs N % block_n == 0 (SGLang ``fp8.py``).

    Raises PayloadError('bad_input') for an architecture not in the table (naming it), a
    config without the fields its rule reads (naming them), a non-MoE config, a bad or
    non-dividing TP/EP, an unsupported quantization, or block-FP8 with N not a multiple of the
    block.
    """
    if not isinstance(cfg, dict):
        raise PayloadError("bad_input", "model config is not an object")
    tp = _pos_int(tp, "--tp")
    ep = _pos_int(ep, "--ep")
    notes: list[str] = []
    arch = _architecture(cfg)
    rule, mc, where, label = _select_rule(arch, cfg)
    if label != arch:
        notes.append(f"language model: {label[len(arch) + 2:-1]} ({_qualified('architectures', where)})")
    if rule.refuse:
        raise PayloadError("bad_input", f"model config ({arch}): {rule.refuse}")
    if rule.enabled_by and not _lookup(rule.enabled_by, mc, cfg) is True:
        raise PayloadError(
            "bad_input", f"model config ({arch}) is not an MoE model: {_qualified(rule.enabled_by, where)} is not "
                         f"true, so SGLang builds dense MLPs ({rule.source})")
    raw = next((v for v in (_lookup(s, mc, cfg) for s in rule.experts) if v is not _MISSING), _MISSING)
    if raw is _MISSING or raw == 0:
        raise PayloadError(
            "bad_input", f"model config ({arch}) is not an MoE model: none of "
                         f"{', '.join(_qualified(s, where) for s in rule.experts)} is set")
    efield, experts = _field(rule.experts, mc, cfg, where, arch, "routed-expert count")
    ifield, inter = _field(rule.intermediate, mc, cfg, where, arch, "expert intermediate size")
    if inter % rule.intermediate_div:
        raise PayloadError("bad_input", f"model config ({arch}): {ifield} {inter} is odd; it holds gate + up")
    inter //= rule.intermediate_div
    _, hidden = _field(rule.hidden, mc, cfg, where, arch, "hidden size")
    _, topk = _field(rule.topk, mc, cfg, where, arch, "top-k", default=rule.topk_default)

    if tp % ep:
        raise PayloadError("bad_input", f"--ep {ep} does not divide --tp {tp} (SGLang needs moe_tp = tp / ep)")
    if rule.expert_parallel:
        moe_tp, local = tp // ep, experts // ep
        if experts % ep:
            raise PayloadError("bad_input", f"{efield} {experts} is not divisible by --ep {ep}")
    else:
        moe_tp, local = tp, experts
        if ep > 1:
            notes.append(f"--ep {ep} does not split this architecture's experts: N = size / TP {tp}")
    if rule.moe_tp1 and moe_tp != 1:
        raise PayloadError(
            "bad_input", f"model config ({arch}): SGLang runs these experts only with MoE-TP 1 ({rule.source}); "
                         f"serve with --ep-size equal to --tp-size (tp/ep is {moe_tp})")
    if inter % moe_tp:
        raise PayloadError("bad_input", f"{ifield} {inter} is not divisible by tp/ep = {moe_tp} (TP {tp}, EP {ep})")

    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        qc = mc.get("quantization_config") if isinstance(mc.get("quantization_config"), dict) else None
    q = _quant(qc, quantization, notes)
    if not rule.quantized and q["method"]:
        raise PayloadError(
            "bad_input", f"model config ({arch}): SGLang runs these experts through fused_moe without quantization "
                         f"({rule.source}); a {q['method']} checkpoint is not something orch can name")
    act = _act_dtype(mc, cfg, dtype, notes)
    selector = q["selector"]
    if selector is None and act == "float32":
        selector = "float32"

    n_rank = inter // moe_tp
    if q["block"]:
        bn = q["block"][0]
        if n_rank % bn:
            raise PayloadError(
                "bad_input",
                f"block-FP8 weights need the per-rank intermediate size to be a multiple of {bn}: "
                f"{ifield} {inter} / (TP {tp} / EP {ep}) = {n_rank} is not (SGLang fp8.py refuses to load; use a "
                f"smaller TP or EP)")

    fused = 0
    if rule.fusion is not None:
        count, size = _shared_count(rule.fusion, mc, cfg, inter)
        moe_archs = mc.get("architectures") if mc is not cfg else cfg.get("architectures")
        moe_arch = moe_archs[0] if isinstance(moe_archs, list) and moe_archs else None
        fused, why = _fusion(rule.fusion, count=count, size=size, routed=experts, inter=inter, n_rank=n_rank,
                             moe_arch=moe_arch, ep=ep, deepep=deepep, capability=capability, quant=q,
                             disabled=disable_shared_experts_fusion)
        notes.append(why)
    if rule.second is not None:
        e2 = _lookup(rule.second[0], mc, cfg)
        i2 = _lookup(rule.second[1], mc, cfg)
        if isinstance(e2, int) and isinstance(i2, int) and e2 % ep == 0 and i2 % moe_tp == 0:
            notes.append(f"{rule.second[2]}: E={e2 // ep},N={i2 // moe_tp} (files of their own; orch names the "
                         f"first expert group)")
    if not rule.gated:
        notes.append("non-gated experts: w1 is [E, N, K], not [E, 2N, K]")
    notes.extend(rule.notes)

    return MoeShape(
        E=local + fused,
        N=n_rank // 2 if q["packed"] else n_rank,
        hidden=hidden,
        topk=topk,
        runtime_topk=topk + fused,
        num_experts=experts,
        shared_fused=fused > 0,
        dtype_selector=selector,
        block_shape=q["block"],
        per_channel_quant=bool(q["per_channel"]),
        weight_dtype=q["weight_dtype"] or act,
        moe_layers=_moe_layer_count(rule.layers, mc, cfg),
        architecture=arch,
        act_dtype=act,
        intermediate_size=inter,
        tp=tp,
        ep=ep,
        quant_method=q["method"],
        notes=notes,
        family=rule.family,
        sglang_source=rule.source,
        gated=rule.gated,
    )


# --------------------------------------------------------------------------- server flags
# (the ``names`` and ``probe`` commands take a model the way the unit's server does)

def add_model_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add the model/server flags of the ``names`` and ``probe`` commands to ``parser``."""
    parser.add_argument("--model-config", required=required,
                        help="model folder, config.json path, or HF repo id (offline cache lookup)")
    parser.add_argument("--hf-home", default=None, help="HF_HOME of the cache (default $HF_HOME or ~/.cache/huggingface)")
    parser.add_argument("--download-dir", default=None,
                        help="server --download-dir (where a ModelScope model may be; SGLANG_USE_MODELSCOPE)")
    parser.add_argument("--tp", type=int, default=1, help="server --tp-size")
    parser.add_argument("--ep", type=int, default=1, help="server --ep-size")
    parser.add_argument("--dtype", default=None, help="server --dtype (auto, bfloat16, float16, float32)")
    parser.add_argument("--quantization", default=None, help="server --quantization (default: from the checkpoint)")
    parser.add_argument("--disable-shared-experts-fusion", action="store_true",
                        help="server --disable-shared-experts-fusion")


def shape_from_args(args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[MoeShape, str]:
    """Load the model config named by ``args`` and return ``(MoeShape, config path)``.

    Raises PayloadError (not_found/bad_input) from :func:`load_model_config`/:func:`moe_shape`.
    """
    path = resolve_model_config_path(args.model_config, args.hf_home, getattr(args, "download_dir", None))
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


# --------------------------------------------------------------------------- docs table

def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _fusion_text(f: Fusion | None) -> str:
    if f is None:
        return "no"
    if f.count_rule == "qwen":
        count = f"{'/'.join(f.count)} (else 1 when {f.size} > 0)"
    elif f.count_rule == "bailing":
        count = f"{'/'.join(f.count)} (at least 1 when {f.size} > 0)"
    else:
        count = "/".join(f.count)
    when = []
    if f.arch:
        when.append(f"architectures[0] is {f.arch}")
    if f.routed_in:
        when.append(f"routed experts in {list(f.routed_in)}")
    if f.same_size:
        when.append(f"{f.size} equals the routed size")
    if f.one == "off":
        when.append("exactly 1 shared expert")
    if f.sm80:
        when.append("sm80+")
    if f.ep_off:
        when.append("no EP")
    if f.deepep_off:
        when.append("no DeepEP")
    if f.quant_off:
        when.append("not " + "/".join(f.quant_off))
    if f.block_divides:
        when.append("block FP8 divides N")
    text = f"yes, + {count}" + (f" when {', '.join(when)}" if when else "")
    if f.one == "error":
        text += "; more than 1 shared expert: SGLang refuses to load"
    return f"{text} ({f.gate})"


def architecture_table_markdown() -> str:
    """The markdown table of :data:`ARCHITECTURES` that docs/sglang-models.md carries.

    One row per rule: family, ``architectures[0]`` names, where the fields sit, the fields of
    E, N and top-k, the shared-expert fusion rule, and the SGLang 0.5.23 source (paths relative
    to ``sglang/srt/``) with the rule's other conditions and notes.
    """
    head = ("| family | `architectures[0]` | fields at | E (routed experts) | N (expert intermediate size) "
            "| top-k | shared expert fused into the routed GEMM | SGLang 0.5.23 source, notes |")
    lines = [head, "|" + "---|" * 8]
    for r in ARCHITECTURES:
        archs = ", ".join(f"`{a}`" for a in r.archs)
        family = r.family + (f" (when `{r.when[0]}` is `{json.dumps(r.when[1])}`)" if r.when else "")
        if r.delegate:
            row = [family, archs, r.config_at, f"the rule of `{r.config_at}.architectures[0]`", "", "", "",
                   "; ".join([r.source, *r.notes])]
        else:
            e = " / ".join(f"`{s}`" for s in r.experts)
            if r.expert_parallel:
                e += " / EP"
            else:
                e += " (all on every rank)"
            n = " / ".join(f"`{s}`" for s in r.intermediate)
            n += (f" / {r.intermediate_div}" if r.intermediate_div != 1 else "")
            n += " / (TP / EP)" if r.expert_parallel else " / TP"
            if r.moe_tp1:
                n += "; needs TP / EP = 1"
            k = " / ".join(f"`{s}`" for s in r.topk) + (f" (default {r.topk_default})" if r.topk_default else "")
            extra = []
            if r.hidden != ("hidden_size",):
                extra.append("K: " + " / ".join(f"`{s}`" for s in r.hidden))
            if r.enabled_by:
                extra.append(f"MoE only when `{r.enabled_by}` is true")
            if not r.gated:
                extra.append("non-gated: w1 [E, N, K]")
            if not r.quantized:
                extra.append("unquantized fused_moe only")
            if r.refuse:
                extra.append("refused: " + r.refuse)
            extra.extend(r.notes)
            shared = _fusion_text(r.fusion)
            row = [family, archs, r.config_at or "top level", e, n, k, shared,
                   r.source + ("; " + "; ".join(extra) if extra else "")]
        lines.append("| " + " | ".join(_md(c) for c in row) + " |")
    return "\n".join(lines) + "\n"
