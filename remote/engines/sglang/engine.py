"""SGLang as an :class:`~remote.engines.interface.Engine`: the interface bound to the modules of this
folder (standard library only).

Each method hands its arguments to the module that holds the rule (and the SGLang release file
and function it follows); nothing here decides anything of its own. docs/architecture.md lists
the method -> module table, and ``tests/unit/remote/engines/sglang/test_engine.py`` checks that
:data:`ENGINE` implements the whole interface and answers as those modules do.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Mapping

from ..launch import ContainerHook, Launch
from ..records import AutotuneState, Generation, HttpRequest, MoeLogReport, MoeRunner, RootHazards
from . import (autotune, bypass, config_root, defaults, env, http, kernel_roles, launcher, lookup, model_flags, moe_log,
               naming, pairs, runner_choices, server_args, server_config)
from . import runner as runner_rules


class SglangEngine:
    """SGLang (module docstring). Stateless: one instance, :data:`ENGINE`."""

    # 1. identity
    name = "sglang"
    display_name = "SGLang"

    # 2. the unit's command line (launcher.py, server_args.py, server_config.py)
    entry_points = launcher.ENTRY_POINTS

    def resolve_launch(self, argv: list[str], *, prefixes: str = "", workdir: str = "",
                       environment: dict[str, str] | None = None, container: ContainerHook | None = None) -> Launch:
        """:func:`remote.engines.sglang.launcher.resolve`."""
        return launcher.resolve(argv, prefixes=prefixes, workdir=workdir, environment=environment, container=container)

    def launch_refusal(self, exec_start: list[str], why: str) -> str:
        """:func:`remote.engines.sglang.launcher.refusal`."""
        return launcher.refusal(exec_start, why)

    def is_console_script(self, text: str) -> bool:
        """:func:`remote.engines.sglang.launcher.is_sglang_script`."""
        return launcher.is_sglang_script(text)

    def is_server_process(self, argv: list[str], entry_args: list[str]) -> bool:
        """:func:`remote.engines.sglang.launcher.is_entry_process` for either entry point."""
        return any(launcher.is_entry_process(argv, entry, entry_args)
                   for entry in (launcher.ENTRY_MODULE, launcher.ENTRY_SERVE))

    def is_own_process(self, cmd: str) -> bool:
        """:func:`remote.engines.sglang.launcher.is_sglang_process`."""
        return launcher.is_sglang_process(cmd)

    def parse_server_args(self, args: list[str]) -> server_args.ServerArgs:
        """:func:`remote.engines.sglang.server_args.parse_launch_args`."""
        return server_args.parse_launch_args(args)

    config_flag = server_config.CONFIG_FLAG

    def config_file(self, server_argv: list[str]) -> str | None:
        """:func:`remote.engines.sglang.server_config.config_path` (``--config FILE.yaml``)."""
        return server_config.config_path(server_argv)

    def merge_config(self, server_argv: list[str], path: str, load: Callable[[], object]) -> list[str]:
        """:func:`remote.engines.sglang.server_config.check_config_name`, then
        :func:`remote.engines.sglang.server_config.merged_args` with SGLang's ``store_true`` flags."""
        server_config.check_config_name(path)
        return server_config.merged_args(server_argv, load(), path, store_true=server_args.BOOL_FLAGS)

    # 3. the environment (env.py, lookup.py)
    env_keys = env.SERVER_ENV_KEYS
    payload_env_keys = env.PAYLOAD_ENV_KEYS
    config_dir_env = env.CONFIG_DIR_ENV

    def config_dir_note(self) -> str:
        """:func:`remote.engines.sglang.lookup.config_dir_note`."""
        return lookup.config_dir_note()

    # 4. shape and file names (model_flags.py, shape.py, naming.py, defaults.py)
    def add_model_flags(self, parser: argparse.ArgumentParser, command: str) -> None:
        """:func:`remote.engines.sglang.model_flags.add_model_flags`."""
        model_flags.add_model_flags(parser, command)

    def model_argv(self, values: Mapping[str, Any]) -> list[str]:
        """:func:`remote.engines.sglang.model_flags.model_argv`."""
        return model_flags.model_argv(values)

    def shape_from_args(self, args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[Any, str]:
        """:func:`remote.engines.sglang.model_flags.shape_from_args`."""
        return model_flags.shape_from_args(args, capability=capability)

    def model_facts(self, config_path: str) -> dict[str, Any]:
        """:func:`remote.engines.sglang.model_flags.model_facts`."""
        return model_flags.model_facts(config_path)

    def device_name(self, torch_name: str) -> str:
        """:func:`remote.engines.sglang.naming.sglang_device_name`."""
        return naming.sglang_device_name(torch_name)

    def device_name_hint(self, name: str) -> str | None:
        """:func:`remote.engines.sglang.naming.torch_form_hint`."""
        return naming.torch_form_hint(name)

    def parse_config_file_name(self, name: str) -> dict | None:
        """:func:`remote.engines.sglang.naming.parse_config_file_name`."""
        return naming.parse_config_file_name(name)

    default_batch_sizes = defaults.DEFAULT_BATCH_SIZES
    #: none: SGLang's kernel launch takes no other keyword (an unknown field would fail it)
    config_extra_fields = ()

    # 5. where config files are read (lookup.py)
    def lookup(self, *, config_dir: str | None, triton_version: str | None, device_name: str | None,
               shape: Any | None, warnings: list[str]) -> dict[str, Any]:
        """:func:`remote.engines.sglang.lookup.lookup_facts`."""
        return lookup.lookup_facts(config_dir=config_dir, triton_version=triton_version, device_name=device_name,
                                   shape=shape, warnings=warnings)

    # 5b. what makes the files moot or dangerous (bypass.py, config_root.py, pairs.py)
    def files_bypassed(self, server: server_args.ServerArgs, version: str | None) -> str | None:
        """:func:`remote.engines.sglang.bypass.files_bypassed` of the launch arguments and
        ``--enable-deterministic-inference``."""
        return bypass.files_bypassed(list(server.launch_args or []), bool(server.enable_deterministic_inference),
                                     version)

    def root_hazards(self, *, configs_root: str | None, unparsable: list[str], misses: Mapping[str, bool],
                     loader_rules: Mapping[str, Any], environment: Mapping[str, str], working_directory: str | None,
                     folder_exists: Callable[[str], bool | None]) -> RootHazards:
        """:func:`remote.engines.sglang.config_root.root_hazards`."""
        return config_root.root_hazards(configs_root=configs_root, unparsable=unparsable, misses=misses,
                                        loader_rules=loader_rules, environment=environment,
                                        working_directory=working_directory, folder_exists=folder_exists)

    def pair_mismatch(self, up: Mapping[str, Any], down: Mapping[str, Any], version: str | None) -> str | None:
        """:func:`remote.engines.sglang.pairs.mismatch_warning`."""
        return pairs.mismatch_warning(dict(up), dict(down), version)

    # 6. the log model (moe_log.py)
    def last_start_at(self, text: str) -> int:
        """:func:`remote.engines.sglang.moe_log.last_start_at`."""
        return moe_log.last_start_at(text)

    def parse_log(self, text: str) -> MoeLogReport:
        """:func:`remote.engines.sglang.moe_log.parse_moe_log`."""
        return moe_log.parse_moe_log(text)

    def verify_loaded(self, report: MoeLogReport, expected_paths: list[str]) -> list[str]:
        """:func:`remote.engines.sglang.moe_log.verify_loaded`."""
        return moe_log.verify_loaded(report, expected_paths)

    def role_of(self, path: str) -> str:
        """:func:`remote.engines.sglang.moe_log.role_of`."""
        return moe_log.role_of(path)

    def hidden_load_lines(self, server) -> str | None:
        """:func:`remote.engines.sglang.moe_log.hidden_load_lines`."""
        return moe_log.hidden_load_lines(server.log_level)

    # 7. the MoE runner (runner.py, runner_choices.py, server_args.py)
    runner_flag = server_args.RUNNER_FLAG
    runner_config_key = server_config.RUNNER_CONFIG_KEY
    runner_field = moe_log.RUNNER_FIELD
    triton_runner = runner_rules.TRITON_RUNNER

    def moe_runner(self, server: server_args.ServerArgs, probe: Mapping[str, Any], *, backend: str | None = None,
                   log: MoeLogReport | None = None) -> MoeRunner:
        """:func:`remote.engines.sglang.runner.moe_runner` of the unit's flags and the probe
        (:func:`remote.engines.sglang.runner.probe_inputs`)."""
        return runner_rules.moe_runner(backend=backend or server.moe_backend, quantization=server.quantization,
                                       ep=server.ep, a2a_backend=server.moe_a2a_backend, log=log,
                                       **runner_rules.probe_inputs(dict(probe)))

    def runner_candidates(self, text: str, version: str | None, effective: Callable[[str], str | None]) -> list[str]:
        """:func:`remote.engines.sglang.runner_choices.parse_candidates`."""
        return runner_choices.parse_candidates(text, version, effective)

    def with_runner(self, words: list[str], runner: str) -> list[str]:
        """:func:`remote.engines.sglang.server_args.with_runner`."""
        return server_args.with_runner(words, runner)

    # 8. requests (http.py)
    liveness_path = http.LIVENESS_PATH
    health_path = http.HEALTH_PATH

    def generate_request(self, prompt: str, max_new_tokens: int) -> HttpRequest:
        """:func:`remote.engines.sglang.http.generate_request`."""
        return http.generate_request(prompt, max_new_tokens)

    def parse_generation(self, answer: object) -> Generation:
        """:func:`remote.engines.sglang.http.parse_generation`."""
        return http.parse_generation(answer)

    def bench_request(self, input_ids: list[int], output_len: int) -> HttpRequest:
        """:func:`remote.engines.sglang.http.bench_request`."""
        return http.bench_request(input_ids, output_len)

    def bench_chunk(self, chunk: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        """:func:`remote.engines.sglang.http.bench_chunk`."""
        return http.bench_chunk(chunk)

    #: ``bench --tool sglang``: SGLang's own ``bench_serving`` (:mod:`remote.engines.sglang.bench_tool`)
    bench_tool = "sglang"

    def run_bench_tool(self, **kwargs: Any) -> dict[str, Any]:
        """:func:`remote.engines.sglang.bench_tool.run_sglang` (imported when asked: it starts SGLang's client)."""
        from . import bench_tool

        return bench_tool.run_sglang(**kwargs)

    # 9. caches that are host state (autotune.py)
    def autotune_cache_root(self, environment: Mapping[str, str], workdir: str | None, home: str | None) -> str | None:
        """:func:`remote.engines.sglang.autotune.cache_root`."""
        return autotune.cache_root(environment, home, workdir)

    autotune_reuse_env = env.AUTOTUNE_CACHE_ENV

    def autotune_cache_dir(self, root: str, *, environment: Mapping[str, str] | None = None,
                           workdir: str | None = None, home: str | None = None) -> str | None:
        """:func:`remote.engines.sglang.autotune.autotune_root` (SGLang names no other folder for it:
        ``environment``, ``workdir`` and ``home`` are not read)."""
        return autotune.autotune_root(root)

    def autotune_state(self, server: server_args.ServerArgs, probe: Mapping[str, Any], runner: MoeRunner,
                       environment: Mapping[str, str], log: MoeLogReport | None) -> AutotuneState | None:
        """:func:`remote.engines.sglang.autotune.server_state` with the backend argument resolution
        leaves (:func:`remote.engines.sglang.runner.resolved_server_args`) and the last start's
        autotune lines and backend (``log.autotune``, ``log.start_runner``)."""
        probe = dict(probe)
        resolved = runner_rules.resolved_server_args(backend=server.moe_backend, quantization=server.quantization,
                                                     ep=server.ep, a2a_backend=server.moe_a2a_backend,
                                                     **runner_rules.probe_inputs(probe))
        return autotune.server_state(server, probe, runner, environment, log.autotune if log else None, resolved,
                                     log.start_runner if log else None)

    def trial_key(self, server: server_args.ServerArgs) -> dict[str, Any]:
        """:func:`remote.engines.sglang.autotune.trial_key`."""
        return autotune.trial_key(server)

    # 10. the tuner's kernel (provider.py)
    provider_name = "sglang"
    provider_target = "remote.engines.sglang.provider:SglangProvider"

    def provider_missing(self) -> str | None:
        """:func:`remote.engines.sglang.kernel_roles.sglang_entry_missing`."""
        return kernel_roles.sglang_entry_missing()

    def load_recorded_routing(self, path: str) -> Any:
        """:func:`remote.engines.sglang.routing_files.load_recorded`."""
        from . import routing_files

        return routing_files.load_recorded(path)


#: SGLang, the engine object the registry holds
ENGINE = SglangEngine()
