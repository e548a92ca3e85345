"""SGLang's ``--config FILE.yaml``: server flags kept in a YAML file, merged into the launch flags.

The rule is SGLang's own (0.5.8 ... 0.5.23: ``prepare_server_args`` in ``srt/server_args.py`` and
``ConfigArgumentMerger`` in ``srt/utils/server_args_config_parser.py``, ``srt/`` before 0.5.20):

- the merge happens only when a token of the launch arguments is exactly ``--config`` (the
  spelling ``--config=FILE`` is stored by argparse and ignored: no merge); more than one
  ``--config`` or none after it is an error;
- the file must end in ``.yaml``/``.yml`` and hold a mapping (an empty file is ``{}``);
- each ``key: value`` becomes flags, the key used verbatim as ``--key``: a boolean of a
  ``store_true`` flag adds ``--key`` when true and nothing when false, another boolean becomes
  ``--key true|false``, a non-empty list ``--key item...`` (an empty one nothing), a mapping
  ``--key <its JSON>``, anything else ``--key <str(value)>``;
- the flags from the file go FIRST, then the command line without ``--config FILE``: argparse
  keeps the last value, so the command line wins over the file, and the file over SGLang's
  defaults.

:func:`config_path` finds the file, :func:`check_config_name` checks its name, :func:`merged_args`
builds the merged argument list from the file's already-parsed content (reading and parsing the
YAML is the caller's: ``orchestrator.facts.server_config``). ``tests/unit/facts/test_unit_sources.py``
checks the merge against the real release's merger. Standard library only.
"""

from __future__ import annotations

import json
import posixpath
from typing import Iterable

from ...protocol import internal_error
from ..errors import EngineError


#: the flag that names the config file (SGLang 0.5.23 ``srt/server_args.py``: ``parser.add_argument("--config")``)
CONFIG_FLAG = "--config"
#: the YAML key SGLang 0.5.23 reads as ``--moe-runner-backend``: each key becomes ``--KEY`` verbatim
#: (``srt/utils/server_args_config_parser.py`` ``ConfigArgumentMerger._add_scalar_arg``) and the
#: parser's flag is ``--moe-runner-backend`` (``srt/arg_groups/arg_utils.py``: ``"--" +
#: name.replace("_", "-")``), so ``moe_runner_backend`` would be an unknown flag
RUNNER_CONFIG_KEY = "moe-runner-backend"


@internal_error("caught by orchestrator.facts.server_config, which raises ConfigFileError naming the file")
class ServerConfigError(EngineError):
    """SGLang would refuse the ``--config`` file (or its use on the command line); the message
    names the file when there is one."""


def config_path(server_argv: list[str]) -> str | None:
    """The file of ``--config FILE`` in the launch arguments ``server_argv`` (after
    ``-m sglang.launch_server``), or None when SGLang would merge none. Raises
    :class:`ServerConfigError` where SGLang raises: ``--config`` twice, or last with no file."""
    idx = [i for i, a in enumerate(server_argv) if a == "--config"]
    if not idx:
        return None
    if len(idx) > 1:
        raise ServerConfigError("the launch command names --config more than once; SGLang refuses that "
                                "(\"Multiple config files specified! Only one allowed.\")")
    if idx[0] == len(server_argv) - 1:
        raise ServerConfigError("--config is the last argument of the launch command: SGLang refuses it "
                                "(\"No config file specified after --config flag!\")")
    return server_argv[idx[0] + 1]


def check_config_name(path: str) -> None:
    """Raises :class:`ServerConfigError` unless ``path`` ends in ``.yaml``/``.yml`` (any case), the
    only files SGLang's merger reads."""
    if posixpath.splitext(path)[1].lower() not in (".yaml", ".yml"):
        raise ServerConfigError(f"SGLang --config {path}: SGLang reads only .yaml/.yml files")


def config_flags(data: object, path: str, store_true: Iterable[str] = ()) -> list[str]:
    """The flags SGLang makes of the parsed YAML ``data`` of ``path`` (see the module docstring).
    ``store_true``: the normalized names (``a_b``) of SGLang's ``store_true`` flags orch knows.
    Raises :class:`ServerConfigError` when the file is not a mapping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ServerConfigError(f"SGLang --config {path}: the file must hold a mapping of flags at its top level")
    st = set(store_true)
    out: list[str] = []
    for key, value in data.items():
        key = str(key)
        if isinstance(value, bool):
            if key.replace("-", "_") in st:
                if value:
                    out.append(f"--{key}")
            else:
                out += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            if value:
                out += [f"--{key}"] + [str(v) for v in value]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def merged_args(server_argv: list[str], data: object, path: str, store_true: Iterable[str] = ()) -> list[str]:
    """``server_argv`` with its ``--config FILE`` replaced by the flags of the file's parsed
    content ``data``, in SGLang's order (file first, so the command line wins). Raises
    :class:`ServerConfigError` for a file SGLang refuses (name, not a mapping)."""
    check_config_name(path)
    flags = config_flags(data, path, store_true)
    i = server_argv.index("--config")
    return flags + server_argv[:i] + server_argv[i + 2:]
