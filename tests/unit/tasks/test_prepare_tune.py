"""The prepare step before the stop and its hand-over to the tune (orchestrator/tasks/tune.py
``prepare_tune`` and ``tune``), with a scripted host: what the payload is asked, what a failed
prepare leaves (the tune compiles after the stop, and says why), and the downtime's tune part."""

from __future__ import annotations

import json

from orchestrator.facts.downtime import PreparedTune
from orchestrator.payload.client import PayloadFailed
from orchestrator.payload.transient import UnitUnavailable
from orchestrator.tasks.tune import prepare_tune, tune
from tests.fakes import FakePayload, ScriptedConnection, make_ctx

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
VARS = {"orch_model_config": "/models/m/config.json", "orch_config_source": "tune",
        "orch_probe": {"file_names": {"up": UP, "down": DOWN}, "capability": "9.0",
                       "gpus": [{"index": 0, "name": "NVIDIA H200", "device_name": "NVIDIA_H200", "capability": "9.0",
                                 "smem_per_block_optin": 232448, "total_memory": 1}]}}


class Payload(FakePayload):
    """A payload client whose transient units cannot start (no systemd-run): commands run in the
    SSH session (:meth:`FakePayload.call`), as on a host without a usable systemd-run."""

    container = None

    def call_in_unit(self, command, args, unit, **kw):
        raise UnitUnavailable("systemd-run: command not found")


def _tune_answer(args, request):
    out = args[args.index("--out") + 1]
    return {"files": {"up": f"{out}/{UP}", "down": f"{out}/{DOWN}"}, "report": f"{out}/report.json",
            "provider": "sglang", "speedup_vs_default": {"1": 1.2},
            "prepared": ({"used": True, "kernels": 12, "dir": args[args.index("--prepared") + 1]}
                         if "--prepared" in args else {"used": False, "reason": "no prepared folder"})}


def _conn():
    return ScriptedConnection([(r"^cat (-- )?/proc/meminfo", "MemAvailable: 1000 kB\n")])


def _downloads(conn, work_prefix):
    for name in (UP, DOWN):
        conn.files[f"{work_prefix}/{name}"] = json.dumps({"1": {"BLOCK_SIZE_M": 16}}).encode()
    conn.files[f"{work_prefix}/report.json"] = b"{}"


def test_prepare_is_asked_for_the_tunes_work_folder_and_gpu_target(tmp_path):
    pl = Payload({"prepare": {"dir": "/w/prepared", "kernels": 959, "failed": 8, "candidates": 1800, "seconds": 54.4,
                              "workers": 8, "nice": 10, "cut": False,
                              "gpu": {"target": ["cuda", 90, 32], "device_name": "NVIDIA H200"}}})
    ctx = make_ctx(tmp_path, VARS, connection=_conn(), payload=pl)
    res = prepare_tune(ctx, space="fast", batch_sizes=[1, 4], provider="sglang", nice=10, max_seconds=900)
    (command, args, _), = pl.calls
    assert command == "prepare"
    for flag, value in (("--capability", "9.0"), ("--smem-limit", "232448"), ("--nice", "10"),
                        ("--max-seconds", "900.0"), ("--batch-sizes", "1,4"), ("--space", "fast")):
        assert args[args.index(flag) + 1] == value
    rec = res.facts["orch_prepared"]
    assert isinstance(rec, PreparedTune) and rec.ok and rec.dir == "/w/prepared" and rec.kernels == 959
    assert rec.target == "cuda sm_90 (NVIDIA H200)" and "SSH session" in rec.how
    assert ctx.run.summary.prepared is rec
    # the tune asks for the same work folder
    work = args[args.index("--out") + 1]
    ctx.vars.update(res.facts)
    pl.responses["tune"] = _tune_answer
    conn = ctx.connection
    _downloads(conn, work)
    ctx.step_started = 100.0
    out = tune(ctx, space="fast", batch_sizes=[1, 4], provider="sglang")
    targs = pl.calls[-1][1]
    assert targs[targs.index("--out") + 1] == work and targs[targs.index("--prepared") + 1] == "/w/prepared"
    assert "12 kernels compiled before the stop" in out.msg
    assert ctx.run.summary.prepared_used["used"] is True
    assert [p.name for p in ctx.run.phases] == ["tune"] and ctx.run.phases[0].start == 100.0


def test_a_failed_prepare_leaves_the_tune_compiling_after_the_stop_with_the_reason(tmp_path):
    pl = Payload({"prepare": PayloadFailed("prepare", "crash", "no result line (exit 1)"), "tune": _tune_answer})
    ctx = make_ctx(tmp_path, VARS, connection=_conn(), payload=pl)
    res = prepare_tune(ctx, space="fast", batch_sizes=[1, 4], provider="sglang")
    assert res.status == "ok"  # never fails the host
    rec = res.facts["orch_prepared"]
    assert not rec.ok and "payload prepare failed (crash)" in rec.reason
    assert rec.line().startswith("not prepared: payload prepare failed") and rec.line().endswith("after the stop")
    ctx.vars.update(res.facts)
    work = pl.calls[0][1][pl.calls[0][1].index("--out") + 1]
    _downloads(ctx.connection, work)
    out = tune(ctx, space="fast", batch_sizes=[1, 4], provider="sglang")
    assert "--prepared" not in pl.calls[-1][1]
    assert "compiled after the stop: the prepare step failed: payload prepare failed (crash)" in out.msg
    assert ctx.run.summary.prepared_used == {"used": False,
                                             "reason": f"the prepare step failed: {rec.reason}"}


def test_prepare_is_skipped_when_the_files_come_from_the_store(tmp_path):
    ctx = make_ctx(tmp_path, dict(VARS, orch_config_source="store"), connection=_conn(), payload=Payload({}))
    assert prepare_tune(ctx, space="fast", batch_sizes=None, provider="sglang").status == "skipped"
