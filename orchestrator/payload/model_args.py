"""What the controller tells a payload command about the unit's model: its model flags and environment.

The tasks ``probe`` and ``tune`` call the payload with the same description of the model (the unit's
engine, its model path, TP/EP/DP sizes, dtype, quantization, ...), written with the payload's own flag
table (``Engine.model_argv``; SGLang's :func:`remote.engines.sglang.model_flags.model_argv`), so the
argv always parses back to the values it was built from
(tests/unit/remote/engines/sglang/test_model_flags.py).
"""

from __future__ import annotations

from remote.engines import activates_environment

from ..engine.results import TaskFailed


def model_flags(ctx) -> list[str]:
    """Payload flags describing the model as the unit runs it (the ``probe`` and ``tune`` tasks).

    The engine is the unit's (``--engine``, ``orch_engine``). The model is ``orch_model_config``
    when set, else (once probed) the config file the probe found (where the engine finds it: HF or
    ModelScope cache), else the unit's model path; the unit's download folder is passed with the
    unit's own model. ``orch_device_name`` becomes ``--device-name``. Raises :class:`TaskFailed`
    when the unit names no model.
    """
    server, engine = ctx.facts.server, ctx.facts.engine
    probed = ctx.facts.probe
    model = (ctx.vars.get("orch_model_config") or (probed.model_config_path if probed is not None else None)
             or server.model_path)
    if not model:
        raise TaskFailed("the unit has no --model-path (nor a --config file giving one) and orch_model_config "
                         "is not set")
    return engine.model_argv({
        "engine": engine.name,
        "model_config": str(model),
        "download_dir": None if ctx.vars.get("orch_model_config") else server.download_dir,
        "tp": server.tp or 1,
        "ep": server.ep or 1,
        # data parallelism: vLLM flattens the experts' TP across DP without EP (N / (TP x DP)); SGLang's
        # shape does not read it. Passed only when > 1, so a DP-less unit's argv is unchanged
        "dp": server.dp if (server.dp or 1) > 1 else None,
        "dtype": server.dtype if server.dtype not in (None, "", "auto") else None,
        "quantization": server.quantization or None,
        "disable_shared_experts_fusion": bool(server.disable_shared_experts_fusion),
        "device_name": str(ctx.vars["orch_device_name"]) if ctx.vars.get("orch_device_name") else None,
    })


#: PATH systemd gives a service whose unit sets none (systemd.exec(5), "Environment variables in
#: spawned processes"; /sbin and /bin for hosts without merged /usr)
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unit_path(ctx) -> str:
    """The PATH the unit's server runs with: its effective environment's, else systemd's default
    (:data:`SYSTEMD_DEFAULT_PATH`). Passed explicitly to every payload command (``env PATH=...``):
    sudo's ``secure_path`` (and sudo-rs, which ignores ``-E``, sudo-rs #1299) would otherwise
    give the payload another PATH than the server's, without ``/usr/sbin`` (Triton runs
    ``ldconfig``, triton #2878) or the unit's CUDA folders."""
    return ctx.facts.environment.get("PATH") or SYSTEMD_DEFAULT_PATH


def wrapper_activates(ctx) -> bool:
    """Whether the unit's launch wrappers activate an environment of their own
    (:func:`remote.engines.launch.activates_environment`: ``conda run``): the payload then keeps
    that ``PATH`` and its bare interpreter name."""
    unit = ctx.facts.unit
    return unit is not None and unit.launch is not None and activates_environment(unit.launch)


def payload_env(ctx) -> dict[str, str]:
    """Environment of the unit the payload must see (``Engine.payload_env_keys`` that the unit sets:
    where the model's config is, the visible GPUs, the config folder the engine reads; and
    ``PATH``: :func:`unit_path`, except where :func:`wrapper_activates`)."""
    env = ctx.facts.environment
    out = {k: env[k] for k in ctx.facts.engine.payload_env_keys if k in env}
    if not wrapper_activates(ctx):
        out["PATH"] = unit_path(ctx)
    return out
