"""Put the payload on a host: upload the checksummed tarball, verify it there, unpack it, and
check the unpacked files again before every run (docs/protocol.md).

The payload lives in ``<state_dir>/payload/<sha12>/`` (mode 0700, root-only); check mode uses a
private temp folder that is removed when the host's play ends. Every command is an argument list
(quoted by the connection); root-only steps go through ``become``.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
import tempfile

from ..engine.results import TaskFailed
from .bundle import Bundle

CHECK_TMP_PREFIX = "/tmp/orch-check."
STALE_PUSH_MIN = 120  # a staging folder older than this (minutes) belongs to a push that died


def check_mode_folder(connection) -> str:
    """A new private temp folder on the host for a check-mode payload (``mktemp -d``)."""
    return connection.run(["mktemp", "-d", CHECK_TMP_PREFIX + "XXXXXXXX"], become=True).stdout.strip()


def remove_check_mode_folder(connection, folder: str) -> bool:
    """Remove a folder made by :func:`check_mode_folder`; refuses any other path. True when removed."""
    if not folder.startswith(CHECK_TMP_PREFIX) or "/" in folder[len(CHECK_TMP_PREFIX):]:
        return False
    connection.run(["rm", "-rf", "--", folder], check=False, become=True)
    return True


def bundle_file_hashes(bundle: Bundle) -> dict[str, str]:
    """``{relative path: sha256 hex}`` of every file in the payload tarball (``remote/...``)."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[m.name] = hashlib.sha256(tar.extractfile(m).read()).hexdigest()
    return out


def tree_mismatch(connection, root: str, bundle: Bundle) -> list[str]:
    """Paths under the unpacked payload ``root`` on the host that are changed, missing or extra
    (``sha256sum`` of every file there against :func:`bundle_file_hashes`); ``[]`` when intact."""
    want = bundle_file_hashes(bundle)
    res = connection.run(["find", root, "-type", "f", "!", "-name", ".verified", "-exec", "sha256sum", "--", "{}", "+"],
                         check=False, become=True, timeout=120)
    got = {}
    for line in res.stdout.splitlines():
        digest, _, path = line.partition("  ")
        got[posixpath.relpath(path, root)] = digest
    return sorted(p for p in set(want) | set(got) if want.get(p) != got.get(p))


def deploy(connection, bundle: Bundle, base: str, state_dir: str, *, check: bool = False,
           on_tampered=None) -> tuple[str, bool]:
    """Make ``<base>/<sha12>`` on the host hold exactly ``bundle``; return ``(root, pushed)``.

    An unpacked payload marked ``.verified`` is re-checked file by file; a changed, missing or added
    file (``on_tampered(root, paths)`` is told) means it is pushed again. A push uploads the tarball
    into a private staging folder (``mktemp -d <base>/.push.XXXXXXXX``), compares its sha256 on the
    host, unpacks and marks it there, and only then renames it to ``root`` (``mv -T``, one
    ``rename(2)``): a reader never sees a half-unpacked tree, and two pushes racing for one folder
    (hosts that mount the same state folder, docs/reliability.md) cannot delete each other's files.
    The loser of such a race keeps the winner's tree when it matches the bundle. A tampered tree is
    first renamed into the staging folder and removed with it. Staging folders older than
    :data:`STALE_PUSH_MIN` minutes (a push that was killed) are removed first. ``state_dir`` and
    ``base`` are created (0700) unless ``check`` (the temp folder exists already). Raises
    :class:`TaskFailed` on a checksum mismatch, or when ``root`` holds another tree after a lost
    race; connection errors pass through.
    """
    conn = connection
    root = posixpath.join(base, bundle.short)
    marker = posixpath.join(root, ".verified")
    present = conn.run(["test", "-f", marker], check=False, become=True).ok
    tampered = False
    if present:
        bad = tree_mismatch(conn, root, bundle)
        if bad:
            if on_tampered is not None:
                on_tampered(root, bad)
            present, tampered = False, True
    if present:
        return root, False
    for d in ((base,) if check else (state_dir, base)):
        conn.run(["mkdir", "-p", d], become=True)
        conn.run(["chmod", "700", d], become=True)
    # staging folders of pushes killed before their cleanup (controller SIGKILLed, host rebooted);
    # a push in progress is minutes old at most
    conn.run(["find", base, "-mindepth", "1", "-maxdepth", "1", "-name", ".push.*", "-mmin", f"+{STALE_PUSH_MIN}",
              "-exec", "rm", "-rf", "--", "{}", "+"], check=False, become=True)
    stage = conn.run(["mktemp", "-d", posixpath.join(base, ".push.XXXXXXXX")], become=True).stdout.strip()
    try:
        remote_tar = posixpath.join(stage, bundle.filename)
        with tempfile.NamedTemporaryFile(suffix=".tar.gz", delete=False) as fh:
            fh.write(bundle.data)
            local = fh.name
        try:
            conn.put(local, remote_tar, become=True)
        finally:
            os.unlink(local)
        got = conn.run(["sha256sum", remote_tar], become=True).stdout.split()
        if not got or got[0] != bundle.sha256:
            raise TaskFailed(f"payload checksum mismatch on host: expected {bundle.sha256}, got {got[:1]}")
        tree = posixpath.join(stage, "tree")
        conn.run(["mkdir", "-m", "700", tree], become=True)
        conn.run(["tar", "-xzf", remote_tar, "-C", tree, "--no-same-owner"], become=True)
        conn.run(["touch", posixpath.join(tree, ".verified")], become=True)
        if tampered:
            conn.run(["mv", "-T", "--", root, posixpath.join(stage, "old")], check=False, become=True)
        moved = conn.run(["mv", "-T", "--", tree, root], check=False, become=True)
        if not moved.ok:
            # Another push got there first (rename(2) does not replace a non-empty folder): keep
            # its tree if it is this bundle, complete.
            if not conn.run(["test", "-f", marker], check=False, become=True).ok or tree_mismatch(conn, root, bundle):
                raise TaskFailed(f"could not put the payload at {root}: {moved.stderr.strip() or moved.stdout.strip()}")
    finally:
        conn.run(["rm", "-rf", "--", stage], check=False, become=True)
    return root, True
