"""SGLang's rules, as the payload and the controller both need them (standard library only).

- :mod:`remote.sglang.naming`: config file names, device name, ``triton_*`` folder names and sort;
- :mod:`remote.sglang.model_config`: finding and reading a model's config.json (HF cache, ModelScope);
- :mod:`remote.sglang.architectures`: which config fields give E, N and top-k per architecture, and
  when the shared expert is fused (the table of docs/sglang-models.md);
- :mod:`remote.sglang.quantization`: the quantization and dtype of the MoE weights and their selectors;
- :mod:`remote.sglang.shape`: the MoE shape (E, N, top-k) and the selectors (``MoeShape``, ``moe_shape``);
- :mod:`remote.sglang.model_flags`: the model flags of ``tune``, ``names``, ``probe`` and
  ``orch config-names``, declared once, and the shape they name;
- :mod:`remote.sglang.docs`: markdown tables rendered from these rules for docs/;
- :mod:`remote.sglang.configfile`: config JSON validation, reading and writing;
- :mod:`remote.sglang.lookup`: where the loader looks and what it would load, read from disk;
- :mod:`remote.sglang.defaults`: default tuning batch sizes, backends and quantizations that
  read (or not) the Triton config files.

With :mod:`remote.protocol`, the only part of ``remote`` that ``orchestrator`` may import.
Nothing here imports torch, triton or sglang.
"""
