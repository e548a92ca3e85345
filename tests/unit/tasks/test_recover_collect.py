"""`orch recover` collects what a dead controller's tune left (issue 21 row 3, docs/reliability.md):
a finished tune's files go into the controller's store under its ticket's tuning key, a stopped
tune's checkpoint is named for the rerun, and nothing that does not match its key is stored."""

from __future__ import annotations

import json

from orchestrator.store import ConfigStore, key_hash
from orchestrator.tasks import TASKS
from tests.fakes import ScriptedConnection, make_ctx, FakePayload

RID = "20260101T000000Z-tune-0a0b0c"
UNIT = f"orch-tune-{RID}.service"
UNITS = "/var/lib/orch/units"
WORK = "/var/lib/orch/work/0123456789abcdef"
UPN, DOWNN = "E=8,N=64,device_name=NVIDIA_H200.json", "E=8,N=64,device_name=NVIDIA_H200_down.json"
CFG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 2}}
KEY = {"device_name": "NVIDIA_H200", "triton_version": "3.6.0", "provider": "builtin", "sglang_version": "0.5.23",
       "E": 8, "N": 64, "hidden": 128, "topk": 2, "dtype_selector": None, "block_shape": None,
       "per_channel_quant": False, "batch_sizes": [1, 4], "space": "smoke"}
TICKET = {"run_id": RID, "host": "h1", "work": WORK, "names": {"up": UPN, "down": DOWNN}, "space": "smoke",
          "batch_sizes": [1, 4], "provider": "auto", "source": "tune", "tuning_key": KEY, "key_hash": key_hash(KEY)}
RESULT = {"proto": 1, "type": "result", "data": {
    "files": {"up": f"{WORK}/{UPN}", "down": f"{WORK}/{DOWNN}"}, "report": f"{WORK}/report.json",
    "provider": "builtin", "batch_sizes": [1, 4], "space": "smoke", "device_name": "NVIDIA_H200",
    "triton_version": "3.6.0"}}


def _conn(ticket=TICKET, out: str | None = json.dumps(RESULT) + "\n", checkpoint: dict | None = None):
    def cat(argv):
        path = argv[-1]
        got = {f"{UNITS}/{UNIT}.ticket.json": json.dumps(ticket) if ticket else None, f"{UNITS}/{UNIT}.out": out,
               f"{WORK}/checkpoint.json": json.dumps(checkpoint) if checkpoint else None}.get(path)
        return (0, got, "") if got is not None else (1, "", f"cat: {path}: No such file or directory")
    conn = ScriptedConnection([(r"^cat -- ", cat)])
    conn.files = {f"{WORK}/{UPN}": json.dumps(CFG).encode(), f"{WORK}/{DOWNN}": json.dumps(CFG).encode(),
                  f"{WORK}/report.json": b"{}"}
    return conn


def _collect(tmp_path, conn, runs=None):
    ctx = make_ctx(tmp_path, {}, connection=conn, payload=FakePayload(), state_dir=tmp_path / "state")
    res = TASKS["recover_collect"].fn(ctx, runs=runs or [{"run_id": RID, "state": "stopped"}])
    return res, ctx


def test_a_finished_tune_is_put_in_the_store_under_its_tickets_key(tmp_path):
    res, ctx = _collect(tmp_path, _conn())
    assert res.status == "changed", res.msg
    entry = ConfigStore(tmp_path / "state").get(KEY)
    assert entry is not None and entry.provenance["run_id"] == RID and entry.provenance["collected_by"] == ctx.options.run_id
    assert json.loads(entry.files["up"].read_text()) == CFG and set(entry.files) == {"up", "down"}
    assert ctx.run.summary.collected[0]["state"] == "collected" and "reuses" in ctx.run.summary.collected[0]["what"]
    assert [e for e, _ in ctx.events] == ["tune_result_collected"]


def test_a_stopped_tune_names_the_batch_sizes_its_checkpoint_keeps(tmp_path):
    progress = json.dumps({"proto": 1, "type": "progress", "done": 1, "total": 2}) + "\n"
    conn = _conn(out=progress, checkpoint={"key_id": "k", "results": {"1": {}, "4": {}}})
    res, ctx = _collect(tmp_path, conn, [{"run_id": RID, "state": "stopped"}])
    c = ctx.run.summary.collected[0]
    assert c["state"] == "progress kept" and c["batch_sizes"] == [1, 4] and "resumes" in c["what"]
    assert ConfigStore(tmp_path / "state").get(KEY) is None and res.status == "ok"


def test_nothing_is_stored_that_does_not_match_its_key_or_is_a_shards_slice(tmp_path):
    wrong = dict(RESULT, data=dict(RESULT["data"], triton_version="3.5.0"))
    res, ctx = _collect(tmp_path, _conn(out=json.dumps(wrong) + "\n"))
    assert ctx.run.summary.collected[0]["state"] == "not collected" and "triton_version" in res.msg
    res, ctx = _collect(tmp_path, _conn(ticket=dict(TICKET, source="shard")))
    assert "shard" in ctx.run.summary.collected[0]["what"]
    assert ConfigStore(tmp_path / "state").get(KEY) is None


def test_a_run_without_a_ticket_has_nothing_to_collect_and_a_failure_never_raises(tmp_path):
    res, ctx = _collect(tmp_path, _conn(ticket=None))
    assert res.status == "ok" and ctx.run.summary.collected is None
    conn = _conn()
    conn.files = {}  # the files are gone: the download fails
    res, ctx = _collect(tmp_path, conn)
    assert ctx.run.summary.collected[0]["state"] == "not collected" and "collecting failed" in res.msg
