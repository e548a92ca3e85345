"""SGLang's rules, as the payload and the controller both need them (standard library only).

- :mod:`remote.sglang.naming`: config file names, device name, ``triton_*`` folder names and sort;
- :mod:`remote.sglang.model`: model config loading, the MoE shape (E, N, top-k) and the selectors;
- :mod:`remote.sglang.configfile`: config JSON validation, reading and writing.

The only part of ``remote`` (with :mod:`remote.protocol`) that ``orchestrator`` may import.
Nothing here imports torch or triton.
"""
