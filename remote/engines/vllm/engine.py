"""vLLM as an :class:`~remote.engines.interface.Engine`: the interface bound to the modules of this
folder (standard library only).

Each method hands its arguments to the module that holds the rule (and the vLLM release file and
function it follows); nothing here decides anything of its own. docs/architecture.md lists the
method -> module table, and ``tests/unit/remote/engines/vllm/test_engine.py`` checks that
:data:`ENGINE` implements the whole interface and answers as those modules do.
"""

from __future__ import annotations

import argparse
import glob
import os
from typing import Any, Callable, Mapping

from ..launch import ContainerHook, Launch
from ..records import AutotuneState, Generation, HttpRequest, MoeLogReport, MoeRunner, RootHazards
from . import autotune, env, http, launcher, lookup, model_flags, moe_log, naming, server_args
from . import runner as runner_rules

#: vLLM's batch sizes for a tune: those of its own tuner (``benchmarks/kernels/benchmark_moe.py``
#: ``main``'s default list), which is the list SGLang's tuner uses too
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


class VllmEngine:
    """vLLM (module docstring). Stateless: one instance, :data:`ENGINE`."""

    # 1. identity
    name = "vllm"
    display_name = "vLLM"

    # 2. the unit's command line (launcher.py, server_args.py)
    entry_points = server_args.ENTRY_POINTS

    def resolve_launch(self, argv: list[str], *, prefixes: str = "", workdir: str = "",
                       environment: dict[str, str] | None = None, container: ContainerHook | None = None) -> Launch:
        """:func:`remote.engines.vllm.launcher.resolve`."""
        return launcher.resolve(argv, prefixes=prefixes, workdir=workdir, environment=environment, container=container)

    def launch_refusal(self, exec_start: list[str], why: str) -> str:
        """:func:`remote.engines.vllm.launcher.refusal`."""
        return launcher.refusal(exec_start, why)

    def is_console_script(self, text: str) -> bool:
        """:func:`remote.engines.vllm.launcher.is_vllm_script`."""
        return launcher.is_vllm_script(text)

    def is_server_process(self, argv: list[str], entry_args: list[str]) -> bool:
        """:func:`remote.engines.vllm.launcher.is_entry_process`."""
        return launcher.is_entry_process(argv, entry_args)

    def is_own_process(self, cmd: str) -> bool:
        """:func:`remote.engines.vllm.launcher.is_vllm_process`."""
        return launcher.is_vllm_process(cmd)

    def parse_server_args(self, args: list[str]) -> server_args.ServerArgs:
        """:func:`remote.engines.vllm.server_args.parse_server_args`."""
        return server_args.parse_server_args(args)

    config_flag = "--config"

    def config_file(self, server_argv: list[str]) -> str | None:
        """:func:`remote.engines.vllm.server_args.config_file`."""
        return server_args.config_file(server_argv)

    def merge_config(self, server_argv: list[str], path: str, load: Callable[[], object]) -> list[str]:
        """:func:`remote.engines.vllm.server_args.merge_config` (the file's name is checked first,
        by :func:`remote.engines.vllm.server_args.config_words`, before ``load`` reads it)."""
        server_args.config_words({}, path)  # raises for a file vLLM refuses by its name
        return server_args.merge_config(server_argv, load(), path)

    # 3. the environment (env.py, lookup.py)
    env_keys = env.SERVER_ENV_KEYS
    payload_env_keys = env.PAYLOAD_ENV_KEYS
    config_dir_env = env.CONFIG_DIR_ENV

    def config_dir_note(self) -> str:
        """:func:`remote.engines.vllm.lookup.config_dir_note`."""
        return lookup.config_dir_note()

    # 4. shape and file names (model_flags.py, shape.py, naming.py)
    def add_model_flags(self, parser: argparse.ArgumentParser, command: str) -> None:
        """:func:`remote.engines.vllm.model_flags.add_model_flags`."""
        model_flags.add_model_flags(parser, command)

    def model_argv(self, values: Mapping[str, Any]) -> list[str]:
        """:func:`remote.engines.vllm.model_flags.model_argv`."""
        return model_flags.model_argv(values)

    def shape_from_args(self, args: argparse.Namespace, capability: tuple[int, int] | None = None) -> tuple[Any, str]:
        """:func:`remote.engines.vllm.model_flags.shape_from_args`."""
        return model_flags.shape_from_args(args, capability)

    def model_facts(self, config_path: str) -> dict[str, Any]:
        """:func:`remote.engines.vllm.model_flags.model_facts`."""
        return model_flags.model_facts(config_path)

    def device_name(self, torch_name: str) -> str:
        """:func:`remote.engines.vllm.naming.vllm_device_name`."""
        return naming.vllm_device_name(torch_name)

    def device_name_hint(self, name: str) -> str | None:
        """The torch form (``NVIDIA H200``) of a name typed in vLLM's file-name form (``NVIDIA_H200``);
        None for a name with a space (already the torch form)."""
        if " " in name or "_" not in name:
            return None
        return name.replace("_", " ")

    def parse_config_file_name(self, name: str) -> dict | None:
        """:func:`remote.engines.vllm.naming.parse_config_file_name`, with the interface's keys
        (``device_name``; ``per_channel_quant`` always False: vLLM names no per-channel selector)."""
        parts = naming.parse_config_file_name(name)
        if parts is None:
            return None
        return {"E": parts["E"], "N": parts["N"], "device_name": parts["device"], "dtype": parts["dtype"],
                "block_shape": parts["block_shape"], "per_channel_quant": False, "down": parts["down"]}

    default_batch_sizes = DEFAULT_BATCH_SIZES
    #: ``SPLIT_K``: vLLM's WNA16 Triton launch passes the entry to ``fused_moe_kernel_gptq_awq``,
    #: which requires it (``invoke_fused_moe_triton_kernel`` overwrites it with 1); shipped files carry it
    config_extra_fields = lookup.EXTRA_FIELDS

    # 5. where config files are read (lookup.py)
    def lookup(self, *, config_dir: str | None, triton_version: str | None, device_name: str | None,
               shape: Any | None, warnings: list[str]) -> dict[str, Any]:
        """:func:`remote.engines.vllm.lookup.lookup_facts`."""
        return lookup.lookup_facts(config_dir=config_dir, triton_version=triton_version, device_name=device_name,
                                   shape=shape, warnings=warnings)

    def files_bypassed(self, server: server_args.ServerArgs, version: str | None) -> str | None:
        """None: no vLLM server flag makes it skip the files (``VLLM_BATCH_INVARIANT=1``, which does,
        is an environment variable: the probe's lookup sees it, ``would_load`` None)."""
        return None

    def root_hazards(self, *, configs_root: str | None, unparsable: list[str], misses: Mapping[str, bool],
                     loader_rules: Mapping[str, Any], environment: Mapping[str, str], working_directory: str | None,
                     folder_exists: Callable[[str], bool | None]) -> RootHazards:
        """:func:`remote.engines.vllm.lookup.root_hazards` (vLLM lists no folder, so no entry can
        crash its lookup; an empty or relative ``VLLM_TUNED_CONFIG_FOLDER`` is read from the
        server's working directory)."""
        return lookup.root_hazards(environment, working_directory, folder_exists)

    def pair_mismatch(self, up: Mapping[str, Any], down: Mapping[str, Any], version: str | None) -> str | None:
        """None: vLLM runs one file for both GEMMs (0.34.0's ``_down.json`` is the down GEMM's own TMA
        config, read alone: ``experts/triton_moe.py`` ``TritonExperts.apply``), so no pair must agree."""
        return None

    # 6. the log model (moe_log.py)
    def last_start_at(self, text: str) -> int:
        """:func:`remote.engines.vllm.moe_log.last_start_at`."""
        return moe_log.last_start_at(text)

    def parse_log(self, text: str) -> MoeLogReport:
        """:func:`remote.engines.vllm.moe_log.parse_moe_log`."""
        return moe_log.parse_moe_log(text)

    def verify_loaded(self, report: MoeLogReport, expected_paths: list[str]) -> list[str]:
        """:func:`remote.engines.vllm.moe_log.verify_loaded`."""
        return moe_log.verify_loaded(report, expected_paths)

    def role_of(self, path: str) -> str:
        """:func:`remote.engines.vllm.moe_log.role_of`."""
        return moe_log.role_of(path)

    def hidden_load_lines(self, server) -> str | None:
        """:func:`remote.engines.vllm.moe_log.hidden_load_lines` of ``--log-level`` (the unit's
        ``VLLM_LOGGING_LEVEL`` is not in :class:`ServerArgs`: a level set only there is not seen)."""
        return moe_log.hidden_load_lines(getattr(server, "log_level", None))

    # 7. the MoE runner (runner.py)
    runner_flag = runner_rules.MOE_BACKEND_FLAG
    runner_config_key = "moe-backend"
    runner_field = moe_log.RUNNER_FIELD
    triton_runner = "triton"

    def moe_runner(self, server: server_args.ServerArgs, probe: Mapping[str, Any], *, backend: str | None = None,
                   log: MoeLogReport | None = None) -> MoeRunner:
        """:func:`remote.engines.vllm.runner.moe_runner` of the unit's ``--moe-backend`` (or
        ``backend``), expert parallelism and quantization, the probe and the last start's log."""
        return runner_rules.moe_runner(backend=backend or server.moe_backend, probe=dict(probe), ep=server.ep,
                                       quantization=server.quantization, log=log)

    def runner_candidates(self, text: str, version: str | None, effective: Callable[[str], str | None]) -> list[str]:
        """:func:`remote.engines.vllm.runner.parse_candidates` (the choices are the same in 0.32.0-0.34.0)."""
        return runner_rules.parse_candidates(text, effective)

    def with_runner(self, words: list[str], runner: str) -> list[str]:
        """:func:`remote.engines.vllm.runner.with_backend`."""
        return runner_rules.with_backend(words, runner)

    # 8. requests (http.py)
    liveness_path = http.MODELS_PATH
    health_path = http.HEALTH_PATH

    def generate_request(self, prompt: str, max_new_tokens: int) -> HttpRequest:
        """:func:`remote.engines.vllm.http.greedy_request`."""
        return http.greedy_request(prompt, max_new_tokens)

    def parse_generation(self, answer: object) -> Generation:
        """:func:`remote.engines.vllm.http.parse_generation`."""
        return http.parse_generation(answer)

    def bench_request(self, input_ids: list[int], output_len: int) -> HttpRequest:
        """:func:`remote.engines.vllm.http.bench_request`."""
        return http.bench_request(input_ids, output_len)

    def bench_chunk(self, chunk: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        """:func:`remote.engines.vllm.http.bench_chunk`."""
        return http.bench_chunk(chunk)

    #: ``bench --tool vllm``: vLLM's own ``vllm bench serve`` (:mod:`remote.engines.vllm.bench_tool`)
    bench_tool = "vllm"

    def run_bench_tool(self, **kwargs: Any) -> dict[str, Any]:
        """:func:`remote.engines.vllm.bench_tool.run_vllm` (imported when asked: it starts vLLM's client)."""
        from . import bench_tool

        return bench_tool.run_vllm(**kwargs)

    # 9. caches that are host state (autotune.py)
    def autotune_cache_root(self, environment: Mapping[str, str], workdir: str | None, home: str | None) -> str | None:
        """:func:`remote.engines.vllm.autotune.cache_root`."""
        return autotune.cache_root(environment, workdir, home)

    #: vLLM has no variable that turns reuse of its FlashInfer autotune cache off
    autotune_reuse_env = None

    def autotune_cache_dir(self, root: str, *, environment: Mapping[str, str] | None = None,
                           workdir: str | None = None, home: str | None = None) -> str | None:
        """:func:`remote.engines.vllm.autotune.autotune_dir`: ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` of
        ``environment`` when set, else ``<root>/flashinfer_autotune_cache``."""
        return autotune.autotune_dir(environment or {}, root, workdir, home)

    def autotune_state(self, server: server_args.ServerArgs, probe: Mapping[str, Any], runner: MoeRunner,
                       environment: Mapping[str, str], log: MoeLogReport | None) -> AutotuneState | None:
        """None: orch does not read vLLM's FlashInfer autotune cache as host state yet (its runners'
        :attr:`MoeRunner.autotunes` are False)."""
        return None

    def trial_key(self, server: server_args.ServerArgs) -> dict[str, Any]:
        """:func:`remote.engines.vllm.autotune.trial_key`."""
        return autotune.trial_key(server)

    # 10. the tuner's kernel (provider.py)
    provider_name = "vllm"
    provider_target = "remote.engines.vllm.provider:VllmProvider"

    def provider_missing(self) -> str | None:
        """Why the ``vllm`` provider cannot run here (read from disk, nothing imported): no ``vllm``
        package, no fused-MoE module (``model_executor/layers/fused_moe/fused_moe.py``), or no compiled
        ops (``vllm/_C*.so``: ``vllm/_custom_ops.py`` imports them through
        ``current_platform.import_kernels``)."""
        try:
            dirs = lookup.package_dirs()
            if not dirs:
                return "vllm is not installed for this interpreter"
            if not os.path.isfile(os.path.join(dirs[0], lookup.LOADER_MODULE)):
                return f"this vLLM has no {lookup.LOADER_MODULE}"
            if not glob.glob(os.path.join(dirs[0], "_C*.so")):
                return f"this vLLM has no compiled ops ({dirs[0]}/_C*.so)"
        except OSError as exc:
            return f"cannot look for vLLM's fused-MoE kernel: {exc}"
        return None

    def load_recorded_routing(self, path: str) -> Any:
        """Raises ``ValueError``: orch reads no routing vLLM records (``orch_tune_routing_file``)."""
        raise ValueError(f"{path}: orch reads no routing file recorded by vLLM")


#: vLLM, the engine object the registry holds
ENGINE = VllmEngine()
