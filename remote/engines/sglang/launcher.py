"""How a unit's ``ExecStart=`` starts SGLang: the launch forms orch knows, resolved to one model.

Every form resolves (:func:`resolve`) to a :class:`Launch`: the Python that runs SGLang, the
wrapper prefix the payload (tuner, probe) reuses so that it runs as the server runs (NUMA and CPU
binding, priority, the conda environment), the SGLang entry point, the arguments SGLang's own
argument parser receives for that entry point, and the environment changes the wrappers make.

Entry points (SGLang 0.5.23):

- ``<python> -m sglang.launch_server ARGS`` (``sglang/launch_server.py``:
  ``prepare_server_args(sys.argv[1:])``);
- SGLang's console script ``sglang serve ARGS`` (``pyproject.toml``: ``sglang =
  sglang.cli.main:main``; ``sglang/cli/main.py`` hands everything after ``serve`` to
  ``sglang/cli/serve.py`` ``serve``, which removes ``--model-type X`` / ``--model-type=X``
  (anywhere), turns a first word that is not an option into ``--model-path WORD`` and, for the
  ``llm`` backend, calls ``prepare_server_args`` with the rest). 0.5.5 to 0.5.16 take only
  ``--model-path`` there; a unit that runs at all on those releases uses no form they refuse, so
  0.5.23's rules read it right. The interpreter is the script's shebang, read on the host
  (:func:`shebang_interpreter`); ``<python> .../bin/sglang serve`` names it directly.

Wrappers (systemd's prefixes, ``env``, ``bash -c``, ``numactl``, ``taskset``, ``nice``, ``stdbuf``,
``uv run``, ``conda run``, ``start-stop-daemon``, containers) are every engine's:
:mod:`remote.engines.launch` reads them and hands the command left to :data:`ENTRY_POINTS`.

A form not listed here raises :class:`LaunchError` naming the word and the forms orch knows
(:data:`KNOWN_FORMS`). Pure and standard library only; the host reads (a console script's
shebang, the uv environment's Python) are the caller's (``orchestrator.facts.unit``).
"""

from __future__ import annotations

import re

from ..launch import (ContainerHook, Launch, LaunchError, apply_exec_prefix, known_forms, shebang_interpreter,
                      split_exec_prefix)
from ..launch import refusal as _refusal
from ..launch import resolve as _resolve

__all__ = ["ENTRY_MODULE", "ENTRY_POINTS", "ENTRY_SERVE", "KNOWN_FORMS", "Launch", "LaunchError", "apply_exec_prefix",
           "is_entry_process", "is_sglang_script", "refusal", "resolve", "serve_server_argv", "shebang_interpreter",
           "split_exec_prefix"]

#: the entry points: ``python -m sglang.launch_server`` and the console script's ``sglang serve``
ENTRY_MODULE = "sglang.launch_server"
ENTRY_SERVE = "sglang serve"


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


class SglangEntryPoints:
    """SGLang's entry points for :func:`remote.engines.launch.resolve` (module docstring)."""

    name = "sglang"
    display_name = "SGLang"
    server_phrase = "an SGLang server"
    modules = (ENTRY_MODULE,)
    scripts = ("sglang",)
    forms = ("<python> -m sglang.launch_server", "sglang serve (SGLang's console script)")

    def enter_module(self, module: str, args: list[str], launch: Launch) -> None:
        """``<python> -m sglang.launch_server ARGS`` (``sglang/launch_server.py``:
        ``prepare_server_args(sys.argv[1:])``)."""
        launch.entry = ENTRY_MODULE
        launch.entry_args = list(args)
        launch.server_argv = list(args)
        launch.forms.append(f"python -m {ENTRY_MODULE}")

    def enter_script(self, argv: list[str], launch: Launch) -> None:
        """``sglang serve ARGS`` (argv[0] is the console script)."""
        if len(argv) < 2 or argv[1] != "serve":
            sub = argv[1] if len(argv) > 1 else ""
            raise LaunchError(f"'sglang {sub}' does not start a server (orch knows 'sglang serve')")
        launch.entry = ENTRY_SERVE
        launch.entry_args = list(argv[2:])
        launch.server_argv = serve_server_argv(list(argv[2:]))
        launch.script = argv[0]
        launch.forms.append(ENTRY_SERVE)

    def image_entrypoint(self, image: str) -> tuple[str, ...] | None:
        """None: orch knows no SGLang image whose entry point starts the server (a container unit
        names SGLang's command after the image)."""
        return None


#: SGLang's entry points (one object: the launch resolver's argument)
ENTRY_POINTS = SglangEntryPoints()
#: what the refusal lists as the forms orch knows
KNOWN_FORMS = known_forms((ENTRY_POINTS,))


def serve_server_argv(args: list[str]) -> list[str]:
    """What SGLang 0.5.23 ``sglang/cli/serve.py`` ``serve`` hands ``prepare_server_args`` for the
    words after ``sglang serve``: ``--model-type`` removed (its value must be ``llm`` or
    ``auto``), a first word that is no option made ``--model-path WORD``. Raises
    :class:`LaunchError` for ``--model-type`` without a value, for another backend (a
    diffusion or out-of-tree server is not SGLang's LLM server) and when it names no model
    (SGLang refuses to start)."""
    backend, rest, i = "auto", [], 0
    while i < len(args):
        w = args[i]
        if w == "--model-type":
            if i + 1 >= len(args):
                raise LaunchError("sglang serve --model-type has no value (SGLang refuses it)")
            backend, i = args[i + 1], i + 2
            continue
        if w.startswith("--model-type="):
            backend, i = w.split("=", 1)[1], i + 1
            continue
        rest.append(w)
        i += 1
    if not backend:
        raise LaunchError("sglang serve --model-type has an empty value (SGLang refuses it)")
    if backend not in ("auto", "llm"):
        raise LaunchError(f"sglang serve --model-type {backend} is not SGLang's language-model server "
                          "(orch tunes the MoE kernels of --model-type llm)")
    if rest and not rest[0].startswith("-"):
        rest = ["--model-path", rest[0], *rest[1:]]
    if _serve_model_path(rest) is None:
        raise LaunchError("sglang serve names no model: SGLang needs a first word that is the model, "
                          "--model-path or --model (spelled out; 'Error: --model-path is required')")
    return rest


def _serve_model_path(args: list[str]) -> str | None:
    """The model ``sglang serve`` finds in ``args`` (SGLang 0.5.23 ``sglang/cli/utils.py``
    ``try_get_model_path``: ``--model-path X``, ``--model X`` or their ``=`` forms, the first
    one), or None."""
    for i, w in enumerate(args):
        if w in ("--model-path", "--model"):
            return args[i + 1] if i + 1 < len(args) else None
        if w.startswith(("--model-path=", "--model=")):
            return w.split("=", 1)[1]
    return None


def resolve(argv: list[str], *, prefixes: str = "", workdir: str = "", environment: dict[str, str] | None = None,
            container: ContainerHook | None = None) -> Launch:
    """:func:`remote.engines.launch.resolve` with SGLang's entry points: the ``ExecStart=`` words
    ``argv`` as a :class:`Launch` that starts SGLang. Raises :class:`LaunchError` for a form orch
    does not know, naming it and :data:`KNOWN_FORMS`."""
    return _resolve(argv, (ENTRY_POINTS,), prefixes=prefixes, workdir=workdir, environment=environment,
                    container=container)


def refusal(exec_start: list[str], why: str) -> str:
    """The message that refuses an ``ExecStart=``: the command, why, and the forms orch knows."""
    return _refusal(exec_start, why, (ENTRY_POINTS,))


def is_sglang_script(text: str) -> bool:
    """Whether the console script ``text`` runs SGLang's ``sglang.cli.main:main`` (pip's and uv's
    generated scripts import it: ``from sglang.cli.main import main``)."""
    return re.search(r"^\s*from sglang\.cli\.main import main\b", text, re.M) is not None


def is_sglang_process(cmd: str) -> bool:
    """True for a command line (``/proc/PID/cmdline`` joined by spaces) of SGLang's own processes:
    ``-m sglang.launch_server`` or a worker it names ``sglang::...`` (SGLang 0.5.23
    srt/managers/scheduler.py, detokenizer_manager.py ``setproctitle``). Pure."""
    return cmd.startswith("sglang::") or ENTRY_MODULE in cmd


def is_entry_process(argv: list[str], entry: str, entry_args: list[str]) -> bool:
    """Whether a process's command line ``argv`` runs the entry point ``entry`` with the words
    ``entry_args`` (a server's process, or its fork: ``python -m sglang.launch_server ARGS``;
    ``python /venv/bin/sglang serve ARGS`` for the console script, as the kernel shows a
    shebang script). Pure."""
    for i in range(1, len(argv)):
        if entry == ENTRY_MODULE and argv[i] == ENTRY_MODULE and argv[i - 1] == "-m":
            return argv[i + 1:] == entry_args
        if entry == ENTRY_SERVE and _base(argv[i - 1]) == "sglang" and argv[i] == "serve":
            return argv[i + 1:] == entry_args
    return False
