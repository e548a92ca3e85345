"""The prepared folder: what ``python -m remote prepare`` makes before the unit stops, and what the
tune after the stop takes from it (``python -m remote tune --prepared DIR``).

Layout, in the tune's work folder ``WORK`` (``DIR`` is ``WORK/prepared``)::

    prepared/manifest.json              what was prepared, for which GPU target, Triton, engine and
                                        shape (below)
    triton-cache/triton-cache-<tag>/    the Triton cache the kernels were compiled into, named by the
                                        prepare's run tag as every tune's own cache is
                                        (:func:`remote.tuning.cache.fresh_cache`); the tune's
                                        TRITON_CACHE_DIR, removed when the tune ends

``manifest.json`` (:func:`build`): ``format``, ``payload_version``, ``gpu`` (``capability``,
``device_name``, ``target`` ``[backend, arch, warp_size]``, ``source``), ``triton_version``,
``engine`` (``provider``, ``version``: SGLang's release, or the payload's for the builtin kernel),
``shape`` {E, N, hidden, topk}, ``dtype``, ``naming`` (file-name selectors), ``quant``, ``space``,
``batch_sizes``, ``interpret``, ``cache`` (the cache folder, relative to ``WORK``), ``shipped``
(the configs SGLang's lookup finds now: the baseline
and tie preference of the search, read before the stop), ``candidates`` (per batch size and GEMM,
the config keys compiled for it, in order), ``kernels`` (``compiled``: compile-request identities,
:meth:`remote.tuning.tuner.aot.KernelSpec.ident`; ``failed``: identity -> error), ``cache_files``
(path -> size of every file the prepare left in the cache), ``stats`` (seconds, workers,
niceness, whether the time budget cut it), ``cuda`` (the prepare process's CUDA state: never
initialised) and ``checksum`` (SHA-256 of the rest, :func:`checksum`).

The tune refuses a folder, naming why, when :func:`check` finds it does not match (another GPU
target, Triton, engine release, payload, shape, dtype or quantization; a changed or truncated
manifest or cache) and then compiles as without one.

Which candidates are prepared (:func:`plan`): the ``fast`` search's first screen for each batch
size (``space.seed_configs``, the shipped config for M and SGLang's default, each with and without
``USE_TMA`` where the GEMM reads it) and every config one step from those (``space.neighbours``):
the candidates of the search's first refinement round, whichever seeds lead. A later round's
candidates, the previous batch size's winner as a hint and the correctness check's batch size
(at most 256) may fall outside; those compile after the stop as before (the compile workers start
only then). ``full`` and ``smoke`` prepare their whole space.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import space as sp

FORMAT = 1
MANIFEST = "manifest.json"
#: the manifest fields a tune must match (the rest describes the prepare)
MATCH_FIELDS = ("payload_version", "triton_version", "engine", "shape", "dtype", "naming", "quant", "interpret")


def clean(kind: str, cfg: dict, tma_kinds) -> dict:
    """``cfg`` as the search times it for GEMM ``kind``: the six fields, ``USE_TMA`` only for a
    GEMM in ``tma_kinds`` (:meth:`remote.tuning.tuner.search.Evaluator.clean`'s rule)."""
    c = {k: int(cfg[k]) for k in sp.KEYS if k in cfg}
    if cfg.get("USE_TMA") and kind in tma_kinds:
        c["USE_TMA"] = True
    return c


def likely_block_m(M: int, E: int, top_k: int) -> int:
    """The BLOCK_SIZE_M a tune is likely to pick at batch size M: twice the mean tokens per active
    expert, rounded up to a power of two, within 16..128. An order of compiling only (the first
    refinement round's candidates of BLOCK_SIZE_M near it are compiled first, so a prepare cut by
    its time budget has compiled the likelier ones): the H200 picks of bf16 Qwen3-30B-A3B
    (docs/benchmarks.md §4.5, E=128, top-k 8) were 16 up to M=128, 32 at 256, 64 at 512 and 1024,
    128 from 1536. Pure."""
    load = M * top_k / max(1, min(E, M * top_k))
    want = 1 << max(0, (max(1, int(2 * load + 0.999)) - 1).bit_length())
    return max(16, min(128, want))


def plan(space: str, M: int, E: int, top_k: int, kinds, tma_kinds, feasible, prefer=(),
         variants=None) -> list[list[tuple]]:
    """The candidates prepared for batch size M, in tiers (compiled tier by tier over every batch
    size): ``[[(kind, cfg), ...], ...]``. ``fast``: tier 0 = the seeds and the ``prefer`` configs
    (``[(up_cfg, down_cfg)]``: the shipped pair for M, SGLang's default), each also with
    ``USE_TMA`` flipped for a GEMM in ``tma_kinds``; tiers 1 and 2 = every feasible config one step
    from tier 0 (:func:`remote.tuning.tuner.space.neighbours`), tier 1 those whose BLOCK_SIZE_M is
    within a factor of 2 of :func:`likely_block_m`, tier 2 the rest. ``variants``: ``{kind: (other
    kind, ...)}``, other launches the server makes of a GEMM with the same config (the provider's
    ``server_variants``: SGLang's up GEMM with a sorted output, ``up_sorted``), prepared after the
    tiers of their configs: ``fast`` gives ``[T0, T1, variants of T0 and T1, T2, variants of T2]``.
    ``full``: SGLang's pruned space (with ``USE_TMA`` for the TMA GEMMs); ``smoke``: its few configs
    (each with its variants). ``feasible(cfg) -> bool`` applies the device's limits. Pure."""
    variants = dict(variants or {})

    def with_variants(tier: list) -> list:
        return [(v, c) for kind, c in tier for v in variants.get(kind, ())]
    tma_kinds = frozenset(tma_kinds or ())
    if space == "smoke":
        cfgs = [c for c in sp.smoke_space() if feasible(c)]
        base = [(k, clean(k, c, tma_kinds)) for k in kinds for c in cfgs]
        return [base, with_variants(base)]
    if space == "full":
        cfgs = [c for c in sp.full_space() if feasible(c)]
        base = [(k, clean(k, c2, tma_kinds)) for k in kinds
                for c in cfgs for c2 in ([c, sp.with_tma(c, True)] if k in tma_kinds else [c])]
        return [base, with_variants(base)]
    if space != "fast":
        raise ValueError(f"unknown space {space!r}")
    tiers: list[list[tuple]] = [[], [], []]
    seen: set = set()

    def add(tier: int, kind: str, cfg: dict) -> None:
        c = clean(kind, cfg, tma_kinds)
        if len(c) < len(sp.KEYS) or not feasible(c):
            return
        key = (kind, sp.cfg_key(c))
        if key not in seen:
            seen.add(key)
            tiers[tier].append((kind, c))

    seeds = [c for c in sp.seed_configs(M, E, top_k) if feasible(c)]
    for kind in kinds:
        own = list(seeds)
        for up, down in prefer or ():
            c = {"up": up, "down": down or up, "joint": up}.get(kind)
            if c:
                own.append(c)
        for c in own:
            add(0, kind, c)
            if kind in tma_kinds:
                add(0, kind, sp.with_tma(c, not c.get("USE_TMA")))
    likely = likely_block_m(M, E, top_k)
    for kind, c in list(tiers[0]):
        near = likely // 2 <= int(c["BLOCK_SIZE_M"]) <= likely * 2
        for nb in sp.neighbours(c, tma=kind in tma_kinds):
            add(1 if near else 2, kind, nb)
    return [tiers[0], tiers[1], with_variants(tiers[0] + tiers[1]), tiers[2], with_variants(tiers[2])]


def checksum(manifest: dict) -> str:
    """SHA-256 (hex) of the manifest without its ``checksum`` field, as canonical JSON (sorted
    keys, no spaces)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def cache_files(cache: Path) -> dict:
    """``{relative path: size in bytes}`` of every file under ``cache`` (empty when absent)."""
    out = {}
    if cache.is_dir():
        for root, _dirs, files in os.walk(cache):
            for f in files:
                p = Path(root) / f
                try:
                    out[str(p.relative_to(cache))] = p.stat().st_size
                except OSError:
                    continue
    return out


def cache_dir(folder: Path, manifest: dict) -> Path | None:
    """The Triton cache of the prepared folder ``folder`` (``WORK/prepared``): ``WORK/<cache>``
    from the manifest; None when the manifest names none, or a path outside ``WORK`` (absolute, or
    with ``..``). Pure but for the path arithmetic."""
    rel = str((manifest or {}).get("cache") or "")
    if not rel or rel.startswith("/") or ".." in Path(rel).parts:
        return None
    return Path(folder).parent / rel


def build(**fields) -> dict:
    """A manifest from its fields (module docstring), with ``format`` and ``checksum`` set."""
    m = dict(fields, format=FORMAT)
    m["checksum"] = checksum(m)
    return m


def expectation(*, payload_version: str, triton_version: str, engine: dict, shape: dict, dtype: str,
                naming: dict, quant, interpret: bool, capability: tuple[int, int] | None) -> dict:
    """What a tune needs a prepared folder to match: :data:`MATCH_FIELDS` and the GPU's compute
    capability (``None`` on the CPU, where nothing is compiled)."""
    return {"payload_version": payload_version, "triton_version": triton_version, "engine": engine,
            "shape": shape, "dtype": dtype, "naming": naming, "quant": quant, "interpret": interpret,
            "capability": f"{capability[0]}.{capability[1]}" if capability else None}


def _norm(v):
    return json.loads(json.dumps(v, sort_keys=True, default=str))


def check(manifest: dict, expect: dict, folder: Path | None = None) -> str | None:
    """Why ``manifest`` (of ``folder``) cannot serve a tune that expects ``expect``
    (:func:`expectation`), or None when it can. Checks the format, the checksum, the GPU's compute
    capability, each of :data:`MATCH_FIELDS`, the prepare process's CUDA state and, with
    ``folder``, that every cache file the prepare wrote is still there with its size. Pure but for
    reading ``folder``."""
    if not isinstance(manifest, dict):
        return "the manifest is not a JSON object"
    if manifest.get("format") != FORMAT:
        return f"manifest format {manifest.get('format')!r}, this payload reads {FORMAT}"
    if manifest.get("checksum") != checksum(manifest):
        return "the manifest's checksum does not match its content (changed or truncated)"
    cap = expect.get("capability")
    got = (manifest.get("gpu") or {}).get("capability")
    if cap is not None and got != cap:
        return f"prepared for compute capability {got}, this GPU is {cap}"
    names = {"payload_version": "payload", "triton_version": "Triton", "engine": "engine",
             "shape": "MoE shape", "dtype": "dtype", "naming": "file-name selectors", "quant": "quantization",
             "interpret": "interpreter mode"}
    for f in MATCH_FIELDS:
        if _norm(manifest.get(f)) != _norm(expect.get(f)):
            return f"prepared for {names[f]} {manifest.get(f)!r}, this tune has {expect.get(f)!r}"
    cuda = manifest.get("cuda") or {}
    if cuda.get("initialized") or cuda.get("visible") not in ("", None):
        return f"the prepare process saw CUDA ({cuda}): not made the way this payload prepares"
    if folder is not None:
        cache = cache_dir(folder, manifest)
        if cache is None:
            return f"the manifest names no cache inside the work folder ({manifest.get('cache')!r})"
        for rel, size in (manifest.get("cache_files") or {}).items():
            p = cache / rel
            try:
                if p.stat().st_size != size:
                    return f"prepared cache file {rel} changed size since the prepare"
            except OSError:
                return f"prepared cache file {rel} is missing"
    return None


def load(folder: Path, expect: dict) -> tuple[dict | None, str | None]:
    """``(manifest, None)`` when ``folder`` holds a prepared folder that serves a tune expecting
    ``expect``; ``(None, why)`` otherwise (absent, unreadable, or :func:`check`'s reason)."""
    folder = Path(folder)
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no {MANIFEST} in {folder} (the prepare step did not finish)"
    except (OSError, ValueError) as exc:
        return None, f"{path}: unreadable ({type(exc).__name__}: {exc})"
    why = check(manifest, expect, folder)
    return (None, why) if why else (manifest, None)
