"""Finding and reading a model's ``config.json`` as SGLang does, offline (stdlib only).

``load_model_config`` reads a Hugging Face ``config.json`` from a folder, a file, or a repo id
resolved offline from the Hugging Face cache (or, with ``SGLANG_USE_MODELSCOPE``, from the
ModelScope cache). Nothing is downloaded. :mod:`remote.engines.sglang.shape` turns the dict into the MoE
shape; :mod:`remote.engines.sglang.model_flags` names a model the way the unit's server does.

This module must not import torch or triton (the ``names`` command and the controller use it
without them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...protocol import PayloadError

#: Largest config.json read (bytes); real ones are a few KB.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def hf_hub_dir(hf_home: str | None = None) -> Path:
    """The Hugging Face hub cache folder.

    ``hf_home`` (if given) else ``$HF_HOME``, else ``~/.cache/huggingface``; the hub is its
    ``hub/`` subfolder. ``$HF_HUB_CACHE`` (huggingface_hub's override) wins when
    ``hf_home`` is not given. If ``hf_home`` itself holds ``models--*`` folders (it is a
    hub folder already) it is used as is.
    """
    if hf_home is None:
        env_hub = os.environ.get("HF_HUB_CACHE")
        if env_hub:
            return Path(env_hub).expanduser()
        hf_home = os.environ.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())
    base = Path(hf_home).expanduser()
    if not (base / "hub").is_dir() and base.is_dir() and any(p.name.startswith("models--") for p in base.iterdir()):
        return base
    return base / "hub"


def _looks_like_repo_id(spec: str) -> bool:
    if spec.startswith(("/", ".", "~")) or "\\" in spec or spec.count("/") > 1:
        return False
    parts = spec.split("/")
    ok = all(p and p not in (".", "..") and all(c.isalnum() or c in "-_." for c in p) for p in parts)
    return ok and ".." not in spec


def use_modelscope(env: dict | None = None) -> bool:
    """SGLang's ``SGLANG_USE_MODELSCOPE`` (0.5.23 ``environ.py``, an ``EnvBool``): true for
    ``true``, ``1``, ``yes``, ``y`` in any case; unset is false. ``env`` defaults to ``os.environ``."""
    value = (os.environ if env is None else env).get("SGLANG_USE_MODELSCOPE", "false")
    return value.strip().lower() in ("true", "1", "yes", "y")


def modelscope_model_root(env: dict | None = None) -> Path:
    """ModelScope's model cache root, which SGLang 0.5.23 asks modelscope for
    (``modelscope.utils.file_utils.get_model_cache_root``, modelscope 1.40):
    ``$MODELSCOPE_CACHE/models``, default ``~/.cache/modelscope/hub/models``."""
    env = os.environ if env is None else env
    cache = env.get("MODELSCOPE_CACHE") or str(Path("~/.cache/modelscope/hub").expanduser())
    return Path(cache).expanduser() / "models"


def modelscope_candidates(spec: str, download_dir: str | None = None, env: dict | None = None) -> list[Path]:
    """Folders where a ModelScope model ``spec`` (``ORG/NAME``) is found without a download, in
    SGLang 0.5.23's order (``handle_modelscope_paths``): ``<model cache root>/ORG/NAME``, then
    ``<--download-dir>/ORG/NAME``; also ``<model cache root>/ORG/NAME`` with the dots of NAME
    written ``___``, where modelscope's ``snapshot_download`` stores a model (modelscope
    ``get_model_masked_directory``; SGLang reaches it through that call)."""
    root = modelscope_model_root(env)
    org, _, name = spec.partition("/")
    out = [root / spec]
    if download_dir:
        out.append(Path(download_dir).expanduser() / spec)
    masked = root / org / name.replace(".", "___")
    if masked not in out:
        out.append(masked)
    return out


def resolve_model_config_path(spec: str, hf_home: str | None = None, download_dir: str | None = None,
                              modelscope: bool | None = None) -> Path:
    """Find the config.json that ``spec`` names; see :func:`load_model_config`.

    With ``modelscope`` (default: :func:`use_modelscope` of this process's environment, which the
    controller sets to the unit's) a repo id is looked up where SGLang looks for a ModelScope model
    (:func:`modelscope_candidates`, ``download_dir``: the server's ``--download-dir``), not in the
    Hugging Face cache. Raises PayloadError('not_found') naming every path tried,
    PayloadError('bad_input') for an empty spec.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PayloadError("bad_input", "model config: empty --model-config")
    p = Path(spec).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise PayloadError("not_found", f"model config: folder {p} has no config.json")
        return cfg
    if p.is_file():
        return p
    if not _looks_like_repo_id(spec):
        raise PayloadError("not_found", f"model config: {p} does not exist")
    if use_modelscope() if modelscope is None else modelscope:
        tried = [c / "config.json" for c in modelscope_candidates(spec, download_dir)]
        for cand in tried:
            if cand.is_file():
                return cand
        raise PayloadError(
            "not_found",
            f"model config: {spec!r} (SGLANG_USE_MODELSCOPE) is in no ModelScope cache: tried "
            + ", ".join(str(t) for t in tried)
            + "; SGLang would download it at start, orch does not download",
        )
    hub = hf_hub_dir(hf_home)
    repo_dir = hub / ("models--" + spec.replace("/", "--"))
    snaps = repo_dir / "snapshots"
    if not snaps.is_dir():
        raise PayloadError(
            "not_found",
            f"model config: {spec!r} is neither a local path nor in the Hugging Face cache "
            f"({snaps} does not exist; offline lookup only)",
        )
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8", errors="replace").strip()
        cand = snaps / rev / "config.json"
        if rev and "/" not in rev and cand.is_file():
            return cand
    cands = sorted(
        (d / "config.json" for d in snaps.iterdir() if (d / "config.json").is_file()),
        key=lambda c: (c.stat().st_mtime, c.parent.name),
        reverse=True,
    )
    if not cands:
        raise PayloadError("not_found", f"model config: no snapshot of {spec!r} under {snaps} has a config.json")
    return cands[0]  # no usable refs/main: the most recently written snapshot


def load_model_config(spec: str, hf_home: str | None = None) -> dict:
    """Load a model's ``config.json`` as a dict.

    ``spec`` is a folder holding ``config.json``, a path to a JSON file, or a Hugging Face
    repo id (``ORG/NAME``) resolved OFFLINE from the cache:
    ``<hub>/models--ORG--NAME/snapshots/<rev>/config.json`` where ``<rev>`` is
    ``refs/main`` when that snapshot has a config.json, else the newest snapshot that
    does (``<hub>`` from :func:`hf_hub_dir`); with ``SGLANG_USE_MODELSCOPE`` set in this
    process's environment, from the ModelScope cache instead (:func:`resolve_model_config_path`).
    Nothing is downloaded.

    Raises PayloadError('not_found') when no file is found and PayloadError('bad_input')
    when the file is larger than :data:`MAX_CONFIG_BYTES`, not JSON, or not an object;
    messages name the path.
    """
    path = resolve_model_config_path(spec, hf_home)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise PayloadError("bad_input", f"model config {path}: {size} bytes, more than {MAX_CONFIG_BYTES}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PayloadError("not_found", f"model config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PayloadError("bad_input", f"model config {path}: not UTF-8 ({exc.reason})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError("bad_input", f"model config {path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise PayloadError("bad_input", f"model config {path}: top level is {type(cfg).__name__}, not an object")
    return cfg

