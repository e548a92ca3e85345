"""One way the controller writes a file: atomically (a temporary file in the same folder, flushed
to disk, then renamed over the target), so a reader never sees half a file and a crash leaves the
old one. (The payload has its own, ``remote/host/fs.py``: it imports nothing from here.)"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically with permissions ``mode``; return the path.
    The folder must exist. Raises ``OSError`` as the file system does (the target is untouched)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
