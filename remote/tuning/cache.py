"""The tuner's own Triton cache: fresh, node-local, per run; moved aside and retried once on error.

A shared or NFS ``TRITON_CACHE_DIR`` (or ``~/.triton`` on an NFS home) gives EBUSY,
FileNotFoundError or "Stale file handle" when several processes write it (triton #11512,
prime-rl #2305, vllm #6103), and a cache left corrupt gives a JSONDecodeError in the middle of a
tune (vllm PR #42786). The tuner therefore never uses the server's cache, nor the one its
environment names: every ``tune`` sets ``TRITON_CACHE_DIR`` to a new folder under its own work
folder (under ``orch_state_dir``, which the probe checks is on a local mount that allows exec),
before Triton is imported, so the compile workers it spawns inherit it. When a batch size fails
with an error that names the cache (:func:`is_cache_error`), that cache is moved aside
(``<name>.broken``, kept to look at) and the failed batch sizes are tuned once more with a new
cache. The cache is removed when the tune ends.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

#: words of an error that comes from a broken or shared Triton cache
CACHE_ERROR_WORDS = ("JSONDecodeError", "Stale file handle", "Device or resource busy", "[Errno 16]",
                     "[Errno 116]", "EBUSY", "ESTALE")


def is_cache_error(text: str, cache_dir: str) -> bool:
    """True when an error ``text`` (a batch size's error or traceback) comes from the Triton cache:
    one of :data:`CACHE_ERROR_WORDS`, or a missing file inside ``cache_dir``. Pure."""
    text = str(text or "")
    if any(w in text for w in CACHE_ERROR_WORDS):
        return True
    return ("FileNotFoundError" in text or "No such file" in text) and bool(cache_dir) and cache_dir in text


def fresh_cache(root: Path, tag: str) -> Path:
    """Make a new folder ``root/triton-cache-<tag>[-k]`` (0700) and point ``TRITON_CACHE_DIR`` of
    this process (and of the processes it starts) at it, and ``TMPDIR`` at its ``tmp/``. Returns it."""
    root.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in tag) or "run"
    k = 0
    while True:
        path = root / (f"triton-cache-{safe}" + (f"-{k}" if k else ""))
        try:
            path.mkdir(mode=0o700)
            break
        except FileExistsError:
            k += 1
    os.environ["TRITON_CACHE_DIR"] = str(path)
    # Triton builds each kernel in a temp folder first: there too, not in a /tmp that may be noexec
    (path / "tmp").mkdir(mode=0o700)
    os.environ["TMPDIR"] = str(path / "tmp")
    tempfile.tempdir = None  # tempfile caches the folder it chose first
    return path


def use_cache(path: Path) -> Path:
    """Point ``TRITON_CACHE_DIR`` (and ``TMPDIR``, as :func:`fresh_cache`) at an existing cache
    folder ``path``: the one ``python -m remote prepare`` filled before the stop. Returns it."""
    path = Path(path)
    (path / "tmp").mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(path)
    os.environ["TMPDIR"] = str(path / "tmp")
    os.environ["TRITON_STORE_BINARY_ONLY"] = "1"  # as the prepare stored its kernels
    tempfile.tempdir = None
    return path


def tune_with_cache(run_once: Callable[[], dict], root: Path, tag: str, log: Callable[[str, str], None],
                    prepared: Path | None = None) -> dict:
    """Run ``run_once`` (returns ``{batch size: error text}`` of the batch sizes that failed; it
    tunes only what is not done yet) with a fresh cache (:func:`fresh_cache`), or the ``prepared``
    one (:func:`use_cache`); when an error is a cache error, move that cache aside and run once
    more with a new one. Returns ``{"errors", "cache", "moved_aside": path | None}``; the last
    cache is removed (a prepared one too: it served this tune)."""
    cache = use_cache(prepared) if prepared is not None else fresh_cache(root, tag)
    aside = None
    try:
        errors = run_once()
        bad = {m: t for m, t in errors.items() if is_cache_error(t, str(cache))}
        if bad:
            aside = cache.with_name(cache.name + ".broken")
            if aside.exists():
                shutil.rmtree(aside, ignore_errors=True)
            cache.rename(aside)
            log(f"Triton cache error for batch sizes {sorted(bad, key=int)} ({next(iter(bad.values()))[:160]}): "
                f"moved {cache} aside to {aside}; retrying once with a new cache", "warning")
            cache = fresh_cache(root, tag)
            errors = run_once()
        return {"errors": errors, "cache": str(cache), "moved_aside": str(aside) if aside else None}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


#: filesystems a cache folder on which is shared between hosts (network and cluster filesystems)
SHARED_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "glusterfs", "beegfs",
                       "fuse.sshfs", "fuse.glusterfs", "fuse.cephfs", "fuse.juicefs", "fuse.s3fs", "9p", "afs"})
#: most kernel folders of a server's cache read (a cache of a busy server holds thousands)
MAX_ENTRIES = 5000
#: compiled-binary suffixes a truncated (zero-byte) file of which Triton would load as a kernel
BINARY_SUFFIXES = (".cubin", ".so", ".hsaco", ".ptx", ".amdgcn", ".spv")


def _arch_of(meta: dict) -> int | None:
    """The GPU architecture a Triton kernel's metadata names: ``target.arch`` (Triton 3.x writes the
    ``GPUTarget`` as a dict, ``triton/compiler/compiler.py``), else an older ``capability``."""
    target = meta.get("target")
    if isinstance(target, dict) and isinstance(target.get("arch"), int):
        return target["arch"]
    if isinstance(target, (list, tuple)) and len(target) > 1 and isinstance(target[1], int):
        return target[1]
    cap = meta.get("capability")
    return cap if isinstance(cap, int) else None


def server_cache_report(path: str, capability: str | None, mount: dict | None) -> dict:
    """What a server's Triton cache folder ``path`` holds that can break its kernels silently
    (issue 32 row 16: a cache copied from another GPU architecture reused a wrong kernel, vllm
    #41871; one truncated by a reboot, triton #10107), read without changing anything:

    ``{"path", "exists", "fstype", "shared" (on a network or cluster filesystem: shared between hosts),
    "entries" (kernel folders read), "archs" {arch: kernel count}, "other_arch" (kernels compiled for
    another architecture than ``capability``, GPU 0's ``"9.0"``; None when it is not known),
    "truncated" (up to 10 paths: a kernel's metadata that is not JSON, or a compiled binary of 0
    bytes), "truncated_count", "limited" (more than :data:`MAX_ENTRIES` kernel folders; the rest not
    read)}``. ``mount``: the mount holding ``path`` (``remote.probe.mount_of``: ``fstype``; None:
    not known). Never raises for what it reads."""
    out = {"path": path, "exists": os.path.isdir(path), "fstype": None, "shared": False, "entries": 0,
           "archs": {}, "other_arch": None, "truncated": [], "truncated_count": 0, "limited": False}
    if not out["exists"]:
        return out
    out["fstype"] = mount["fstype"] if mount else None
    out["shared"] = bool(mount and mount["fstype"] in SHARED_FS)
    mine = None
    if capability:
        major, _, minor = capability.partition(".")
        mine = int(major) * 10 + int(minor or 0) if major.isdigit() and (minor or "0").isdigit() else None
    archs: dict[int, int] = {}
    try:
        folders = sorted(os.listdir(path))
    except OSError:
        folders = []
    for name in folders:
        d = os.path.join(path, name)
        if not os.path.isdir(d):
            continue
        if out["entries"] >= MAX_ENTRIES:
            out["limited"] = True
            break
        out["entries"] += 1
        try:
            files = os.listdir(d)
        except OSError:
            continue
        for f in files:
            p = os.path.join(d, f)
            if f.endswith(".json") and not f.startswith("__grp__"):
                try:
                    with open(p, encoding="utf-8") as fh:
                        meta = json.load(fh)
                except (OSError, ValueError):
                    meta = None
                    _note_truncated(out, p)
                arch = _arch_of(meta) if isinstance(meta, dict) else None
                if arch is not None:
                    archs[arch] = archs.get(arch, 0) + 1
            elif f.endswith(BINARY_SUFFIXES):
                try:
                    if os.path.getsize(p) == 0:
                        _note_truncated(out, p)
                except OSError:
                    pass
    out["archs"] = {str(a): n for a, n in sorted(archs.items())}
    if mine is not None:
        out["other_arch"] = sum(n for a, n in archs.items() if a != mine)
    return out


def _note_truncated(out: dict, path: str) -> None:
    out["truncated_count"] += 1
    if len(out["truncated"]) < 10:
        out["truncated"].append(path)
