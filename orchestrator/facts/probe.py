"""The payload's ``probe`` answer as typed facts (``orch_probe``), parsed once, at the probe task.

The fields and their meaning are the payload's (``remote/probe.py`` module docstring: the result
``data``); :class:`ProbeFacts` mirrors them one to one and :meth:`ProbeFacts.parse` refuses an
answer that lacks one or carries one it does not know (:func:`orchestrator.facts.schema.parse`),
so the controller and the payload cannot drift apart silently. The model's MoE shape is the
engine's record (SGLang's :class:`remote.engines.sglang.shape.MoeShape`) as the payload sends it,
with the tuner's answer added. Records written before engines were named (``sglang``,
``sglang_would_load``, ...) are read under the new names (:mod:`.legacy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote.engines import MoeShape

from .legacy import EXISTING_KEYS, LEGACY_ENGINE, PROBE_KEYS, renamed
from .schema import Record, fields_from_dict


@dataclass(slots=True)
class GpuInfo(Record):
    """One visible CUDA GPU: ``index``; ``name`` as CUDA reports it; ``device_name`` in the engine's
    file-name form (None when the name cannot be used in a file name); ``capability``
    (``"9.0"``); ``smem_per_block_optin`` and ``total_memory`` in bytes."""

    index: int
    name: str
    device_name: str | None
    capability: str
    smem_per_block_optin: int | None
    total_memory: int


@dataclass(slots=True)
class EngineInfo(Record):
    """Where the engine is and where it reads MoE configs (``Engine.lookup``'s ``engine``; SGLang:
    ``remote.engines.sglang.lookup.find_sglang``): ``installed``, ``version``, ``package_dir``;
    ``loader_module`` and its ``layout``
    (``current``/``old``); ``loader_rules`` (the lookup rules read from the loader, None when
    they could not be read); ``configs_root`` (the folder holding ``triton_X_Y_Z/``) and whether
    it exists; ``shipped_configs_root``; ``other_layout_configs_root`` (stale configs of another
    layout); ``moe_config_dir`` (the unit's config-dir variable, ``Engine.config_dir_env``); ``loader_rules_inferred``:
    why ``loader_rules`` were inferred from the tree's layout and version instead of read from the
    loader (``remote.engines.sglang.lookup.inferred_rules``), None when they were read."""

    installed: bool
    version: str | None
    package_dir: str | None
    loader_module: str | None
    layout: str | None
    loader_rules: dict[str, Any] | None
    configs_root: str | None
    configs_root_exists: bool
    shipped_configs_root: str | None
    other_layout_configs_root: str | None
    moe_config_dir: str | None
    loader_rules_inferred: str | None = None


@dataclass(slots=True)
class ExistingFile(Record):
    """What the engine's lookup finds for one config file (``existing.up``/``existing.down``):
    ``folders`` (``triton_*`` folders holding it, newest first), ``in_installed_folder`` (in the
    folder orch installs into), ``would_load`` (the path the engine would load, None: none),
    ``fallback_error`` (why its fallback search would fail), ``read_by_engine`` (False for a
    ``_down`` file of a release that reads none)."""

    folders: list[str] = field(default_factory=list)
    would_load: str | None = None
    fallback_error: str | None = None
    in_installed_folder: bool = False
    read_by_engine: bool = True

    @classmethod
    def from_dict(cls, data: Any) -> "ExistingFile":
        """Leniently, older names included (:data:`orchestrator.facts.legacy.EXISTING_KEYS`)."""
        return fields_from_dict(cls, renamed(data, EXISTING_KEYS))


@dataclass(slots=True)
class TunerProvider(Record):
    """The kernel ``tune --provider auto`` would time on the host (an engine's provider, or ``builtin``) and
    why it falls back to ``builtin`` (None: it does not); ``remote.tuning.support``."""

    auto: str
    reason: str | None


@dataclass
class ProbedModel(MoeShape):
    """The model's MoE GEMM shape (the engine's ``MoeShape``, E/N/top-k in experts,
    elements and experts per token) plus ``tuner_unsupported``: why the payload's tuner cannot
    run these MoE weights (``remote.tuning.support.unsupported_reason``), None when it can;
    ``checkpoint_quant_method``: the checkpoint's quantization method as the engine names it
    (``Engine.model_facts``; None: unquantized or not read); ``config_dtype`` / ``model_type``:
    the text config's ``dtype`` (or ``torch_dtype``) and ``model_type``, from which the engine
    resolves the model's dtype (SGLang: ``remote.engines.sglang.autotune.torch_dtype``)."""

    tuner_unsupported: str | None = None
    checkpoint_quant_method: str | None = None
    #: the same answer per resolved provider (an engine's, ``builtin``): the engine's own kernel runs
    #: weight formats (int4/int8, per-channel fp8) the builtin one does not; None from older payloads
    tuner_unsupported_by: dict[str, str | None] | None = None
    config_dtype: str | None = None
    model_type: str | None = None

    def untunable_reason(self, provider: str | None = None) -> str | None:
        """Why this model cannot be tuned here with ``provider`` (resolved: an engine's or ``builtin``;
        None: the provider ``auto`` resolves to), with what to do instead; None when it can."""
        by = self.tuner_unsupported_by or {}
        why = by[provider] if provider in by else self.tuner_unsupported
        return f"{why}; tune them elsewhere and `orch configs import` the files" if why else None


@dataclass(slots=True)
class AutotuneCache(Record):
    """One FlashInfer autotune cache folder on the host (``remote.probe.autotune_caches``):
    ``<root>/flashinfer/autotune/<version>/<sm>/<key>/`` at ``path``, its ``files``
    (``rank_*.json`` names) and ``runs`` (files under ``runs/``, fresh results of starts that do
    not reuse the cache)."""

    version: str
    sm: str
    key: str
    path: str
    files: list[str] = field(default_factory=list)
    runs: int = 0


@dataclass(slots=True)
class ProbeFacts(Record):
    """The host as the payload's ``probe`` sees it (``orch_probe``; the fields of
    ``remote/probe.py``'s result ``data``): GPUs, Triton, the engine (``engine_name``) and its
    config folder (``engine``), the model's shape and the exact file names the engine looks for
    (role ``up``/``down`` -> name), the folder orch installs into (``install_dir``), what the
    engine's lookup finds for each file
    (``existing``), the tuner's answers and the probe's warnings; FlashInfer's version
    (``flashinfer_version``, None: not installed) and the autotune cache folders found under
    ``autotune_cache_root`` (``autotune_caches``)."""

    gpus: list[GpuInfo]
    device_name: str | None
    capability: str | None
    mixed_gpus: bool
    torch_version: str | None
    triton_version: str | None
    triton_folder: str | None
    engine_name: str
    exact_folder: str | None
    engine: EngineInfo
    model: ProbedModel | None
    model_config_path: str | None
    file_names: dict[str, str] | None
    install_dir: str | None
    install_dir_exists: bool
    existing: dict[str, ExistingFile] | None
    unparsable_folders: list[str]
    tuner_provider: TunerProvider
    triton_kernels: bool
    warnings: list[str]
    flashinfer_version: str | None
    autotune_cache_root: str | None
    autotune_caches: list[AutotuneCache]
    #: where ``capability`` came from (``flag``: orch_gpu_capability, ``torch``, ``nvidia-smi``; None:
    #: nowhere) and each source asked, with its answer (``remote.probe``)
    capability_source: str | None = None
    capability_tried: list[str] = field(default_factory=list)
    #: the server's Triton cache as read by the probe (``remote.tuning.cache.server_cache_report``;
    #: None: not asked, a container unit)
    server_triton_cache: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "ProbeFacts":
        """Leniently: a probe of any release, older names included (:data:`orchestrator.facts.legacy.PROBE_KEYS`;
        a probe that names no engine was SGLang's)."""
        data = renamed(data, PROBE_KEYS)
        if isinstance(data, dict):
            data.setdefault("engine_name", LEGACY_ENGINE)
        return fields_from_dict(cls, data)

    def existing_file(self, role: str) -> ExistingFile:
        """What the lookup finds for ``role``'s file; nothing found (:class:`ExistingFile`'s
        defaults) when the probe named no such file."""
        return (self.existing or {}).get(role) or ExistingFile()

    def untunable_reason(self, provider: str | None = None) -> str | None:
        """Why the payload's tuner cannot tune this model with ``provider`` (``auto``/None: what
        the probe's ``tuner_provider.auto`` names; :meth:`ProbedModel.untunable_reason`); None
        when it can or no model was probed."""
        if self.model is None:
            return None
        if provider in (None, "auto"):
            provider = self.tuner_provider.auto
        return self.model.untunable_reason(provider)
