"""What orch needs from an inference engine: the :class:`Engine` interface (standard library only).

An engine is the server a systemd unit runs, whose fused-MoE Triton kernel reads per-shape tile
config files (:mod:`remote.engines.triton_moe` holds their shared format). orch adapts to it at
one place: each engine has a folder of its own under ``remote/engines/`` with an ``engine.py``
whose object implements :class:`Engine`, registered in ``ENGINES`` (``remote/engines/__init__.py``). The
controller (``orchestrator/``) reaches engine rules only through that object, chosen once per
host from the unit's command line (``engine_for`` of the same facade) and carried as the typed
fact ``orch_engine``; payload commands that need engine rules take ``--engine NAME``
(:data:`remote.protocol.ENGINE_NAMES`) or recognise the engine themselves.

The interface is engine-neutral: no method, argument or record here names an engine. The records
that cross it are in :mod:`remote.engines.records` (a MoE runner, a start's log, an autotune
cache, a generation) and :mod:`remote.engines.launch` (a resolved launch command); the server
arguments an engine parses satisfy :class:`ServerArgs`. Every method names, in its
implementation's docstring, the engine release file and function whose rule it follows, and the
engine's oracle tests hold it against the real releases.

Sections (docs/architecture.md lists which module implements each method, per engine):

1. identity: :attr:`Engine.name`, :attr:`Engine.display_name`;
2. the unit's command line: :attr:`Engine.entry_points`, :meth:`Engine.resolve_launch`,
   :meth:`Engine.launch_refusal`, :meth:`Engine.is_console_script`, :meth:`Engine.is_server_process`,
   :meth:`Engine.is_own_process`,
   :meth:`Engine.parse_server_args`, :attr:`Engine.config_flag`, :meth:`Engine.config_file`,
   :meth:`Engine.merge_config`;
3. the environment the server reads: :attr:`Engine.env_keys`, :attr:`Engine.payload_env_keys`,
   :attr:`Engine.config_dir_env`, :meth:`Engine.config_dir_note`;
4. the model's MoE shape and the config file names: :meth:`Engine.add_model_flags`,
   :meth:`Engine.model_argv`, :meth:`Engine.shape_from_args`, :meth:`Engine.model_facts`, :meth:`Engine.device_name`,
   :meth:`Engine.device_name_hint`, :meth:`Engine.parse_config_file_name`,
   :attr:`Engine.default_batch_sizes`, :attr:`Engine.config_extra_fields`;
5. where the server looks for config files: :meth:`Engine.lookup` (package tree, layouts, the
   config-dir variable, release fallbacks; run by the payload's ``probe`` on the host), and what
   makes the files moot or dangerous: :meth:`Engine.files_bypassed` (flags with which the server
   never reads them), :meth:`Engine.root_hazards` (a configs root the lookup crashes on or a
   config-dir variable that moves it), :meth:`Engine.pair_mismatch` (an up/down pair the server
   cannot run as measured);
6. the log model: :meth:`Engine.last_start_at`, :meth:`Engine.parse_log`,
   :meth:`Engine.verify_loaded`, :meth:`Engine.role_of`;
7. the MoE runner: :meth:`Engine.moe_runner`, :meth:`Engine.runner_candidates`,
   :attr:`Engine.runner_flag`, :attr:`Engine.runner_config_key`, :attr:`Engine.runner_field`,
   :attr:`Engine.triton_runner`,
   :meth:`Engine.with_runner`;
8. requests: :attr:`Engine.liveness_path`, :attr:`Engine.health_path`,
   :meth:`Engine.generate_request`, :meth:`Engine.parse_generation`, :meth:`Engine.bench_request`,
   :meth:`Engine.bench_chunk`, :attr:`Engine.bench_tool`, :meth:`Engine.run_bench_tool`;
9. caches that are host state: :meth:`Engine.autotune_cache_root`, :attr:`Engine.autotune_reuse_env`,
   :meth:`Engine.autotune_cache_dir`,
   :meth:`Engine.autotune_state`, :meth:`Engine.trial_key`;
10. the kernel the tuner times: :attr:`Engine.provider_name`, :meth:`Engine.provider_missing` (the
    tuner's registry, ``remote.tuning.providers``, loads the provider lazily from :attr:`Engine.provider_target`).
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

from .errors import EngineError
from .launch import ContainerHook, EntryPoints, Launch
from .records import AutotuneState, Generation, HttpRequest, MoeLogReport, MoeRunner, RootHazards


@runtime_checkable
class ServerArgs(Protocol):
    """The server settings orch reads from a unit's launch command, whatever the engine.

    ``interpreter``: the Python that runs the server; ``argv``: the ``ExecStart=`` words;
    ``launch_args``: the arguments the engine's own parser receives (its config file merged);
    ``config_file``: that config file (None: none); ``model_path``; ``served_model_name``;
    ``download_dir``; ``dtype`` (None: not given) and ``quantization`` (None: not given);
    ``tp``/``ep``/``pp``/``dp``: the parallel sizes; ``port``/``host``: where it listens;
    ``nnodes``/``node_rank``/``dist_init_addr``: a server spread over several hosts;
    ``disable_shared_experts_fusion``; ``moe_backend``: the MoE runner backend the command asks
    for (``auto`` when it names none). An engine's own record has more fields, which only that
    engine's methods read.
    """

    interpreter: str
    argv: list[str]
    launch_args: list[str]
    config_file: str | None
    model_path: str | None
    served_model_name: str | None
    download_dir: str | None
    dtype: str | None
    quantization: str | None
    tp: int
    ep: int
    pp: int
    dp: int
    port: int
    host: str
    nnodes: int
    node_rank: int
    dist_init_addr: str | None
    disable_shared_experts_fusion: bool

    @property
    def moe_backend(self) -> str:
        """The MoE runner backend the launch command asks for (``auto`` when none)."""


@runtime_checkable
class Engine(Protocol):
    """Everything orch needs from an inference engine (module docstring). Implementations hold no
    state of a host: every answer is a pure function of its arguments (the caller reads the host)."""

    # --------------------------------------------------------------------------- 1. identity

    #: the engine's name: ``orch_engine``'s value, the payload's ``--engine``, the tuning key's
    #: ``engine`` (one of :data:`remote.protocol.ENGINE_NAMES`)
    name: str
    #: how messages name the engine (its own spelling of its name)
    display_name: str

    # --------------------------------------------------------------------------- 2. the unit's command line

    #: the engine's launch forms, handed the command that remains once the wrappers are read
    #: (:func:`remote.engines.launch.resolve`)
    entry_points: EntryPoints

    def resolve_launch(self, argv: list[str], *, prefixes: str = "", workdir: str = "",
                       environment: dict[str, str] | None = None,
                       container: ContainerHook | None = None) -> Launch:
        """``ExecStart=`` words (variables expanded, systemd's prefixes ``prefixes`` split off) as a
        :class:`~remote.engines.launch.Launch` whose entry point is this engine's. Raises
        :class:`~remote.engines.launch.LaunchError` for a form the engine does not start."""

    def launch_refusal(self, exec_start: list[str], why: str) -> str:
        """The sentence that refuses ``exec_start``: the command, ``why``, and the forms orch knows."""

    def is_console_script(self, text: str) -> bool:
        """Whether ``text`` (a console script read on the host) is the engine's own entry script."""

    def is_server_process(self, argv: list[str], entry_args: list[str]) -> bool:
        """Whether a process command line ``argv`` is this engine's server started with the words
        ``entry_args`` (:attr:`Launch.entry_args`): a server's process or its fork."""

    def is_own_process(self, cmd: str) -> bool:
        """Whether a process command line (``/proc/PID/cmdline`` joined by spaces, as nvidia-smi's
        compute apps show it) is one of the engine's own processes: its server or a worker it starts."""

    def parse_server_args(self, args: list[str]) -> ServerArgs:
        """The :class:`ServerArgs` of ``args`` (what the engine's parser receives:
        :attr:`Launch.server_argv` with the config file merged), by the engine's flag rules;
        ``interpreter`` and ``argv`` left empty for the caller. Raises :class:`EngineError` for a
        flag the engine would refuse."""

    #: the flag that names a server config file (``--config``; None: the engine reads none)
    config_flag: str | None

    def config_file(self, server_argv: list[str]) -> str | None:
        """The server config file ``server_argv`` names (None: none). Raises :class:`EngineError`
        where the engine refuses the command line's use of it."""

    def merge_config(self, server_argv: list[str], path: str, load: Callable[[], object]) -> list[str]:
        """``server_argv`` with the config file ``path`` merged as the engine merges it; ``load()``
        reads and parses the file (YAML: the caller's, the payload being standard library only),
        called once the engine accepts the file's name. Raises :class:`EngineError` for a file
        the engine refuses."""

    # --------------------------------------------------------------------------- 3. the environment

    #: variables of the unit's environment the server reads that orch uses (compared with the
    #: running process's, shown by ``orch doctor``)
    env_keys: tuple[str, ...]
    #: those the payload must see too (where the model's config is, the GPUs, the config folder)
    payload_env_keys: tuple[str, ...]
    #: the variable that moves the folder the server reads config files from (None: none)
    config_dir_env: str | None

    def config_dir_note(self) -> str:
        """Which releases read :attr:`config_dir_env` (for a message that asks to set it)."""

    # --------------------------------------------------------------------------- 4. shape and file names

    def add_model_flags(self, parser: argparse.ArgumentParser, command: str) -> None:
        """Add the model flags of ``command`` (``tune``, ``names``, ``probe``, ``config-names``) to ``parser``."""

    def model_argv(self, values: Mapping[str, Any]) -> list[str]:
        """The argv that gives a payload command the model flags ``values`` (flag dest -> value)."""

    def shape_from_args(self, args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[Any, str]:
        """``(shape, model config path)`` of parsed model flags: the model's per-rank MoE shape
        (a record with ``E``, ``N``, ``hidden``, ``topk``, the name selectors, ``to_dict()`` and
        ``file_names(device_name, ...)``). Raises ``PayloadError('bad_input')``."""

    def model_facts(self, config_path: str) -> dict[str, Any]:
        """What the probe reports of a model config besides its shape, as the engine reads it:
        ``checkpoint_quant_method``, ``config_dtype``, ``model_type``."""

    def device_name(self, torch_name: str) -> str:
        """The GPU name as the engine writes it in config file names. Raises ``BadInput`` (a
        ``PayloadError`` and a ``ValueError``) for a name it refuses."""

    def device_name_hint(self, name: str) -> str | None:
        """The torch form a device name the operator typed probably meant (None: it is one)."""

    def parse_config_file_name(self, name: str) -> dict | None:
        """The parts of a config file name (``E``, ``N``, ``device_name``, ``dtype``, ``block_shape``,
        ``per_channel_quant``, ``down``); None when the engine cannot produce that name."""

    #: the batch sizes M the tuner times by default (tokens), the engine's own tuning list
    default_batch_sizes: tuple[int, ...]
    #: entry fields beyond the shared ones (``remote.engines.triton_moe.configfile``) that the engine's
    #: loader hands to its kernel and that a file may carry (validated as non-negative ints)
    config_extra_fields: tuple[str, ...]

    # --------------------------------------------------------------------------- 5. where config files are read

    def lookup(self, *, config_dir: str | None, triton_version: str | None, device_name: str | None,
               shape: Any | None, warnings: list[str]) -> dict[str, Any]:
        """What the server on this host reads (run by the payload's ``probe``, without importing
        the engine): ``engine`` (installed, version, package dir, loader rules, configs root...),
        ``triton_folder`` (the folder orch installs into, None where the engine keeps none per
        Triton release), ``exact_folder`` (the one the loader tries first), ``install_dir`` and
        ``install_dir_exists``, ``file_names`` (role -> name, as this release names them),
        ``existing`` (role -> ``folders``, ``in_installed_folder``, ``would_load``,
        ``fallback_error``, ``read_by_engine``) and ``unparsable_folders``; ``warnings`` gets what
        the operator should read."""

    def files_bypassed(self, server: ServerArgs, version: str | None) -> str | None:
        """Why the server started with ``server`` never reads the Triton config files whatever its
        MoE runner, under the engine release ``version`` (None: unknown, taken as the newest
        release's rules): one sentence naming the flag and the engine code that bypasses the files;
        None when it may read them. ``plan`` skips such a server before anything is stopped and
        ``orch doctor`` calls it ``not-applicable``."""

    def root_hazards(self, *, configs_root: str | None, unparsable: list[str], misses: Mapping[str, bool],
                     loader_rules: Mapping[str, Any], environment: Mapping[str, str], working_directory: str | None,
                     folder_exists: Callable[[str], bool | None]) -> RootHazards:
        """What in the server's configs root makes it crash or read elsewhere, as a
        :class:`~remote.engines.records.RootHazards`. ``configs_root``: the probed root (None: none);
        ``unparsable``: its entries the lookup cannot parse (the probe's ``unparsable_folders``);
        ``misses``: role -> whether a lookup the server makes finds no exact file for that role;
        ``loader_rules``: the probe's rules of this release; ``environment``: what the server gets;
        ``working_directory``: the unit's (None: the service manager's default);
        ``folder_exists(path)``: whether a folder is on the host (None: cannot be told), called only
        for a folder a config-dir variable points the server at. Raises nothing."""

    def pair_mismatch(self, up: Mapping[str, Any], down: Mapping[str, Any], version: str | None) -> str | None:
        """The warning for an installed up/down config pair (``up``, ``down``: the files as loaded,
        batch size M key -> entry, in the files' order) that disagrees where the engine release
        ``version`` (None: unknown, the newest rules) needs the two GEMMs to agree, in the words of
        that release's rule (the server dies, or runs a tile nobody measured); None when they agree
        or a table cannot be read that way (the config validator reports those)."""

    # --------------------------------------------------------------------------- 6. the log model

    def last_start_at(self, text: str) -> int:
        """Offset of the line where the last server start in ``text`` begins, -1 when none."""

    def parse_log(self, text: str) -> MoeLogReport:
        """One start's log ``text`` as a :class:`~remote.engines.records.MoeLogReport`: loaded,
        default, fallback and runner lines."""

    def verify_loaded(self, report: MoeLogReport, expected_paths: list[str]) -> list[str]:
        """Why the start of ``report`` does not count as running ``expected_paths`` ([] when it does)."""

    def role_of(self, path: str) -> str:
        """``up`` or ``down``: the GEMM a config file path is for."""

    def hidden_load_lines(self, server: ServerArgs) -> str | None:
        """Why the server's log cannot show which config files it loaded (its log level hides
        those lines and its start line), one phrase naming the level and the engine's rule; None
        when it logs them. A missing line then proves nothing, and the files
        on disk decide."""

    # --------------------------------------------------------------------------- 7. the MoE runner

    #: the launch flag that names the MoE runner backend
    runner_flag: str
    #: the server config file's key for it (None: the engine's config file has none)
    runner_config_key: str | None
    #: the server argument's name of the MoE runner backend, as a start's log shows it
    runner_field: str
    #: the runner backend whose start reads the Triton config files (a runner trial's Triton candidate)
    triton_runner: str

    def moe_runner(self, server: ServerArgs, probe: Mapping[str, Any], *, backend: str | None = None,
                   log: MoeLogReport | None = None) -> MoeRunner:
        """Which MoE runner ``server`` runs with ``backend`` (None: the one it asks for), from the
        payload's ``probe`` answer (a dict) and its last start's ``log`` (decisive where it shows
        the choice): a :class:`~remote.engines.records.MoeRunner` with ``reads_triton_configs`` and
        ``autotunes``. Raises nothing (unknown is an answer)."""

    def runner_candidates(self, text: str, version: str | None,
                          effective: Callable[[str], str | None]) -> list[str]:
        """The runner backends a trial starts for ``--moe-runners text`` on engine ``version``
        (``effective(backend)``: the runner a start with it runs). Raises ``PayloadError('bad_input')``."""

    def with_runner(self, words: list[str], runner: str) -> list[str]:
        """Command-line words with the MoE runner backend set to ``runner`` (every other word kept)."""

    # --------------------------------------------------------------------------- 8. requests

    #: answers as soon as the server listens (not readiness)
    liveness_path: str
    #: the health request
    health_path: str

    def generate_request(self, prompt: str, max_new_tokens: int) -> HttpRequest:
        """A greedy generation of ``prompt`` (``max_new_tokens`` tokens at most)."""

    def parse_generation(self, answer: object) -> Generation:
        """The text, output token ids and token count of an answer to :meth:`generate_request`."""

    def bench_request(self, input_ids: list[int], output_len: int) -> HttpRequest:
        """One streamed benchmark request in the engine's native API (``bench --api generate``): the
        prompt ``input_ids``, exactly ``output_len`` output tokens, greedy. (``--api openai`` is the
        OpenAI ``/v1/completions`` every engine serves, built by the benchmark itself.)"""

    def bench_chunk(self, chunk: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        """One decoded stream chunk of :meth:`bench_request`: ``(it carries text, its usage)``, the
        usage holding the cumulative ``completion_tokens`` and ``prompt_tokens`` when reported."""

    #: ``bench --tool NAME`` that runs the engine's own benchmark client (None: it has none)
    bench_tool: str | None

    def run_bench_tool(self, **kwargs: Any) -> dict[str, Any]:
        """Run the engine's own benchmark client once per level (the keywords of the payload's
        ``bench`` command: ``url``, ``levels``, ``input_len``, ``output_len``, ``num_prompts``,
        ``level_timeout``, ``seed``, ``model``, ``api``); the answer has the benchmark's metric names."""

    # --------------------------------------------------------------------------- 9. caches that are host state

    def autotune_cache_root(self, environment: Mapping[str, str], workdir: str | None,
                            home: str | None) -> str | None:
        """The root the server's start-up autotune cache lives under, as the server expands it:
        ``environment`` the server's, ``workdir`` its working directory (None: a relative value is
        left as written), ``home`` its user's home (None: unknown). None when it needs ``home``
        and ``home`` is None."""

    #: the variable that turns reuse of the autotune cache off (None: the engine has none)
    autotune_reuse_env: str | None

    def autotune_cache_dir(self, root: str, *, environment: Mapping[str, str] | None = None,
                           workdir: str | None = None, home: str | None = None) -> str | None:
        """The folder that holds every autotune cache file (what a runner trial backs up): under the
        cache root ``root``, unless the server's ``environment`` names another folder (``workdir``:
        its working directory, for a relative value; ``home``: its user's home, for ``~``; None:
        unknown). None when the answer needs ``home`` and it is None."""

    def autotune_state(self, server: ServerArgs, probe: Mapping[str, Any], runner: MoeRunner,
                       environment: Mapping[str, str], log: MoeLogReport | None) -> AutotuneState | None:
        """The start-up autotune of ``server`` (None: its runner does not autotune), from the
        ``probe`` answer, the server's ``environment`` and its last start's ``log``
        (:meth:`parse_log`; its ``autotune`` lines)."""

    def trial_key(self, server: ServerArgs) -> dict[str, Any]:
        """What, beyond the model, the GPU and the releases, decides a runner trial's measurement
        (flags that change the runners' kernels or their autotune): hosts that agree on it share a trial."""

    # --------------------------------------------------------------------------- 10. the tuner's kernel

    #: the ``tune --provider`` that times the engine's own kernel (None: the engine has none)
    provider_name: str | None
    #: ``module:Class`` of that provider (torch and triton: loaded only by the tuner's registry)
    provider_target: str | None

    def provider_missing(self) -> str | None:
        """Why the provider cannot run on this host (read from disk, nothing imported: the probe runs
        beside a serving unit), None when it can."""

    def load_recorded_routing(self, path: str) -> Any:
        """A routing the engine recorded (``orch_tune_routing_file``, on the host) as the fields of a
        ``remote.tuning.tuner.routing.Recorded`` (``kind``, ``source``, ``rows``: top-k ids
        [tokens, k], or ``shares``: per-expert shares, ``files``); raises ``ValueError`` naming the
        file for a file it cannot read, or for an engine that records no routing orch reads. Loads
        torch (the tuner only calls it)."""


def satisfies(engine: object) -> list[str]:
    """What ``engine`` lacks of :class:`Engine` ([] when it implements the interface): each member
    it does not have, and each method whose parameters are not the interface's (names, in order).
    Used by the tests of every engine; pure."""
    members = sorted({n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__))
    out = []
    for name in members:
        if not hasattr(engine, name):
            out.append(f"{name}: missing")
            continue
        want = vars(Engine).get(name)
        if callable(want) and not isinstance(want, property):
            mine = [p for p in inspect.signature(getattr(engine, name)).parameters]
            theirs = [p for p in inspect.signature(want).parameters if p != "self"]
            if mine != theirs:
                out.append(f"{name}: parameters {mine}, the interface's {theirs}")
    return out
