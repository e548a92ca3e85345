"""The ``sglang`` tuner provider against the real SGLang releases (wheels from the registry).

Each release runs in its own Python process (releases cannot share one), with
``tests/sglang_standins.py`` standing in for the packages and compiled ops absent here; SGLang's
Triton GEMM, its Triton alignment for small M and its launch code run for real under
``TRITON_INTERPRET=1`` on tiny shapes. Releases: 0.5.23 (``sglang.kernels.ops.moe`` +
``moe_runner/triton_utils``), 0.5.8 (``fused_moe_triton/`` split into modules) and
0.4.10.post2 (``fused_moe_triton/fused_moe.py``, no ``_down`` files).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import pytest

from tests.paths import REPO
from tests.waiting import run_watched

ROOT = REPO
RELEASES = ["0.4.10.post2", "0.5.8", "0.5.23"]

PRELUDE = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {root!r})
from tests.sglang_standins import prepare, release_tree
STANDINS = prepare(release_tree({version!r}))
import torch
from remote.engines.sglang.provider import SglangProvider, load_kernel
from tests.paths import REPO
K = load_kernel()
P = SglangProvider(K)
SHAPE = dict(E=8, N=64, hidden=128, topk=2)
CFG = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
def emit(obj):
    print("RESULT " + json.dumps(obj, default=str))
"""


def run_release(version: str, body: str) -> dict:
    """Run ``body`` after :data:`PRELUDE` for ``version`` in a fresh interpreter; returns the
    object the body passed to ``emit``."""
    code = PRELUDE.format(root=str(ROOT), version=version) + textwrap.dedent(body)
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = run_watched([sys.executable, "-c", code], cwd=str(ROOT), env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


EXPECTED = {
    # release: (entry point of the GEMM, _down files, USE_TMA read from up, from down, kinds)
    "0.5.23": ("sglang.kernels.ops.moe.fused_moe_triton_kernels:invoke_fused_moe_kernel", True, True, True,
               ["up", "down"]),
    "0.5.8": ("sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_kernels:invoke_fused_moe_kernel", True, False,
              True, ["up", "down"]),
    "0.4.10.post2": ("sglang.srt.layers.moe.fused_moe_triton.fused_moe:invoke_fused_moe_kernel", False, False, False,
                     ["joint"]),
}


@pytest.mark.parametrize("version", RELEASES)
def test_gemms_and_whole_kernel_on_the_real_release(version):
    r = run_release(version, """
        from remote.tuning.kernel.reference import fused_moe_reference, relative_error
        d = P.describe()
        out = {"describe": d, "gemm": {}, "whole": {}}
        for M in (3, 40):  # 3 * top-k <= 64: SGLang's Triton alignment; 80 > 64: the CUDA one (stood in)
            p = P.make_problem(SHAPE, M, "float16", "cpu", M)
            ids = p.topk_ids.reshape(-1).long()
            tok = torch.arange(M).repeat_interleave(SHAPE["topk"])
            x, w1, w2 = p.x.double(), p.w1.double(), p.w2.double()
            h = torch.stack([x[tok[i]] @ w1[ids[i]].T for i in range(ids.numel())])
            for kind in P.kinds:
                P.gemm_fn(p, kind, CFG)()
            got_h = p.cache1[: M * SHAPE["topk"]].double()
            n = SHAPE["N"]
            act = p.cache2[: M * SHAPE["topk"]].double()
            act_ref = torch.nn.functional.silu(got_h[:, :n]) * got_h[:, n:]
            y_ref = torch.stack([act[i] @ w2[ids[i]].T for i in range(ids.numel())])
            y_ref = y_ref * p.topk_weights.reshape(-1, 1).double()
            got_y = p.cache3.reshape(-1, SHAPE["hidden"]).double()
            out["gemm"][M] = {"up": ((got_h - h).norm() / h.norm()).item(),
                              "act": ((act - act_ref).norm() / act_ref.norm()).item(),
                              "down": ((got_y - y_ref).norm() / y_ref.norm()).item()}
            ref = fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids)
            down = dict(CFG, BLOCK_SIZE_N=64, num_stages=3)
            out["whole"][M] = {"tuned": relative_error(P.full_fn(p, CFG, down)(), ref),
                               "default": relative_error(P.full_fn(p, None, None)(), ref)}
        P.close()
        emit(out)
    """)
    entry, down_file, up_tma, down_tma, kinds = EXPECTED[version]
    d = r["describe"]
    assert d["version"] == version and d["entry_points"]["invoke"] == entry
    assert (d["down_file"], d["up_tma"], d["down_tma"], d["kinds"]) == (down_file, up_tma, down_tma, kinds)
    assert d["tma_device"] is False and d["tma_kinds"] == [], "no TMA search without a Hopper GPU"
    for M, errs in r["gemm"].items():
        assert errs["up"] < 1e-3, (M, errs)  # fp16 outputs
        assert errs["act"] < 1e-3 and errs["down"] < 1e-3, (M, errs)
    for M, errs in r["whole"].items():
        assert errs["tuned"] < 1e-2 and errs["default"] < 1e-2, (M, errs)


@pytest.mark.parametrize("version", RELEASES)
def test_whole_kernel_reads_the_candidate_files_as_the_server_does(version):
    """The configs SGLang's own launch receives come from the files the provider wrote: up
    config to the up GEMM, ``_down`` config to the down GEMM; no file: SGLang's default config;
    the loader's cache is cleared. 0.4.x (no SGLANG_MOE_CONFIG_DIR, no ``_down`` file): the one
    config, forced through its ``override_config``, reaches both GEMMs."""
    r = run_release(version, """
        import sys as _sys
        fm = K.fused_module
        seen = []
        real = fm.invoke_fused_moe_kernel
        import inspect
        sig = inspect.signature(real)
        def spy(*a, **kw):
            seen.append(dict(sig.bind(*a, **kw).arguments["config"]))
            return real(*a, **kw)
        fm.invoke_fused_moe_kernel = spy
        p = P.make_problem(SHAPE, 5, "float16", "cpu", 1)
        up = dict(CFG, BLOCK_SIZE_N=64)
        down = dict(CFG, BLOCK_SIZE_K=32, GROUP_SIZE_M=16)
        P.full_fn(p, up, down)()
        tuned = list(seen); seen.clear()
        P.full_fn(p, CFG, CFG)()
        other = list(seen); seen.clear()
        P.full_fn(p, None, None)()
        default = list(seen)
        names = K.file_names(8, 64, None, None)
        env_during = os.environ.get("SGLANG_MOE_CONFIG_DIR")
        P.close()
        emit({"tuned": tuned, "other": other, "default": default, "expected_default": P.default_config(p),
              "names": names, "env_during": env_during, "env_after": os.environ.get("SGLANG_MOE_CONFIG_DIR")})
    """)
    strip = lambda c: {k: v for k, v in c.items() if k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",  # noqa: E731
                                                             "GROUP_SIZE_M", "num_warps", "num_stages")}
    up = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    down = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=16, num_warps=4, num_stages=2)
    assert [strip(c) for c in r["tuned"]] == ([up, down] if version != "0.4.10.post2" else [up, up])
    assert strip(r["other"][0])["BLOCK_SIZE_N"] == 32, "a new folder is read (SGLang's cache was cleared)"
    exp = {k: v for k, v in r["expected_default"].items() if k not in ("num_warps", "num_stages")}
    assert [{k: v for k, v in c.items() if k in exp} for c in r["default"]] == [exp, exp]
    assert r["names"]["up"] == "E=8,N=64,device_name=NVIDIA_H200.json"
    assert r["names"]["down"] == (None if version == "0.4.10.post2" else "E=8,N=64,device_name=NVIDIA_H200_down.json")
    if version == "0.4.10.post2":  # its loader ignores SGLANG_MOE_CONFIG_DIR: override_config forces it
        assert r["env_during"] is None
    else:
        assert r["env_during"] and r["env_after"] is None, "SGLANG_MOE_CONFIG_DIR restored on close"


def test_use_tma_reaches_sglangs_launch_and_files_on_0_5_23():
    """USE_TMA of a candidate: the down GEMM gets a_use_tma/b_use_tma, the up GEMM b_use_tma
    (0.5.23 reads both); the written _down file carries it and SGLang's loader returns it."""
    r = run_release("0.5.23", """
        p = P.make_problem(SHAPE, 5, "float16", "cpu", 1)
        tma = dict(CFG, USE_TMA=True)
        dk = P._launch_kwargs(p, "down", tma)
        uk = P._launch_kwargs(p, "up", tma)
        d = P._dir_for(p, CFG, tma)
        os.environ["SGLANG_MOE_CONFIG_DIR"] = d
        K.clear_config_cache()
        down_cfgs = K._get_configs(8, 64, None, 0, 0, True)
        P.close()
        emit({"down": {k: dk.get(k) for k in ("a_use_tma", "b_use_tma", "c_sorted")},
              "down_rows": dk["A"].shape[0], "pairs": 5 * 2,
              "up": {k: uk.get(k) for k in ("a_use_tma", "b_use_tma", "c_sorted")},
              "up_config_has_tma": "USE_TMA" in uk["config"], "loaded": down_cfgs})
    """)
    assert r["down"] == {"a_use_tma": True, "b_use_tma": True, "c_sorted": None}
    assert r["up"] == {"a_use_tma": None, "b_use_tma": True, "c_sorted": False}
    assert not r["up_config_has_tma"], "USE_TMA is a launch flag, never a kernel meta-parameter"
    # sorted, block-padded TMA layout: pairs + min(pairs, E + 1) * (BLOCK_SIZE_M - 1) rows
    assert r["down_rows"] == r["pairs"] + min(r["pairs"], 9) * 15
    assert r["loaded"] == {"5": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                                      num_warps=4, num_stages=2, USE_TMA=True)}


def test_use_tma_refused_where_the_release_cannot_take_it():
    r = run_release("0.4.10.post2", """
        p = P.make_problem(SHAPE, 5, "float16", "cpu", 1)
        msgs = []
        for kind in ("down", "joint"):
            try:
                P.gemm_fn(p, kind, dict(CFG, USE_TMA=True))
                msgs.append(None)
            except ValueError as exc:
                msgs.append(str(exc))
        emit(msgs)
    """)
    assert all(m and "USE_TMA" in m for m in r), r


def test_fp8_block_on_0_5_23():
    """fp8_w8a8 block [128, 128]: SGLang quantizes the activations itself; its per-GEMM path
    and its whole kernel match the float64 reference on the same quantized weights."""
    r = run_release("0.5.23", """
        shape = dict(E=8, N=128, hidden=256, topk=2)
        p = P.make_problem(shape, 3, "float16", "cpu", 2, quant={"block_shape": [128, 128]})
        cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
        errs = {"whole": P.check(p, cfg, cfg), "default": P.check(p, None, None)}
        names = K.file_names(8, 128, "fp8_w8a8", [128, 128])
        P.close()
        emit({"errs": errs, "names": names})
    """)
    assert r["errs"]["whole"] < 1e-2 and r["errs"]["default"] < 1e-2, r
    assert r["names"]["up"] == "E=8,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


QUANT_FORMATS = {
    # name: (tuner spec quant entry, shape (N as the file names it), the up file SGLang names)
    "int4_w4a16": ({"dtype": "int4_w4a16", "group_size": 64}, dict(E=8, N=64, hidden=256, topk=2),
                   "E=8,N=64,device_name=NVIDIA_H200,dtype=int4_w4a16.json"),
    "int4_w4a16_zp": ({"dtype": "int4_w4a16", "group_size": 64, "has_zp": True}, dict(E=8, N=64, hidden=256, topk=2),
                      "E=8,N=64,device_name=NVIDIA_H200,dtype=int4_w4a16.json"),
    "int8_w8a16": ({"dtype": "int8_w8a16", "group_size": 64}, dict(E=8, N=128, hidden=256, topk=2),
                   "E=8,N=128,device_name=NVIDIA_H200,dtype=int8_w8a16.json"),
    "int8_w8a8_channel": ({"dtype": "int8_w8a8", "per_channel": True}, dict(E=8, N=128, hidden=256, topk=2),
                          "E=8,N=128,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json"),
    "int8_w8a8_block": ({"dtype": "int8_w8a8", "block_shape": [128, 128]}, dict(E=8, N=128, hidden=256, topk=2),
                        "E=8,N=128,device_name=NVIDIA_H200,dtype=int8_w8a8,block_shape=[128, 128].json"),
    "fp8_w8a8_channel": ({"dtype": "fp8_w8a8", "per_channel": True}, dict(E=8, N=128, hidden=256, topk=2),
                         "E=8,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json"),
    "fp8_w8a8_tensor": ({"dtype": "fp8_w8a8"}, dict(E=8, N=128, hidden=256, topk=2),
                        "E=8,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"),
}


def test_quantized_formats_on_sglangs_kernel_0_5_23():
    """Every weight format SGLang's Triton fused MoE runs, built as its quantization method holds
    it: SGLang's fused_experts (reading the candidate files, which carry the release's own names)
    and its per-GEMM launch pass the float64 reference on the same quantized numbers, with tuned
    and default configs; the flags, scales, zero points and block shape reach SGLang's
    invoke_fused_moe_kernel as the server passes them; a reference that ignores the zero points
    (or quantization) does not pass, so the check can fail."""
    r = run_release("0.5.23", """
        import inspect
        from remote.tuning.kernel import formats
        from remote.tuning.kernel.reference import relative_error
        fm = K.fused_module
        real = fm.invoke_fused_moe_kernel
        sig = inspect.signature(real)
        seen = []
        def spy(*a, **kw):
            b = sig.bind(*a, **kw).arguments
            seen.append({k: (str(b[k].dtype) if hasattr(b.get(k), "dtype") else b.get(k))
                         for k in ("use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16",
                                   "per_channel_quant", "block_shape", "B", "B_zp", "B_scale")})
            return real(*a, **kw)
        fm.invoke_fused_moe_kernel = spy
        FORMATS = %r
        cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
        out = {}
        for name, (q, shape, _) in FORMATS.items():
            p = P.make_problem(shape, 3, "float16", "cpu", 2, quant=q)
            seen.clear()
            tuned = P.check(p, cfg, dict(cfg, BLOCK_SIZE_N=64))
            calls = list(seen)
            default = P.check(p, None, None)
            for kind in P.kinds:
                P.gemm_fn(p, kind, cfg)()
            fmt = p.quant
            y = P.full_fn(p, cfg, cfg)()
            wrong_zp = relative_error(y, formats.reference(p.x, p.w1, p.w2, fmt, p.topk_weights, p.topk_ids,
                                                           scales=(p.w1_scale, p.w2_scale), zps=None))
            names = K.file_names(shape["E"], p.N_file, fmt.dtype, fmt.kernel_block_shape, fmt.per_channel)
            out[name] = dict(tuned=tuned, default=default, calls=calls, wrong_zp=wrong_zp, names=names,
                             N=p.N, w1=list(p.w1.shape), tma=sorted(P.tma_kinds_for(p)))
        P.close()
        emit(out)
    """ % ({k: (v[0], v[1], v[2]) for k, v in QUANT_FORMATS.items()},))
    for name, (q, shape, up_name) in QUANT_FORMATS.items():
        o = r[name]
        assert o["tuned"] < 1e-2 and o["default"] < 1e-2, (name, o["tuned"], o["default"])
        assert o["names"]["up"] == up_name, (name, o["names"])
        assert len(o["calls"]) == 2, o["calls"]  # up and down GEMM
        sel = q["dtype"]
        for c in o["calls"]:
            assert c["use_" + sel] is True and sum(c[f"use_{s}"] is True for s in
                                                   ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16")) == 1, c
            assert bool(c["per_channel_quant"]) == bool(q.get("per_channel")), c
            assert c["block_shape"] == ([0, q["group_size"]] if "group_size" in q else q.get("block_shape")), c
            assert (c["B_zp"] is not None) == bool(q.get("has_zp")), c
        if sel == "int4_w4a16":  # packed: the stored K is half the real one, the file's N half the intermediate size
            assert o["N"] == 2 * shape["N"] and o["w1"] == [shape["E"], 2 * o["N"], shape["hidden"] // 2]
            assert o["calls"][0]["B"] == "torch.uint8"
        if q.get("has_zp"):
            assert o["wrong_zp"] > 10 * o["tuned"], o  # the reference tells real zero points from the implicit 8
    assert r["int4_w4a16"]["tma"] == []  # SGLang's GPTQ/AWQ kernel takes no TMA descriptors


def test_tune_command_with_the_sglang_provider(tmp_path):
    """``python -m remote tune --provider sglang`` end to end on 0.5.23 (smoke space, CPU): files
    with sorted integer keys, the down file on the up file's BLOCK_SIZE_M, the report names the
    SGLang version and its entry points."""
    from tests import sglang_standins as st
    tree = st.release_tree("0.5.23")
    env = st.subprocess_env(tmp_path / "site", tree, ROOT)
    env["TRITON_INTERPRET"] = "1"
    out = tmp_path / "out"
    p = run_watched([sys.executable, "-m", "remote", "tune", "--provider", "sglang", "--space", "smoke",
                        "--shape", "E=8,N=64,hidden=128,topk=2", "--batch-sizes", "40,2", "--device-name",
                        "NVIDIA H200", "--out", str(out)], cwd=str(ROOT), env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["provider"] == "sglang" and rep["engine_info"]["version"] == "0.5.23"
    assert rep["engine_info"]["entry_points"]["invoke"] == EXPECTED["0.5.23"][0]
    assert rep["engine_info"]["file_names"]["up"] == "E=8,N=64,device_name=NVIDIA_H200.json"
    up = json.loads((out / "E=8,N=64,device_name=NVIDIA_H200.json").read_text())
    down = json.loads((out / "E=8,N=64,device_name=NVIDIA_H200_down.json").read_text())
    assert list(up) == ["2", "40"] == list(down)
    for k in up:
        assert up[k]["BLOCK_SIZE_M"] == down[k]["BLOCK_SIZE_M"]
        assert {"num_warps", "num_stages"} <= set(up[k]) and {"num_warps", "num_stages"} <= set(down[k])
    for M, r in rep["batch_sizes"].items():
        assert r["rel_err"] < 1e-2 and r["final"], (M, r)


def test_standins_never_answer_for_a_compiled_op_they_do_not_replace():
    r = run_release("0.5.23", """
        import sgl_kernel
        try:
            sgl_kernel.some_kernel_nobody_stood_in(1)
            emit("no error")
        except NotImplementedError as exc:
            emit({"msg": str(exc), "standins": STANDINS})
    """)
    assert "some_kernel_nobody_stood_in" in r["msg"]
    # the stand-ins in use are listed, and none of them is SGLang's GEMM or launch code
    assert "sgl_kernel" in r["standins"]["modules"]
    assert not any("invoke_fused_moe_kernel" in o or "fused_moe_kernel" == o.rsplit(".", 1)[-1]
                   for o in r["standins"]["ops"])


def test_alignment_standin_keeps_sglangs_contract():
    """The CUDA alignment stand-in (used for M * top_k > 64, absent here and on the H200) gives
    what SGLang's own Triton alignment gives where both apply: the same padded total, the same
    expert per block, the same set of pairs in each block, pads holding numel."""
    r = run_release("0.5.23", """
        from sglang.kernels.ops.moe.moe_align_small_numel import moe_align_small_numel
        from tests.sglang_standins import moe_align_block_size as standin
        import triton
        out = []
        g = torch.Generator().manual_seed(5)
        for E, M, k, bm in ((8, 5, 2, 16), (70, 7, 8, 16), (12, 20, 3, 32)):
            ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32)
            numel = ids.numel()
            cap = (numel * bm if numel < E + 1 else numel + (E + 1) * (bm - 1)) + 3
            cap = cap // 4 * 4
            nb = triton.cdiv(cap, bm)
            res = []
            for fn in ("sglang", "standin"):
                st = torch.full((cap,), -7, dtype=torch.int32)
                ex = torch.full((nb,), -7, dtype=torch.int32)
                nt = torch.zeros(1, dtype=torch.int32)
                if fn == "sglang":
                    moe_align_small_numel(ids, E + 1, bm, st, ex, nt)
                else:
                    standin(ids, E + 1, bm, st, ex, nt, torch.zeros(E + 2, dtype=torch.int32), True)
                total = int(nt[0])
                blocks = [sorted(st[b * bm:(b + 1) * bm].tolist()) for b in range(total // bm)]
                res.append({"total": total, "experts": ex[: total // bm].tolist(), "blocks": blocks})
            out.append({"numel": numel, "sglang": res[0], "standin": res[1]})
        emit(out)
    """)
    for case in r:
        assert case["sglang"] == case["standin"], case
        assert all(v == case["numel"] for b in case["standin"]["blocks"] for v in b if v >= case["numel"])


def test_down_tma_only_where_sglangs_kernel_computes_it():
    """Down TMA reads sorted rows; SGLang 0.5.23's per-channel branch scales them by the unsorted
    token, so only 16-bit weights and block fp8 may search it (the int8 per-channel rejections
    on the H200, docs/benchmarks.md §4.3)."""
    from types import SimpleNamespace

    from remote.tuning.kernel.formats import WeightFormat
    from remote.engines.sglang.provider import SglangProvider, down_tma_computes

    int8_channel = WeightFormat("int8_w8a8", per_channel=True)
    int8_block = WeightFormat("int8_w8a8", block_shape=(128, 128))
    fp8_block = WeightFormat("fp8_w8a8", block_shape=(128, 128))
    fp8_channel = WeightFormat("fp8_w8a8", per_channel=True)
    fp8_tensor = WeightFormat("fp8_w8a8")
    int4 = WeightFormat("int4_w4a16", group_size=128)
    assert down_tma_computes(None) and down_tma_computes(fp8_block)
    assert not any(down_tma_computes(f) for f in (int8_channel, int8_block, fp8_channel, fp8_tensor))

    kernel = SimpleNamespace(down_file=True, tma_device=True, up_tma=True, down_tma=True)
    prov = SglangProvider(kernel=kernel)
    assert prov.tma_kinds == {"up", "down"}
    kinds = {name: prov.tma_kinds_for(SimpleNamespace(quant=f)) for name, f in
             dict(bf16=None, fp8_block=fp8_block, int8_channel=int8_channel, fp8_tensor=fp8_tensor, int4=int4).items()}
    assert kinds == dict(bf16={"up", "down"}, fp8_block={"up", "down"}, int8_channel={"up"},
                         fp8_tensor={"up"}, int4=set())


def test_fused_shared_expert_routing_on_the_real_release():
    """With the server's routing of a fused shared expert (top-2 routed + the shared one, id E - 1),
    SGLang 0.5.23's GEMMs and its whole ``fused_experts`` run top-3 over E = 9: the problem's buffers
    hold 3 rows a token (a buffer sized for the routed top-k alone is written past its end), the
    down GEMM writes every row, and the whole kernel matches the float64 reference."""
    r = run_release("0.5.23", """
        from remote.tuning.kernel.reference import fused_moe_reference, relative_error
        shape = dict(E=9, N=64, hidden=128, topk=2)
        out = {}
        for M in (3, 40):  # 9 rows: SGLang's Triton alignment; 120: the CUDA one (stood in)
            p = P.make_problem(shape, M, "float16", "cpu", M, routing={"shared": 1})
            p.cache3.fill_(float("nan"))
            for kind in P.kinds:
                P.gemm_fn(p, kind, CFG)()
            ref = fused_moe_reference(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids)
            out[M] = {"top_k": p.top_k, "cache3": list(p.cache3.shape), "shared_col": p.topk_ids[:, -1].tolist(),
                      "nan": bool(torch.isnan(p.cache3).any()), "info": p.routing_info,
                      "whole": relative_error(P.full_fn(p, CFG, CFG)(), ref),
                      "default": relative_error(P.full_fn(p, None, None)(), ref)}
        P.close()
        emit(out)
    """)
    for M, o in r.items():
        M = int(M)
        assert o["top_k"] == 3 and o["cache3"] == [M, 3, 128] and o["shared_col"] == [8] * M
        assert not o["nan"], "the down GEMM wrote every (token, expert) row"
        assert o["info"]["shared_expert"] and o["info"]["max_load"] == M
        assert o["whole"] < 1e-2 and o["default"] < 1e-2, o
