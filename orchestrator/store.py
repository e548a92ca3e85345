"""The controller's store of tuned configs, keyed by everything that decides the files.

Hosts whose *tuning key* is equal need byte-identical files: SGLang device name,
Triton version, kernel provider and SGLang version, E, N, hidden size, top-k, the
dtype/block/per-channel selectors, the batch sizes and the search space. orch tunes
each key once and reuses the result (unless ``--retune``).

Layout: ``<state_dir>/store/<key hash>/`` with ``key.json``, ``provenance.json`` (host,
time, run id, payload version, provider), ``report.json`` and the config files.
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

KEY_FIELDS = ("device_name", "triton_version", "provider", "sglang_version", "E", "N", "hidden", "topk",
              "dtype_selector", "block_shape", "per_channel_quant", "batch_sizes", "space")


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
        "provider": provider, "sglang_version": probe.sglang.version,
        **shape, "per_channel_quant": bool(shape["per_channel_quant"]),
        "batch_sizes": sorted(int(b) for b in batch_sizes) if batch_sizes else None, "space": space,
    }


def key_hash(key: dict) -> str:
    """Stable 16-hex-digit hash of a tuning key."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


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
        """The entry for ``key``, or None."""
        d = self.root / key_hash(key)
        return self._load(d) if (d / "provenance.json").exists() else None

    def _load(self, d: Path) -> Entry:
        prov = json.loads((d / "provenance.json").read_text())
        key = json.loads((d / "key.json").read_text())
        files = {role: d / name for role, name in (prov.get("files") or {}).items()}
        rep = d / "report.json"
        return Entry(d.name, d, key, prov, files, rep if rep.exists() else None)

    def put(self, key: dict, files: dict[str, str | Path], report: str | Path | None, provenance: dict) -> Entry:
        """Store validated config files for ``key`` atomically (a temp folder renamed in place)."""
        from remote.engines.triton_moe.configfile import load_config_file
        from remote.protocol import PayloadError

        for role, path in files.items():
            try:
                load_config_file(str(path))
            except PayloadError as exc:
                raise StoreError(f"{path}: {exc.msg}") from None
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / key_hash(key)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        for path in files.values():
            shutil.copyfile(path, tmp / Path(path).name)
        if report and Path(report).exists():
            shutil.copyfile(report, tmp / "report.json")
        prov = dict(provenance, files={role: Path(p).name for role, p in files.items()},
                    stored=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        (tmp / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return self._load(final)

    def list(self) -> list[Entry]:
        """Every entry, newest first."""
        if not self.root.exists():
            return []
        out = [self._load(d) for d in self.root.iterdir() if (d / "provenance.json").exists()]
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
        exported = src / "provenance.json"
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
        jsons = sorted(p for p in src.glob("*.json") if p.name.startswith("E=") and p.name != "report.json")
        up = [p for p in jsons if not p.stem.endswith("_down")]
        down = [p for p in jsons if p.stem.endswith("_down")]
        if len(up) != 1 or len(down) > 1:
            raise StoreError(f"{src}: expected one up file and at most one _down file, found {[p.name for p in jsons]}")
        files = {"up": up[0], **({"down": down[0]} if down else {})}
        if down:
            from remote.engines.triton_moe.configfile import check_down_matches_up, load_config_file
            from remote.protocol import PayloadError

            try:
                check_down_matches_up(load_config_file(str(up[0])), load_config_file(str(down[0])))
            except PayloadError as exc:
                raise StoreError(f"{src}: {exc.msg}") from None
        rep = src / "report.json"
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
