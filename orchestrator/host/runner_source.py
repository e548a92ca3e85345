"""Where a unit's MoE runner is set, and the one-value edit that changes it there (runner trial).

A runner trial (``orch tune --moe-runners``) starts each candidate through a reversible change to the
unit. Where the unit's own files set the runner, orch changes that one value there instead of
adding its drop-in (:func:`runner_source` decides, :func:`edited_text` makes the new text):

- ``env_file``: the ExecStart's (last) runner flag (``Engine.runner_flag``: SGLang's
  ``--moe-runner-backend``) takes a variable (``$MOE_RUNNER``, ``${MOE_RUNNER}``, or
  ``--moe-runner-backend=${MOE_RUNNER}``) and an ``EnvironmentFile=`` sets it
  (the last file that sets it: systemd reads the files in order, a later one overriding an earlier
  one, and all of them over ``Environment=``, systemd.exec(5)). systemd reads the file at each start,
  so a restart applies it with no ``daemon-reload``.
- ``config``: the command line has no runner flag and the unit's server config file sets the
  engine's key for it (``Engine.runner_config_key``: for SGLang's ``--config`` YAML
  ``moe-runner-backend``, the spelling the server honours,
  :data:`remote.engines.sglang.server_config.RUNNER_CONFIG_KEY`). The file is read at each start.
- ``dropin``: every other unit (a literal flag, a variable set only by ``Environment=``, no flag and
  no YAML key, or a file orch cannot edit one value of safely).

Pure: no host access (the caller reads the files).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import yaml

from remote.engines import Engine, engine_named

from ..facts.systemd_env import parse_env_file

_VAR = re.compile(r"^\$(?:(\w+)|\{(\w+)\})$")
_RUNNER = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class RunnerSource:
    """Where the trial changes the runner: ``kind`` ``dropin`` (orch's drop-in), ``env_file`` (the
    variable ``key`` in ``path``) or ``config`` (the YAML key ``key`` in ``path``)."""

    kind: Literal["dropin", "env_file", "config"]
    path: str = ""
    key: str = ""

    def describe(self) -> str:
        """One line for the run's output."""
        if self.kind == "dropin":
            return "orch's drop-in"
        what = "EnvironmentFile=" if self.kind == "env_file" else "--config"
        return f"{self.key} in {what} {self.path}"


def _flag_value(words: list[str], flag: str) -> str | None:
    """The word the last ``flag`` of ``words`` takes (argparse keeps the last), or None."""
    got = None
    for i, w in enumerate(words):
        if w == flag:
            got = words[i + 1] if i + 1 < len(words) else ""
        elif w.startswith(flag + "="):
            got = w[len(flag) + 1:]
    return got


def runner_source(words: list[str], env_files: list[tuple[str, str]], config_file: str | None = None,
                  config_text: str | None = None, engine: Engine | None = None) -> RunnerSource:
    """Where the unit's runner is set (module docstring). ``words``: the ExecStart words as the unit
    files give them (variables not expanded); ``env_files``: ``(path, text)`` of each
    ``EnvironmentFile=`` file systemd reads, in order; ``config_file``/``config_text``: the SGLang
    ``--config`` file (host path) and its text; ``engine``: whose runner flag and config key (None:
    the default engine). A source is chosen only when :func:`edited_text` can change its value
    alone; otherwise ``dropin``. Never raises."""
    engine = engine or engine_named(None)
    key = engine.runner_config_key
    value = _flag_value(words, engine.runner_flag)
    if value is not None:
        m = _VAR.match(value)
        if m:
            var = m.group(1) or m.group(2)
            for path, text in reversed(env_files):
                if var in parse_env_file(text):
                    src = RunnerSource("env_file", path, var)
                    return src if edited_text(src, text, engine.triton_runner) is not None else RunnerSource("dropin")
        return RunnerSource("dropin")
    if config_file and config_text is not None:
        try:
            data = yaml.safe_load(config_text)
        except yaml.YAMLError:
            return RunnerSource("dropin")
        if key is not None and isinstance(data, dict) and key in data:
            src = RunnerSource("config", config_file, key)
            return src if edited_text(src, config_text, engine.triton_runner) is not None else RunnerSource("dropin")
    return RunnerSource("dropin")


def _edit_env(text: str, key: str, runner: str) -> str | None:
    lines = text.splitlines(keepends=True)
    pat = re.compile(r"^(\s*)(" + re.escape(key) + r")(\s*=\s*)(.*?)(\r?\n?)$", re.S)
    for i in range(len(lines) - 1, -1, -1):
        m = pat.match(lines[i])
        if not m:
            continue
        old = m.group(4)
        if old.rstrip().endswith("\\") or (i and lines[i - 1].rstrip("\r\n").endswith("\\")):
            return None  # a value continued over lines (or this line continues another): not one value alone
        quote = old[:1] if old[:1] in ("'", '"') and len(old) > 1 and old.rstrip()[-1:] == old[:1] else ""
        lines[i] = f"{m.group(1)}{m.group(2)}{m.group(3)}{quote}{runner}{quote}{m.group(5)}"
        return "".join(lines)
    return None


def _edit_yaml(text: str, key: str, runner: str) -> str | None:
    lines = text.splitlines(keepends=True)
    pat = re.compile(r"^(['\"]?)" + re.escape(key) + r"\1(\s*:\s*)(['\"]?)([^'\"#\s]*)\3(\s+#.*)?(\s*?)(\r?\n?)$", re.S)
    hits = [i for i, ln in enumerate(lines) if pat.match(ln)]
    if len(hits) != 1:
        return None
    m = pat.match(lines[hits[0]])
    lines[hits[0]] = (f"{m.group(1)}{key}{m.group(1)}{m.group(2)}{m.group(3)}{runner}{m.group(3)}"
                      f"{m.group(5) or ''}{m.group(6)}{m.group(7)}")
    return "".join(lines)


def edited_text(source: RunnerSource, text: str, runner: str) -> str | None:
    """``text`` (the file of ``source``) with the runner value set to ``runner`` and every other
    byte kept (comments, order, quoting, line ends), or None when orch cannot do that safely: the
    assignment spans lines, the YAML key is not on one line of its own at the top level, or the
    result does not read back (systemd's env-file rules, YAML) as the old content with only that
    value changed. Raises ValueError for a runner name that is not a plain word, or for ``dropin``."""
    if not _RUNNER.match(runner):
        raise ValueError(f"not a runner name: {runner!r}")
    if source.kind == "env_file":
        new = _edit_env(text, source.key, runner)
        if new is None:
            return None
        want = dict(parse_env_file(text), **{source.key: runner})
        return new if parse_env_file(new) == want else None
    if source.kind == "config":
        new = _edit_yaml(text, source.key, runner)
        if new is None:
            return None
        try:
            old_data, new_data = yaml.safe_load(text), yaml.safe_load(new)
        except yaml.YAMLError:
            return None
        if not isinstance(old_data, dict):
            return None
        return new if new_data == dict(old_data, **{source.key: runner}) else None
    raise ValueError("a drop-in is not edited: see orchestrator.host.runner_trial.dropin_text")


def configured_runner(words: list[str], env_files: list[tuple[str, str]], config_file: str | None = None,
                      config_text: str | None = None, environment: dict[str, str] | None = None,
                      engine: Engine | None = None) -> str:
    """The runner backend the unit's files give now (``auto`` when none), as the server will read it
    at its next start: the command line's last runner flag, a ``$VAR``/``${VAR}`` value taken from
    the last ``EnvironmentFile=`` that sets it, else from ``environment`` (the unit's
    ``Environment=``); without a flag, the config file's key (``Engine.runner_config_key``).
    Arguments as :func:`runner_source`. Never raises."""
    engine = engine or engine_named(None)
    key = engine.runner_config_key
    value = _flag_value(words, engine.runner_flag)
    if value is not None:
        m = _VAR.match(value)
        if not m:
            return value
        var = m.group(1) or m.group(2)
        for _path, text in reversed(env_files):
            got = parse_env_file(text)
            if var in got:
                return got[var]
        return (environment or {}).get(var, value)
    if config_file and config_text is not None:
        try:
            data = yaml.safe_load(config_text)
        except yaml.YAMLError:
            data = None
        if key is not None and isinstance(data, dict) and data.get(key) is not None:
            return str(data[key])
    return "auto"
