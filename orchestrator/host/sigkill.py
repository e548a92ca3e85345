"""Processes orch ended by SIGKILL, and the stricter benchmark check that follows one.

sglang #22779: after a leftover of the server was ended by SIGKILL (it ignored SIGTERM, so it
could not release what it held), the next server answers ``/health`` and then stalls after
about a hundred requests. A benchmark that forgives 1% failed requests would not see that; so,
once this run has SIGKILLed a process (the ``reap`` task's leftovers of the GPUs, ``service``'s
holders of the port), the benchmark after the next start requires every request to return
tokens, and the recap says which processes were SIGKILLed.
"""

from __future__ import annotations


def note_sigkills(ctx, killed: list[dict], by: str) -> list[dict]:
    """Record in the run summary (``sigkilled``) and as ``sigkill`` events the entries of
    ``killed`` (the payload's ``reap``/``port`` lists: ``{"pid", "cmdline", "signal", ...}``)
    that SIGKILL ended; ``by``: ``reap`` or ``port``. Returns those entries."""
    hits = [{"pid": k.get("pid"), "cmdline": k.get("cmdline"), "by": by} for k in killed
            if k.get("signal") == "SIGKILL"]
    for h in hits:
        ctx.emit("sigkill", **h)
    if hits:
        ctx.run.summary.sigkilled = (ctx.run.summary.sigkilled or []) + hits
    return hits


def requests_without_tokens(levels: list[dict]) -> list[str]:
    """One line per benchmark level (the payload ``bench`` levels: ``max_concurrency``,
    ``num_prompts``, ``completed``, ``failed``, ``timed_out``, ``warmup_failed``) in which a
    request, measured or warm-up, did not return tokens (a request that ended without a token is
    ``failed`` in the payload's count); [] when every request did. Pure."""
    out = []
    for lv in levels:
        n = int(lv.get("num_prompts") or 0)
        done = int(lv.get("completed") or 0)
        bad = int(lv.get("failed") or 0) + int(lv.get("timed_out") or 0)
        warm = int(lv.get("warmup_failed") or 0)
        if bad or warm or done < n:
            errors = "; ".join(str(e) for e in (lv.get("errors") or [])[:2])
            out.append(f"concurrency {lv.get('max_concurrency')}: {done} of {n} requests returned tokens"
                       + (f", {warm} warm-up request(s) failed" if warm else "") + (f" ({errors})" if errors else ""))
    return out
