"""SGLang's server flags that orch reads, and the launch command line parsed as SGLang parses it.

Mirrors the flag definitions of each covered release: ``srt/server_args.py`` (``add_argument``
calls up to 0.5.12; annotated ``ServerArgs`` fields from 0.5.16) and ``srt/arg_groups/fields/*.py``
(0.5.23: ``parallel.py``, ``model.py``, ``exec_.py``, ...), whose field name gives the option
``--field-name`` and whose ``Arg(aliases=...)`` gives the other spellings. :data:`FLAGS` is the
table: for each value orch reads, every option SGLang accepts for it (argparse also takes a unique
prefix: ``--tp`` is ``--tp-size``), its type and its default per release.
``tests/unit/remote/engines/sglang/test_server_args_oracle.py`` reads those files of every covered
release with :mod:`ast` and holds the table against them.

:func:`split_launch` finds the launch command in a unit's ``ExecStart`` (the forms of
:mod:`remote.engines.sglang.launcher`: ``python -m sglang.launch_server``, ``sglang serve``, wrappers);
:func:`parse_server_args` reads the flags of :data:`FLAGS` from its arguments into a
:class:`ServerArgs`. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...protocol import internal_error
from ..errors import EngineError
from .launcher import LaunchError, resolve


@internal_error("caught by orchestrator.facts.unit, which raises UnitError naming the unit")
class ServerArgsError(EngineError):
    """A launch command SGLang would refuse (a flag with no value, a bad integer, an option
    spelled with underscores); the message names the flag."""


@dataclass(frozen=True)
class Flag:
    """One server setting orch reads.

    ``field``: the :class:`ServerArgs` attribute; ``options``: every spelling SGLang registers for
    it, its own name first (``--tp-size``), then ``--tp`` (argparse's prefix of ``--tp-size``,
    not registered); ``kind``: ``str`` | ``int`` | ``bool`` (``store_true``: no value);
    ``defaults``: ``((release, value), ...)``, oldest first: the flag exists from the first
    release named (of the covered ones) and has that default until the next entry's release.
    """

    field: str
    options: tuple[str, ...]
    kind: str
    defaults: tuple[tuple[str, Any], ...]

    @property
    def default(self) -> Any:
        """The default of the newest covered release (SGLang 0.5.23)."""
        return self.defaults[-1][1]

    @property
    def since(self) -> str:
        """The first covered release that has the flag."""
        return self.defaults[0][0]


_ALL = "0.4.10.post2"  # the oldest covered release (tests/sglang_loader.py ORACLE_RELEASES)

#: The server settings orch reads (SGLang 0.5.23 ``srt/arg_groups/fields/``; older releases where
#: they differ, per ``defaults``).
FLAGS: tuple[Flag, ...] = (
    Flag("model_path", ("--model-path", "--model"), "str", ((_ALL, None),)),
    Flag("tp", ("--tp-size", "--tensor-parallel-size", "--tp"), "int", ((_ALL, 1),)),
    Flag("ep", ("--ep-size", "--expert-parallel-size", "--ep"), "int", ((_ALL, 1),)),
    Flag("pp", ("--pp-size", "--pipeline-parallel-size"), "int", ((_ALL, 1),)),
    Flag("dp", ("--dp-size", "--data-parallel-size"), "int", ((_ALL, 1),)),
    Flag("attn_dp_size", ("--attn-dp-size", "--attention-data-parallel-size"), "int", (("0.5.23", 1),)),
    Flag("enable_deterministic_inference", ("--enable-deterministic-inference",), "bool", (("0.5.3", False),)),
    Flag("port", ("--port",), "int", ((_ALL, 30000),)),
    Flag("host", ("--host",), "str", ((_ALL, "127.0.0.1"),)),
    Flag("moe_runner_backend", ("--moe-runner-backend",), "str", (("0.5.2", "auto"),)),
    Flag("moe_a2a_backend", ("--moe-a2a-backend",), "str", ((_ALL, None), ("0.5.2", "none"))),
    Flag("quantization", ("--quantization",), "str", ((_ALL, None),)),
    Flag("dtype", ("--dtype",), "str", ((_ALL, "auto"),)),
    Flag("served_model_name", ("--served-model-name",), "str", ((_ALL, None),)),
    Flag("disable_shared_experts_fusion", ("--disable-shared-experts-fusion",), "bool", ((_ALL, False),)),
    Flag("disable_flashinfer_autotune", ("--disable-flashinfer-autotune",), "bool", (("0.5.8", False),)),
    Flag("nnodes", ("--nnodes",), "int", ((_ALL, 1),)),
    Flag("node_rank", ("--node-rank",), "int", ((_ALL, 0),)),
    Flag("dist_init_addr", ("--dist-init-addr", "--nccl-init-addr"), "str", ((_ALL, None),)),
    Flag("download_dir", ("--download-dir",), "str", ((_ALL, None),)),
    Flag("log_level", ("--log-level",), "str", ((_ALL, "info"),)),
)
#: option spelling -> :class:`ServerArgs` field
FLAG_ALIASES: dict[str, str] = {opt: f.field for f in FLAGS for opt in f.options}
#: fields of ``store_true`` flags (no value on the command line)
BOOL_FLAGS: frozenset[str] = frozenset(f.field for f in FLAGS if f.kind == "bool")
#: fields whose value is an integer
INT_FLAGS: frozenset[str] = frozenset(f.field for f in FLAGS if f.kind == "int")
_DEFAULT = {f.field: f.default for f in FLAGS}


@dataclass
class ServerArgs:
    """The parts of an SGLang launch command orch needs (defaults: SGLang 0.5.23's, :data:`FLAGS`).

    ``interpreter``: the Python that runs SGLang (absolute path as in ExecStart); ``argv``: the
    ExecStart words; ``tp``/``ep``: tensor/expert parallel sizes; ``port``/``host``: where it
    listens; ``moe_runner_backend``: ``auto`` when not given; ``moe_a2a_backend``: the expert
    all-to-all (``none`` when not given); ``nnodes``/``node_rank``/``dist_init_addr``: a server
    spread over several hosts; ``download_dir``: ``--download-dir``; ``log_level``: ``--log-level``
    (every logger's level, SGLang's ``configure_logger``); ``config_file``: the
    ``--config`` YAML merged into these values (None: none); ``launch_args``: the flags after
    ``-m sglang.launch_server`` as SGLang parses them (``--config`` merged).
    """

    interpreter: str
    argv: list[str]
    model_path: str | None = _DEFAULT["model_path"]
    tp: int = _DEFAULT["tp"]
    ep: int = _DEFAULT["ep"]
    pp: int = _DEFAULT["pp"]
    dp: int = _DEFAULT["dp"]
    attn_dp_size: int = _DEFAULT["attn_dp_size"]
    enable_deterministic_inference: bool = _DEFAULT["enable_deterministic_inference"]
    port: int = _DEFAULT["port"]
    host: str = _DEFAULT["host"]
    moe_runner_backend: str = _DEFAULT["moe_runner_backend"]
    moe_a2a_backend: str = _DEFAULT["moe_a2a_backend"]
    quantization: str | None = _DEFAULT["quantization"]
    dtype: str | None = None  # SGLang's default is "auto"; None: not given (the model config decides)
    served_model_name: str | None = _DEFAULT["served_model_name"]
    disable_shared_experts_fusion: bool = _DEFAULT["disable_shared_experts_fusion"]
    disable_flashinfer_autotune: bool = _DEFAULT["disable_flashinfer_autotune"]
    nnodes: int = _DEFAULT["nnodes"]
    node_rank: int = _DEFAULT["node_rank"]
    dist_init_addr: str | None = _DEFAULT["dist_init_addr"]
    download_dir: str | None = _DEFAULT["download_dir"]
    log_level: str = _DEFAULT["log_level"]
    config_file: str | None = None
    launch_args: list[str] = field(default_factory=list)

    @property
    def moe_backend(self) -> str:
        """The MoE runner backend the command asks for: ``--moe-runner-backend`` (``auto`` when
        not given), as :class:`remote.engines.interface.ServerArgs` names it for every engine."""
        return self.moe_runner_backend or "auto"


#: the flag that names the MoE runner backend (the :data:`FLAGS` entry of ``moe_runner_backend``)
RUNNER_FLAG = "--moe-runner-backend"


def with_runner(words: list[str], runner: str) -> list[str]:
    """``words`` (command-line words) without any ``--moe-runner-backend V`` /
    ``--moe-runner-backend=V`` and with ``--moe-runner-backend runner`` at the end (argparse keeps
    the last value, and SGLang's parser takes the command line over a ``--config`` file: SGLang
    0.5.23 ``srt/utils/server_args_config_parser.py`` ``ConfigArgumentMerger.merge_config_with_args``
    puts the file's flags first). Pure."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w == RUNNER_FLAG:
            skip = True
            continue
        if w.startswith(RUNNER_FLAG + "="):
            continue
        out.append(w)
    return out + [RUNNER_FLAG, runner]


#: the flag of SGLang's deprecated data-parallel attention (``srt/arg_groups/parallel_hook.py``)
DP_ATTENTION_FLAG = "--enable-dp-attention"


def attention_dp(server: ServerArgs) -> tuple[int, int]:
    """``(attention data-parallel size, data-parallel replicas)`` as SGLang 0.5.23 runs ``server``:
    ``--attn-dp-size`` (``attn_dp_size``, a part of FlashInfer's cache hash in
    ``flashinfer_autotune_cache_path``) and ``--dp-size``; the deprecated ``--dp-size N
    --enable-dp-attention`` is ``attn_dp_size N`` with one replica
    (``srt/arg_groups/parallel_hook.py`` ``_handle_deprecated_dp_attention``, held against the
    wheel by ``test_server_args_oracle.py``). Pure."""
    attn, dp = int(server.attn_dp_size or 1), int(server.dp or 1)
    if DP_ATTENTION_FLAG in (server.launch_args or []) and attn == 1:
        return dp, 1
    return attn, dp


def split_launch(exec_start: list[str]) -> tuple[str, list[str]] | None:
    """``(interpreter, the arguments SGLang's parser receives)`` of a launch command in
    ``exec_start`` (every form of :mod:`remote.engines.sglang.launcher`; a console script's interpreter
    is its path until the host's shebang is read), or None when the command is not one."""
    try:
        launch = resolve(list(exec_start))
    except LaunchError:
        return None
    return launch.interpreter or launch.script or "", launch.server_argv


def _refuse_underscores(args: list[str]) -> None:
    """SGLang registers no option with ``_`` in its name; argparse refuses ``--tp_size`` (e.g.
    from a ``tp_size:`` key of a ``--config`` file, merged verbatim as ``--tp_size``)."""
    for tok in args:
        name = tok.split("=", 1)[0]
        if name.startswith("--") and "_" in name and name.replace("_", "-") in FLAG_ALIASES:
            raise ServerArgsError(f"SGLang refuses the flag {name} (its spelling is {name.replace('_', '-')}); "
                                  "a --config file key with underscores becomes such a flag")


def parse_server_args(exec_start: list[str], launch_args: list[str] | None = None) -> ServerArgs | None:
    """Find the launch command in ``exec_start`` and parse its flags.

    Accepts the forms of :mod:`remote.engines.sglang.launcher` (``python -m sglang.launch_server``,
    ``sglang serve``, ``bash -c '...'``, ``env VAR=x python ...`` and the other wrappers).
    Returns None when the command is not an SGLang server. Flag values come as
    ``--flag value`` or ``--flag=value``; the last one wins, as in argparse. ``launch_args``
    replaces the flags of ``exec_start`` (the ``--config`` file merged in). Raises
    :class:`ServerArgsError` for a flag orch reads with no value or a bad integer, and for one
    spelled with underscores (SGLang refuses it).
    """
    found = split_launch(exec_start)
    if found is None:
        return None
    interpreter, args = found
    sa = parse_launch_args(list(launch_args) if launch_args is not None else args)
    sa.interpreter, sa.argv = interpreter, list(exec_start)
    return sa


def parse_launch_args(args: list[str]) -> ServerArgs:
    """The :class:`ServerArgs` of the arguments ``args`` that SGLang's ``prepare_server_args``
    receives (``interpreter`` and ``argv`` left empty for the caller). Raises
    :class:`ServerArgsError` as :func:`parse_server_args`."""
    sa = ServerArgs(interpreter="", argv=[], launch_args=list(args))
    _refuse_underscores(args)
    j = 0
    while j < len(args):
        tok = args[j]
        key, val = (tok.split("=", 1) + [None])[:2] if tok.startswith("--") and "=" in tok else (tok, None)
        field_name = FLAG_ALIASES.get(key)
        if field_name is None:
            j += 1
            continue
        if field_name in BOOL_FLAGS:
            setattr(sa, field_name, True)
            j += 1
            continue
        if val is None:
            if j + 1 >= len(args):
                raise ServerArgsError(f"flag {key} has no value in ExecStart")
            val = args[j + 1]
            j += 2
        else:
            j += 1
        if field_name in INT_FLAGS:
            try:
                setattr(sa, field_name, int(val))
            except ValueError:
                raise ServerArgsError(f"flag {key} must be an integer, got {val!r}") from None
        else:
            setattr(sa, field_name, val)
    return sa
