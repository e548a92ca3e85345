"""SGLang's rules, their one home: what the payload and the controller both follow (standard library only).

Each module names the SGLang release files it mirrors; the oracle tests hold it against the real
wheels (docs/sglang-releases.md):

- :mod:`remote.engines.sglang.naming`: config file names, device name, ``triton_*`` folder names and sort;
- :mod:`remote.engines.sglang.model_config`: finding and reading a model's config.json (HF cache, ModelScope);
- :mod:`remote.engines.sglang.architectures`: which config fields give E, N and top-k per architecture, and
  when the shared expert is fused (the table of docs/sglang-models.md);
- :mod:`remote.engines.sglang.quantization`: the quantization and dtype of the MoE weights and their selectors;
- :mod:`remote.engines.sglang.shape`: the MoE shape (E, N, top-k) and the selectors (``MoeShape``, ``moe_shape``);
- :mod:`remote.engines.sglang.model_flags`: the model flags of ``tune``, ``names``, ``probe`` and
  ``orch config-names``, declared once, and the shape they name;
- :mod:`remote.engines.sglang.lookup`: where the loader looks and what it would load, read from disk, and
  each covered release's rules (for a loader that cannot be read);
- :mod:`remote.engines.sglang.moe_log`: the start-up log of every release: where a start begins, the MoE
  runner it chose, its config lookups;
- :mod:`remote.engines.sglang.server_args`: the server flags orch reads, their spellings and defaults per
  release, ``ServerArgs`` and the launch command parser;
- :mod:`remote.engines.sglang.launcher`: how a unit's ``ExecStart=`` starts SGLang (``python -m
  sglang.launch_server``, ``sglang serve``, ``uv run``, ``conda run``, ``numactl`` and the other
  wrappers, systemd's prefixes): the interpreter, wrapper prefix, entry point and arguments;
- :mod:`remote.engines.sglang.server_config`: the ``--config FILE.yaml`` merge rule (on parsed data);
- :mod:`remote.engines.sglang.runner`: which MoE runner a server uses and whether it reads the Triton
  config files, with SGLang's reason (``orch tune``'s plan and ``orch doctor`` both ask it);
- :mod:`remote.engines.sglang.runner_choices`: the ``--moe-runner-backend`` choices of each release (runner trial);
- :mod:`remote.engines.sglang.autotune`: FlashInfer's start-up autotune: when it runs, its cache root, path
  and key (``$SGLANG_CACHE_DIR`` as the server expands it), the flags that change it;
- :mod:`remote.engines.sglang.env`: the environment variables SGLang reads that orch uses;
- :mod:`remote.engines.sglang.http`: the ``/generate``, ``/health`` and ``/v1/models`` requests and answers;
- :mod:`remote.engines.sglang.defaults`: default tuning batch sizes;
- :mod:`remote.engines.sglang.kernel_roles`: the kernel entry points the ``sglang`` tuner provider drives;
- :mod:`remote.engines.sglang.provider`: SGLang's own kernel as the tuner times it (torch and triton:
  loaded only by the tuner's registry);
- :mod:`remote.engines.sglang.bench_tool`: ``bench --tool sglang`` (SGLang's ``bench_serving``);
- :mod:`remote.engines.sglang.engine`: :data:`~remote.engines.sglang.engine.ENGINE`, these rules bound to
  :class:`remote.engines.interface.Engine` (docs/architecture.md lists which module implements each method).

The controller reaches them only through the facade (``remote.engines``: ``ENGINES``, ``engine_for``).
Nothing here imports torch, triton or sglang (but ``provider``).
"""
