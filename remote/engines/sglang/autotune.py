"""FlashInfer's start-up autotune in SGLang: when it runs, where its result is cached, and whether a
start reuses it. Standard library only.

It mirrors SGLang 0.5.23 ``srt/model_executor/runner/flashinfer_autotune.py`` (paths below are
under ``sglang/srt/``):

* :func:`autotune_runs`: ``should_run_flashinfer_autotune`` (line 77): on CUDA only, not with
  ``--disable-flashinfer-autotune``, deterministic inference or KV-cache sharding, not for
  ``flashinfer_cutedsl`` with the DeepEP all-to-all; for the MoE when ``moe_runner_backend`` (as
  server-argument resolution left it) is one of :data:`AUTOTUNE_BACKENDS`, and only on compute
  capability 9.0 or newer. Its dense-GEMM cases (NVFP4 / FP8 GEMMs on FlashInfer kernels) are
  reported as not modelled.
* :func:`cache_key`, :func:`cache_dir`, :func:`rank_file`: ``flashinfer_autotune_cache_path``
  (line 164): ``$SGLANG_CACHE_DIR/flashinfer/autotune/<flashinfer.__version__>/sm<major><minor>/
  <key>/rank_tp<r>_pp<r>_dp<r>.json``, the key the first 16 hex digits of the SHA-256 of
  ``model_path|dtype|quantization|moe_runner_backend|tp|pp|attn_dp|ep|<hf config class>|
  candidate_selection=v2_default|skip_ops=<sorted,joined>`` (and ``|draft_quant=...`` for a
  speculative draft worker).
* :func:`cache_root`: ``srt/environ.py`` ``SGLANG_CACHE_DIR = EnvStr(os.path.expanduser(
  "~/.cache/sglang"))``: the default is the service user's ``~/.cache/sglang``; a value that is
  set is used as written (no ``~`` expansion; a relative path is relative to the server's working
  directory).
* :func:`reuses_cache`: ``SGLANG_FLASHINFER_AUTOTUNE_CACHE = EnvBool(True)``: ``0`` (``false``,
  ``no``, ``n``) turns reuse off, and each start writes a fresh file under ``<key>/runs/``
  (``flashinfer_autotune_context``); a value ``EnvBool`` cannot parse keeps the default.
* :func:`torch_dtype`: the model's dtype as ``str(torch.dtype)``, by ``configs/model_config.py``
  ``_get_and_verify_dtype``.
* :func:`autotune_log`: the lines ``flashinfer_autotune_context`` logs (``Running FlashInfer
  autotune with cache: PATH``, the ``cache reuse DISABLED`` line, ``FlashInfer autotune
  completed.``): the path a start used is ground truth for the key.

``tests/unit/remote/engines/sglang/test_autotune_oracle.py`` runs the wheel's own
``flashinfer_autotune_cache_path``, ``should_run_flashinfer_autotune``, ``_get_and_verify_dtype``
and ``EnvBool`` against these over a grid, and holds the log wordings against the wheel's source.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

from ..records import AutotuneLog, AutotuneState

_FILE = "srt/model_executor/runner/flashinfer_autotune.py"

#: ``should_run_flashinfer_autotune``'s ``moe_needs_autotune`` list (line 117).
AUTOTUNE_BACKENDS = ("flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_mxfp4", "flashinfer_cutedsl",
                     "flashinfer_cutlass", "flashinfer_megamoe")
#: Quantizations whose dense GEMMs may autotune too (``fp4_gemm_needs_autotune``, ``fp8_gemm_needs_autotune``).
_GEMM_QUANTS = ("modelopt_fp4", "modelopt_mixed", "mxfp8", "minimax_m3_nvfp4", "modelopt", "modelopt_fp8")
#: ``srt/environ.py`` ``EnvBool.parse``.
_TRUE, _FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")
#: ``configs/model_config.py`` ``_STR_DTYPE_TO_TORCH_DTYPE``.
_DTYPES = {"half": "torch.float16", "float16": "torch.float16", "float": "torch.float32", "float32": "torch.float32",
           "bfloat16": "torch.bfloat16"}
#: The ``hf_config`` class SGLang 0.5.23 loads per ``model_type`` (transformers' ``CONFIG_MAPPING_NAMES``,
#: or the checkpoint's own ``configuration_*.py`` class of the same name): the hash's last model input.
CONFIG_CLASSES = {
    "deepseek_v3": "DeepseekV3Config", "deepseek_v2": "DeepseekV2Config", "qwen3_moe": "Qwen3MoeConfig",
    "qwen2_moe": "Qwen2MoeConfig", "mixtral": "MixtralConfig", "glm4_moe": "Glm4MoeConfig",
    "gpt_oss": "GptOssConfig", "llama4": "Llama4Config", "olmoe": "OlmoeConfig", "dbrx": "DbrxConfig",
}


def runner_autotunes(runner: str | None) -> bool:
    """Whether the MoE runner ``runner`` autotunes its kernels at start-up: one of
    :data:`AUTOTUNE_BACKENDS` (``should_run_flashinfer_autotune``'s MoE list), or any FlashInfer
    runner (``flashinfer_*``: a release may add one before orch lists it). Pure."""
    return runner in AUTOTUNE_BACKENDS or (runner or "").startswith("flashinfer")


def _bool_env(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return True if value.lower() in _TRUE else False if value.lower() in _FALSE else default


def cache_root(env: dict[str, str], home: str | None) -> str | None:
    """``$SGLANG_CACHE_DIR`` as the server sees it (``env``: the unit's environment), else
    ``home`` + ``/.cache/sglang`` (``home``: the service user's home; None: unknown, then None)."""
    if "SGLANG_CACHE_DIR" in env:
        return env["SGLANG_CACHE_DIR"]
    return f"{home.rstrip('/')}/.cache/sglang" if home else None


def reuses_cache(env: dict[str, str]) -> bool:
    """False when ``SGLANG_FLASHINFER_AUTOTUNE_CACHE`` in ``env`` turns reuse off (``0``, ``false``, ...)."""
    return _bool_env(env.get("SGLANG_FLASHINFER_AUTOTUNE_CACHE"), True)


def autotune_runs(*, backend: str | None, capability: str | None, quantization: str | None = None,
                  a2a_backend: str | None = "none", disabled: bool = False, deterministic: bool = False,
                  kv_cache_sharding: bool = False) -> tuple[bool | None, str]:
    """Whether FlashInfer autotunes at start-up, and why (``should_run_flashinfer_autotune``).

    ``backend``: ``moe_runner_backend`` as server-argument resolution left it (None: unknown);
    ``capability``: CUDA compute capability ``"10.0"`` (None: not probed); ``quantization``: the
    resolved ``--quantization``; ``disabled``: ``--disable-flashinfer-autotune``;
    ``deterministic``: ``--enable-deterministic-inference``; ``kv_cache_sharding``:
    ``--enable-kv-cache-sharding``. Returns ``(True/False/None, reason)``, None when it depends on
    what is not known. Pure.
    """
    rule = f"{_FILE} should_run_flashinfer_autotune"
    for on, flag in ((kv_cache_sharding, "--enable-kv-cache-sharding"), (disabled, "--disable-flashinfer-autotune"),
                     (deterministic, "--enable-deterministic-inference")):
        if on:
            return False, f"{flag} turns FlashInfer autotune off ({rule})"
    if backend is None:
        return None, "the MoE runner backend is not known"
    if backend == "flashinfer_cutedsl" and (a2a_backend or "none") == "deepep":
        return False, f"flashinfer_cutedsl with --moe-a2a-backend deepep is not autotuned ({rule})"
    if backend not in AUTOTUNE_BACKENDS:
        if quantization in _GEMM_QUANTS:
            return None, (f"moe_runner_backend {backend} is not autotuned, but {quantization} dense GEMMs may be on "
                          f"FlashInfer kernels, which orch does not model ({rule})")
        return False, f"moe_runner_backend {backend} is not a FlashInfer runner ({rule})"
    if not capability:
        return None, "FlashInfer autotunes on compute capability 9.0+ only, and the GPU's was not probed"
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        return None, f"compute capability {capability!r} is not MAJOR.MINOR"
    if major < 9:
        return False, f"FlashInfer autotunes on compute capability 9.0+ only, this GPU is {capability} ({rule})"
    return True, f"moe_runner_backend {backend} on sm{str(capability).replace('.', '')} autotunes at start ({rule})"


def torch_dtype(dtype: str | None, config_dtype: str | None, model_type: str | None = None) -> str | None:
    """The model's dtype as ``str(torch.dtype)`` (``"torch.bfloat16"``), by ``configs/model_config.py``
    ``_get_and_verify_dtype``: ``dtype`` is ``--dtype`` (None: ``auto``), ``config_dtype`` the
    config's ``dtype`` or ``torch_dtype`` (``"bfloat16"``; None: float32), ``model_type`` the
    config's. None for a ``--dtype`` SGLang refuses. Pure."""
    config = _DTYPES.get(config_dtype or "", "torch.float32")
    dtype = (dtype or "auto").lower()
    if dtype != "auto":
        return _DTYPES.get(dtype)
    if config != "torch.float32":
        return config
    return "torch.bfloat16" if (model_type or "").startswith("gemma") else "torch.float16"


def cache_key(*, model_path: str, dtype: str, quantization: str | None, backend: str, tp: int = 1, pp: int = 1,
              attn_dp: int = 1, ep: int = 1, config_class: str, skip_ops: Iterable[str] = (),
              draft_quant: str | None = None) -> str:
    """The 16-hex-digit key of ``flashinfer_autotune_cache_path`` (module docstring).

    ``model_path``: ``--model-path`` as given; ``dtype``: :func:`torch_dtype`'s string;
    ``quantization``: the resolved ``--quantization`` (None prints ``None``); ``backend``: the
    resolved ``moe_runner_backend``; ``tp``/``pp``/``attn_dp``/``ep``: the parallel sizes;
    ``config_class``: the ``hf_config`` class name (:data:`CONFIG_CLASSES`); ``skip_ops``:
    ``--flashinfer-autotune-skip-ops``; ``draft_quant``: set for a speculative draft worker only. Pure.
    """
    parts = [str(model_path), str(dtype), str(quantization), str(backend), str(tp), str(pp), str(attn_dp), str(ep),
             str(config_class), "candidate_selection=v2_default", "skip_ops=" + ",".join(sorted(set(skip_ops)))]
    if draft_quant is not None:
        parts.append(f"draft_quant={draft_quant}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def arch_dir(capability: str) -> str:
    """``sm100`` for ``"10.0"`` (``f"sm{major}{minor}"``)."""
    major, _, minor = str(capability).partition(".")
    return f"sm{int(major)}{int(minor or 0)}"


def cache_dir(root: str, flashinfer_version: str, capability: str, key: str) -> str:
    """``<root>/flashinfer/autotune/<flashinfer_version>/sm<XY>/<key>`` (``flashinfer_version``:
    ``flashinfer.__version__``, ``unknown`` when it has none). Pure."""
    return f"{root.rstrip('/')}/flashinfer/autotune/{flashinfer_version}/{arch_dir(capability)}/{key}"


def rank_file(tp_rank: int = 0, pp_rank: int = 0, dp_rank: int | None = 0) -> str:
    """``rank_tp0_pp0_dp0.json`` (MegaMoE adds ``_gpu<uuid>``, not modelled)."""
    return f"rank_tp{tp_rank}_pp{pp_rank}_dp{dp_rank or 0}.json"


#: ``flashinfer_autotune_context``'s lines (line 304, 312, 369).
LOG_WITH_CACHE = "Running FlashInfer autotune with cache: "
LOG_NO_REUSE = ("Running FlashInfer autotune (cache reuse DISABLED via SGLANG_FLASHINFER_AUTOTUNE_CACHE=0); "
                "writing fresh result to: ")
LOG_DONE = "FlashInfer autotune completed."
_CACHE_LINE = re.compile(re.escape(LOG_WITH_CACHE) + r"(?P<path>\S.*?\.json)\s*$")
_FRESH_LINE = re.compile(re.escape(LOG_NO_REUSE) + r"(?P<path>\S.*?\.json)\s*$")


def autotune_log(lines: Iterable[str]) -> AutotuneLog | None:
    """The autotune lines of one start's log (``lines``, any prefix on each); None when it logged none."""
    path, reuse, done, seen = None, None, False, False
    for line in lines:
        m = _CACHE_LINE.search(line)
        f = None if m else _FRESH_LINE.search(line)
        if m or f:
            seen, path, reuse = True, (m or f).group("path"), bool(m)
        elif LOG_DONE in line:
            seen, done = True, True
    return AutotuneLog(path, reuse, done) if seen else None


def key_of_path(path: str) -> tuple[str, str, str] | None:
    """``(flashinfer version, sm dir, key)`` of a rank file's or cache dir's path (a ``runs/`` file
    included); None when the path is not under ``flashinfer/autotune/``."""
    m = re.search(r"/flashinfer/autotune/(?P<v>[^/]+)/(?P<sm>sm\d+)/(?P<key>[0-9a-f]{16})(?:/|$)", path)
    return (m.group("v"), m.group("sm"), m.group("key")) if m else None


def autotune_state(*, enabled: tuple[bool | None, str], env: dict[str, str], root: str | None,
                   flashinfer_version: str | None, capability: str | None, key: str | None, key_why: str | None,
                   caches: list[dict], log: AutotuneLog | None = None) -> AutotuneState:
    """The :class:`AutotuneState` from :func:`autotune_runs`'s answer ``enabled``, the unit's
    ``env``, the cache ``root``, the installed ``flashinfer_version`` (None: not installed), the
    GPU's ``capability``, this server's derived ``key`` (None: not derived, ``key_why``), the cache
    folders the probe found (``caches``: ``{version, sm, key, path, files, runs}``) and the last
    start's :func:`autotune_log` (its path wins over the derived key). Pure."""
    reuse = reuses_cache(env)
    source = "derived" if key else None
    logged = key_of_path(log.path) if log and log.path else None
    if logged:
        if key and logged[2] != key:
            key_why = f"the last start used key {logged[2]}; orch derived {key}"
        key, source = logged[2], "log"
    sm = arch_dir(capability) if capability else (logged[1] if logged else None)
    version = flashinfer_version
    if flashinfer_version is None and enabled[0] is not False:
        enabled = (False, "FlashInfer is not installed for the server's Python")
    path = cache_dir(root, version, capability, key) if (root and version and capability and key) else None
    if path is None and logged:
        path = log.path.rsplit("/runs/", 1)[0] if "/runs/" in log.path else log.path.rsplit("/", 1)[0]
    mine = [c for c in caches if c.get("sm") == sm]
    same_version = [c for c in mine if c.get("version") == version]
    other = [c["path"] for c in mine if c.get("version") != version and (key is None or c.get("key") == key)]
    if not reuse:
        cache = "not-reused"
    elif key is None or version is None or sm is None:
        cache = "unknown"
    else:
        hit = [c for c in same_version if c.get("key") == key and c.get("files")]
        cache = "present" if hit else "missing"
    return AutotuneState(enabled[0], enabled[1], reuse, root, flashinfer_version, key, source, key_why, path, cache,
                         other)
