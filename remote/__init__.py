"""orch payload: the program orch pushes to each GPU host.

Runs with the host's own Python; needs only the standard library, plus torch and
triton for ``probe`` and ``tune``. Imports nothing from ``orchestrator``.
See docs/protocol.md for the JSON-lines protocol spoken with the controller.
"""

PAYLOAD_VERSION = "0.1.0"
PROTO = 1
