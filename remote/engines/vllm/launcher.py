"""vLLM's own processes and console script, as the host shows them (standard library only).

vLLM 0.32.0-0.34.0:

- the console script ``vllm`` (``vllm = vllm.entrypoints.cli.main:main``, the distribution's
  ``entry_points.txt``): pip and uv write ``from vllm.entrypoints.cli.main import main``;
- the server's processes: the API server (``-m vllm.entrypoints.openai.api_server ARGS`` or
  ``vllm serve ARGS``; the kernel shows a shebang script as ``python /venv/bin/vllm serve ...``)
  and the processes it starts, which name themselves ``VLLM::<name>`` through ``setproctitle``
  (``vllm/utils/system_utils.py`` ``set_process_title``, prefix ``VLLM_PROCESS_NAME_PREFIX``,
  default ``VLLM``): ``VLLM::EngineCore``, ``VLLM::EngineCore_DP0``, ``VLLM::Worker_TP0``,
  ``VLLM::APIServer_0``, ``VLLM::DPCoordinator`` (``v1/engine/core.py``,
  ``v1/executor/multiproc_executor.py``, ``v1/utils.py``, ``v1/engine/coordinator.py``).
"""

from __future__ import annotations

import os
import re

from ..launch import refusal as _refusal
from ..launch import resolve as _resolve
from ..launch import ContainerHook, Launch
from .server_args import ENTRY_MODULE, ENTRY_POINTS

#: the prefix vLLM's processes give their titles (``envs.VLLM_PROCESS_NAME_PREFIX``'s default)
PROCESS_PREFIX = "VLLM::"


def resolve(argv: list[str], *, prefixes: str = "", workdir: str = "", environment: dict[str, str] | None = None,
            container: ContainerHook | None = None) -> Launch:
    """:func:`remote.engines.launch.resolve` with vLLM's entry points
    (:data:`remote.engines.vllm.server_args.ENTRY_POINTS`). Raises
    :class:`~remote.engines.launch.LaunchError` for a form orch does not know."""
    return _resolve(argv, (ENTRY_POINTS,), prefixes=prefixes, workdir=workdir, environment=environment,
                    container=container)


def refusal(exec_start: list[str], why: str) -> str:
    """The message that refuses an ``ExecStart=``: the command, why, and vLLM's forms."""
    return _refusal(exec_start, why, (ENTRY_POINTS,))


def is_vllm_script(text: str) -> bool:
    """Whether the console script ``text`` runs vLLM's ``vllm.entrypoints.cli.main:main`` (the
    import pip's and uv's generated scripts hold)."""
    return re.search(r"^\s*from vllm\.entrypoints\.cli\.main import main\b", text, re.M) is not None


def is_vllm_process(cmd: str) -> bool:
    """True for a command line (``/proc/PID/cmdline`` joined by spaces) of vLLM's own processes:
    a ``VLLM::...`` title, ``-m vllm.entrypoints.openai.api_server``, or the console script's
    ``vllm serve``. Pure."""
    if cmd.startswith(PROCESS_PREFIX) or ENTRY_MODULE in cmd:
        return True
    words = cmd.split()
    return any(os.path.basename(w) == "vllm" and i + 1 < len(words) and words[i + 1] == "serve"
               for i, w in enumerate(words))


def is_entry_process(argv: list[str], entry_args: list[str]) -> bool:
    """Whether a process's command line ``argv`` runs vLLM's server with the words ``entry_args``
    (``python -m vllm.entrypoints.openai.api_server ARGS``, or ``python /venv/bin/vllm serve ARGS``
    / ``vllm serve ARGS`` for the console script). Pure."""
    for i in range(1, len(argv)):
        if argv[i] == ENTRY_MODULE and argv[i - 1] == "-m":
            return argv[i + 1:] == entry_args
        if os.path.basename(argv[i - 1]) == "vllm" and argv[i] == "serve":
            return argv[i + 1:] == entry_args
    return False
