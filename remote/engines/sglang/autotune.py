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
  set is used as written (``EnvStr.parse`` returns it, ``flashinfer_autotune_cache_path`` takes
  ``Path(value)``: no ``~`` expansion, so ``~/c`` is a folder named ``~`` in the working
  directory; a relative path is relative to the server's working directory). The one answer for
  every caller (``orch doctor``'s probe and the runner trial's backup):
  ``test_autotune_oracle.py`` runs the wheel's ``flashinfer_autotune_cache_path`` in a working
  directory for ``~/c``, ``rel/dir`` and an absolute value.
* :func:`server_key`, :func:`server_state`: a unit's key and state from its server arguments
  (the deprecated DP-attention form counted as ``attn_dp``:
  :func:`remote.engines.sglang.server_args.attention_dp`), the probe and the last start's log;
  :data:`UNMODELLED_KEY_FLAGS`: the launch flags that change the key in ways orch does not model
  (``--flashinfer-autotune-skip-ops``, ``srt/arg_groups/fields/exec_.py``: the ``skip_ops=`` part;
  ``--speculative-moe-runner-backend``, ``srt/arg_groups/fields/spec.py``: the draft worker's
  backend); :func:`trial_flags`: the flags a runner trial's group key keeps.
* :func:`reuses_cache`: ``SGLANG_FLASHINFER_AUTOTUNE_CACHE = EnvBool(True)``: ``0`` (``false``,
  ``no``, ``n``) turns reuse off, and each start writes a fresh file under ``<key>/runs/``
  (``flashinfer_autotune_context``); a value ``EnvBool`` cannot parse keeps the default.
* :func:`torch_dtype`: the model's dtype as ``str(torch.dtype)``, by ``configs/model_config.py``
  ``_get_and_verify_dtype``.
* :func:`autotune_log`: the lines ``flashinfer_autotune_context`` logs (``Running FlashInfer
  autotune with cache: PATH``, the ``cache reuse DISABLED`` line, ``FlashInfer autotune
  completed.``), and FlashInfer's own autotuner's start and end lines between them: the path a
  start used is ground truth for the key; a start line without its end is an autotune still
  running (or hung).

``tests/unit/remote/engines/sglang/test_autotune_oracle.py`` runs the wheel's own
``flashinfer_autotune_cache_path``, ``should_run_flashinfer_autotune``, ``_get_and_verify_dtype``
and ``EnvBool`` against these over a grid, and holds the log wordings against the wheel's source.
"""

from __future__ import annotations

import hashlib
import re
import posixpath
from typing import Any, Iterable, Mapping

from ..records import AutotuneLog, AutotuneState, MoeRunner
from .env import AUTOTUNE_CACHE_ENV, CACHE_DIR_ENV
from .server_args import attention_dp

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


def cache_root(env: Mapping[str, str], home: str | None, workdir: str | None = None) -> str | None:
    """The root of SGLang's caches as the server uses it (module docstring): ``$SGLANG_CACHE_DIR``
    of ``env`` (the server's environment) as written, joined to ``workdir`` (the server's working
    directory; None: left as written) when it is not absolute (``~/c`` included: SGLang does not
    expand it); else ``home`` + ``/.cache/sglang`` (``home``: the server user's home; None:
    unknown, then None). Pure."""
    if CACHE_DIR_ENV in env:
        value = env[CACHE_DIR_ENV]
        return value if workdir is None or value.startswith("/") else posixpath.join(workdir or "/", value)
    return f"{home.rstrip('/')}/.cache/sglang" if home else None


def autotune_root(root: str) -> str:
    """``<root>/flashinfer/autotune``: the folder under the cache root that holds every FlashInfer
    autotune cache file (``flashinfer_autotune_cache_path``). Pure."""
    return root.rstrip("/") + "/flashinfer/autotune"


def reuses_cache(env: Mapping[str, str]) -> bool:
    """False when ``SGLANG_FLASHINFER_AUTOTUNE_CACHE`` in ``env`` turns reuse off (``0``, ``false``, ...)."""
    return _bool_env(env.get(AUTOTUNE_CACHE_ENV), True)


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
#: FlashInfer's own autotuner (``flashinfer/autotuner.py`` ``autotune()``, entered by
#: ``flashinfer_autotune_context``), logged through its ``flashinfer.jit`` logger inside SGLang's two
#: lines: ``[Autotuner]: Autotuning process starts ...`` and ``... ends``. A start whose last such line is
#: the start line is tuning now, or hangs there (a warm cache under TP/EP, vllm PR #54618).
LOG_TUNER_STARTS = "[Autotuner]: Autotuning process starts"
LOG_TUNER_ENDS = "[Autotuner]: Autotuning process ends"
_CACHE_LINE = re.compile(re.escape(LOG_WITH_CACHE) + r"(?P<path>\S.*?\.json)\s*$")
_FRESH_LINE = re.compile(re.escape(LOG_NO_REUSE) + r"(?P<path>\S.*?\.json)\s*$")


def autotune_log(lines: Iterable[str]) -> AutotuneLog | None:
    """The autotune lines of one start's log (``lines``, any prefix on each); None when it logged none."""
    path, reuse, done, seen, tuning = None, None, False, False, False
    for line in lines:
        m = _CACHE_LINE.search(line)
        f = None if m else _FRESH_LINE.search(line)
        if m or f:
            seen, path, reuse, done = True, (m or f).group("path"), bool(m), False
        elif LOG_DONE in line:
            seen, done = True, True
        elif LOG_TUNER_STARTS in line:
            seen, tuning = True, True
        elif LOG_TUNER_ENDS in line:
            tuning = False
    return AutotuneLog(path, reuse, done, tuning) if seen else None


def key_of_path(path: str) -> tuple[str, str, str] | None:
    """``(flashinfer version, sm dir, key)`` of a rank file's or cache dir's path (a ``runs/`` file
    included); None when the path is not under ``flashinfer/autotune/``."""
    m = re.search(r"/flashinfer/autotune/(?P<v>[^/]+)/(?P<sm>sm\d+)/(?P<key>[0-9a-f]{16})(?:/|$)", path)
    return (m.group("v"), m.group("sm"), m.group("key")) if m else None


def autotune_state(*, enabled: tuple[bool | None, str], env: Mapping[str, str], root: str | None,
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


#: the ``--flashinfer-autotune-skip-ops`` flag (``srt/arg_groups/fields/exec_.py``): the ``skip_ops=``
#: part of the cache key
SKIP_OPS_FLAG = "--flashinfer-autotune-skip-ops"
#: launch flags that change the cache key in ways orch does not model (module docstring)
UNMODELLED_KEY_FLAGS = (SKIP_OPS_FLAG, "--speculative-moe-runner-backend")
#: flags (besides those :class:`remote.engines.sglang.server_args.ServerArgs` reads) that change
#: FlashInfer's autotune of the server, so hosts that differ in them measure a runner trial apart
TRIAL_FLAGS = (SKIP_OPS_FLAG,)
#: prefixes of the speculative-decoding flags (``srt/arg_groups/fields/spec.py``): the draft worker
#: autotunes with ``--speculative-moe-runner-backend`` / ``--speculative-moe-a2a-backend`` (else the
#: target's), its quantization enters its cache hash (``draft_quant=``), and the draft token count
#: sets the autotune shapes (``should_run_flashinfer_autotune``, ``max_speculative_num_draft_tokens``);
#: every one of them is kept, spelled as the unit spells it (``--no-`` forms of the boolean ones too)
SPECULATIVE_PREFIXES = ("--speculative-", "--no-speculative-")


def trial_flags(launch_args: list[str]) -> list[list[str]]:
    """The flags of ``launch_args`` (the server's arguments, ``--config`` merged: ``ServerArgs.launch_args``)
    that enter a runner trial's group key besides the parsed sizes: :data:`TRIAL_FLAGS` and every
    flag starting with one of :data:`SPECULATIVE_PREFIXES`, each as ``[flag, value]`` (``value``
    the next word when it is not itself a flag, ``""`` for a switch, the part after ``=`` for
    ``--flag=value``), sorted. Pure."""
    out: list[list[str]] = []
    for i, tok in enumerate(launch_args):
        name, eq, val = tok.partition("=")
        if not (name in TRIAL_FLAGS or name.startswith(SPECULATIVE_PREFIXES)):
            continue
        if not eq:
            nxt = launch_args[i + 1] if i + 1 < len(launch_args) else ""
            val = "" if nxt.startswith("--") else nxt
        out.append([name, val])
    return sorted(out)


def server_key(server: Any, model: Mapping[str, Any] | None,
               resolved: tuple[str, str | None] | None) -> tuple[str | None, str | None]:
    """``(key, why not)``: the cache key (:func:`cache_key`) of the server ``server`` (a
    :class:`~remote.engines.sglang.server_args.ServerArgs`) from its flags, the probed ``model``
    (``model_type``, ``config_dtype``) and the resolved ``(moe_runner_backend, quantization)``;
    None with the reason when an input is not known. Pure."""
    flag = next((f for f in UNMODELLED_KEY_FLAGS if any(a.split("=", 1)[0] == f for a in server.launch_args)), None)
    if flag:
        return None, f"{flag} changes the cache key in a way orch does not model"
    if resolved is None:
        return None, "the resolved moe_runner_backend is not known"
    if not model or not server.model_path:
        return None, "no model config read"
    model_type = model.get("model_type")
    config_class = CONFIG_CLASSES.get(model_type or "")
    if config_class is None:
        return None, f"the config class of model_type {model_type!r} is not known to orch"
    dtype = torch_dtype(server.dtype, model.get("config_dtype"), model_type)
    if dtype is None:
        return None, f"--dtype {server.dtype} is not one SGLang accepts"
    return cache_key(model_path=server.model_path, dtype=dtype, quantization=resolved[1], backend=resolved[0],
                     tp=server.tp, pp=server.pp, attn_dp=attention_dp(server)[0], ep=server.ep,
                     config_class=config_class), None


def server_state(server: Any, probe: Mapping[str, Any], runner: MoeRunner, env: Mapping[str, str],
                 log: AutotuneLog | None, resolved: tuple[str, str | None] | None,
                 start_backend: str | None = None) -> AutotuneState | None:
    """The :class:`AutotuneState` of ``server`` (its ``ServerArgs``), or None when its MoE runner
    ``runner`` does not autotune and resolution does not leave it an autotuning backend. ``probe``:
    the payload's probe answer (``capability``, ``model``, ``flashinfer_version``,
    ``autotune_cache_root``, ``autotune_caches``); ``env``: the server's environment; ``log``: the
    last start's :func:`autotune_log`; ``resolved``: ``(moe_runner_backend, quantization)`` as
    argument resolution leaves them (:func:`remote.engines.sglang.runner.resolved_server_args`);
    ``start_backend``: the ``moe_runner_backend`` its last start logged (wins over the derived
    one). Pure."""
    if start_backend and resolved is not None:
        resolved = (start_backend, resolved[1])
    backend = resolved[0] if resolved else None
    if not (runner.autotunes or backend in AUTOTUNE_BACKENDS):
        return None
    capability = probe.get("capability")
    enabled = autotune_runs(backend=backend, capability=capability, quantization=server.quantization,
                            a2a_backend=server.moe_a2a_backend, disabled=server.disable_flashinfer_autotune,
                            deterministic=server.enable_deterministic_inference,
                            kv_cache_sharding="--enable-kv-cache-sharding" in server.launch_args)
    key, why = server_key(server, probe.get("model"), resolved)
    return autotune_state(enabled=enabled, env=env, root=probe.get("autotune_cache_root"),
                          flashinfer_version=probe.get("flashinfer_version"), capability=capability, key=key,
                          key_why=why, caches=list(probe.get("autotune_caches") or []), log=log)


def trial_key(server: Any) -> dict[str, Any]:
    """What of ``server`` (its ``ServerArgs``), besides the model, the GPU and the releases, decides
    a runner trial's measurement: the attention DP and DP replicas (:func:`attention_dp`), the
    all-to-all backend and the runner flag (SGLang's runner rules, :mod:`remote.engines.sglang.runner`),
    whether FlashInfer autotunes (``--disable-flashinfer-autotune``,
    ``--enable-deterministic-inference``) and the flags of :func:`trial_flags` (its key). Pure."""
    return {"attn_dp_dp": list(attention_dp(server)), "a2a": server.moe_a2a_backend,
            "autotune_off": bool(server.disable_flashinfer_autotune),
            "deterministic": bool(server.enable_deterministic_inference), "flags": trial_flags(server.launch_args),
            "runner": server.moe_runner_backend or "auto"}
