"""The environment systemd gives a service, and how it expands ``ExecStart=`` (pure functions).

Rules (systemd.exec(5), "Environment" section; the parser is systemd's ``src/basic/env-file.c``):

- ``Environment=`` assignments are read in order (later ones win); an empty ``Environment=``
  resets the list.
- ``EnvironmentFile=`` names files read just before the process starts, in the order given; an
  optional leading ``-`` means "skip it when missing" (without it a missing file makes the start
  fail); an empty ``EnvironmentFile=`` resets the list; the name may be a wildcard expression.
  **Settings from these files override settings made with ``Environment=``**; a variable set in
  several files takes its value from the last one.
- ``UnsetEnvironment=`` removes variables (``VAR``) or exact assignments (``VAR=value``) at the end.
- File syntax: newline-separated ``KEY=VALUE``; blank lines and lines starting with ``#`` or
  ``;`` are comments; whitespace around the key and leading/trailing whitespace of an unquoted
  value are dropped (interior whitespace kept); in an unquoted value a backslash keeps the next
  character and a backslash-newline continues the line; ``'...'`` is verbatim and may span lines;
  ``"..."`` may span lines and unescapes ``\\"``, ``\\\\``, `` \\` `` and ``\\$`` (other escapes stay as
  written, a backslash-newline is dropped); a key that is not a valid name (e.g. ``export FOO``)
  is ignored.
- Specifiers (systemd.unit(5)) in these settings: ``%n`` (the unit's full name), ``%N`` (without
  its suffix), ``%p`` (the part before ``@``), ``%i``/``%I`` (the instance after ``@``), ``%%``;
  orch refuses any other (:func:`expand_specifiers`) rather than guess it.
- ``ExecStart=`` is split into words first; then ``${FOO}`` (inside a word or as one) becomes the
  value of FOO as exactly one word, ``$FOO`` as a word of its own becomes the value split at
  whitespace (zero or more words); ``$$`` is a literal ``$``; an unset variable is empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import internal_error

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WS = " \t\n\r"
_SHELL_NEED_ESCAPE = "\"\\`$"
#: glob characters in an ``EnvironmentFile=`` name (a wildcard expression)
GLOB_CHARS = "*?["


@dataclass(frozen=True)
class EnvFileRef:
    """One ``EnvironmentFile=`` entry: the ``path`` (absolute, may hold wildcards) and whether it is
    ``optional`` (written with a leading ``-``)."""

    path: str
    optional: bool

    @property
    def is_glob(self) -> bool:
        """True when the name is a wildcard expression."""
        return any(c in self.path for c in GLOB_CHARS)


def env_file_refs(values: list[str]) -> list[EnvFileRef]:
    """The files of the ``EnvironmentFile=`` values ``values`` (in unit-file order, drop-ins
    included): an empty value resets the list, ``-`` marks a file optional. Pure."""
    refs: list[EnvFileRef] = []
    for raw in values:
        v = raw.strip()
        if not v:
            refs = []
            continue
        optional = v.startswith("-")
        refs.append(EnvFileRef(v[1:].strip() if optional else v, optional))
    return refs


def parse_show_env_files(show_text: str) -> list[EnvFileRef]:
    """``EnvironmentFiles=`` lines of real systemd's ``systemctl show`` (one per file:
    ``EnvironmentFiles=/etc/default/x (ignore_errors=yes)``) as :class:`EnvFileRef`. Pure."""
    refs = []
    for line in show_text.splitlines():
        if line.startswith("EnvironmentFiles="):
            m = re.fullmatch(r"EnvironmentFiles=(.*?)(?: \(ignore_errors=(yes|no)\))?", line.rstrip())
            if m and m.group(1):
                refs.append(EnvFileRef(m.group(1), m.group(2) == "yes"))
    return refs


def parse_env_file(text: str) -> dict[str, str]:
    """Assignments of an environment file, as systemd reads it (see the module docstring); a
    later assignment of a key replaces an earlier one. Pure; never raises."""
    out: dict[str, str] = {}
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_ws = val_ws = None  # index where trailing whitespace of the key / unquoted value begins

    def push() -> None:
        k = "".join(key[:key_ws] if key_ws is not None else key)
        if _NAME.fullmatch(k):
            out[k] = "".join(value)

    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in _WS:
                state, key, key_ws, value = "key", [c], None, []
        elif state == "key":
            if c in "\n\r":
                state = "pre_key"
            elif c == "=":
                state, val_ws = "pre_value", None
            else:
                if c not in _WS:
                    key_ws = None
                elif key_ws is None:
                    key_ws = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in "\n\r":
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in _WS:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in "\n\r":
                if val_ws is not None:
                    del value[val_ws:]
                push()
                state = "pre_key"
            elif c == "\\":
                state, val_ws = "value_escape", None
            else:
                if c not in _WS:
                    val_ws = None
                elif val_ws is None:
                    val_ws = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in "\n\r":
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in _SHELL_NEED_ESCAPE:
                value.append(c)
            elif c != "\n":
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in "\n\r":
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if c in "\n\r" else "comment"
        i += 1
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        if state == "value" and val_ws is not None:
            del value[val_ws:]
        push()
    return out


def effective_environment(assignments: dict[str, str], files: list[dict[str, str]],
                          unset: list[str] | None = None) -> dict[str, str]:
    """The service's environment from its ``Environment=`` ``assignments``, the parsed
    ``EnvironmentFile=`` contents ``files`` (in order: each overrides the assignments and the
    files before it) and ``UnsetEnvironment=`` entries ``unset``. Pure."""
    env = dict(assignments)
    for f in files:
        env.update(f)
    for u in unset or []:
        if "=" in u:
            k, v = u.split("=", 1)
            if env.get(k) == v:
                env.pop(k)
        else:
            env.pop(u, None)
    return env


@internal_error("orchestrator.facts.unit catches it and raises UnitError naming the unit")
class SpecifierError(ValueError):
    """A systemd specifier orch does not expand (the message names it)."""


def expand_specifiers(text: str, unit: str) -> str:
    """``text`` with the systemd specifiers of unit ``unit`` (``NAME.service`` or ``NAME``)
    expanded (see the module docstring); raises :class:`SpecifierError` for another one. Pure."""
    full = unit if "." in unit else f"{unit}.service"
    stem = full.rsplit(".", 1)[0]
    prefix, _, instance = stem.partition("@")
    values = {"n": full, "N": stem, "p": prefix, "i": instance, "I": instance, "%": "%"}

    def one(m: re.Match) -> str:
        c = m.group(1)
        if c not in values:
            raise SpecifierError(f"systemd specifier %{c} in {text!r}: orch expands only "
                                 "%n %N %p %i %I %%")
        return values[c]

    return re.sub(r"%(.)", one, text)


_BRACED = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_exec_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """``ExecStart=`` words ``argv`` with systemd's variable expansion over ``env`` (see the
    module docstring): ``$FOO`` alone splits into words, ``${FOO}`` stays one word. Pure."""
    out: list[str] = []
    for word in argv:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            out += env.get(m.group(1), "").split()
            continue
        out.append(_BRACED.sub(lambda mm: "$" if mm.group(0) == "$$" else env.get(mm.group(1), ""), word))
    return out


def parse_environ(raw: str) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated ``KEY=VALUE``) as a dict. Pure."""
    out = {}
    for item in raw.split("\0"):
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out
