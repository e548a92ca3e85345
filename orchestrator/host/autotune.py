"""FlashInfer's start-up autotune of one unit, from its facts: where its cache lies (for the probe)
and its state (for ``orch doctor``). The rules are :mod:`remote.engines.sglang.autotune`'s (SGLang 0.5.23
``srt/model_executor/runner/flashinfer_autotune.py``); this module only feeds them the unit's
server arguments, environment and the probe's answer."""

from __future__ import annotations

import posixpath

from remote.engines.sglang import autotune
from remote.engines.sglang.runner import MoeRunner, probe_inputs, resolved_server_args

from ..facts.probe import ProbeFacts
from ..facts.unit import ServerArgs, UnitFacts

#: launch flags that change the cache key in ways orch does not model
_UNMODELLED_KEY_FLAGS = ("--flashinfer-autotune-skip-ops", "--speculative-moe-runner-backend")


def cache_root(unit: UnitFacts) -> str | None:
    """The server's ``$SGLANG_CACHE_DIR`` (:func:`remote.engines.sglang.autotune.cache_root`): the unit's
    value (relative to its ``WorkingDirectory=``, ``/`` without one), else ``$HOME/.cache/sglang``
    of the unit's environment; None when neither is set (the payload then looks under its own
    user's home, the service's when the unit has no ``User=``)."""
    root = autotune.cache_root(unit.environment, unit.environment.get("HOME"))
    if root is not None and not root.startswith("/"):
        root = posixpath.join(unit.working_directory or "/", root)
    return root


def _attn_dp(server: ServerArgs) -> int:
    """``attn_dp_size``: ``--attn-dp-size``, or the deprecated ``--dp-size N --enable-dp-attention``
    (SGLang 0.5.23 ``srt/arg_groups/parallel_hook.py`` ``_handle_deprecated_dp_attention``)."""
    if "--enable-dp-attention" in server.launch_args and int(server.attn_dp_size or 1) == 1:
        return int(server.dp or 1)
    return int(server.attn_dp_size or 1)


def derived_key(server: ServerArgs, probe: ProbeFacts, resolved: tuple[str, str | None] | None) -> \
        tuple[str | None, str | None]:
    """``(key, why not)``: this server's cache key (:func:`remote.engines.sglang.autotune.cache_key`) from
    its flags, the model config and the resolved ``(moe_runner_backend, quantization)``; None with
    the reason when an input is not known."""
    model = probe.model
    flag = next((f for f in _UNMODELLED_KEY_FLAGS if any(a.split("=", 1)[0] == f for a in server.launch_args)), None)
    if flag:
        return None, f"{flag} changes the cache key in a way orch does not model"
    if resolved is None:
        return None, "the resolved moe_runner_backend is not known"
    if model is None or not server.model_path:
        return None, "no model config read"
    config_class = autotune.CONFIG_CLASSES.get(model.model_type or "")
    if config_class is None:
        return None, f"the config class of model_type {model.model_type!r} is not known to orch"
    dtype = autotune.torch_dtype(server.dtype, model.config_dtype, model.model_type)
    if dtype is None:
        return None, f"--dtype {server.dtype} is not one SGLang accepts"
    return autotune.cache_key(model_path=server.model_path, dtype=dtype, quantization=resolved[1],
                              backend=resolved[0], tp=server.tp, pp=server.pp, attn_dp=_attn_dp(server),
                              ep=server.ep, config_class=config_class), None


def autotune_state(unit: UnitFacts, server: ServerArgs, probe: ProbeFacts, runner: MoeRunner,
                   log: autotune.AutotuneLog | None, start_backend: str | None = None) -> autotune.AutotuneState | None:
    """The unit's :class:`remote.engines.sglang.autotune.AutotuneState`, or None when its MoE runner is not
    a FlashInfer one. ``start_backend``: the ``moe_runner_backend`` its last start logged (wins
    over the derived one)."""
    inputs = probe_inputs(probe.to_dict())
    resolved = resolved_server_args(backend=server.moe_runner_backend or "auto", quantization=server.quantization,
                                    ep=server.ep, a2a_backend=server.moe_a2a_backend, **inputs)
    if start_backend and resolved is not None:
        resolved = (start_backend, resolved[1])
    backend = resolved[0] if resolved else None
    if not ((runner.runner or "").startswith("flashinfer") or backend in autotune.AUTOTUNE_BACKENDS):
        return None
    enabled = autotune.autotune_runs(backend=backend, capability=probe.capability, quantization=server.quantization,
                                     a2a_backend=server.moe_a2a_backend,
                                     disabled=server.disable_flashinfer_autotune,
                                     deterministic=server.enable_deterministic_inference,
                                     kv_cache_sharding="--enable-kv-cache-sharding" in server.launch_args)
    key, why = derived_key(server, probe, resolved)
    return autotune.autotune_state(enabled=enabled, env=unit.environment, root=probe.autotune_cache_root,
                                   flashinfer_version=probe.flashinfer_version, capability=probe.capability,
                                   key=key, key_why=why, caches=[c.to_dict() for c in probe.autotune_caches],
                                   log=log)
