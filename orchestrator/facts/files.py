"""Config files on the host as facts: are they valid for SGLang's loader, and were they changed
after the server last started (SGLang caches configs in-process, so a restart is needed)."""

from __future__ import annotations

import json
import posixpath

from .hostfiles import HostFileError, file_sha256, read_file

#: larger config files are refused unread (SGLang's own are a few KiB)
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def file_digest(connection, path: str) -> str | None:
    """The sha256 (hex) of the file ``path`` on the host, or None when it cannot be read
    (``sha256sum``, read-only; through sudo only when the login user is refused). ``orch doctor``
    compares the ranks of a multi-node server with it: every rank must load the same files."""
    return file_sha256(connection, path)


def read_config(connection, path: str) -> dict | None:
    """The config file ``path`` on the host as loaded JSON (keys in the file's order, as SGLang's
    loader keeps them), or None when it cannot be read, is larger than 4 MiB or is not a JSON
    object. Read as the login user, through sudo only when that is refused."""
    argv = ["head", "-c", str(MAX_CONFIG_BYTES + 1), "--", path]
    res = connection.run(argv, check=False, timeout=60)
    if not res.ok and "Permission denied" in res.stderr:
        res = connection.run(argv, check=False, become=True, timeout=60)
    if not res.ok or len(res.stdout.encode()) > MAX_CONFIG_BYTES:
        return None
    try:
        data = json.loads(res.stdout)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def config_problem(connection, path: str, extra_fields: tuple[str, ...] = ()) -> str | None:
    """Why the engine's loader would fail on the config file ``path`` on the host (unreadable, too
    large, not JSON, a key or field it refuses; ``extra_fields``: the engine's own entry fields,
    ``Engine.config_extra_fields``), or None when it is valid. Read as the login user, through sudo
    only when that is refused (orch installs configs 0644)."""
    from remote.protocol import PayloadError
    from remote.engines import validate_config

    try:
        text = read_file(connection, path, limit=MAX_CONFIG_BYTES, missing_ok=False)
    except HostFileError as exc:
        return "larger than 4 MiB" if exc.too_large else f"cannot read: {exc.reason[:100]}"
    try:
        validate_config(json.loads(text), posixpath.basename(path), extra_fields=tuple(extra_fields))
    except ValueError as exc:
        return f"not JSON: {exc}"
    except PayloadError as exc:
        prefix = posixpath.basename(path) + ": "  # validate_config names the source first
        return exc.msg[len(prefix):] if exc.msg.startswith(prefix) else exc.msg
    return None


def parse_changed_since_start(stdout: str, paths: list[str]) -> list[str]:
    """From ``date +%s; ps -o etimes= -p PID; stat -c %Y PATHS...`` output: the paths whose mtime
    is later than the process start (now - elapsed seconds). [] when the output is not that."""
    vals = stdout.split()
    if len(vals) != 2 + len(paths) or not all(v.isdigit() for v in vals):
        return []
    started = int(vals[0]) - int(vals[1])
    return [p for p, m in zip(paths, vals[2:]) if int(m) > started]


def changed_since_start(connection, main_pid: int, paths: list[str]) -> list[str]:
    """Those of ``paths`` replaced after the unit's main process ``main_pid`` started; [] when it
    cannot be told (no main PID, a command failed)."""
    if not main_pid or not paths:
        return []
    # a process gone or a path missing makes it fail: then it cannot be told, which is the answer []
    res = connection.run(["sh", "-c", 'date +%s; ps -o etimes= -p "$1"; shift; stat -c %Y -- "$@"', "sh",
                          str(main_pid), *paths], check=False, timeout=30)
    return parse_changed_since_start(res.stdout, paths) if res.ok else []
