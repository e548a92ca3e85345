"""The controller's store of tuned configs, keyed by everything that decides the files.

Hosts whose *tuning key* is equal need byte-identical files: the device name (the engine's
form), Triton version, kernel provider, the engine and its release, E, N, hidden size, top-k,
the dtype/block/per-channel selectors, the batch sizes and the search space. orch tunes each
key once and reuses the result (unless ``--retune``).

Layout: ``<state_dir>/store/<key hash>/`` with :data:`KEY_FILE`, :data:`PROVENANCE_FILE` (host,
time, run id, payload version, provider), :data:`REPORT_FILE` and the config files. Entries
written before orch named engines (their key names the release ``sglang_version`` and no engine)
are read as SGLang's, under their old hash (:func:`legacy_key`; :mod:`orchestrator.facts.legacy`).
"""

from __future__ import annotations

from .errors import OrchError
from .facts.probe import ProbeFacts

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.protocol import RESOLVED_PROVIDERS

from .facts.legacy import LEGACY_ENGINE, STORE_KEY_KEYS, renamed

KEY_FIELDS = ("device_name", "triton_version", "provider", "engine", "engine_version", "E", "N", "hidden", "topk",
              "dtype_selector", "block_shape", "per_channel_quant", "batch_sizes", "space")
#: the files of a store entry (and of an exported one) besides the config files
KEY_FILE = "key.json"
PROVENANCE_FILE = "provenance.json"
REPORT_FILE = "report.json"


class StoreError(OrchError):
    """A store entry or an import is invalid; the message names the file."""


def tuning_key(probe: ProbeFacts, space: str, batch_sizes: list[int] | None, provider: str) -> dict[str, Any]:
    """The tuning key of a host from its payload probe (``orch_probe``; dict of :data:`KEY_FIELDS`).

    ``provider`` ``auto`` is the kernel the payload resolves it to on that host, as its probe
    reports it (``tuner_provider.auto``, decided by ``remote.tuning.support.resolve_provider_name``),
    so two hosts that would tune with different kernels never share files. Raises
    :class:`StoreError` when ``provider`` is ``auto`` and the probe has no answer.
    """
    model = probe.model
    shape = {k: getattr(model, k) if model is not None else None
             for k in ("E", "N", "hidden", "topk", "dtype_selector", "block_shape", "per_channel_quant")}
    if provider == "auto":
        provider = probe.tuner_provider.auto
        if provider not in RESOLVED_PROVIDERS:
            raise StoreError(f"the probe reported no tuner_provider.auto (got {provider!r}): "
                             "cannot tell which kernel `tune --provider auto` would run")
    return {
        "device_name": probe.device_name, "triton_version": probe.triton_version,
        "provider": provider, "engine": probe.engine_name, "engine_version": probe.engine.version,
        **shape, "per_channel_quant": bool(shape["per_channel_quant"]),
        "batch_sizes": sorted(int(b) for b in batch_sizes) if batch_sizes else None, "space": space,
    }


def _extra_fields(key: dict) -> tuple[str, ...]:
    """The entry fields the key's engine also reads (``Engine.config_extra_fields``: vLLM's
    ``SPLIT_K``); none for an engine this build does not know."""
    from remote.engines import ENGINES

    engine = ENGINES.get(str(key.get("engine") or ""))
    return tuple(engine.config_extra_fields) if engine is not None else ()


def key_hash(key: dict) -> str:
    """Stable 16-hex-digit hash of a tuning key."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def read_key(data: dict) -> dict:
    """A tuning key read from disk (a store entry's or an export's :data:`KEY_FILE`, a recover
    ticket's), in today's names: a key written before orch named engines gets ``engine_version``
    for its old name and :data:`orchestrator.facts.legacy.LEGACY_ENGINE` as ``engine``."""
    if not isinstance(data, dict) or "engine" in data:
        return data
    return {**renamed(data, STORE_KEY_KEYS), "engine": LEGACY_ENGINE}


def legacy_key(key: dict) -> dict | None:
    """The form a store wrote ``key`` in before orch named engines (its hash names that entry's
    folder), or None for a key of another engine or one already in that form."""
    if key.get("engine") != LEGACY_ENGINE:
        return None
    old = {v: k for k, v in STORE_KEY_KEYS.items()}
    return {old.get(k, k): v for k, v in key.items() if k != "engine"}


@dataclass
class Entry:
    """One stored result: ``files`` role -> path, ``key``, ``provenance``, ``report`` path or None."""

    hash: str
    dir: Path
    key: dict
    provenance: dict
    files: dict[str, Path]
    report: Path | None


class ConfigStore:
    """Tuned results on the controller (``<state_dir>/store``)."""

    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / "store"

    def get(self, key: dict) -> Entry | None:
        """The entry for ``key`` (a key of today's form: :func:`read_key`), or None; an entry an
        older store wrote for it (:func:`legacy_key`) counts."""
        key = read_key(key)
        for k in (key, legacy_key(key)):
            d = self.root / key_hash(k) if k is not None else None
            if d is not None and (d / PROVENANCE_FILE).exists():
                return self._load(d)
        return None

    def _load(self, d: Path) -> Entry:
        prov = json.loads((d / PROVENANCE_FILE).read_text())
        key = read_key(json.loads((d / KEY_FILE).read_text()))
        files = {role: d / name for role, name in (prov.get("files") or {}).items()}
        rep = d / REPORT_FILE
        return Entry(d.name, d, key, prov, files, rep if rep.exists() else None)

    def put(self, key: dict, files: dict[str, str | Path], report: str | Path | None, provenance: dict) -> Entry:
        """Store validated config files for ``key`` (in today's form, :func:`read_key`) atomically (a
        temp folder renamed in place)."""
        key = read_key(key)
        from remote.engines import load_config_file
        from remote.protocol import PayloadError

        extra = _extra_fields(key)
        for role, path in files.items():
            try:
                load_config_file(str(path), extra_fields=extra)
            except PayloadError as exc:
                raise StoreError(f"{path}: {exc.msg}") from None
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / key_hash(key)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        for path in files.values():
            shutil.copyfile(path, tmp / Path(path).name)
        if report and Path(report).exists():
            shutil.copyfile(report, tmp / REPORT_FILE)
        prov = dict(provenance, files={role: Path(p).name for role, p in files.items()},
                    stored=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        (tmp / KEY_FILE).write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
        (tmp / PROVENANCE_FILE).write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return self._load(final)

    def list(self) -> list[Entry]:
        """Every entry, newest first."""
        if not self.root.exists():
            return []
        out = [self._load(d) for d in self.root.iterdir() if (d / PROVENANCE_FILE).exists()]
        return sorted(out, key=lambda e: e.provenance.get("stored", ""), reverse=True)

    def find(self, prefix: str) -> Entry:
        """The entry whose hash starts with ``prefix``; StoreError when none or several."""
        hits = [e for e in self.list() if e.hash.startswith(prefix)]
        if len(hits) != 1:
            raise StoreError(f"{len(hits)} store entries match {prefix!r}")
        return hits[0]

    def import_tree(self, src: Path, key: dict, provenance: dict) -> Entry:
        """Import files tuned elsewhere (a folder with the up and optional ``_down`` file), validated.

        A folder ``orch configs export`` wrote carries its entry's ``provenance.json``: where and
        when the files were tuned (host, run id, provider, versions) is kept, under ``provenance``'s
        own keys, and the time they were first stored becomes ``tuned_at``; ``imported_from`` names
        ``src``. Raises :class:`StoreError` for an invalid file, naming it."""
        src = Path(src)
        exported = src / PROVENANCE_FILE
        if exported.exists():
            try:
                earlier = json.loads(exported.read_text())
            except ValueError as exc:
                raise StoreError(f"{exported}: not JSON: {exc}") from None
            if not isinstance(earlier, dict):
                raise StoreError(f"{exported}: a provenance is a JSON object, got {type(earlier).__name__}")
            kept = {k: v for k, v in earlier.items() if k not in ("files", "stored", "imported_from", "tuned_at")}
            provenance = {**kept, **{k: v for k, v in provenance.items() if v is not None},
                          "tuned_at": earlier.get("tuned_at") or earlier.get("stored")}
        jsons = sorted(p for p in src.glob("*.json") if p.name.startswith("E=") and p.name != REPORT_FILE)
        up = [p for p in jsons if not p.stem.endswith("_down")]
        down = [p for p in jsons if p.stem.endswith("_down")]
        if len(up) != 1 or len(down) > 1:
            raise StoreError(f"{src}: expected one up file and at most one _down file, found {[p.name for p in jsons]}")
        files = {"up": up[0], **({"down": down[0]} if down else {})}
        if down:
            from remote.engines import check_down_matches_up, load_config_file
            from remote.protocol import PayloadError

            try:
                extra = _extra_fields(read_key(key))
                check_down_matches_up(load_config_file(str(up[0]), extra_fields=extra),
                                      load_config_file(str(down[0]), extra_fields=extra))
            except PayloadError as exc:
                raise StoreError(f"{src}: {exc.msg}") from None
        rep = src / REPORT_FILE
        return self.put(key, files, rep if rep.exists() else None, dict(provenance, imported_from=str(src)))


def provenance_text(prov: dict) -> str:
    """Where a store entry comes from, for messages: ``tuned on gpu-a at 2026-12-03T22:42:47+00:00,
    run 20261203T224228Z-tune-c7eac4``, and for an imported entry ``; imported from DIR at TIME``.
    An import of files with no record of their host says so instead of naming ``None``."""
    host, run = prov.get("host"), prov.get("run_id")
    when = prov.get("tuned_at") or (None if prov.get("imported_from") else prov.get("stored"))
    text = (f"tuned on {host}" if host else "tuned on a host the import does not name") \
        + (f" at {when}" if when else "") + (f", run {run}" if run else "")
    if prov.get("imported_from"):
        text += f"; imported from {prov['imported_from']} at {prov.get('stored')}"
    return text


def measured_on(prov: dict) -> str | None:
    """Who measured a store entry's kernel speedup (its ``report.json``), as the summary names it:
    ``gpu-a (run R)``, ``the imported files' tuner (DIR)`` when the import names no host, None
    for an entry neither tuned here nor imported."""
    if prov.get("host"):
        return f"{prov['host']}" + (f" (run {prov['run_id']})" if prov.get("run_id") else "")
    if prov.get("imported_from"):
        return f"the imported files' tuner ({prov['imported_from']})"
    return None
