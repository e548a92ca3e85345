"""Helpers for end-to-end tests: run the real ``orch`` CLI against a test bed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.paths import REPO  # noqa: E402  (re-exported for the e2e tests)
from tests.waiting import files_state, run_watched

#: small benchmark so e2e runs stay short (the stand-in simulates token timing). 32 output tokens a
#: request: the stand-in keeps its token schedule under load, but each request's own cost (the
#: client's connection, the HTTP exchange) is not simulated and grows with the load; with 8 tokens
#: (about 40 ms a request) two runs against the same stand-in differed by up to 36 % with four busy
#: loops on a loaded 2-core machine, with 32 by at most 11 % (issue 17)
FAST_VARS = {"orch_bench_concurrency": [1, 4], "orch_bench_input_len": 16, "orch_bench_output_len": 32,
             "orch_ready_timeout": 120, "orch_stop_timeout": 60,
             # margin for that noise, well inside the stand-in's simulated gain of a tune (6 -> 4 ms a
             # token, +50 %): only the regression tests use the 3% default
             "orch_regression_threshold": 25}


def inventory(bed, path: Path, host_vars: dict | None = None, **group_vars) -> Path:
    """Write the bed's inventory with fast test settings; ``host_vars``: {host: {var: value}}."""
    vars_ = dict(FAST_VARS)
    vars_.update(group_vars)
    bed.write_inventory(path, **vars_)
    data = yaml.safe_load(Path(path).read_text())
    for group in data["all"]["children"].values():
        for name, hv in (group.get("hosts") or {}).items():
            if "orch_unit" in hv:  # older bed writers
                hv["orch_service"] = hv.pop("orch_unit")
            hv.setdefault("orch_device_name", bed.host(name).options.get("gpu_name", "NVIDIA H200"))
            hv.setdefault("orch_gpu_capability", bed.host(name).options.get("gpu_capability", "9.0"))
            hv.update((host_vars or {}).get(name, {}))
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
    return Path(path)


def orch(*args: str, state_dir: Path, env: dict | None = None, prefix: list[str] | None = None,
         progress: tuple = (), stall: float | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m orchestrator ARGS --state-dir STATE --json``; returns the completed process.
    ``prefix``: argv put before the interpreter (e.g. ``unshare ...`` for a private /etc/ssh).
    No wall-time limit: it runs while its output or its run records under ``state_dir`` (or
    ``progress``, :mod:`tests.waiting`) move, and is killed as hung after ``stall`` s without."""
    cmd = [*(prefix or []), sys.executable, "-m", "orchestrator", *args]
    if args and args[0] in ("tune", "rollback", "doctor"):
        cmd += ["--state-dir", str(state_dir)]
    full_env = dict(os.environ, XDG_STATE_HOME=str(state_dir), COLUMNS="200")
    full_env.update(env or {})
    return run_watched(cmd, progress=(lambda: files_state(state_dir), *progress), stall=stall,
                       what=f"orch {' '.join(args[:1])}", cwd=REPO, env=full_env)


def flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks and the indent of wrapped lines) made one
    space: orch wraps its output at spaces to the width ($COLUMNS, 200 here), so a message is
    looked for in the flattened text (a path is never broken: it stays one word)."""
    return " ".join(text.split())


def recap(proc: subprocess.CompletedProcess) -> dict:
    """The ``--json`` recap printed on stdout (fails with the stderr tail if absent)."""
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON recap (exit {proc.returncode}); stderr:\n{proc.stderr[-6000:]}") from None


def ready_bed(tmp: Path, n_hosts: int, host_options: dict):
    """The body of a module's ``bed`` fixture (``yield from ready_bed(...)``): a test bed of
    ``n_hosts`` hosts in ``tmp / "bed"`` whose stand-in servers all answer ``/health``; yields
    ``(bed, tmp)`` and destroys the bed afterwards, also when a host never became healthy."""
    from tests.testbed.bed import TestBed

    bed = TestBed(n_hosts=n_hosts, host_options=host_options, workdir=tmp / "bed")
    bed.__enter__()
    try:
        for h in bed.hosts:
            h.wait_http("/health")
        yield bed, tmp
    finally:
        bed.destroy()
