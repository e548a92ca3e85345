"""The second opinion: every claim a tune report makes against the server's current configs is
measured again, independently of the search, before the report makes it.

The search decides on its own measurements (screening, finalists, its whole-kernel stage on its
own inputs). A pick it found faster than the shipped file can lose there once the inputs change
(docs/benchmarks.md §4.7: on DeepSeek-V3 fp8 the tune claimed 1.02 to 1.07 over shipped, an
independent timing confirmed 3 of 15 M). So after the search, in the same process,
:func:`second_opinion` times the whole fused MoE (the provider's ``full_fn``: for SGLang's
provider its ``fused_experts`` reading the candidate files exactly as the server reads them) of
the tuned pair, SGLang's default and the shipped pair on **fresh inputs** (a new problem: other
activations and another draw of the same routing), in ``rounds`` interleaved rounds (the order
rotates every round, so drift and order effects hit every variant alike), median per variant,
with the spread (fastest and slowest round) and the per-round ratios of each baseline to the
tuned pair.

:func:`verdict` applies the rule: when the tuned pair is slower than the baseline the server
would otherwise run (the shipped file's entry for M; SGLang's default config where no file is
shipped) in this second opinion, the pick is replaced by that baseline and the report says so.
"""

from __future__ import annotations

import statistics

from .timing import SLOW_CALL_US, SLOW_REPLAY_US

#: Interleaved rounds of the second opinion on a GPU.
ROUNDS = 5
_FULL = dict(n_calls=10, reps=10)


def _protocol(estimate_us: float | None, cpu: bool) -> dict:
    if cpu:
        return dict(n_calls=1, reps=1)
    if estimate_us is not None and estimate_us >= SLOW_CALL_US:
        return dict(_FULL, replay_us=SLOW_REPLAY_US)
    return dict(_FULL)


def second_opinion(provider, problem, timer, variants: dict, cpu: bool, rounds: int = ROUNDS,
                   estimates: dict | None = None) -> dict:
    """Time ``variants`` ``{name: (up_cfg, down_cfg)}`` (``None`` configs: no file, the provider's
    default) as the whole fused MoE on ``problem`` (fresh inputs), ``rounds`` interleaved rounds
    (1 on the CPU), the order rotated each round; ``estimates`` ``{name: us}`` (the search's times)
    choose the slow-kernel protocol (``timing.SLOW_CALL_US``).

    Returns ``{"rounds", "us": {name: median or None}, "spread_us": {name: [min, max]},
    "ratio_to_tuned": {name: {"median", "min", "max"}}}`` (a baseline's time over the tuned pair's
    per round: above 1 the tuned pair is faster), ``"failed": {name: error}``. A variant that fails
    to run is None (e.g. a shipped config that does not fit this device)."""
    names = list(variants)
    est = estimates or {}
    samples: dict = {n: [] for n in names}
    failed: dict = {}
    n_rounds = 1 if cpu else max(1, int(rounds))
    fns = {}
    for n in names:
        try:
            fns[n] = provider.full_fn(problem, *variants[n])
        except Exception as exc:  # e.g. a config SGLang's launch code rejects
            failed[n] = f"{type(exc).__name__}: {str(exc)[:200]}"
    for r in range(n_rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            if n in failed:
                continue
            try:
                samples[n].append(timer.time(fns[n], **_protocol(est.get(n), cpu)))
            except Exception as exc:
                failed[n] = f"{type(exc).__name__}: {str(exc)[:200]}"
    us = {n: (statistics.median(samples[n]) if samples[n] and n not in failed else None) for n in names}
    spread = {n: ([round(min(samples[n]), 3), round(max(samples[n]), 3)] if us[n] is not None else None)
              for n in names}
    ratios = {}
    tuned = samples.get("tuned") if "tuned" not in failed else None
    for n in names:
        if n == "tuned" or us[n] is None or not tuned:
            continue
        per = [a / b for a, b in zip(samples[n], tuned) if b > 0]
        if per:
            ratios[n] = {"median": round(statistics.median(per), 4), "min": round(min(per), 4),
                         "max": round(max(per), 4)}
    return {"rounds": n_rounds, "us": us, "spread_us": spread, "ratio_to_tuned": ratios, "failed": failed}


def verdict(opinion: dict, baseline: str) -> tuple[bool, str]:
    """``(replace, why)``: replace the tuned pick by ``baseline`` (``"shipped"`` or ``"default"``)
    when the second opinion timed the tuned pair slower than it (medians); ``why`` is the report's
    sentence. Nothing is replaced when either did not run."""
    us = opinion.get("us") or {}
    t, b = us.get("tuned"), us.get(baseline)
    if t is None or b is None:
        return False, f"no second opinion against {baseline} (a variant did not run)"
    r = (opinion.get("ratio_to_tuned") or {}).get(baseline) or {}
    spread = f" (per-round ratios {r.get('min')} to {r.get('max')})" if r else ""
    if t > b:
        return True, (f"the tuned pair lost to the {baseline} entry in the second opinion: {t:.1f} us against "
                      f"{b:.1f} us, {baseline}/tuned {b / t:.4f}{spread}; the {baseline} entry is written instead")
    return False, f"the tuned pair beat the {baseline} entry in the second opinion: {b / t:.4f}x{spread}"
