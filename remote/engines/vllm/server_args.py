"""vLLM's launch forms and the server flags orch reads, parsed as vLLM 0.32.0-0.34.0 parse them
(standard library only).

Entry points (:class:`VllmEntryPoints`, handed to :func:`remote.engines.launch.resolve`, which
reads the wrappers every engine shares: ``env``, ``numactl``, ``uv run``, ``conda run``, ...):

- the console script ``vllm serve [MODEL] ARGS`` (``vllm = vllm.entrypoints.cli.main:main``;
  ``vllm/entrypoints/cli/serve.py`` ``ServeSubcommand``): the parser receives ``["serve", ...]``;
- ``<python> -m vllm.entrypoints.openai.api_server ARGS`` (``api_server.py``'s ``__main__``, which
  0.34.0 marks deprecated and hands to ``vllm/entrypoints/launchers/api_server/entry.py`` ``main``;
  0.32.0/0.33.0 the same through ``launchers``): the parser receives ``ARGS``;
- the ``vllm/vllm-openai`` container image (:func:`image_entrypoint`): its ``ENTRYPOINT`` is
  ``vllm serve`` (vLLM's ``docker/Dockerfile``, stage ``vllm-openai``, since 0.11.1; ``python3 -m
  vllm.entrypoints.openai.api_server`` up to 0.11.0), so the container's command words are what
  follows ``vllm serve`` (the model first, or ``--model``).

The parser (``vllm/utils/argparse_utils.py`` ``FlexibleArgumentParser.parse_args``), in order:

1. ``vllm serve`` only: a ``--model X``/``--model=X`` anywhere is moved to be the first word after
   ``serve`` (with a warning); a command whose first word after ``serve`` is an option, that gives
   ``--served-model-name`` and no ``--config``, is refused ("model should be provided as the
   first positional argument");
2. ``--config FILE`` (``_pull_args_from_config``, ``load_config_file``): the YAML's keys become
   ``--KEY VALUE`` words inserted so that the command line wins over the file and the file over
   the defaults (:func:`merge_config`);
3. every ``--option`` name has ``_`` turned into ``-`` up to the first ``.`` (``--tensor_parallel_size``
   is ``--tensor-parallel-size``); ``--group.field VALUE`` words are nested JSON of the group
   (``--logging-config.log_level DEBUG``);
4. argparse: ``--flag VALUE``, ``--flag=VALUE``, short aliases ``-tp 2``/``-tp=2``; booleans of
   the config dataclasses are ``BooleanOptionalAction`` (``--enable-expert-parallel`` and
   ``--no-enable-expert-parallel``); the last occurrence wins.

The positional ``model_tag`` is the model for ``vllm serve`` only (``ServeSubcommand.cmd`` copies it
to ``--model``); ``python -m ...api_server`` accepts it but never reads it, so there the model is
``--model`` or vLLM's default (``Qwen/Qwen3-0.6B``, ``vllm/config/model.py``).

:data:`FLAGS` is the table of the flags orch reads, with every spelling and the default per
release; ``tests/unit/remote/engines/vllm/test_server_args_oracle.py`` holds it (and this parser)
against the releases' ``vllm/engine/arg_utils.py``, ``vllm/config/*.py``, the front-end's
``cli_args.py`` and the release's own ``FlexibleArgumentParser``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ...protocol import internal_error
from ..errors import EngineError
from ..launch import Launch, LaunchError, known_forms

#: ``python -m`` module that starts vLLM's OpenAI-compatible server
ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
#: the console script's server subcommand
ENTRY_SERVE = "vllm serve"
#: vLLM's server image and the entry point it runs: the ``ENTRYPOINT`` of the ``vllm-openai`` stage of
#: vLLM's ``docker/Dockerfile``, ``vllm serve`` since 0.11.1 (0.11.1 to 0.34.0 read), ``python3 -m
#: vllm.entrypoints.openai.api_server`` up to 0.11.0 (0.8.5, 0.9.0, 0.10.0, 0.11.0 read)
IMAGE = "vllm/vllm-openai"
IMAGE_ENTRYPOINT = ("vllm", "serve")
IMAGE_ENTRYPOINT_BEFORE = ("python3", "-m", ENTRY_MODULE)
#: the first release whose image runs :data:`IMAGE_ENTRYPOINT`
IMAGE_SERVE_SINCE = (0, 11, 1)
#: the model vLLM serves when none is named (``ModelConfig.model``, 0.32.0-0.34.0)
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"


@internal_error("caught by orchestrator.facts.unit, which raises UnitError naming the unit")
class ServerArgsError(EngineError):
    """A vLLM launch command vLLM would refuse (a flag with no value, a bad integer, a ``--config``
    file it cannot merge); the message names the flag or file."""


class VllmEntryPoints:
    """vLLM's entry points for :func:`remote.engines.launch.resolve` (module docstring)."""

    name = "vllm"
    display_name = "vLLM"
    server_phrase = "a vLLM server"
    modules = (ENTRY_MODULE,)
    scripts = ("vllm",)
    forms = (f"<python> -m {ENTRY_MODULE}", "vllm serve MODEL (vLLM's console script)",
             f"the {IMAGE} container image")

    def enter_module(self, module: str, args: list[str], launch: Launch) -> None:
        """``<python> -m vllm.entrypoints.openai.api_server ARGS``: the parser receives ``ARGS``."""
        launch.entry = ENTRY_MODULE
        launch.entry_args = list(args)
        launch.server_argv = list(args)
        launch.forms.append(f"python -m {ENTRY_MODULE}")

    def enter_script(self, argv: list[str], launch: Launch) -> None:
        """``vllm serve ARGS`` (argv[0] the console script): the parser receives ``["serve", *ARGS]``.
        Raises :class:`LaunchError` for another subcommand (``vllm bench``, ``vllm chat``: no server)."""
        if len(argv) < 2 or argv[1] != "serve":
            sub = argv[1] if len(argv) > 1 else ""
            raise LaunchError(f"'vllm {sub}' does not start a server (orch knows 'vllm serve')")
        launch.entry = ENTRY_SERVE
        launch.entry_args = list(argv[2:])
        launch.server_argv = ["serve", *argv[2:]]
        launch.script = argv[0]
        launch.forms.append(ENTRY_SERVE)

    def image_entrypoint(self, image: str) -> tuple[str, ...] | None:
        """:func:`image_entrypoint` (the ``vllm/vllm-openai`` image's ``vllm serve``, or its api_server
        up to 0.11.0)."""
        return image_entrypoint(image)


#: vLLM's entry points (one object: the launch resolver's argument)
ENTRY_POINTS = VllmEntryPoints()
#: what a refusal lists as the forms orch knows for vLLM
KNOWN_FORMS = known_forms((ENTRY_POINTS,))

_IMAGE_RE = re.compile(r"^(?:(?:docker\.io|registry-1\.docker\.io|index\.docker\.io)/)?vllm/vllm-openai"
                       r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


_RELEASE_TAG_RE = re.compile(r":v?(\d+)\.(\d+)\.(\d+)(?![\d])")


def image_entrypoint(image: str) -> tuple[str, ...] | None:
    """The ``ENTRYPOINT`` of ``image`` when it is vLLM's server image (``vllm/vllm-openai``, any
    tag or digest, on Docker Hub), else None. vLLM's ``docker/Dockerfile``, stage ``vllm-openai``:
    ``("vllm", "serve")`` from 0.11.1 on (the console script: a first word that is not an option is
    the model), ``("python3", "-m", ENTRY_MODULE)`` up to 0.11.0. A release tag (``v0.10.2``,
    ``v0.9.0-cu128``) picks by its release; any other tag (``latest``, ``nightly``) or a digest
    alone is taken as a current image."""
    if not _IMAGE_RE.match(image or ""):
        return None
    tag = _RELEASE_TAG_RE.search(image.split("@", 1)[0].rsplit("/", 1)[-1])
    if tag and tuple(int(x) for x in tag.groups()) < IMAGE_SERVE_SINCE:
        return IMAGE_ENTRYPOINT_BEFORE
    return IMAGE_ENTRYPOINT


def container_command(image: str, entrypoint: str | None, command: list[str]) -> list[str] | None:
    """The command a container of ``image`` runs: ``--entrypoint`` (``entrypoint``, the run
    command's) followed by the run command's words after the image, else the image's own entry
    point (:func:`image_entrypoint`) followed by them; None when neither says what runs (an image
    orch does not know, run with its own entry point)."""
    if entrypoint:
        return [entrypoint, *command]
    own = image_entrypoint(image)
    if own is None:
        return list(command) if command else None
    return [*own, *command]


@dataclass(frozen=True)
class Flag:
    """One vLLM server setting orch reads.

    ``field``: the :class:`ServerArgs` attribute; ``options``: vLLM's spellings (its own name
    first, then the short alias of ``arg_utils.py``); ``kind``: ``str`` | ``int`` | ``bool``
    (``BooleanOptionalAction``: also ``--no-NAME``) | ``flag`` (``store_true``) | ``list``
    (``nargs="+"``); ``defaults``: ``((release, value), ...)`` oldest first; ``source``: the
    vLLM file whose dataclass field or ``add_argument`` defines it.
    """

    field: str
    options: tuple[str, ...]
    kind: str
    defaults: tuple[tuple[str, Any], ...]
    source: str

    @property
    def default(self) -> Any:
        """The default of the newest covered release."""
        return self.defaults[-1][1]


_ALL = "0.32.0"
_ENGINE, _PAR, _MODEL, _KERNEL = ("vllm/engine/arg_utils.py", "vllm/config/parallel.py", "vllm/config/model.py",
                                  "vllm/config/kernel.py")
_FRONT = "cli_args.py FrontendArgs"

#: The server flags orch reads (vLLM 0.32.0-0.34.0; ``EngineArgs.add_cli_args`` spellings).
FLAGS: tuple[Flag, ...] = (
    Flag("model", ("--model",), "str", ((_ALL, DEFAULT_MODEL),), _MODEL),
    Flag("served_model_name", ("--served-model-name",), "list", ((_ALL, None),), _MODEL),
    Flag("dtype", ("--dtype",), "str", ((_ALL, "auto"),), _MODEL),
    Flag("quantization", ("--quantization", "-q"), "str", ((_ALL, None),), _MODEL),
    Flag("download_dir", ("--download-dir",), "str", ((_ALL, None),), "vllm/config/load.py"),
    Flag("tp", ("--tensor-parallel-size", "-tp"), "int", ((_ALL, 1),), _PAR),
    Flag("pp", ("--pipeline-parallel-size", "-pp"), "int", ((_ALL, 1),), _PAR),
    Flag("dp", ("--data-parallel-size", "-dp"), "int", ((_ALL, 1),), _PAR),
    Flag("dp_local", ("--data-parallel-size-local", "-dpl"), "int", ((_ALL, None),), _PAR),
    Flag("pcp", ("--prefill-context-parallel-size", "-pcp"), "int", ((_ALL, 1),), _PAR),
    Flag("enable_expert_parallel", ("--enable-expert-parallel", "-ep"), "bool", ((_ALL, False),), _PAR),
    Flag("enable_eplb", ("--enable-eplb",), "bool", ((_ALL, False),), _PAR),
    Flag("all2all_backend", ("--all2all-backend",), "str", ((_ALL, None),), _PAR),
    Flag("nnodes", ("--nnodes", "-n"), "int", ((_ALL, 1),), _PAR),
    Flag("node_rank", ("--node-rank", "-r"), "int", ((_ALL, 0),), _PAR),
    Flag("moe_backend", ("--moe-backend",), "str", ((_ALL, "auto"),), _KERNEL),
    Flag("port", ("--port",), "int", ((_ALL, 8000),), _FRONT),
    Flag("host", ("--host",), "str", ((_ALL, None),), _FRONT),
    Flag("headless", ("--headless",), "flag", ((_ALL, False),), "cli_args.py make_arg_parser"),
    Flag("log_level", ("--log-level",), "str", ((_ALL, None),), _ENGINE),
)
#: option spelling -> :class:`ServerArgs` field
FLAG_ALIASES: dict[str, str] = {opt: f.field for f in FLAGS for opt in f.options}
_BY_FIELD = {f.field: f for f in FLAGS}
_NEGATED = {"--no-" + f.options[0][2:]: f.field for f in FLAGS if f.kind == "bool"}


@dataclass
class ServerArgs:
    """The parts of a vLLM launch command orch needs (defaults: vLLM 0.34.0's, :data:`FLAGS`).

    ``interpreter``/``argv``: the Python and the ``ExecStart=`` words (the caller's);
    ``entry``: :data:`ENTRY_SERVE` or :data:`ENTRY_MODULE`; ``launch_args``: what vLLM's parser
    receives (``--config`` merged); ``model_path``: the model vLLM loads (``--model``, the
    positional one of ``vllm serve``, else :data:`DEFAULT_MODEL`); ``model_given``: the command
    names one; ``ignored_model_tag``: a positional word ``python -m ...api_server`` accepts and
    never reads; ``served_model_names``: ``--served-model-name`` (all of them); ``tp``, ``pp``,
    ``dp``: parallel sizes; ``enable_expert_parallel``; ``port`` (8000); ``host`` (``""``: every
    interface, vLLM's ``None``); ``moe_backend`` (lower case, ``-`` as ``_``); ``log_level``:
    ``--log-level`` or ``--logging-config.log_level`` (None: ``VLLM_LOGGING_LEVEL`` decides);
    ``headless``: a node that serves no HTTP (multi-node data parallel).
    """

    interpreter: str = ""
    argv: list[str] = field(default_factory=list)
    entry: str = ENTRY_MODULE
    launch_args: list[str] = field(default_factory=list)
    config_file: str | None = None
    model_path: str | None = DEFAULT_MODEL
    model_given: bool = False
    ignored_model_tag: str | None = None
    served_model_names: list[str] = field(default_factory=list)
    download_dir: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_local: int | None = None
    pcp: int = 1
    enable_expert_parallel: bool = False
    enable_eplb: bool = False
    all2all_backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    port: int = 8000
    host: str = ""
    headless: bool = False
    log_level: str | None = None
    moe_backend_value: str = "auto"
    dist_init_addr: str | None = None
    disable_shared_experts_fusion: bool = False

    @property
    def moe_backend(self) -> str:
        """``--moe-backend`` as vLLM reads it (``auto`` when not given)."""
        return self.moe_backend_value

    @property
    def served_model_name(self) -> str | None:
        """The first ``--served-model-name`` (the name ``/v1/models`` lists first), None when not given."""
        return self.served_model_names[0] if self.served_model_names else None

    @property
    def ep(self) -> int:
        """Expert-parallel size: TP x DP with ``--enable-expert-parallel`` (vLLM's
        ``FusedMoEParallelConfig.make``: the experts are split over the flattened TP x DP ranks),
        else 1."""
        return self.tp * self.dp if self.enable_expert_parallel else 1

    @property
    def api_name(self) -> str:
        """The model name requests must use: the first served name, else the model path
        (``vllm/entrypoints/openai/models/serving.py`` ``base_model_paths``)."""
        return self.served_model_name or (self.model_path or DEFAULT_MODEL)


def config_file(server_argv: list[str]) -> str | None:
    """The ``--config`` file ``server_argv`` names (None: none). Raises :class:`ServerArgsError`
    for two of them or one with no path (vLLM's ``_pull_args_from_config`` asserts one file and
    raises ``No config file specified!``). Only the exact word ``--config`` is merged, as vLLM's
    ``"--config" in args`` test: ``--config=FILE`` is never merged (argparse takes it as the value
    of ``make_arg_parser``'s ``--config`` option, which nothing reads), so its flags do not apply."""
    n = server_argv.count("--config")
    if n == 0:
        return None
    if n > 1:
        raise ServerArgsError("vLLM takes one --config file ('More than one config file specified!')")
    i = server_argv.index("--config")
    if i == len(server_argv) - 1:
        raise ServerArgsError("--config has no file ('No config file specified!')")
    return server_argv[i + 1]


def config_words(data: Any, path: str, bool_flags: frozenset[str] | None = None) -> list[str]:
    """The words vLLM's ``load_config_file`` makes of a parsed YAML ``data`` (file ``path``):
    ``--KEY VALUE`` per key in file order; a true boolean ``--KEY``, a false one ``--no-KEY`` where
    vLLM has that option (``bool_flags``: the ``BooleanOptionalAction`` names orch knows; other
    false booleans are dropped); a list ``--KEY item ...`` (nothing when empty); a mapping
    ``--KEY '<JSON>'``; anything else ``--KEY str(value)``. Raises :class:`ServerArgsError` for a
    file that is not ``.yaml``/``.yml`` or not a mapping."""
    ext = path.rsplit(".", 1)[-1]
    if ext not in ("yaml", "yml"):
        raise ServerArgsError(f"vLLM's --config must be a yaml/yml file, got {path!r} "
                              f"('Config file must be of a yaml/yml type. {ext} supplied')")
    if not isinstance(data, dict):
        raise ServerArgsError(f"--config {path}: vLLM reads a YAML mapping of flag names to values")
    known = bool_flags if bool_flags is not None else frozenset(
        f.options[0][2:] for f in FLAGS if f.kind == "bool")
    out: list[str] = []
    for key, value in data.items():
        key = str(key)
        if isinstance(value, bool):
            if value:
                out.append("--" + key)
            elif key.replace("_", "-") in known:
                out.append("--no-" + key)
        elif isinstance(value, list):
            if value:
                out += ["--" + key, *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += ["--" + key, json.dumps(value)]
        else:
            out += ["--" + key, str(value)]
    return out


def merge_config(server_argv: list[str], data: Any, path: str) -> list[str]:
    """``server_argv`` with the ``--config`` file ``path`` (parsed YAML ``data``) merged as vLLM's
    ``_pull_args_from_config`` merges it: for the api_server (first word an option, or none) the
    file's words go first; for ``serve`` after ``serve MODEL`` when the command line has the
    model, else right after ``serve``; ``--config FILE`` itself is removed. Precedence: the
    command line, then the file, then the defaults. Raises :class:`ServerArgsError` for a file
    vLLM refuses and for ``vllm serve`` with a model in neither place ("No model specified!")."""
    args = list(server_argv)
    if config_file(args) is None:
        return args
    index = args.index("--config")
    words = config_words(data, path)
    if not args[0].startswith("-") and args[0] == "serve":
        in_cli = len(args) > 1 and not args[1].startswith("-")
        if not in_cli and "--model" not in words:
            raise ServerArgsError(f"vllm serve names no model on its command line nor in --config {path} "
                                  "('No model specified!')")
        cut = 2 if in_cli else 1
        return args[:cut] + words + args[cut:index] + args[index + 2:]
    return words + args[:index] + args[index + 2:]


_DASHES = re.compile(r"(?<=--)[^.]*")


def _normalise(args: list[str]) -> list[str]:
    """vLLM's option-name rule: ``_`` -> ``-`` in a ``--name`` up to the first ``.``."""
    out = []
    for a in args:
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out.append(_DASHES.sub(lambda m: m.group(0).replace("_", "-"), k, count=1) + "=" + v)
            else:
                out.append(_DASHES.sub(lambda m: m.group(0).replace("_", "-"), a, count=1))
        else:
            out.append(a)
    return out


def _serve_model_first(args: list[str]) -> list[str]:
    """``vllm serve``'s rewrite: the first ``--model`` (``--model X`` or ``--model=X``) becomes the
    word after ``serve``; a command with an option first, ``--served-model-name`` and no
    ``--config`` is refused."""
    for i, a in enumerate(args):
        if a == "--model" or a.startswith("--model="):
            if a == "--model":
                if i + 1 >= len(args):
                    raise ServerArgsError("flag --model has no value")
                tag, rest = args[i + 1], i + 2
            else:
                tag, rest = a[len("--model="):], i + 1
            args = ["serve", tag, *args[1:i], *args[rest:]]
            break
    if len(args) > 1 and args[1].startswith("-") and "--config" not in args and any(
            re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args):
        raise ServerArgsError("vllm serve with --served-model-name needs the model as its first word "
                              "('`model` should be provided as the first positional argument')")
    return args


def _int(key: str, val: str) -> int:
    try:
        return int(val)
    except ValueError:
        raise ServerArgsError(f"flag {key} must be an integer, got {val!r}") from None


def parse_server_args(args: list[str]) -> ServerArgs:
    """The :class:`ServerArgs` of what vLLM's parser receives (:attr:`Launch.server_argv`: a
    leading ``serve`` for ``vllm serve``; the ``--config`` file merged by :func:`merge_config`, or
    still named: then ``config_file`` is set and its flags are not read). ``interpreter`` and
    ``argv`` are the caller's. Raises :class:`ServerArgsError` for a flag orch reads with no value
    or a bad integer, and where vLLM refuses the command (see :func:`_serve_model_first`).

    Approximation: an option orch does not read is taken to have the next word as its value when
    that word is no option (vLLM's options without a value, e.g. ``--enforce-eager``, are many; a
    model placed right after one of them is not seen): ``vllm serve MODEL ...``, the form vLLM's
    usage line gives, is always read right."""
    sa = ServerArgs(launch_args=list(args))
    words = list(args)
    positional: list[str] = []
    if words[:1] == ["serve"]:
        sa.entry = ENTRY_SERVE
        words = _serve_model_first(words)[1:]
        if words and not words[0].startswith("-"):
            positional.append(words.pop(0))
    words = _normalise(words)
    dotted: dict[str, str] = {}
    j = 0
    while j < len(words):
        tok = words[j]
        if tok == "--config":
            sa.config_file = words[j + 1] if j + 1 < len(words) else None
            j += 2
            continue
        if not tok.startswith("-") or tok == "-":
            positional.append(tok)
            j += 1
            continue
        key, val = (tok.split("=", 1) + [None])[:2] if "=" in tok else (tok, None)
        if key.startswith("--") and "." in key:
            if val is None:
                val = words[j + 1] if j + 1 < len(words) else ""
                j += 1
            dotted[key[2:]] = val
            j += 1
            continue
        if key in _NEGATED:
            setattr(sa, _NEGATED[key], False)
            j += 1
            continue
        name = FLAG_ALIASES.get(key)
        if name is None:
            # an option orch does not read: its value (the next word, when no option) is skipped
            j += 2 if val is None and j + 1 < len(words) and not words[j + 1].startswith("-") else 1
            continue
        kind = _BY_FIELD[name].kind
        if kind in ("bool", "flag"):
            setattr(sa, name, True)
            j += 1
            continue
        if kind == "list":
            vals = [val] if val is not None else []
            k = j + 1
            if val is None:
                while k < len(words) and not words[k].startswith("-"):
                    vals.append(words[k])
                    k += 1
            if not vals:
                raise ServerArgsError(f"flag {key} has no value")
            sa.served_model_names = vals
            j = k
            continue
        if val is None:
            if j + 1 >= len(words):
                raise ServerArgsError(f"flag {key} has no value")
            val = words[j + 1]
            j += 2
        else:
            j += 1
        if kind == "int":
            setattr(sa, name, _int(key, val))
        elif name == "moe_backend":
            sa.moe_backend_value = val.lower().replace("-", "_")
        elif name == "model":
            sa.model_path, sa.model_given = val, True
        elif name == "host":
            sa.host = val
        else:
            setattr(sa, name, val)
    if positional:
        if sa.entry == ENTRY_SERVE:
            sa.model_path, sa.model_given = positional[0], True
        else:
            sa.ignored_model_tag = positional[0]
    if sa.log_level is None and "logging-config.log_level" in dotted:
        sa.log_level = dotted["logging-config.log_level"]
    if sa.pcp > 1:
        # vLLM flattens the experts' TP across DP and PCP (FusedMoEParallelConfig.make,
        # flatten_tp_across_dp_and_pcp, 0.32.0-0.34.0): N = intermediate / (TP x DP x PCP), EP over all
        # three. orch's MoE shape reads TP and DP only, so it would tune a file this server never reads
        raise ServerArgsError(f"--prefill-context-parallel-size {sa.pcp}: orch does not read the MoE shape of "
                              "prefill context parallelism yet (vLLM splits the experts over TP x DP x PCP); "
                              "nothing was stopped")
    return sa


#: vLLM's log-level variable and its default (``vllm/envs.py``)
LOGGING_LEVEL_ENV, LOGGING_LEVEL_DEFAULT = "VLLM_LOGGING_LEVEL", "INFO"


def effective_log_level(server: ServerArgs, environment: dict[str, str]) -> str:
    """The level vLLM's logger runs at: ``--log-level``, else ``--logging-config.log_level``,
    else ``$VLLM_LOGGING_LEVEL`` (upper-cased, ``vllm/envs.py``), else ``INFO``
    (``vllm/logger.py`` ``configure_logging_from_args``; ``vllm/config/logging.py``
    ``LoggingConfig.log_level``)."""
    if server.log_level:
        return server.log_level.upper()
    return (environment.get(LOGGING_LEVEL_ENV) or LOGGING_LEVEL_DEFAULT).upper()
