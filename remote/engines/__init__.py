"""The inference engines orch tunes for, and the facade the controller reaches them through
(standard library only).

- :mod:`remote.engines.interface`: :class:`~remote.engines.interface.Engine`, everything orch needs
  from an inference engine, and :class:`~remote.engines.interface.ServerArgs`;
- :mod:`remote.engines.records`: the records that cross that interface (MoE runner, start-up log,
  autotune cache, generation);
- :mod:`remote.engines.launch`: the launch wrappers every engine's units use (``numactl``,
  ``uv run``, ``conda run``, ...) and :class:`~remote.engines.launch.Launch`;
- :mod:`remote.engines.triton_moe`: what every engine that runs the fused-MoE Triton kernel with
  per-shape JSON tile configs shares (the config format and its validation);
- :mod:`remote.engines.sglang`: SGLang's rules (file names, model shapes, loader search, log
  lines, server flags, MoE runner selection, FlashInfer autotune).

With :mod:`remote.protocol`, the only part of ``remote`` that ``orchestrator`` may import.
"""

from .errors import EngineError
from .interface import Engine, ServerArgs
from .launch import Launch, LaunchError
from .records import AutotuneLog, AutotuneState, Generation, HttpRequest, MoeLogLine, MoeLogReport, MoeRunner, RunnerLine

__all__ = ["AutotuneLog", "AutotuneState", "Engine", "EngineError", "Generation", "HttpRequest", "Launch",
           "LaunchError", "MoeLogLine", "MoeLogReport", "MoeRunner", "RunnerLine", "ServerArgs"]
