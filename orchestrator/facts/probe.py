"""The payload's ``probe`` answer as typed facts (``orch_probe``), parsed once, at the probe task.

The fields and their meaning are the payload's (``remote/probe.py`` module docstring: the result
``data``); :class:`ProbeFacts` mirrors them one to one and :meth:`ProbeFacts.parse` refuses an
answer that lacks one or carries one it does not know (:func:`orchestrator.facts.schema.parse`),
so the controller and the payload cannot drift apart silently. The model's MoE shape is the
payload's own record, :class:`remote.engines.sglang.shape.MoeShape`, with the tuner's answer added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote.engines.sglang.shape import MoeShape

from .schema import Record


@dataclass(slots=True)
class GpuInfo(Record):
    """One visible CUDA GPU: ``index``; ``name`` as CUDA reports it; ``device_name`` in SGLang's
    file-name form (None when the name cannot be used in a file name); ``capability``
    (``"9.0"``); ``smem_per_block_optin`` and ``total_memory`` in bytes."""

    index: int
    name: str
    device_name: str | None
    capability: str
    smem_per_block_optin: int | None
    total_memory: int


@dataclass(slots=True)
class SglangInfo(Record):
    """Where SGLang is and where it reads MoE configs (``remote.engines.sglang.lookup.find_sglang``):
    ``installed``, ``version``, ``package_dir``; ``loader_module`` and its ``layout``
    (``current``/``old``); ``loader_rules`` (the lookup rules read from the loader, None when
    they could not be read); ``configs_root`` (the folder holding ``triton_X_Y_Z/``) and whether
    it exists; ``shipped_configs_root``; ``other_layout_configs_root`` (stale configs of another
    layout); ``moe_config_dir`` (the unit's ``SGLANG_MOE_CONFIG_DIR``); ``loader_rules_inferred``:
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
    """What SGLang's lookup finds for one config file (``existing.up``/``existing.down``):
    ``folders`` (``triton_*`` folders holding it, newest first), ``in_installed_folder`` (in the
    folder orch installs into), ``sglang_would_load`` (the path SGLang would load, None: none),
    ``fallback_error`` (why SGLang's fallback search would fail), ``read_by_sglang`` (False for a
    ``_down`` file of a release that reads none)."""

    folders: list[str] = field(default_factory=list)
    sglang_would_load: str | None = None
    fallback_error: str | None = None
    in_installed_folder: bool = False
    read_by_sglang: bool = True


@dataclass(slots=True)
class TunerProvider(Record):
    """The kernel ``tune --provider auto`` would time on the host (``sglang``/``builtin``) and
    why it falls back to ``builtin`` (None: it does not); ``remote.tuning.support``."""

    auto: str
    reason: str | None


@dataclass
class ProbedModel(MoeShape):
    """The model's MoE GEMM shape (:class:`remote.engines.sglang.shape.MoeShape`, E/N/top-k in experts,
    elements and experts per token) plus ``tuner_unsupported``: why the payload's tuner cannot
    run these MoE weights (``remote.tuning.support.unsupported_reason``), None when it can;
    ``checkpoint_quant_method``: the checkpoint's quantization method as SGLang names it
    (``remote.engines.sglang.runner.checkpoint_quant_method``; None: unquantized or not read);
    ``config_dtype`` / ``model_type``: the text config's ``dtype`` (or ``torch_dtype``) and
    ``model_type``, from which SGLang resolves the model's dtype (``remote.engines.sglang.autotune.torch_dtype``)."""

    tuner_unsupported: str | None = None
    checkpoint_quant_method: str | None = None
    #: the same answer per resolved provider (``sglang``/``builtin``): SGLang's own kernel runs
    #: weight formats (int4/int8, per-channel fp8) the builtin one does not; None from older payloads
    tuner_unsupported_by: dict[str, str | None] | None = None
    config_dtype: str | None = None
    model_type: str | None = None

    def untunable_reason(self, provider: str | None = None) -> str | None:
        """Why this model cannot be tuned here with ``provider`` (resolved: ``sglang``/``builtin``;
        None: the provider ``auto`` resolves to), with what to do instead; None when it can."""
        by = self.tuner_unsupported_by or {}
        why = by[provider] if provider in by else self.tuner_unsupported
        return f"{why}; tune them elsewhere and `orch configs import` the files" if why else None


@dataclass(slots=True)
class AutotuneCache(Record):
    """One FlashInfer autotune cache folder on the host (``remote.probe.autotune_caches``):
    ``<root>/flashinfer/autotune/<version>/<sm>/<key>/`` at ``path``, its ``files``
    (``rank_*.json`` names) and ``runs`` (files under ``runs/``, fresh results written with
    ``SGLANG_FLASHINFER_AUTOTUNE_CACHE=0``)."""

    version: str
    sm: str
    key: str
    path: str
    files: list[str] = field(default_factory=list)
    runs: int = 0


@dataclass(slots=True)
class ProbeFacts(Record):
    """The host as the payload's ``probe`` sees it (``orch_probe``; the fields of
    ``remote/probe.py``'s result ``data``): GPUs, Triton, SGLang and its config folder, the
    model's shape and the exact file names SGLang looks for (role ``up``/``down`` -> name), the
    folder orch installs into (``install_dir``), what SGLang's lookup finds for each file
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
    sglang_exact_folder: str | None
    sglang: SglangInfo
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
