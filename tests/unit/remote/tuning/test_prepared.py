"""Preparing a tune before the stop and taking it after (remote/tuning/prepare.py,
remote/tuning/tuner/prepared.py, remote/tuning/tuner/offgpu.py).

On the CPU: the candidate plan, the manifest and its check (each reason a tune refuses a folder),
the GPU target from nvidia-smi, the prepare and the tune as payload commands under
``TRITON_INTERPRET=1`` (the interpreter compiles nothing: the manifest, the candidates, the
hand-over and the fallback are what is checked), and the rule that the prepare process never
initialises CUDA. The compile itself is real in the last test: SGLang 0.5.23's GEMM, captured in the
prepare process (no GPU, stand-in driver) and compiled for sm_90 there, is what a process with the
GPU's answers finds in the cache at its first launch, without sending a compile request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from remote.tuning.tuner import prepared
from remote.tuning.tuner import space as sp
from tests.paths import REPO

SHAPE = "E=8,N=64,hidden=128,topk=2"


def _feasible(c):
    return sp.fits(c, 232448, 2)[0]


# ----------------------------------------------------------------------------- plan


def test_fast_plan_is_the_first_screen_then_one_step_from_it():
    default = sp.default_config(64, 128)
    shipped = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=16, num_warps=4, num_stages=4,
                   USE_TMA=True)
    tiers = prepared.plan("fast", 64, 128, 8, ("up", "down"), {"down"}, _feasible, [(shipped, shipped),
                                                                                  (default, default)],
                          variants={"up": ("up_sorted",)})
    assert len(tiers) == 5
    first = {(k, sp.cfg_key(c)) for k, c in tiers[0]}
    second = {(k, sp.cfg_key(c)) for k, c in tiers[1] + tiers[3]}
    # the server's other launch of each up config (sorted output) follows the tiers of its configs
    assert tiers[2] == [("up_sorted", c) for k, c in tiers[0] + tiers[1] if k == "up"]
    assert tiers[4] == [("up_sorted", c) for k, c in tiers[3] if k == "up"]
    tiers = [tiers[0], tiers[1], tiers[3]]
    assert all(16 <= c["BLOCK_SIZE_M"] <= 64 for _, c in tiers[1])  # near BLOCK_SIZE_M 32, likely at M=64
    assert {c["BLOCK_SIZE_M"] for _, c in tiers[2]} <= {128, 256}
    assert not first & second and len(first) == len(tiers[0]) and len(second) == len(tiers[1])
    seeds = [c for c in sp.seed_configs(64, 128, 8) if _feasible(c)]
    for c in seeds:
        assert ("up", sp.cfg_key(c)) in first and ("down", sp.cfg_key(c)) in first
        assert ("down", sp.cfg_key(sp.with_tma(c, True))) in first  # the TMA GEMM both ways
        assert ("up", sp.cfg_key(sp.with_tma(c, True))) not in first | second  # up reads no USE_TMA here
    assert ("up", sp.cfg_key(sp.with_tma(shipped, False))) in first  # USE_TMA dropped where not read
    assert ("down", sp.cfg_key(shipped)) in first and ("up", sp.cfg_key(default)) in first
    # every candidate of the search's first refinement round, whichever seeds lead
    for kind, c in tiers[0]:
        for nb in sp.neighbours(c, tma=kind == "down"):
            if _feasible(nb):
                assert (kind, sp.cfg_key(prepared.clean(kind, nb, {"down"}))) in first | second
    assert all(_feasible(c) for t in tiers for _, c in t)


@pytest.mark.parametrize("M, bm", [(1, 16), (128, 16), (256, 32), (512, 64), (1024, 128), (4096, 128)])
def test_likely_block_m_follows_the_tokens_per_expert(M, bm):
    assert prepared.likely_block_m(M, 128, 8) == bm


def test_full_and_smoke_plans_are_their_spaces():
    smoke = prepared.plan("smoke", 4, 8, 2, ("joint",), (), _feasible)
    assert [c for _, c in smoke[0]] == sp.smoke_space() and smoke[1] == []
    full = prepared.plan("full", 4, 8, 2, ("up",), {"up"}, _feasible, variants={"up": ("up_sorted",)})
    assert len(full[0]) == 2 * len([c for c in sp.full_space() if _feasible(c)])
    assert full[1] == [("up_sorted", c) for _, c in full[0]]
    with pytest.raises(ValueError):
        prepared.plan("fastest", 4, 8, 2, ("up",), (), _feasible)


# ----------------------------------------------------------------------------- manifest


def _manifest(**over):
    fields = dict(payload_version="1.0", gpu={"capability": "9.0", "target": ["cuda", 90, 32]}, triton_version="3.6.0",
                  engine={"provider": "sglang", "version": "0.5.23"}, shape={"E": 8, "N": 64, "hidden": 128, "topk": 2},
                  dtype="bfloat16", naming={"dtype": None, "block_shape": None, "per_channel_quant": False},
                  quant=None, interpret=False, kernels={"compiled": ["a"], "failed": {}}, cache_files={},
                  cache="triton-cache/triton-cache-orch.1",
                  cuda={"visible": "", "initialized": False})
    fields.update(over)
    return prepared.build(**fields)


def _expect(**over):
    e = dict(payload_version="1.0", triton_version="3.6.0", engine={"provider": "sglang", "version": "0.5.23"},
             shape={"E": 8, "N": 64, "hidden": 128, "topk": 2}, dtype="bfloat16",
             naming={"dtype": None, "block_shape": None, "per_channel_quant": False}, quant=None, interpret=False,
             capability=(9, 0))
    e.update(over)
    return prepared.expectation(**e)


def test_manifest_matches_its_tune():
    assert prepared.check(_manifest(), _expect()) is None


@pytest.mark.parametrize("over, words", [
    ({"capability": (8, 0)}, "compute capability 9.0, this GPU is 8.0"),
    ({"triton_version": "3.5.1"}, "Triton '3.6.0'"),
    ({"engine": {"provider": "sglang", "version": "0.5.22"}}, "engine"),
    ({"payload_version": "1.1"}, "payload"),
    ({"shape": {"E": 8, "N": 128, "hidden": 128, "topk": 2}}, "MoE shape"),
    ({"dtype": "float16"}, "dtype"),
    ({"quant": {"dtype": "fp8_w8a8", "block_shape": [128, 128]}}, "quantization"),
    ({"interpret": True}, "interpreter mode"),
])
def test_manifest_refused_naming_what_differs(over, words):
    why = prepared.check(_manifest(), _expect(**over))
    assert why and words in why


def test_manifest_refused_when_changed_or_made_with_cuda(tmp_path):
    m = _manifest()
    m["triton_version"] = "3.5.1"  # edited after the prepare, checksum not recomputed
    assert "checksum" in prepared.check(m, _expect())
    assert "format" in prepared.check(dict(_manifest(), format=0), _expect())
    bad = _manifest(cuda={"visible": "0", "initialized": True})
    assert "saw CUDA" in prepared.check(bad, _expect())
    folder = tmp_path / "work" / "prepared"  # the cache is the work folder's triton-cache/triton-cache-<tag>
    cache = tmp_path / "work" / "triton-cache" / "triton-cache-orch.1" / "ab"
    cache.mkdir(parents=True)
    (cache / "k.cubin").write_bytes(b"12345")
    m = _manifest(cache_files={"ab/k.cubin": 5})
    assert prepared.cache_dir(folder, m) == cache.parent
    assert prepared.check(m, _expect(), folder) is None
    (cache / "k.cubin").write_bytes(b"123")
    assert "changed size" in prepared.check(m, _expect(), folder)
    (cache / "k.cubin").unlink()
    assert "missing" in prepared.check(m, _expect(), folder)
    for outside in ("/tmp/x", "../other", ""):
        assert "no cache inside the work folder" in prepared.check(_manifest(cache=outside), _expect(), folder)
    manifest, why = prepared.load(tmp_path / "nowhere", _expect())
    assert manifest is None and "did not finish" in why


# ----------------------------------------------------------------------------- GPU target


def test_gpu_target_from_the_probe_else_nvidia_smi(tmp_path):
    from remote.protocol import PayloadError
    from remote.tuning.tuner import offgpu
    from remote.gpus.nvidia import parse_cap_name
    assert parse_cap_name("9.0, NVIDIA H200\n9.0, NVIDIA H200\n") == ("9.0", "NVIDIA H200")
    assert parse_cap_name("[N/A], NVIDIA H200\n") is None
    assert offgpu.gpu_target("9.0", "NVIDIA H200")["target"] == ["cuda", 90, 32]
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=compute_cap,name ] && echo '12.0, NVIDIA RTX PRO 6000' "
                   "&& exit 0\nexit 6\n")
    smi.chmod(0o755)
    got = offgpu.gpu_target(None, None, str(smi))
    assert got == {"capability": "12.0", "device_name": "NVIDIA RTX PRO 6000", "target": ["cuda", 120, 32],
                   "source": "nvidia-smi"}
    none = tmp_path / "old-smi"
    none.write_text("#!/bin/sh\necho 'Field \"compute_cap\" is not a valid field to query.'; exit 2\n")
    none.chmod(0o755)
    with pytest.raises(PayloadError, match="no compute capability"):
        offgpu.gpu_target(None, "NVIDIA H200", str(none))


# ----------------------------------------------------------------------------- the two commands (CPU)

CUDA_SPY = """
import os, torch
_orig = torch.cuda._lazy_init
def _spy(*a, **k):
    with open(os.environ["ORCH_TEST_CUDA_MARK"], "a") as f:
        f.write("lazy_init %d\\n" % os.getpid())
    return _orig(*a, **k)
torch.cuda._lazy_init = _spy
"""


def _payload(tmp_path, *args, env_extra=None):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(CUDA_SPY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), TRITON_INTERPRET="1",
               ORCH_TEST_CUDA_MARK=str(tmp_path / "cuda-mark"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-m", "remote", *args], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=900)
    final = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{") and '"type": "result"' in ln
             or ln.startswith("{") and '"type": "error"' in ln]
    assert final, f"rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return final[-1], p


def test_prepare_then_tune_takes_the_prepared_folder_and_falls_back_when_refused(tmp_path):
    work = tmp_path / "work"
    common = ["--shape", SHAPE, "--batch-sizes", "1,4", "--space", "smoke", "--provider", "builtin",
              "--device-name", "NVIDIA H200", "--out", str(work)]
    res, _ = _payload(tmp_path, "prepare", *common, "--capability", "9.0", "--workers", "1")
    assert res["type"] == "result", res
    d = res["data"]
    assert d["interpret"] and "compiles nothing" in d["nothing_compiled"] and d["kernels"] == 0
    assert d["cuda"] == {"visible": "", "initialized": False}
    # no CUDA initialisation was even attempted in the prepare process (torch.cuda._lazy_init spied)
    assert not (tmp_path / "cuda-mark").exists()
    manifest = json.loads((work / "prepared" / prepared.MANIFEST).read_text())
    assert manifest["gpu"]["target"] == ["cuda", 90, 32] and manifest["checksum"] == prepared.checksum(manifest)
    assert manifest["shape"] == {"E": 8, "N": 64, "hidden": 128, "topk": 2} and manifest["dtype"] == "float16"
    assert manifest["stats"]["nice"] == 10 and manifest["stats"]["workers"] == 1
    cands = manifest["candidates"]
    assert set(cands) == {"1", "4"} and len(cands["1"]["up"]) == len(sp.smoke_space())

    res, _ = _payload(tmp_path, "tune", *common, "--prepared", str(work / "prepared"), "--no-resume")
    assert res["type"] == "result", res
    assert res["data"]["prepared"]["used"] is True
    report = json.loads((work / "report.json").read_text())
    assert report["prepared"]["used"] is True and report["prepared"]["dir"] == str(work / "prepared")
    # the prepared cache was the tune's own (under its work folder, named by the run's tag), removed at the end
    assert report["triton_cache"]["dir"] == report["prepared"]["cache"]
    assert report["prepared"]["cache"].startswith(str(work / "triton-cache" / "triton-cache-"))
    assert not os.path.exists(report["prepared"]["cache"])

    # a folder prepared for another shape is refused, naming why; the tune compiles as without one
    res, _ = _payload(tmp_path, "prepare", *common, "--capability", "9.0", "--workers", "1")
    res, p = _payload(tmp_path, "tune", *[a if a != SHAPE else "E=8,N=128,hidden=128,topk=2" for a in common],
                      "--prepared", str(work / "prepared"), "--no-resume")
    assert res["type"] == "result", res
    assert res["data"]["prepared"]["used"] is False and "MoE shape" in res["data"]["prepared"]["reason"]
    assert "refused" in p.stdout and "compiling after the stop" in p.stdout


def test_prepare_needs_a_compute_capability_off_the_interpreter(tmp_path):
    res, _ = _payload(tmp_path, "prepare", "--shape", SHAPE, "--batch-sizes", "1", "--provider", "builtin",
                      "--out", str(tmp_path / "w"), "--smi", str(tmp_path / "absent"),
                      env_extra={"TRITON_INTERPRET": "0"})
    assert res["type"] == "error" and res["kind"] == "not_found" and "compute capability" in res["msg"]


# ----------------------------------------------------------------------------- real compile (CPU, sm_90)

GPU_LIKE = """
import os, sys, json
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, {root!r})
from remote.tuning.tuner import offgpu
# what the timing process sees on an H200: device queries and Triton's driver answer for sm_90
offgpu.answer_as_target("9.0", "NVIDIA H200")
offgpu.use_target_driver(("cuda", 90, 32))
from remote.engines.sglang.provider import SglangProvider, load_kernel
from remote.tuning.tuner.compile import TargetCompiler
manifest = json.load(open({manifest!r}))
P = SglangProvider(load_kernel())
p = P.make_problem(dict(E=8, N=64, hidden=128, topk=2), 40, "bfloat16", "cpu", 0, shape_only=True)
jobs = []
for kind, keys in manifest["candidates"]["40"].items():
    jobs += [(kind, dict(zip(("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                              "num_stages"), k))) for k in keys]
c = TargetCompiler(workers=1, prepared=manifest["kernels"]["compiled"])
c.bind(P, p)
fails = c.compile(jobs, M=40)
# SGLang's own launch code, its kernels in compile-only mode (as the timing process's first launch)
for obj in vars(P.k.kernel_module).values():
    if type(obj).__name__ == "JITFunction":
        obj.run = (lambda _run: lambda *a, **kw: _run(*a, **dict(kw, warmup=True)))(obj.run)
for kind, cfg in jobs:
    kw = P._launch_kwargs(p, "up" if kind == "up_sorted" else kind, cfg)
    if kind == "up_sorted":  # the server's up GEMM when the down GEMM uses TMA
        kw["c_sorted"] = True
    P.k.invoke(**kw)
st = c.stats()
c.close()
print("RESULT " + json.dumps({{"fails": [str(k) for k in fails], "stats": st, "jobs": len(jobs)}}))
"""


def test_sglang_kernels_compiled_before_the_stop_are_the_launch_cache_hits(tmp_path):
    from tests.sglang_standins import release_tree, subprocess_env
    env = subprocess_env(tmp_path / "site", release_tree("0.5.23"), REPO)
    env.pop("TRITON_INTERPRET", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    work = tmp_path / "work"
    p = subprocess.run([sys.executable, "-m", "remote", "prepare", "--shape", SHAPE, "--batch-sizes", "40",
                        "--space", "smoke", "--provider", "sglang", "--capability", "9.0", "--device-name",
                        "NVIDIA H200", "--smem-limit", "232448", "--workers", "2", "--out", str(work)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    res = [json.loads(ln) for ln in p.stdout.splitlines() if '"type": "result"' in ln]
    assert res, f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    d = res[-1]["data"]
    # up, down and the up GEMM as the server launches it before a TMA down GEMM (c_sorted)
    assert d["kernels"] == 3 * len(sp.smoke_space()) and d["failed"] == 0 and not d["cut"], d
    cands = json.loads((work / "prepared" / prepared.MANIFEST).read_text())["candidates"]["40"]
    assert set(cands) == {"up", "down", "up_sorted"}
    assert d["cuda"] == {"visible": "", "initialized": False}
    manifest = work / "prepared" / prepared.MANIFEST
    script = tmp_path / "gpu_like.py"
    script.write_text(textwrap.dedent(GPU_LIKE.format(root=str(REPO), manifest=str(manifest))))
    cache = prepared.cache_dir(work / "prepared", json.loads(manifest.read_text()))
    assert cache.parent == work / "triton-cache" and cache.name.startswith("triton-cache-")
    env2 = dict(env, TRITON_CACHE_DIR=str(cache), TRITON_STORE_BINARY_ONLY="1")
    q = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env2, cwd=REPO, timeout=900)
    out = [ln for ln in q.stdout.splitlines() if ln.startswith("RESULT ")]
    assert q.returncode == 0 and out, f"{q.stdout[-2000:]}\n{q.stderr[-4000:]}"
    r = json.loads(out[-1][len("RESULT "):])
    st = r["stats"]
    # nothing was sent to a compile worker, every job was prepared, and
    # every first launch found its binary in the prepared cache
    compiled = json.loads(manifest.read_text())["kernels"]["compiled"]
    assert r["fails"] == [] and st["sent"] == 0 and st["prepared"] == len(compiled), st
    assert st["prepared_jobs"] == r["jobs"] and st["launch_compiles"] == 0 and st["launch_cache_hits"] == r["jobs"]


def test_prepare_takes_the_tunes_budget_and_routing_flags():
    """The controller passes the tune's flags to the prepare step too: ``--budget`` and the routing
    flags must parse there (before, the prepare failed with "unrecognized arguments: --budget 120"
    and every tune compiled after the stop)."""
    import argparse

    from remote.tuning import prepare

    p = argparse.ArgumentParser()
    prepare.add_arguments(p)
    args = p.parse_args(["--out", "/w", "--model-config", "/m.json", "--budget", "120", "--routing-file", "/r",
                         "--routing-skew", "0.5"])
    assert args.budget == 120.0 and args.routing_file == "/r" and args.routing_skew == 0.5
