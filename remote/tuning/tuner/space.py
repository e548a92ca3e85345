"""Search spaces, resource pruning and SGLang's default config.

Config dicts use SGLang's field names: BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps,
num_stages (all ints), and ``USE_TMA`` (bool) where the kernel reads it (SGLang 0.5.5+
down configs, 0.5.20+ up configs: TMA loads on Hopper and newer). A config without
``USE_TMA`` means TMA off.
"""

from __future__ import annotations

import itertools

KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

# SGLang benchmark/kernels/fused_moe_triton/common_utils.py (get_configs_compute_bound, CUDA branch;
# the tuner is benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py): 4 x 5 x 3 x 4 x 2 x 4 = 1920 configs.
FULL_STAGES = (2, 3, 4, 5)
FULL_BM = (16, 32, 64, 128, 256)
FULL_BK = (64, 128, 256)
FULL_BN = (32, 64, 128, 256)
FULL_WARPS = (4, 8)
FULL_GROUP = (1, 16, 32, 64)

MAX_REGS_PER_THREAD = 255  # CUDA limit for any sm_70+ GPU


def cfg_key(cfg: dict) -> tuple:
    """Hashable key of a config: the six fields in :data:`KEYS` order, plus a seventh
    element 1 when ``USE_TMA`` is true (a config with TMA off keeps the 6-tuple)."""
    key = tuple(int(cfg[k]) for k in KEYS)
    return key + (1,) if cfg.get("USE_TMA") else key


def from_key(key: tuple) -> dict:
    """Inverse of :func:`cfg_key` (``USE_TMA: True`` only when the key has it)."""
    cfg = dict(zip(KEYS, (int(v) for v in key[:6])))
    if len(key) > 6 and key[6]:
        cfg["USE_TMA"] = True
    return cfg


def with_tma(cfg: dict, on: bool) -> dict:
    """``cfg`` with ``USE_TMA`` set (``on``) or removed."""
    c = {k: v for k, v in cfg.items() if k != "USE_TMA"}
    if on:
        c["USE_TMA"] = True
    return c


def full_space() -> list[dict]:
    """SGLang's 1920-config CUDA search space (tuning_fused_moe_triton.py, unpruned)."""
    return [dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=s)
            for s, bm, bk, bn, w, g in itertools.product(FULL_STAGES, FULL_BM, FULL_BK, FULL_BN,
                                                         FULL_WARPS, FULL_GROUP)]


def smoke_space() -> list[dict]:
    """A handful of configs for CPU test-bed runs (TRITON_INTERPRET=1, tiny shapes)."""
    return [dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
            for bm, bn in ((16, 32), (16, 64), (32, 64))]


def smem_bytes(cfg: dict, elem_bytes: int = 2) -> int:
    """Shared memory (bytes) one block of the GEMM kernel needs.

    ``num_stages`` pipeline buffers (``num_stages - 1`` when BLOCK_SIZE_M < 64) of
    ``(BLOCK_SIZE_M + BLOCK_SIZE_N) * BLOCK_SIZE_K * elem_bytes`` bytes. Formula from the
    project's H200 measurements with Triton 3.6 (docs/benchmarks.md section 1: 256x64x128 with 3
    stages needs 245,760 B, Triton's own figure at its OutOfResources; a unit test holds it).
    ``elem_bytes``: 2 for bf16/fp16, 1 for fp8, 4 for fp32.
    """
    stages = int(cfg["num_stages"])
    if int(cfg["BLOCK_SIZE_M"]) < 64:
        stages -= 1
    stages = max(stages, 1)
    return stages * (int(cfg["BLOCK_SIZE_M"]) + int(cfg["BLOCK_SIZE_N"])) * int(cfg["BLOCK_SIZE_K"]) * elem_bytes


def acc_regs_per_thread(cfg: dict) -> int:
    """fp32 accumulator registers per thread: BLOCK_SIZE_M * BLOCK_SIZE_N / (32 * num_warps)."""
    return int(cfg["BLOCK_SIZE_M"]) * int(cfg["BLOCK_SIZE_N"]) // (32 * int(cfg["num_warps"]))


def fits(cfg: dict, smem_limit: int | None, elem_bytes: int = 2, block_k: int | None = None) -> tuple[bool, str]:
    """Whether a config can run well on the device, without compiling it.

    Rules: shared memory per block (:func:`smem_bytes`) <= ``smem_limit`` (the device's
    opt-in per-block limit, bytes; ``None`` = unknown, not checked); the accumulator alone
    must fit the 255 registers a thread may have (a larger one spills to local memory on
    every K step); for block-quantized fp8 (``block_k`` = the block's K, e.g. 128)
    BLOCK_SIZE_K must divide ``block_k`` (one weight scale per K step, the rule SGLang's
    tuner applies to block_shape). Returns ``(ok, reason)``.
    """
    if block_k and int(block_k) % int(cfg["BLOCK_SIZE_K"]):
        return False, f"BLOCK_SIZE_K {cfg['BLOCK_SIZE_K']} does not divide the fp8 block's K {block_k}"
    if smem_limit is not None:
        need = smem_bytes(cfg, elem_bytes)
        if need > smem_limit:
            return False, f"shared memory {need} B > {smem_limit} B"
    regs = acc_regs_per_thread(cfg)
    if regs > MAX_REGS_PER_THREAD:
        return False, f"accumulator needs {regs} registers/thread > {MAX_REGS_PER_THREAD}"
    return True, ""


def prune(configs: list[dict], smem_limit: int | None, elem_bytes: int = 2, max_k: int | None = None,
          max_n: int | None = None, block_k: int | None = None) -> tuple[list[dict], list[tuple[dict, str]]]:
    """Split ``configs`` into (runnable, [(ruled_out, reason)]) by :func:`fits`.

    ``max_k``/``max_n``: optional GEMM K and N; BLOCK_SIZE_K > next_pow2(K) (or N) only
    pads with masked work and is ruled out too (never the case for real models).
    ``block_k``: see :func:`fits`.
    """
    keep, out = [], []
    for c in configs:
        ok, why = fits(c, smem_limit, elem_bytes, block_k)
        if ok and max_k is not None and int(c["BLOCK_SIZE_K"]) > max(16, _next_pow2(max_k)):
            ok, why = False, f"BLOCK_SIZE_K {c['BLOCK_SIZE_K']} > K {max_k}"
        if ok and max_n is not None and int(c["BLOCK_SIZE_N"]) > max(16, _next_pow2(max_n)):
            ok, why = False, f"BLOCK_SIZE_N {c['BLOCK_SIZE_N']} > N {max_n}"
        (keep if ok else out).append(c if ok else (c, why))
    return keep, out


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def default_config(M: int, E: int, dtype_selector: str | None = None, block_shape=None) -> dict:
    """SGLang 0.5.23's fallback config (``get_default_config``) when no file is found.

    bf16/fp16: ``BLOCK_SIZE_M 64, N 64, K 32, GROUP_SIZE_M 8``, or ``16/32/64, G1`` when
    M <= E; fp8_w8a8 per-tensor: ``128/256/128, G32, 8 warps, 4 stages``; fp8 block:
    ``64/block_n/block_k, G32, 4 warps, 3 stages`` (SGLang 0.5.23
    ``srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py`` ``get_default_config``). Where SGLang
    leaves num_warps/num_stages out, Triton's launch defaults (4 warps, 3 stages) apply and
    are written here explicitly.
    """
    if dtype_selector == "fp8_w8a8":
        if block_shape:
            return dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=int(block_shape[0]), BLOCK_SIZE_K=int(block_shape[1]),
                        GROUP_SIZE_M=32, num_warps=4, num_stages=3)
        return dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=32, num_warps=8,
                    num_stages=4)
    if M <= E:
        return dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    return dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8, num_warps=4, num_stages=3)


def closest_entry(configs: dict, M: int) -> dict:
    """The entry SGLang uses for M: the integer key closest to M (ties: the first in key
    order, as Python's ``min`` over the file's keys does in ``try_get_optimal_moe_config``)."""
    keys = [int(k) for k in configs]
    k = min(keys, key=lambda x: abs(x - M))
    return dict(configs[str(k)] if str(k) in configs else configs[k])


# ----------------------------------------------------------------------- fast search

def seed_configs(M: int, E: int, top_k: int, block_ms=FULL_BM) -> list[dict]:
    """Stage-1 seeds of the fast search: one config per (BLOCK_SIZE_M, N, K) triple.

    BLOCK_SIZE_M is limited to the useful range for the expected tokens per active expert
    (a block much larger than any expert's token count only multiplies padding): up to
    4 x next_pow2(expected max load), at least 16. Warps 8 for blocks of 128x256 and up,
    else 4; 3 stages; GROUP_SIZE_M 1 when an expert holds less than one block, else 16.
    """
    pairs = M * top_k
    active = min(E, pairs)
    mean_load = pairs / max(active, 1)
    cap = max(16, 4 * _next_pow2(int(mean_load * 1.5) + 1))
    out = []
    for bm in block_ms:
        if bm > cap and bm != min(block_ms):
            continue
        for bn in FULL_BN:
            for bk in FULL_BK:
                warps = 8 if bm * bn >= 128 * 256 else 4
                group = 1 if mean_load < bm else 16
                out.append(dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=group,
                                num_warps=warps, num_stages=3))
    return out


def neighbours(cfg: dict, tma: bool = False) -> list[dict]:
    """Configs one step from ``cfg`` inside the full space, BLOCK_SIZE_M fixed: any other
    num_stages, num_warps or GROUP_SIZE_M value; BLOCK_SIZE_N and BLOCK_SIZE_K halved or
    doubled; with ``tma`` (the kernel reads ``USE_TMA`` for this GEMM) also ``USE_TMA``
    flipped."""
    out = []
    if tma:
        out.append(with_tma(cfg, not cfg.get("USE_TMA")))

    def with_(**kw):
        c = dict(cfg)
        c.update(kw)
        return c

    for s in FULL_STAGES:
        if s != cfg["num_stages"]:
            out.append(with_(num_stages=s))
    for w in FULL_WARPS:
        if w != cfg["num_warps"]:
            out.append(with_(num_warps=w))
    for g in FULL_GROUP:
        if g != cfg["GROUP_SIZE_M"]:
            out.append(with_(GROUP_SIZE_M=g))
    for f in (cfg["BLOCK_SIZE_N"] // 2, cfg["BLOCK_SIZE_N"] * 2):
        if f in FULL_BN:
            out.append(with_(BLOCK_SIZE_N=f))
    for f in (cfg["BLOCK_SIZE_K"] // 2, cfg["BLOCK_SIZE_K"] * 2):
        if f in FULL_BK:
            out.append(with_(BLOCK_SIZE_K=f))
    return out
