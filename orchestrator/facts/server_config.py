"""A server config file read on the controller's side (SGLang's ``--config FILE.yaml``): the YAML
parsed, then merged by the engine's rule.

The merge rule is the engine's and lives with its other rules (``Engine.config_file`` and
``Engine.merge_config``; SGLang: :mod:`remote.engines.sglang.server_config`: which token names the
file, which names it may have, how each ``key: value`` becomes flags, file first so the command
line wins). This module only parses the file's text (PyYAML, ``safe_load``, the payload being
standard library only) and turns the engine's refusals into :class:`ConfigFileError`.
"""

from __future__ import annotations

import yaml

from remote.engines import Engine, EngineError, engine_named

from ..errors import OrchError


class ConfigFileError(OrchError):
    """The engine would refuse the server config file (or its use on the command line); the message
    names the file."""

    exit_status = 1


def config_path(server_argv: list[str], engine: Engine | None = None) -> str | None:
    """The config file ``server_argv`` names (``Engine.config_file`` of ``engine``; None: the
    default engine), raising :class:`ConfigFileError` where the engine refuses the command line
    (SGLang: ``--config`` twice, or last with no file)."""
    try:
        return (engine or engine_named(None)).config_file(server_argv)
    except EngineError as exc:
        raise ConfigFileError(str(exc)) from None


def merge_config(server_argv: list[str], text: str, path: str, engine: Engine | None = None) -> list[str]:
    """``server_argv`` with its config file replaced by the flags of ``text`` (the file's content),
    merged by the engine's rule (``Engine.merge_config``). Raises :class:`ConfigFileError` for a
    file the engine refuses (its name, before the YAML is read; YAML; not a mapping)."""
    def load() -> object:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigFileError(f"{path}: not valid YAML: {exc}") from None

    try:
        return (engine or engine_named(None)).merge_config(server_argv, path, load)
    except EngineError as exc:
        raise ConfigFileError(str(exc)) from None
