"""Readiness of a restarted SGLang server, and proof from its log that configs were loaded.

``/v1/models`` answers before the server can generate (sglang #33719): it is only
liveness. Ready means ``/health`` (``/health_generate`` in current releases) answers
200, or, where ``/health`` is absent (404), a real 1-token ``/generate`` completes.
Polling stops early when ``systemctl is-active`` says the unit failed.
"""

from __future__ import annotations

import time

import httpx

from ..engine.results import Cancelled, TaskFailed, TaskResult
from ..facts.moe_log import parse_moe_log, verify_loaded
from ..facts.unit import is_active

POLL_S = 1.0
LOG_LINES = 20000


def server_url(ctx) -> str:
    """The server's base URL as the controller reaches it.

    ``orch_sglang_url`` if set; else ``http://<ansible_host>:<port>`` from the unit's
    ``--port`` (a server bound to 127.0.0.1 needs ``orch_sglang_url`` or a tunnel).
    """
    if ctx.vars.get("orch_sglang_url"):
        return str(ctx.vars["orch_sglang_url"]).rstrip("/")
    server = (ctx.vars.get("orch_unit") or {}).get("server") or {}
    host = ctx.vars.get("ansible_host") or ctx.name
    if ctx.vars.get("ansible_connection") == "local":
        host = "127.0.0.1"
    return f"http://{host}:{server.get('port', 30000)}"


def _read_log(ctx, unit: str) -> str:
    return ctx.transport.run(["journalctl", "-u", unit, "--no-pager", "-n", str(LOG_LINES)],
                             check=False, become=True, timeout=60).stdout


def mark_log(ctx, unit: str) -> None:
    """Remember the unit log as it is now, so :func:`log_since_mark` returns only newer lines."""
    ctx.state["log_mark"] = _read_log(ctx, unit)


def log_since_mark(ctx, unit: str) -> str:
    """Unit log lines written since :func:`mark_log` (logs that accumulate across restarts).

    The earlier text is matched as a prefix; when the journal rotated in between, the
    lines after the last earlier line are returned.
    """
    before = ctx.state.get("log_mark", "")
    now = _read_log(ctx, unit)
    if before and now.startswith(before):
        return now[len(before):]
    last = before.strip().splitlines()[-1:] if before.strip() else []
    if last and last[0] in now:
        return now.rsplit(last[0], 1)[1]
    return now


def wait_ready(ctx, unit: str, timeout: float = 1800, generate_check: bool = True) -> TaskResult:
    """Task ``wait_ready``: poll ``/v1/models`` then ``/health`` until ready or ``timeout`` s.

    Fails early when the unit becomes ``failed``/``inactive``. Returns the seconds it took.
    """
    url = server_url(ctx)
    start = time.monotonic()
    deadline = start + float(timeout)
    stage = "liveness"
    last = ""
    with httpx.Client(timeout=10.0) as client:
        while True:
            state = is_active(ctx.transport, unit)
            if state in ("failed", "inactive"):
                tail = log_since_mark(ctx, unit).strip().splitlines()[-8:]
                raise TaskFailed(f"{unit} became {state} while waiting for readiness; log tail:\n" + "\n".join(tail),
                                 {"log_tail": tail})
            try:
                if stage == "liveness":
                    r = client.get(f"{url}/v1/models")
                    last = f"/v1/models {r.status_code}"
                    if r.status_code == 200:
                        stage = "health"
                        continue
                else:
                    r = client.get(f"{url}/health")
                    last = f"/health {r.status_code}"
                    if r.status_code == 200:
                        break
                    if r.status_code == 404 and generate_check:
                        g = client.post(f"{url}/generate", json={"text": "ping", "sampling_params":
                                                                 {"max_new_tokens": 1, "temperature": 0}})
                        last = f"/generate {g.status_code}"
                        if g.status_code == 200:
                            break
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            if ctx.cancelled():
                raise Cancelled()
            if time.monotonic() > deadline:
                raise TaskFailed(f"{unit} not ready after {timeout:.0f} s at {url} (last: {last})")
            ctx.progress(stage=f"waiting for {stage}", done=0, total=0)
            time.sleep(POLL_S)
    took = round(time.monotonic() - start, 1)
    return TaskResult.ok(f"ready at {url} after {took} s", seconds=took, url=url)


wait_ready.check_safe = False


def verify_log(ctx, unit: str, expect_paths: list[str] | None = None, allow_default: bool = False) -> TaskResult:
    """Task ``verify_log``: prove from this start's log lines which MoE configs were loaded.

    ``expect_paths``: files that must appear in ``Using MoE kernel config from <path>.``;
    any sub-optimal line (fallback, default, down missing) for them fails the task.
    ``allow_default`` (rollback to a state with no file): the default line is expected.
    """
    text = log_since_mark(ctx, unit)
    rep = parse_moe_log(text)
    expect = list(expect_paths or [])
    problems = verify_loaded(rep, expect) if expect else []
    if not expect and not allow_default and rep.suboptimal:
        problems = list(rep.suboptimal)
    data = {"loaded": rep.loaded, "default": rep.default, "fallback": rep.fallback,
            "down_missing": rep.down_missing, "suboptimal": rep.suboptimal}
    if problems:
        raise TaskFailed("; ".join(problems), data)
    what = ", ".join(p.rsplit("/", 1)[-1] for p in rep.loaded) or "default config"
    return TaskResult.ok(f"log shows: {what}", **data)
