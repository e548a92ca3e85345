"""Quantized expert weights in SGLang's layouts (remote/tuning/kernel/formats.py), on the CPU.

The layouts are checked against what SGLang 0.5.23's loaders produce from a checkpoint
(``moe_wna16.py``: GPTQ int4 qweight ``.T.view(uint8)`` = two values per byte, low nibble first;
zero points ``+1`` and packed along N) and against the inverse of each quantization.
"""

from __future__ import annotations

import pytest
import torch

from remote.tuning.kernel import formats
from remote.tuning.kernel.formats import WeightFormat


def _w(E=2, rows=8, cols=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(E, rows, cols, generator=g) / 16


FORMATS = [
    WeightFormat("int4_w4a16", group_size=64),
    WeightFormat("int4_w4a16", group_size=128, has_zp=True),
    WeightFormat("int8_w8a16", group_size=64),
    WeightFormat("int8_w8a16", group_size=64, has_zp=True),
    WeightFormat("int8_w8a8", per_channel=True),
    WeightFormat("int8_w8a8", block_shape=(128, 128)),
    WeightFormat("fp8_w8a8", per_channel=True),
    WeightFormat("fp8_w8a8", block_shape=(128, 128)),
    WeightFormat("fp8_w8a8"),
]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.dtype}-{f.block_shape}-{f.per_channel}-{f.has_zp}")
def test_stored_shapes_and_dtypes_are_sglangs(fmt):
    E, rows, cols = 2, 256, 256
    q, s, z = formats.quantize(_w(E, rows, cols), fmt, torch.bfloat16)
    e_q, e_s, e_z = formats.empty(E, rows, cols, fmt, torch.bfloat16, "cpu")
    assert (q.shape, q.dtype, s.shape, s.dtype) == (e_q.shape, e_q.dtype, e_s.shape, e_s.dtype)
    assert (z is None) == (e_z is None) and (z is None or (z.shape, z.dtype) == (e_z.shape, e_z.dtype))
    if fmt.dtype == "int4_w4a16":
        # MoeWNA16Method.create_weights: [E, rows, cols // 2] uint8, scales [E, rows, cols // group] params_dtype
        assert q.shape == (E, rows, cols // 2) and q.dtype == torch.uint8
        assert s.shape == (E, rows, cols // fmt.group_size) and s.dtype == torch.bfloat16
        assert z is None or z.shape == (E, rows // 2, cols // fmt.group_size)
    elif fmt.per_channel:
        assert s.shape == (E, rows, 1) and s.dtype == torch.float32  # w8a8_int8.py: [E, 2N, 1] float32
    elif fmt.block_shape:
        assert s.shape == (E, rows // 128, cols // 128)
    assert fmt.kernel_block_shape == ([0, fmt.group_size] if fmt.weight_only else
                                      (list(fmt.block_shape) if fmt.block_shape else None))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.dtype}-{f.block_shape}-{f.per_channel}-{f.has_zp}")
def test_dequantize_inverts_quantize_within_one_step(fmt):
    w = _w(2, 256, 256)
    q, s, z = formats.quantize(w, fmt, torch.float16)
    d = formats.dequantize(q, s, z, fmt)
    err = (d - w.double()).abs()
    if fmt.dtype.startswith("fp8"):
        assert (err / w.double().abs().clamp(min=1e-3)).median() < 0.07  # e4m3: 3 mantissa bits
    else:
        bits = 4 if fmt.packed else 8
        span = 2 ** bits - 1 if fmt.has_zp else 2 ** (bits - 1) - 1
        step = w.abs().max().item() * (2 if fmt.has_zp else 1) / span
        assert err.max().item() <= step * 0.51 + 1e-3


def test_int4_packing_is_the_gptq_loaders():
    """A GPTQ int4 checkpoint packs eight 4-bit values per int32 along K (value i at bits 4i); SGLang's
    moe_wna16 loader transposes and views the int32 words as bytes. The provider's packed bytes are
    exactly that view of the same values."""
    fmt = WeightFormat("int4_w4a16", group_size=64)
    q, s, _ = formats.quantize(_w(1, 4, 128), fmt, torch.float16)
    vals = torch.stack((q & 0xF, q >> 4), dim=3).reshape(1, 4, 128).to(torch.int64)  # [E, N, K] 4-bit values
    words = torch.zeros(1, 4, 16, dtype=torch.int64)
    for i in range(8):
        words |= vals[:, :, i::8] << (4 * i)
    gptq_qweight = words.to(torch.int32).transpose(1, 2).contiguous()  # checkpoint layout [K // 8, N]
    loaded = gptq_qweight.transpose(1, 2).contiguous().view(torch.uint8)  # moe_wna16 loader: .T.view(uint8)
    assert torch.equal(loaded, q)


def test_zero_points_are_packed_along_n_and_used():
    fmt = WeightFormat("int4_w4a16", group_size=64, has_zp=True)
    w = _w(1, 4, 128) + 0.05  # asymmetric values: zero points are not 8
    q, s, z = formats.quantize(w, fmt, torch.float32)
    zv = torch.stack((z & 0xF, z >> 4), dim=2).reshape(1, 4, 2)
    assert not torch.all(zv == 8)
    d_wrong = formats.dequantize(q, s, None, fmt)  # as if the kernel assumed the implicit 8
    d = formats.dequantize(q, s, z, fmt)
    assert (d - w.double()).abs().max() < (d_wrong - w.double()).abs().max()


def test_reference_quantizes_activations_like_the_launch():
    """w8a8: the reference quantizes x per token (int8 / 127); a16: x is used as it is."""
    x = torch.randn(5, 256, dtype=torch.float16)
    a16 = formats.quantize_activation(x, WeightFormat("int4_w4a16", group_size=64))
    assert torch.equal(a16, x.double())
    a8 = formats.quantize_activation(x, WeightFormat("int8_w8a8", per_channel=True))
    step = x.float().abs().amax(dim=1, keepdim=True).double() / 127
    assert ((a8 - x.double()).abs() <= step / 2 + 1e-6).all() and not torch.equal(a8, x.double())


@pytest.mark.parametrize("bad", [dict(dtype="int5"), dict(dtype="int4_w4a16"), dict(dtype="int8_w8a8"),
                                 dict(dtype="fp8_w8a8", per_channel=True, block_shape=(128, 128)),
                                 dict(dtype="int8_w8a8", per_channel=True, has_zp=True)])
def test_formats_sglang_does_not_run_are_refused(bad):
    with pytest.raises(ValueError):
        formats.from_quant(bad)


SUPPORT_CASES = [
    # naming, builtin runs it, sglang runs it
    ({"dtype_selector": None, "weight_dtype": "bfloat16"}, True, True),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e4m3", "block_shape": [128, 128]}, True, True),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e4m3", "per_channel_quant": True}, False, True),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e5m2"}, False, False),
    ({"dtype_selector": "int8_w8a8", "weight_dtype": "int8", "per_channel_quant": True}, False, True),
    ({"dtype_selector": "int8_w8a8", "weight_dtype": "int8", "block_shape": [128, 128]}, False, True),
    ({"dtype_selector": "int8_w8a8", "weight_dtype": "int8"}, False, False),  # SGLang asserts per-channel
    ({"dtype_selector": "int4_w4a16", "weight_dtype": "int4", "group_size": 128}, False, True),
    ({"dtype_selector": "int4_w4a16", "weight_dtype": "int4", "group_size": 0}, False, False),
    ({"dtype_selector": "int8_w8a16", "weight_dtype": "int8", "group_size": 128, "has_zp": True}, False, True),
    ({"dtype_selector": None, "weight_dtype": "bfloat16", "gated": False}, False, False),
]


@pytest.mark.parametrize("naming, builtin, sglang", SUPPORT_CASES)
def test_unsupported_reason_per_provider(naming, builtin, sglang):
    """The builtin kernel keeps refusing int4/int8 and per-channel fp8, saying the sglang provider runs
    them; the sglang provider runs what SGLang's Triton fused MoE runs; the probe reports both and the
    controller refuses with the provider it will tune with."""
    from orchestrator.facts.probe import ProbedModel
    from orchestrator.facts.schema import from_dict
    from remote.tuning.support import quant_entry, unsupported_reason

    b, s = unsupported_reason(naming, "builtin"), unsupported_reason(naming, "sglang")
    assert (b is None) == builtin and (s is None) == sglang, (b, s)
    if not builtin and sglang:
        assert "sglang provider" in b
        q = quant_entry(naming)
        assert formats.from_quant(q).dtype == naming["dtype_selector"]  # the provider can build it
    model = dict(naming, tuner_unsupported=b, tuner_unsupported_by={"builtin": b, "sglang": s})
    pm = from_dict(ProbedModel, model)
    assert (pm.untunable_reason("sglang") is None) == sglang and (pm.untunable_reason("builtin") is None) == builtin


def test_int8_per_channel_weight_only_round_trips():
    """vLLM's experts_int8 layout: int8 weights, float32 scales [E, rows], no group or zero point; the
    kernel gets no block shape and no per-token activation flag."""
    import torch

    from remote.tuning.kernel import formats

    fmt = formats.from_quant(dict(dtype="int8_w8a16", per_channel=True))
    assert fmt.int8_per_channel and fmt.weight_only and fmt.kernel_block_shape is None
    assert fmt.flags()["use_int8_w8a16"] and not fmt.flags()["per_channel_quant"]
    w = torch.randn(2, 8, 32)
    q, s, z = formats.quantize(w, fmt, torch.float16)
    assert q.dtype == torch.int8 and s.shape == (2, 8) and s.dtype == torch.float32 and z is None
    back = formats.dequantize(q, s, None, fmt)
    assert (back - w.double()).abs().max() <= s.double().max() / 2 + 1e-6
    e, es, ez = formats.empty(2, 8, 32, fmt, torch.float16, "cpu")
    assert e.dtype == torch.int8 and es.shape == (2, 8) and ez is None
    with pytest.raises(ValueError, match="per-channel int8_w8a16"):
        formats.WeightFormat("int8_w8a16", per_channel=True, has_zp=True)
