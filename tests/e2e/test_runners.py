"""End to end: a unit whose MoE runner SGLang picks by model, weights and GPU (issue 18, item 1).

One bed host, ``b200-deepseek-fp8`` (``tests/testbed/bed.py`` ``HOST_PRESETS``): a B200 (compute
capability 10.0) serving a DeepSeek-V3-architecture fp8 model with no ``--moe-runner-backend``.
The stand-in SGLang resolves ``auto`` as SGLang 0.5.23 does (its table is held against the wheel in
``tests/unit/testbed/test_standin_runners.py``): ``flashinfer_trtllm``, logging SGLang's line, reading
no Triton file, and autotuning FlashInfer at start into ``$SGLANG_CACHE_DIR`` at the path the
release's own ``flashinfer_autotune_cache_path`` gives.

* ``orch tune`` skips the host before anything changes: exit 0, the reason shown, the unit's
  MainPID unchanged, no file written; ``--check`` says the same;
* ``orch doctor`` shows the runner, SGLang's reason and the autotune state: the cache for this
  server present after the stand-in's start; missing once the cache folder is emptied; left from
  another FlashInfer version once it is moved under another version's folder.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import flat, inventory, orch, recap
from tests.testbed.bed import HOST_PRESETS

pytestmark = pytest.mark.testbed

CACHE = "/srv/sglang-cache/flashinfer/autotune"
USE_LINE = "Use flashinfer_trtllm as MoE runner backend on sm100 for DeepseekV3ForCausalLM"


def _snapshot(host):
    return {"sglang": host.file_tree_hash("/opt/sglang"), "units": host.file_tree_hash("/etc/systemd/system"),
            "cache": host.file_tree_hash("/srv/sglang-cache"), "active": host.unit_state(),
            "pid": host.sh(f"systemctl show -p MainPID {host.unit}", check=False).stdout.strip()}


def _doctor(inv, tmp_path, name):
    proc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / name)
    assert proc.returncode == 0, proc.stderr[-6000:]  # not-triton is a good verdict
    return proc, recap(proc)["gpu-a"]


def test_b200_auto_unit_is_skipped_and_doctor_shows_its_autotune(testbed_factory, tmp_path):
    bed = testbed_factory(1, host_options={"gpu-a": dict(HOST_PRESETS["b200-deepseek-fp8"])})
    h = bed.hosts[0]
    log = h.unit_log()
    assert USE_LINE in log and "moe_runner_backend='flashinfer_trtllm'" in log
    assert "Using MoE kernel config" not in log and "Using default MoE kernel config" not in log
    assert f"Running FlashInfer autotune with cache: {CACHE}/0.6.9/sm100/" in log
    files = h.sh(f"find {CACHE} -name 'rank_*.json'").stdout.split()
    assert len(files) == 1 and files[0].endswith("/rank_tp0_pp0_dp0.json"), files
    inv = inventory(bed, tmp_path / "hosts.yaml")
    before = _snapshot(h)

    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = recap(proc)["hosts"]["gpu-a"]
    assert r["outcome"] != "failed" and r["summary"]["plan"]["action"] == "skip", r
    reason = r["summary"]["plan"]["reason"]
    assert "_deepseek_moe_quant_resolution sets flashinfer_trtllm" in reason and "change nothing" in reason
    assert flat(reason) in flat(proc.stderr)  # shown to the user, whole (wrapped at spaces)
    assert _snapshot(h) == before  # nothing stopped, restarted or written
    assert h.sh(f"test -e {h.triton_dir!r}", check=False).returncode != 0

    check = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=tmp_path / "check")
    assert check.returncode == 0, check.stderr[-6000:]
    c = recap(check)["hosts"]["gpu-a"]
    assert c["summary"]["plan"]["action"] == "skip" and c["summary"]["plan"]["reason"] == reason
    assert flat(reason) in flat(check.stderr)
    assert _snapshot(h) == before

    proc, row = _doctor(inv, tmp_path, "doc1")
    assert row["verdict"] == "not-triton", row
    assert row["runner"]["runner"] == "flashinfer_trtllm" and "_deepseek_moe_quant_resolution" in row["why"]
    tune = row["autotune"]
    assert tune["enabled"] is True and tune["cache"] == "present" and tune["other_versions"] == [], tune
    key_dir = files[0].rsplit("/", 1)[0]
    assert tune["path"] == key_dir and tune["key_source"] == "log"
    assert "its cache for this server is present" in row["why"]
    table = orch("doctor", str(inv), "--service", "sglang-qwen", state_dir=tmp_path / "doc-table")
    assert table.returncode == 0, table.stderr[-6000:]
    assert "runner flashinfer_trtllm" in table.stdout and "autotune on, cache present" in table.stdout, table.stdout

    h.sh(f"rm -f {key_dir}/rank_*.json")
    _proc, row = _doctor(inv, tmp_path, "doc2")
    assert row["autotune"]["cache"] == "missing" and "the next start autotunes again" in row["why"], row

    stale = key_dir.replace("/0.6.9/", "/0.5.3/")
    h.sh(f"mkdir -p {stale} && echo '{{}}' > {stale}/rank_tp0_pp0_dp0.json")
    _proc, row = _doctor(inv, tmp_path, "doc3")
    assert row["autotune"]["cache"] == "missing" and row["autotune"]["other_versions"] == [stale], row
    assert "cache left by another FlashInfer version" in row["why"]
    assert h.unit_state() == "active" and _snapshot(h)["pid"] == before["pid"]
    json.dumps(row)  # the JSON form
