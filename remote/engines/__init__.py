"""The inference engines orch tunes for, and the facade the controller reaches them through
(standard library only).

- :mod:`remote.engines.interface`: :class:`~remote.engines.interface.Engine`, everything orch needs
  from an inference engine, and :class:`~remote.engines.interface.ServerArgs`;
- :mod:`remote.engines.records`: the records that cross that interface (MoE runner, start-up log,
  autotune cache, generation, the configs root's hazards);
- :mod:`remote.engines.launch`: the launch wrappers every engine's units use (``numactl``,
  ``uv run``, ``conda run``, ...) and :class:`~remote.engines.launch.Launch`;
- :mod:`remote.engines.triton_moe`: what every engine that runs the fused-MoE Triton kernel with
  per-shape JSON tile configs shares (the config format and its validation);
- :mod:`remote.engines.sglang`: SGLang's rules (file names, model shapes, loader search, log
  lines, server flags, MoE runner selection, FlashInfer autotune), bound to the interface by
  :mod:`remote.engines.sglang.engine`;
- :mod:`remote.engines.vllm`: vLLM's rules, bound to the interface by :mod:`remote.engines.vllm.engine`.

This package is the facade: :data:`ENGINES` (name -> engine), :func:`engine_for` (which engine a
unit's command line starts), :func:`engine_named`, :func:`add_model_flags` and
:func:`shape_from_args` (the payload's model flags with ``--engine``), and the shared config-file
functions. With :mod:`remote.protocol`, the only part of ``remote`` that ``orchestrator`` may
import (``tests/test_architecture.py``).
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from ..protocol import DEFAULT_ENGINE, ENGINE_NAMES, PayloadError
from .errors import EngineError
from .interface import Engine, ServerArgs
from .launch import (ContainerHook, Launch, LaunchError, activates_environment, in_image, shebang_interpreter,
                     split_exec_prefix)
from .launch import refusal as _refusal
from .launch import resolve as _resolve
from .records import (AutotuneLog, AutotuneState, Generation, HttpRequest, MoeLogLine, MoeLogReport, MoeRunner,
                      RootHazards, RunnerLine)
from .sglang.engine import ENGINE as _SGLANG
from .triton_moe.configfile import check_down_matches_up, dumps_config, load_config_file, loads_config, validate_config
from .triton_moe.shape import MoeShape
from .vllm.engine import ENGINE as _VLLM

__all__ = ["ENGINES", "AutotuneLog", "AutotuneState", "ContainerHook", "Engine", "EngineError", "Generation",
           "HttpRequest", "Launch", "LaunchError", "MoeLogLine", "MoeLogReport", "MoeRunner", "MoeShape", "RootHazards", "RunnerLine", "ServerArgs",
           "activates_environment", "add_model_flags", "check_down_matches_up", "container_command", "device_name_arg", "dumps_config",
           "engine_for",
           "engine_named", "in_image", "launch_refusal", "load_config_file", "loads_config", "probe_view", "servers_phrase",
           "shape_from_args",
           "shebang_interpreter", "split_exec_prefix", "validate_config"]

#: every engine orch knows, by name (:data:`remote.protocol.ENGINE_NAMES`, in that order)
ENGINES: dict[str, Engine] = {_SGLANG.name: _SGLANG, _VLLM.name: _VLLM}
assert tuple(ENGINES) == ENGINE_NAMES, "remote.protocol.ENGINE_NAMES names the registered engines"


def engine_named(name: str | None) -> Engine:
    """The engine called ``name`` (None: :data:`remote.protocol.DEFAULT_ENGINE`). Raises
    :class:`EngineError` naming the engines orch knows for another name."""
    found = ENGINES.get(name or DEFAULT_ENGINE)
    if found is None:
        raise EngineError(f"engine {name!r} is not one orch knows ({', '.join(ENGINES)})")
    return found


def engine_for(exec_start: list[str], *, name: str | None = None, prefixes: str = "", workdir: str = "",
               environment: dict[str, str] | None = None,
               container: ContainerHook | None = None) -> tuple[Engine, Launch]:
    """Which engine a unit's ``ExecStart=`` words (variables expanded, systemd's prefixes
    ``prefixes`` split off) start, and how: ``(engine, launch)``. The wrappers are read once
    (:func:`remote.engines.launch.resolve`) and the command left is handed to the engine whose
    entry point it is; ``name`` (the inventory's ``orch_engine``) asks that engine alone. Raises
    :class:`EngineError` for an unknown ``name`` and :class:`LaunchError` for a command no engine
    starts (the message names the word and every engine's entry points)."""
    if name is not None:
        engine = engine_named(name)
        return engine, engine.resolve_launch(exec_start, prefixes=prefixes, workdir=workdir,
                                             environment=environment, container=container)
    launch = _resolve(exec_start, [e.entry_points for e in ENGINES.values()], prefixes=prefixes, workdir=workdir,
                      environment=environment, container=container)
    return ENGINES[launch.engine], launch


def container_command(image: str, entrypoint: str | None, command: list[str]) -> list[str]:
    """The command a container run starts: ``--entrypoint`` (``entrypoint``) followed by the words
    after the image (``command``); else, for an engine's own server image
    (``EntryPoints.image_entrypoint``: vLLM's ``vllm/vllm-openai``), that image's entry point
    followed by them; else ``command`` as written."""
    if entrypoint:
        return [entrypoint, *command]
    for engine in ENGINES.values():
        own = engine.entry_points.image_entrypoint(image)
        if own:
            return [*own, *command]
    return list(command)


def launch_refusal(exec_start: list[str], why: str, name: str | None = None) -> str:
    """The sentence that refuses ``exec_start`` (``name``: the one engine it was read for; None: every
    engine): the command, ``why``, and the forms orch knows."""
    entries = [engine_named(name).entry_points] if name else [e.entry_points for e in ENGINES.values()]
    return _refusal(exec_start, why, entries)


def servers_phrase(name: str | None = None) -> str:
    """``an SGLang server`` (``name``'s engine; None: every engine, joined by ``nor``): how a
    refusal names what a unit is not."""
    engines = [engine_named(name)] if name else list(ENGINES.values())
    return " nor ".join(e.entry_points.server_phrase for e in engines)


def add_model_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The model flags of ``command``, ``--engine`` among them (every engine reads the model the
    same way: orch's names for the server's model settings, declared once, by the default engine's
    ``add_model_flags``; ``--engine`` picks whose rules :func:`shape_from_args` applies)."""
    engine_named(DEFAULT_ENGINE).add_model_flags(parser, command)


def shape_from_args(args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[Any, str]:
    """``(shape, source)`` of parsed model flags by the rules of ``args.engine``'s engine."""
    return engine_named(getattr(args, "engine", None)).shape_from_args(args, capability)


def device_name_arg(engine: Engine, name: str) -> str:
    """``Engine.device_name`` of a ``--device-name`` value, raising ``PayloadError('bad_input')``
    that names the flag for a name the engine refuses."""
    try:
        return engine.device_name(name)
    except ValueError as exc:
        raise PayloadError("bad_input", f"--device-name: {getattr(exc, 'msg', exc)}") from None


def probe_view(probe: Any) -> Mapping[str, Any]:
    """A probe answer as the engines read it: the dict form of a typed probe (its ``to_dict()``),
    or the dict itself."""
    return probe.to_dict() if hasattr(probe, "to_dict") else dict(probe or {})
