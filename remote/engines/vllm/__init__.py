"""vLLM's rules, their one home (standard library only, except the kernel provider).

Each module names the vLLM release files it mirrors (0.32.0, 0.33.0, 0.34.0); the oracle tests
(``tests/unit/remote/engines/vllm/``) hold it against the releases' own code (docs/vllm.md):

- :mod:`remote.engines.vllm.naming`: config file names, the device-name rule (H200 family), dtype
  selectors, the 0.34.0 ``_down.json`` case, release comparisons;
- :mod:`remote.engines.vllm.lookup`: where the loader looks (``VLLM_TUNED_CONFIG_FOLDER`` first,
  then the package's ``configs/``), the log lines and the level they need, the JSON format
  (``triton_version`` key, ``USE_TMA`` from 0.34.0, ``SPLIT_K``), what orch writes;
- :mod:`remote.engines.vllm.runner`: which MoE kernel a server runs (``--moe-backend``, the
  priority lists per weight format) and its ``Using ... MoE backend`` log line;
- :mod:`remote.engines.vllm.server_args`: the launch forms (``vllm serve``, ``python -m
  vllm.entrypoints.openai.api_server``, the ``vllm/vllm-openai`` image), the flags orch reads with
  their defaults, the ``--config`` merge and the log level, parsed as vLLM's parser parses them;
- :mod:`remote.engines.vllm.shape`: the MoE shape one rank runs (E, N under TP/EP, shared experts,
  the weight format) from a model's ``config.json``;
- :mod:`remote.engines.vllm.http`: readiness (``/health``, ``/v1/models``), the ``/v1/completions``
  request and answer, ``vllm bench serve``'s metric names;
- :mod:`remote.engines.vllm.bench_tool`: ``bench --tool vllm``, vLLM's own ``vllm bench serve``
  once per level, its result JSON and printed summary read into orch's metric names;
- :mod:`remote.engines.vllm.provider`: vLLM's own ``fused_experts_impl`` as a tuner provider
  (needs torch, triton and vLLM; never imported by the controller).
"""
