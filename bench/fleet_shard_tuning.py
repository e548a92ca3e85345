"""Measure `--shard-tuning` on the test bed: a group of identical hosts tuning one key.

Runs `orch tune` twice on the same N-host bed (smoke space, TRITON_INTERPRET=1 on the CPU):
once without sharding (one host tunes every batch size, the others reuse its result) and
once with `--shard-tuning` (each host tunes a slice, the slices are merged). Prints a table:
wall time of the tune step per host, the slowest tune step, and the whole run.

    sudo .venv/bin/python bench/fleet_shard_tuning.py [--hosts 4] [--batch-sizes 1,2,4,...]

Needs root (network namespaces). The tuners of all hosts share this machine's CPU cores,
so the speedup is bounded by the core count here; on a fleet each host tunes on its own GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.helpers import inventory, orch, recap  # noqa: E402
from tests.testbed.bed import TestBed  # noqa: E402


def run_once(bed, tmp: Path, label: str, batch_sizes: list[int], shard: bool) -> dict:
    state = tmp / f"state-{label}"
    inv = inventory(bed, tmp / f"{label}.yaml", orch_tune_batch_sizes=batch_sizes, orch_bench=False)
    args = ["tune", str(inv), "--service", "sglang-qwen", "--json", "--forks", str(len(bed.hosts))]
    if shard:
        args.append("--shard-tuning")
    t0 = time.monotonic()
    proc = orch(*args, state_dir=state, timeout=3600)
    wall = time.monotonic() - t0
    res = recap(proc)
    events = [json.loads(x) for x in (state / "runs" / res["run_id"] / "events.jsonl").read_text().splitlines()]
    tune = {e["host"]: e["data"].get("seconds") for e in events
            if e["event"] == "task" and e["module"] == "tune" and e["status"] == "changed"}
    outcomes = {h: r["outcome"] for h, r in res["hosts"].items()}
    return {"label": label, "wall_s": wall, "tune_s": tune, "outcomes": outcomes, "exit": proc.returncode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,24,32,48")
    a = ap.parse_args()
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as td, TestBed(n_hosts=a.hosts) as bed:
        tmp = Path(td)
        rows = [run_once(bed, tmp, "one-tuner", sizes, False), run_once(bed, tmp, "sharded", sizes, True)]
    print(f"hosts: {a.hosts}, batch sizes: {sizes}, cpu cores: {os.cpu_count()}")
    print(f"{'mode':<10} {'exit':>4} {'tuning hosts':>12} {'slowest tune s':>15} {'sum tune s':>11} {'run wall s':>11}")
    for r in rows:
        t = [v for v in r["tune_s"].values() if v is not None]
        print(f"{r['label']:<10} {r['exit']:>4} {len(t):>12} {max(t):>15.1f} {sum(t):>11.1f} {r['wall_s']:>11.1f}")
    slow = [max(v for v in r["tune_s"].values()) for r in rows]
    print(f"tune-step speedup (slowest tuner, one-tuner / sharded): {slow[0] / slow[1]:.2f}x; "
          f"whole run: {rows[0]['wall_s'] / rows[1]['wall_s']:.2f}x")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
