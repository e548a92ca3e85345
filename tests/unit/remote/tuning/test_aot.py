"""Compiling for the GPU's target off the GPU (remote/tuning/tuner/aot.py, compile.TargetCompiler).

No GPU here, so the timing process's side runs with a stand-in Triton driver (:data:`FAKE_DRIVER`:
current device 0, stream 0, target ``cuda`` sm_90, warp 32) and Triton's interpreter off: Triton's
real launch path (bind, specialise, parse options, compile) runs on CPU tensors up to the point
where it would load the binary on a GPU, which ``warmup=True`` skips. The compile itself is real:
Triton's NVIDIA backend and its bundled ptxas make a cubin for sm_90 on this CPU machine. What is
checked: a compile request captured from a launch, compiled in a worker process that sees no GPU
and never initialises CUDA, lands in ``TRITON_CACHE_DIR`` under the key the launch computes (the
launch then finds it: a cache hit, counted by Triton's compilation listener); without the worker
the same launch compiles (a miss), so the hit is the worker's doing. SGLang 0.5.23's own
``fused_moe_kernel``, launched by its ``invoke_fused_moe_kernel`` (up GEMM, and the down GEMM with
TMA), is checked the same way. Each case runs in a fresh interpreter (the stand-in driver and the
interpreter switch are process-wide).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from tests.paths import REPO
from tests.waiting import run_watched

FAKE_DRIVER = """
import os, sys, json
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, {root!r})
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class FakeDriver:
    def get_current_device(self):
        return 0
    def get_current_stream(self, device=None):
        return 0
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self):
        return torch.device("cpu")

def emit(obj):
    print("RESULT " + json.dumps(obj, default=str))
"""

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def double(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) * 2, mask=i < n)
'''


def run_case(tmp_path, body: str, env_extra: dict | None = None) -> dict:
    """``body`` (inside ``main()``, after :data:`FAKE_DRIVER`) in a fresh interpreter with its own
    Triton cache; returns what it passed to ``emit``."""
    (tmp_path / "aotkern.py").write_text(KERNEL)
    code = FAKE_DRIVER.format(root=str(REPO)) + "\ndef main():\n" + textwrap.indent(textwrap.dedent(body), "    ") + \
        "\n\nif __name__ == '__main__':\n    main()\n"
    script = tmp_path / "case.py"
    script.write_text(code)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    env.pop("TRITON_INTERPRET", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(env_extra or {})
    p = run_watched([sys.executable, str(script)], cwd=str(tmp_path), env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _cubins(cache) -> list[str]:
    return sorted(f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".cubin"))


def test_worker_compile_is_the_launch_cache_hit(tmp_path):
    r = run_case(tmp_path, """
        driver.set_active(FakeDriver())
        from aotkern import double
        from remote.tuning.tuner import aot
        from remote.tuning.tuner.compile import TargetCompiler
        x, y = torch.zeros(256), torch.zeros(256)
        launch = lambda: double[(2,)](x, y, 256, BLOCK=128, num_warps=4)
        warm = lambda: double.warmup(x, y, 256, BLOCK=128, num_warps=4, grid=(2,))

        class Prov:  # a provider whose compile requests come from this launch
            def kernel_specs(self, problem, kind, cfg):
                return aot.capture([double], launch)

        specs = aot.capture([double], launch)
        c = TargetCompiler(workers=1)
        from tests.unit.remote.tuning.test_aot import worker_probe
        probe = c._pool.submit(worker_probe).result()
        c.bind(Prov(), None)
        fails = c.compile([("up", {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                                   "num_warps": 4, "num_stages": 2})], M=1)
        after_worker = sorted(os.listdir(os.environ["TRITON_CACHE_DIR"]))
        warm()
        st = c.stats()
        # a second kernel specialisation no worker compiled: the launch compiles it (the contrast)
        double.warmup(x, y, 255, BLOCK=64, num_warps=4, grid=(2,))
        st2 = c.stats()
        c.close()
        emit({"specs": [dict(fn=s.fn, signature=s.signature, options=s.options, target=s.target)
                        for s in specs], "probe": probe, "fails": [str(k) for k in fails],
              "after_worker": after_worker, "stats": st, "stats2": st2,
              "main_cuda": torch.cuda.is_initialized()})
    """)
    spec = r["specs"][0]
    assert spec["fn"] == "aotkern:double" and spec["target"] == ["cuda", 90, 32]
    assert spec["signature"] == {"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    assert spec["options"]["num_warps"] == 4 and spec["options"]["arch"] == "sm90"
    assert r["probe"] == {"CUDA_VISIBLE_DEVICES": "", "cuda_initialized": False}
    assert r["fails"] == [] and r["after_worker"]  # the worker wrote the artifact
    assert r["stats"]["sent"] == 1 and r["stats"]["mode"] == "target"
    assert r["stats"]["launch_cache_hits"] == 1 and r["stats"]["launch_compiles"] == 0
    assert r["stats"]["notes"] == []
    # a specialisation no worker compiled is compiled by the launch, and counted so: the hit above
    # could have been a miss
    assert r["stats2"]["launch_compiles"] == 1 and r["stats2"]["launch_cache_hits"] == 1
    assert len(_cubins(tmp_path / "cache")) == 2


def worker_probe() -> dict:
    """Run in a compile worker: what it sees of CUDA (after importing torch)."""
    import torch
    return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_initialized": bool(torch.cuda.is_initialized())}


def test_compile_worker_refuses_a_visible_gpu(monkeypatch):
    from remote.tuning.tuner import aot
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ok, err = aot.compile_specs([])
    assert not ok and "would use CUDA" in err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert aot.compile_specs([]) == (True, "")


def test_available_says_why_not_under_the_interpreter(monkeypatch):
    from remote.tuning.tuner import aot
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET" in aot.available()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert aot.available() is None  # this Triton (3.x) has the target compile API


def test_capture_failure_falls_back_to_context_workers_with_the_reason(tmp_path):
    r = run_case(tmp_path, """
        driver.set_active(FakeDriver())
        from remote.tuning.tuner import aot
        from remote.tuning.tuner.compile import TargetCompiler

        class Prov:
            def kernel_specs(self, problem, kind, cfg):
                raise aot.CaptureError("launch code failed under capture: RuntimeError: no")

        class Ctx:  # the context compiler the fallback builds
            enabled, seconds, mode = True, 0.0, "context"
            def __init__(self):
                self.got = []
            def submit(self, jobs, M=None):
                self.got += [(k, M) for k, _ in jobs]
                return {}
            def close(self):
                pass

        made = []
        c = TargetCompiler(workers=1, fallback=lambda: made.append(Ctx()) or made[-1])
        c.bind(Prov(), None)
        cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 2}
        c.submit([("up", cfg), ("down", cfg)], M=8)
        c.submit([("up", dict(cfg, BLOCK_SIZE_N=64))], M=8)
        st = c.stats()
        c.close()
        emit({"stats": st, "got": made[0].got if made else None, "pool": c._pool is None})
    """)
    assert r["stats"]["mode"] == "context" and "launch code failed under capture" in r["stats"]["fallback_reason"]
    assert r["got"] == [["up", 8], ["down", 8], ["up", 8]] and r["pool"]


def test_make_compiler_reports_why_the_target_path_is_not_taken(monkeypatch):
    from remote.tuning.tuner import driver

    class NoSpecs:
        name = "builtin"
        compile_target = "remote.tuning.providers.builtin:compile_one"

        def precompile_args(self, shape, dtype, quant=None):
            return {"shape": shape}

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    spec = {"shape": {"E": 8, "N": 64, "hidden": 128, "topk": 2}, "dtype": "float16"}
    c = driver.make_compiler(NoSpecs(), spec, "cuda:0")
    try:
        assert c.mode == "context" and "kernel_specs" in c.fallback_reason
    finally:
        c.close()
    c = driver.make_compiler(NoSpecs(), dict(spec, compile_mode="context"), "cuda:0")
    try:
        assert "forced" in c.stats()["fallback_reason"]
    finally:
        c.close()
    with pytest.raises(ValueError, match="compile_mode"):
        driver.make_compiler(NoSpecs(), dict(spec, compile_mode="gpu"), "cuda:0")


def test_time_split_parts_add_up():
    from remote.tuning.tuner.driver import time_split
    a = {"compile": 1.0, "first": 2.0, "timer": 10.0}
    b = {"compile": 4.0, "first": 3.5, "timer": 18.0}
    s = time_split(a, b, t0=100.0, t_search=112.0, t_compare=113.0, t_end=115.5, t_start=99.0)
    assert s == {"compile": 3.0, "first_launch": 1.5, "timing": 6.5, "search_other": 1.0, "compare": 1.0,
                 "check": 2.5, "setup": 1.0, "wall": 16.5}
    assert sum(v for k, v in s.items() if k != "wall") == pytest.approx(s["wall"])


@pytest.mark.slow
def test_sglang_0_5_23_gemm_compiled_off_the_gpu_is_its_launch_cache_hit(tmp_path):
    from tests.sglang_standins import release_tree, subprocess_env
    env = subprocess_env(tmp_path / "site", release_tree("0.5.23"), REPO)
    r = run_case(tmp_path, """
        driver.set_active(FakeDriver())
        from remote.engines.sglang.provider import SglangProvider, load_kernel
        from remote.tuning.tuner.compile import TargetCompiler
        P = SglangProvider(load_kernel())
        # M * top_k > 64: the alignment is SGLang's CUDA op (a stand-in here), not a Triton launch
        p = P.make_problem(dict(E=8, N=64, hidden=128, topk=2), 40, "bfloat16", "cpu", 0)
        up = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
        down = dict(up, BLOCK_SIZE_N=64, USE_TMA=True)
        specs = {k: [dict(fn=s.fn, signature=s.signature) for s in P.kernel_specs(p, k, c)]
                 for k, c in (("up", up), ("down", down))}
        c = TargetCompiler(workers=2)
        c.bind(P, p)
        fails = c.compile([("up", up), ("down", down)], M=40)
        # SGLang's own launch code with its kernels in compile-only mode (as the timing process's first launch)
        for obj in vars(P.k.kernel_module).values():
            if type(obj).__name__ == "JITFunction":
                obj.run = (lambda _run: lambda *a, **kw: _run(*a, **dict(kw, warmup=True)))(obj.run)
        P.k.invoke(**P._launch_kwargs(p, "up", up))
        P.k.invoke(**P._launch_kwargs(p, "down", down))
        st = c.stats()
        c.close()
        emit({"specs": specs, "fails": [str(k) for k in fails], "stats": st})
    """, env_extra={k: env[k] for k in ("PYTHONPATH", "ORCH_STANDINS_REPO", "ORCH_STANDINS_SGLANG")})
    up, down = r["specs"]["up"][0], r["specs"]["down"][0]
    assert up["fn"] == down["fn"] == "sglang.kernels.ops.moe.fused_moe_triton_kernels:fused_moe_kernel"
    assert up["signature"]["a_ptr"] == "*bf16" and up["signature"]["b_desc"] == "constexpr"
    assert down["signature"]["b_desc"].startswith("tensordesc") and down["signature"]["a_desc"].startswith("tensordesc")
    assert r["fails"] == [], r["stats"]
    assert r["stats"]["sent"] == 2 and r["stats"]["launch_cache_hits"] == 2 and r["stats"]["launch_compiles"] == 0
    assert r["stats"]["notes"] == []
