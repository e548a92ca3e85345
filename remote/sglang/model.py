"""Model configs and the MoE shape SGLang's fused-MoE kernel sees (stdlib only).

``load_model_config`` reads a Hugging Face ``config.json`` (a folder, a file, or a repo
id resolved offline from the HF cache). ``moe_shape`` turns it, with the server's
``--tp-size``/``--ep-size``/``--quantization``/``--dtype``, into the per-rank E and N and
the dtype/block/per-channel selectors that make up SGLang's config file name.

Rules follow SGLang 0.5.23 (see /work/shared/facts/sglang-moe-configs.md and the
shared models README): at run time ``E, _, N = w2.shape`` with
``N = moe_intermediate_size / (tp / ep)`` and ``E = experts // ep`` plus the fused shared
expert (``determine_num_fused_shared_experts`` in ``models/deepseek_v2.py``/``glm4_moe.py``).

This module must not import torch or triton (the ``names`` command and the controller
use it without them).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .naming import config_file_name, sglang_device_name
from ..protocol import PayloadError

#: Largest config.json read (bytes); real ones are a few KB.
MAX_CONFIG_BYTES = 16 * 1024 * 1024

#: Expert-count field names, first present wins (Qwen-MoE, DeepSeek/GLM, Mixtral/gpt-oss/Llama4).
EXPERT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")
#: Top-k field names, first present wins.
TOPK_FIELDS = ("num_experts_per_tok", "experts_per_token", "moe_topk")

#: Architectures whose shared expert SGLang fuses into the routed GEMM on NVIDIA (sm80+,
#: no EP/DeepEP) unless ``--disable-shared-experts-fusion``. Value: allowed routed-expert
#: counts (None = any). SGLang 0.5.23 ``DeepseekV2ForCausalLM.determine_num_fused_shared_experts``
#: allows 256 (384 only for Quark MXFP4 checkpoints, not NVIDIA); GLM-4-MoE dropped its
#: expert-count check (sglang PR #8804); the rest per the facts file.
FUSED_SHARED_FAMILIES: dict[str, tuple[int, ...] | None] = {
    "DeepseekV3ForCausalLM": (256,),
    "DeepseekV32ForCausalLM": (256,),
    "GlmMoeDsaForCausalLM": (256,),
    "Glm4MoeForCausalLM": None,
    "MistralLarge3ForCausalLM": None,
    "Llama4ForConditionalGeneration": None,
    "Llama4ForCausalLM": None,
    "MiniMaxM3ForCausalLM": None,
    "Qwen3NextForCausalLM": None,
}

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


def resolve_model_config_path(spec: str, hf_home: str | None = None) -> Path:
    """Find the config.json that ``spec`` names; see :func:`load_model_config`.

    Raises PayloadError('not_found') naming every path tried, PayloadError('bad_input')
    for an empty spec.
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
    does (``<hub>`` from :func:`hf_hub_dir`). Nothing is downloaded.

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
    ``architecture``: ``architectures[0]`` (or ``model_type``).
    ``notes``: human-readable caveats (e.g. the layer may not use Triton configs).
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


def _text_config(cfg: dict) -> dict:
    if any(cfg.get(k) for k in EXPERT_FIELDS):
        return cfg
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and any(sub.get(k) for k in EXPERT_FIELDS):
            return sub
    return cfg


def _pos_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise PayloadError("bad_input", f"{what} must be a positive integer, got {v!r}")
    return v


def _first(d: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if d.get(k) is not None:
            return k, d[k]
    return None, None


def _count_moe_layers(tc: dict, fields_from: dict) -> int | None:
    L = tc.get("num_hidden_layers", fields_from.get("num_hidden_layers"))
    if isinstance(L, bool) or not isinstance(L, int) or L <= 0:
        return None
    if tc.get("first_k_dense_replace") is not None:  # DeepSeek / GLM
        k = int(tc["first_k_dense_replace"])
        freq = int(tc.get("moe_layer_freq") or 1)
        return sum(1 for i in range(L) if i >= k and i % freq == 0)
    if tc.get("decoder_sparse_step") is not None or tc.get("mlp_only_layers"):  # Qwen2/3-MoE
        step = int(tc.get("decoder_sparse_step") or 1)
        dense = set(tc.get("mlp_only_layers") or [])
        return sum(1 for i in range(L) if i not in dense and (i + 1) % step == 0)
    if tc.get("interleave_moe_layer_step") is not None:  # Llama4
        step = int(tc["interleave_moe_layer_step"] or 1)
        return sum(1 for i in range(L) if (i + 1) % step == 0)
    return L


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

    ``cfg``: a config.json dict (fields may sit under ``text_config``). ``tp``/``ep``:
    the server's ``--tp-size``/``--ep-size`` (moe_tp = tp / ep). ``quantization``: the
    server's ``--quantization`` (None: from the checkpoint's ``quantization_config``).
    ``dtype``: the server's ``--dtype`` (None/``auto``: from the config).
    ``disable_shared_experts_fusion``: the server flag. ``capability``: the GPU's CUDA
    capability when known (fusion needs sm80+). ``deepep``: a DeepEP MoE backend (fusion
    off by default).

    Rules: E = experts // ep, +1 for a fused shared expert (families in
    :data:`FUSED_SHARED_FAMILIES`, n_shared_experts == 1, ep == 1, no DeepEP, sm80+,
    not W4AFP8); N = moe_intermediate_size (Mixtral/gpt-oss: intermediate_size) / moe_tp;
    block-FP8 needs N % block_n == 0 (SGLang ``fp8.py``).

    Raises PayloadError('bad_input') for a non-MoE config, a bad or non-dividing TP/EP,
    an unsupported quantization, or block-FP8 with N not a multiple of the block.
    """
    if not isinstance(cfg, dict):
        raise PayloadError("bad_input", "model config is not an object")
    tp = _pos_int(tp, "--tp")
    ep = _pos_int(ep, "--ep")
    notes: list[str] = []
    tc = _text_config(cfg)
    archs = cfg.get("architectures") or tc.get("architectures") or []
    arch = str(archs[0]) if isinstance(archs, list) and archs else str(cfg.get("model_type") or tc.get("model_type") or "unknown")

    efield, experts = _first(tc, EXPERT_FIELDS)
    if not experts:
        raise PayloadError(
            "bad_input",
            f"model config ({arch}) is not an MoE model: none of {', '.join(EXPERT_FIELDS)} is set")
    experts = _pos_int(experts, efield)
    ifield, inter = _first(tc, ("moe_intermediate_size", "intermediate_size"))
    if inter is None:
        raise PayloadError("bad_input", f"model config ({arch}): no moe_intermediate_size or intermediate_size")
    inter = _pos_int(inter, ifield)
    hidden = _pos_int(tc.get("hidden_size"), "hidden_size")
    kfield, topk = _first(tc, TOPK_FIELDS)
    topk = _pos_int(topk, kfield or "num_experts_per_tok")

    if tp % ep:
        raise PayloadError("bad_input", f"--ep {ep} does not divide --tp {tp} (SGLang needs moe_tp = tp / ep)")
    moe_tp = tp // ep
    if inter % moe_tp:
        raise PayloadError("bad_input", f"{ifield} {inter} is not divisible by tp/ep = {moe_tp} (TP {tp}, EP {ep})")
    if experts % ep:
        raise PayloadError("bad_input", f"{efield} {experts} is not divisible by --ep {ep}")

    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        qc = tc.get("quantization_config") if isinstance(tc.get("quantization_config"), dict) else None
    q = _quant(qc, quantization, notes)
    act = _act_dtype(tc, cfg, dtype, notes)
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

    shared = tc.get("n_shared_experts")
    if shared is None and arch.startswith("Llama4"):
        shared = 1
    if shared is None and arch == "Qwen3NextForCausalLM" and tc.get("shared_expert_intermediate_size"):
        shared = 1
    fused = False
    if arch in FUSED_SHARED_FAMILIES and not disable_shared_experts_fusion:
        allowed = FUSED_SHARED_FAMILIES[arch]
        if shared != 1:
            notes.append(f"{arch}: n_shared_experts={shared!r}, shared-expert fusion off")
        elif allowed is not None and experts not in allowed:
            notes.append(f"{arch}: {experts} routed experts not in SGLang's fusion allow-list {allowed}; fusion off")
        elif ep > 1:
            notes.append("expert parallelism: shared-expert fusion off on NVIDIA")
        elif deepep:
            notes.append("DeepEP backend: shared-expert fusion off by default")
        elif capability is not None and tuple(capability) < (8, 0):
            notes.append(f"compute capability {capability}: shared-expert fusion needs sm80+")
        elif q["method"] == "w4afp8":
            notes.append("W4AFP8: shared-expert fusion off")
        else:
            fused = True
            notes.append("shared expert fused into the routed GEMM (E + 1, runtime top-k + 1); "
                         "off with --disable-shared-experts-fusion or flashinfer_trtllm/cutedsl runners")

    E = experts // ep + (1 if fused else 0)
    N = n_rank // 2 if q["packed"] else n_rank
    return MoeShape(
        E=E,
        N=N,
        hidden=hidden,
        topk=topk,
        runtime_topk=topk + (1 if fused else 0),
        num_experts=experts,
        shared_fused=fused,
        dtype_selector=selector,
        block_shape=q["block"],
        per_channel_quant=bool(q["per_channel"]),
        weight_dtype=q["weight_dtype"] or act,
        moe_layers=_count_moe_layers(tc, cfg),
        architecture=arch,
        act_dtype=act,
        intermediate_size=inter,
        tp=tp,
        ep=ep,
        quant_method=q["method"],
        notes=notes,
    )


# --------------------------------------------------------------------------- server flags
# (the ``names`` and ``probe`` commands take a model the way the unit's server does)

def add_model_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add the model/server flags of the ``names`` and ``probe`` commands to ``parser``."""
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

    Raises PayloadError (not_found/bad_input) from :func:`load_model_config`/:func:`moe_shape`.
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
