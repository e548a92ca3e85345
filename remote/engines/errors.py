"""The root of the errors an engine's rules raise (standard library only)."""

from __future__ import annotations

from ..protocol import internal_error


@internal_error("subclassed by the engines' own errors; caught by the controller's unit facts (UnitError) "
                "and the payload's commands (PayloadError), which name the unit or the file")
class EngineError(ValueError):
    """A unit's command line, server flags or server config file that the engine would refuse (or
    that orch cannot read); the message names the flag, word or file."""
