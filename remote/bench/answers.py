"""Greedy answers of the server to a fixed prompt set (``answers``), for the runner trial's output check.

``python -m remote answers --url URL --request FILE [--concurrent]``; the request: ``{"prompts": [str, ...],
"max_new_tokens": int}``. Each prompt is sent as the engine's greedy generation request
(``--engine``; ``Engine.generate_request``: SGLang's native ``POST /generate`` with
``sampling_params`` ``{"temperature": 0, "max_new_tokens": N}``, :mod:`remote.engines.sglang.http`),
one at a time, so batching does not enter, or with ``--concurrent`` all at once (one request each,
on its own connection), so the server decodes them as one batch; the answer is read by
``Engine.parse_generation``. Result: ``{"answers": [{"text", "output_ids": [int] | null}], "url"}``,
in prompt order.
Raises ``PayloadError`` ``bad_input`` (request) or ``runtime`` (a prompt not answered with 200).
"""

from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor

from ..engines import engine_named
from ..protocol import DEFAULT_ENGINE, ENGINE_NAMES, PayloadError
from .common import parse_url

MAX_PROMPTS = 256


def add_arguments(parser) -> None:
    """Flags of ``answers``."""
    parser.add_argument("--url", required=True, help="the unit's base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--request", required=True, help="JSON request file, - for stdin")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per prompt")
    parser.add_argument("--engine", choices=ENGINE_NAMES, default=DEFAULT_ENGINE, help="the engine serving --url")
    parser.add_argument("--concurrent", action="store_true", help="send every prompt at once (one batch)")


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
    engine = engine_named(getattr(args, "engine", None))
    if not getattr(args, "concurrent", False):
        return {"url": args.url, "answers": [answer(target, p, n, args.timeout, engine) for p in prompts]}
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return {"url": args.url, "answers": list(pool.map(lambda p: answer(target, p, n, args.timeout, engine),
                                                          prompts))}


def answer(target, prompt: str, max_new_tokens: int, timeout: float, engine=None) -> dict:
    """One greedy answer: ``{"text", "output_ids"}`` (``output_ids`` None when the server sends
    none); ``engine``: the :class:`~remote.engines.interface.Engine` (None: the default). Raises
    ``PayloadError('runtime')`` when the server does not answer 200."""
    engine = engine or engine_named(None)
    req = engine.generate_request(prompt, max_new_tokens)
    body = json.dumps(req.body)
    conn = target.connection(timeout=timeout)
    try:
        conn.request(req.method, target.prefix + req.path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read(1 << 22)
    except (OSError, http.client.HTTPException) as exc:
        raise PayloadError("runtime", f"{req.path} at {target.host}:{target.port}: {exc}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise PayloadError("runtime", f"{req.path} answered {resp.status}: {raw[:200]!r}")
    try:
        data = json.loads(raw)
    except ValueError:
        raise PayloadError("runtime", f"{req.path} answered no JSON: {raw[:200]!r}") from None
    return engine.parse_generation(data).to_dict()
