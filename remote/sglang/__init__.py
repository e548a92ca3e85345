"""SGLang's rules, as the payload and the controller both need them (standard library only).

- :mod:`remote.sglang.naming`: config file names, device name, ``triton_*`` folder names and sort;
- :mod:`remote.sglang.model`: model config loading, the MoE shape (E, N, top-k) and the selectors;
- :mod:`remote.sglang.configfile`: config JSON validation, reading and writing;
- :mod:`remote.sglang.lookup`: where the loader looks and what it would load, read from disk;
- :mod:`remote.sglang.defaults`: default tuning batch sizes, backends and quantizations that
  read (or not) the Triton config files.

With :mod:`remote.protocol`, the only part of ``remote`` that ``orchestrator`` may import.
Nothing here imports torch, triton or sglang.
"""
