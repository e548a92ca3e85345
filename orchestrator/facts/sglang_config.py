"""SGLang's ``--config FILE.yaml`` read on the controller's side: the YAML parsed, then merged.

The merge rule is SGLang's and lives with SGLang's other rules
(:mod:`remote.engines.sglang.server_config`: which token names the file, which names it may have, how each
``key: value`` becomes flags, file first so the command line wins). This module only parses the
file's text (PyYAML, ``safe_load``) and turns the rule's refusals into :class:`ConfigFileError`.
"""

from __future__ import annotations

from typing import Iterable

import yaml

from remote.engines.sglang import server_config
from remote.engines.sglang.server_config import ServerConfigError

from ..errors import OrchError


class ConfigFileError(OrchError):
    """SGLang would refuse the ``--config`` file (or its use on the command line); the message
    names the file."""

    exit_status = 1


def config_path(server_argv: list[str]) -> str | None:
    """:func:`remote.engines.sglang.server_config.config_path`, raising :class:`ConfigFileError` where
    SGLang refuses the command line (``--config`` twice, or last with no file)."""
    try:
        return server_config.config_path(server_argv)
    except ServerConfigError as exc:
        raise ConfigFileError(str(exc)) from None


def merge_config(server_argv: list[str], text: str, path: str, store_true: Iterable[str] = ()) -> list[str]:
    """``server_argv`` with its ``--config FILE`` replaced by the flags of ``text`` (the file's
    content), merged by SGLang's rule (:func:`remote.engines.sglang.server_config.merged_args`). Raises
    :class:`ConfigFileError` for a file SGLang refuses (name, YAML, not a mapping)."""
    try:
        server_config.check_config_name(path)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigFileError(f"SGLang --config {path}: not valid YAML: {exc}") from None
        return server_config.merged_args(server_argv, data, path, store_true)
    except ServerConfigError as exc:
        raise ConfigFileError(str(exc)) from None
