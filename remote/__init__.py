"""orch payload: the program orch pushes to each GPU host (``python -m remote <command>``).

Runs with the host's own Python; needs only the standard library, plus torch and triton for
``tune`` (``probe`` uses them when present). See docs/protocol.md for the JSON-lines protocol
spoken with the controller.

Roles, one folder each:

- the program: ``__main__`` (``COMMANDS``: command name -> module) and ``protocol``;
- read-only commands: ``probe``, ``names``;
- ``sglang/``: SGLang's rules, their one home (file names, model MoE shape, config JSON, the
  loader's lookup, the start-up log, server flags and ``--config`` merge, which MoE runner reads
  the Triton files, defaults), standard library only;
- ``host/``: host operations (atomic writes, backups and manifests, install, restore, run
  records, the host lock, the GPU reaper, the unit's port), standard library only;
- ``bench/``: the ``bench`` command (orch's HTTP client, or an engine's own) and ``reach``
  (where the server answers, asked from the host);
- ``tuning/``: the ``tune`` command with its kernel, tuner and providers (torch, triton), and
  ``tuning.support``, what the tuner can run, readable without torch.

Import rule: nothing here imports ``orchestrator``; ``orchestrator`` imports only the engines'
facade (the ``remote.engines`` package) and ``remote.protocol``; commands never import one another
(what they share lives in ``engines/``, ``host/fs``, ``host/changes``, ``host/procs``,
``bench/common`` or ``tuning/support``); only ``tuning/`` imports torch or triton, and only when tuning. ``tests/test_architecture.py``
checks all of it.
"""

PAYLOAD_VERSION = "0.4.0"
PROTO = 1
