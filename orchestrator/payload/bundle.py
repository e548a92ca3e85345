"""Build the payload tarball pushed to hosts (a versioned, checksummed ``remote/``).

The archive is reproducible: sorted members, fixed mtimes, uid/gid 0, no
``__pycache__``. Its name carries the payload version and the first 12 hex digits of
its sha256 (docs/protocol.md), so a host can verify what it runs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

REMOTE_DIR = Path(__file__).resolve().parents[2] / "remote"


@dataclass(frozen=True)
class Bundle:
    """A built payload: ``data`` (gzip bytes), ``sha256`` (hex), ``version``."""

    data: bytes
    sha256: str
    version: str

    @property
    def short(self) -> str:
        return self.sha256[:12]

    @property
    def filename(self) -> str:
        return f"orch-payload-{self.version}-{self.short}.tar.gz"


def _version(src: Path) -> str:
    for line in (src / "__init__.py").read_text().splitlines():
        if line.startswith("PAYLOAD_VERSION"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError(f"{src}/__init__.py has no PAYLOAD_VERSION")


@lru_cache(maxsize=4)
def build_bundle(src: Path = REMOTE_DIR) -> Bundle:
    """Tar and gzip ``src`` (the ``remote`` package) deterministically; cached per process."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(src.rglob("*")):
                rel = path.relative_to(src.parent)
                if "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo") or not path.is_file():
                    continue
                info = tarfile.TarInfo(str(rel))
                data = path.read_bytes()
                info.size = len(data)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), version=_version(src))
