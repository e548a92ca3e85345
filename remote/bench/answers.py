"""Greedy answers of the server to a fixed prompt set (``answers``), for the runner trial's output check.

``python -m remote answers --url URL --request FILE``; the request: ``{"prompts": [str, ...],
"max_new_tokens": int}``. Each prompt is sent alone to SGLang's native ``POST /generate``
(``srt/entrypoints/http_server.py``) with ``sampling_params`` ``{"temperature": 0,
"max_new_tokens": N}`` (greedy: SGLang samples the top token at temperature 0), one at a time, so
batching does not enter. Result: ``{"answers": [{"text", "output_ids": [int] | null}], "url"}``.
Raises ``PayloadError`` ``bad_input`` (request) or ``runtime`` (a prompt not answered with 200).
"""

from __future__ import annotations

import http.client
import json

from ..protocol import PayloadError
from .common import parse_url

MAX_PROMPTS = 256


def add_arguments(parser) -> None:
    """Flags of ``answers``."""
    parser.add_argument("--url", required=True, help="the unit's base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--request", required=True, help="JSON request file, - for stdin")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per prompt")


def run(args) -> dict:
    """``answers`` command: see the module docstring."""
    from ..host.fs import load_request

    req = load_request(args.request)
    prompts, n = req.get("prompts"), req.get("max_new_tokens")
    if not isinstance(prompts, list) or not prompts or len(prompts) > MAX_PROMPTS \
            or not all(isinstance(p, str) and p for p in prompts):
        raise PayloadError("bad_input", f"prompts must be 1..{MAX_PROMPTS} non-empty strings")
    if not isinstance(n, int) or not 1 <= n <= 4096:
        raise PayloadError("bad_input", f"max_new_tokens must be an integer 1..4096, got {n!r}")
    target = parse_url(args.url)
    return {"url": args.url, "answers": [answer(target, p, n, args.timeout) for p in prompts]}


def answer(target, prompt: str, max_new_tokens: int, timeout: float) -> dict:
    """One greedy answer: ``{"text", "output_ids"}`` (``output_ids`` None when the server sends
    none). Raises ``PayloadError('runtime')`` when the server does not answer 200."""
    body = json.dumps({"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}})
    conn = target.connection(timeout=timeout)
    try:
        conn.request("POST", target.prefix + "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read(1 << 22)
    except (OSError, http.client.HTTPException) as exc:
        raise PayloadError("runtime", f"/generate at {target.host}:{target.port}: {exc}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise PayloadError("runtime", f"/generate answered {resp.status}: {raw[:200]!r}")
    try:
        data = json.loads(raw)
    except ValueError:
        raise PayloadError("runtime", f"/generate answered no JSON: {raw[:200]!r}") from None
    if isinstance(data, list):
        data = data[0] if data else {}
    ids = data.get("output_ids")
    return {"text": str(data.get("text", "")), "output_ids": ids if isinstance(ids, list) else None}
