"""Ask the server over HTTP from the host itself (``reach``): where does it answer?

``python -m remote reach --url http://127.0.0.1:30000 [--url URL ...] [--path /v1/models]
[--method GET|POST] [--json BODY] [--timeout S]``

A server bound to loopback, or to one NIC address, answers only there: the controller cannot
poll it from outside, and ``127.0.0.1`` may be refused. The controller uses this command, run on
the host, to find the address where the server answers before it stops anything, and then to
poll readiness at that same address (the benchmark runs on the host too).

Each URL (``http(s)://host[:port]``, :func:`remote.bench.common.parse_url`) gets one request to
``--path``; nothing is retried. Result ``data``::

    {"results": [{"url", "path", "status": int | null, "error": str | null, "ms": float,
                  "json": object | null}], ...}

``status`` is the HTTP status (an HTTP error status counts as an answer); ``error`` names why
there was none (refused, timeout, ...); ``json`` is the answer's body when it is JSON of at most
64 KiB (readiness reads the tokens of its one-token ``/generate`` from it), else null. Errors: ``PayloadError("bad_input")`` for a malformed URL,
path or body, or a timeout that is not a positive number of seconds.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from ..protocol import PayloadError
from .common import parse_url


def add_arguments(parser) -> None:
    """Flags of ``reach``."""
    parser.add_argument("--url", action="append", required=True, help="base URL (repeatable)")
    parser.add_argument("--path", default="/v1/models", help="path to ask (default /v1/models)")
    parser.add_argument("--method", choices=("GET", "POST"), default="GET")
    parser.add_argument("--json", default=None, help="JSON body of a POST")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per request")


def ask(url: str, path: str, method: str = "GET", body: bytes | None = None, timeout: float = 5.0) -> dict:
    """One request to ``url + path``: ``{"url", "path", "status", "error", "ms", "json"}`` (never raises
    for a connection problem: it is the answer)."""
    t0 = time.monotonic()
    out = {"url": url, "path": path, "status": None, "error": None, "json": None}
    req = urllib.request.Request(url.rstrip("/") + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out["status"] = resp.status
            raw = resp.read(65537)
        if 0 < len(raw) <= 65536:
            try:
                out["json"] = json.loads(raw)
            except ValueError:
                pass
    except urllib.error.HTTPError as exc:
        out["status"] = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        out["error"] = f"{type(reason).__name__}: {reason}"
    out["ms"] = round((time.monotonic() - t0) * 1000.0, 1)
    return out


def run(args) -> dict:
    """``reach`` command: see the module docstring."""
    if not args.path.startswith("/") or any(c in args.path for c in "\r\n "):
        raise PayloadError("bad_input", f"--path must be an absolute URL path, got {args.path!r}")
    if not 0 < args.timeout < float("inf"):
        raise PayloadError("bad_input", f"--timeout must be a positive number of seconds, got {args.timeout}")
    body = None
    if args.json is not None:
        try:
            json.loads(args.json)
        except ValueError as exc:
            raise PayloadError("bad_input", f"--json is not JSON: {exc}") from None
        body = args.json.encode()
    for u in args.url:
        parse_url(u)
    return {"results": [ask(u, args.path, args.method, body, args.timeout) for u in args.url]}
