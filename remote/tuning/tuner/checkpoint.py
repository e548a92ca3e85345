"""Checkpoint of a tuning run: one JSON file in the output folder, rewritten atomically
(:func:`remote.host.fs.atomic_write`) after each finished batch size, keyed so that only the
same run resumes from it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ...host.fs import atomic_write
from ...protocol import CHECKPOINT_FILE

NAME = CHECKPOINT_FILE


def run_key(**fields) -> tuple[dict, str]:
    """``(fields, key_id)``: ``key_id`` = sha256 of the sorted JSON of ``fields`` (shape,
    dtype, space, device name, Triton version, provider, seed, payload version...), first 16 hex."""
    text = json.dumps(fields, sort_keys=True, default=str)
    return fields, hashlib.sha256(text.encode()).hexdigest()[:16]


def load(out_dir: str | os.PathLike, key_id: str) -> tuple[dict, str | None]:
    """Finished results ``{str(M): result}`` of a checkpoint with this ``key_id``.

    Returns ``({}, reason)`` when there is none or it belongs to another run (``reason``
    says which) or cannot be read; never raises for a bad file.
    """
    path = Path(out_dir) / NAME
    if not path.exists():
        return {}, None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {}, f"unreadable checkpoint {path}: {exc}"
    if data.get("key_id") != key_id:
        return {}, f"checkpoint {path} belongs to another run (key {data.get('key_id')}, this run {key_id}); not reused"
    res = data.get("results")
    return (res if isinstance(res, dict) else {}), None


def save(out_dir: str | os.PathLike, key: dict, key_id: str, results: dict) -> Path:
    """Write the checkpoint atomically and durably (:func:`remote.host.fs.atomic_write`: temp file,
    fsync, rename, fsync folder; mode 0644). Returns its path. Raises ``OSError`` (ENOSPC, ...)."""
    path = Path(out_dir) / NAME
    text = json.dumps({"key_id": key_id, "key": key, "results": results}, indent=1, sort_keys=True, default=str)
    atomic_write(str(path), text.encode("utf-8"))
    return path
