"""remote.engines.triton_moe.configfile: validation, reading and writing of SGLang fused-MoE config JSON."""

from __future__ import annotations

import json

import pytest

from remote.engines.triton_moe.configfile import check_down_matches_up, dumps_config, load_config_file, loads_config, validate_config
from remote.protocol import PayloadError
from tests.paths import DATA

REFERENCE = DATA / "reference" / "sglang-0.5.23-triton_3_6_0"


def entry(m=16, n=64, k=64, g=1, w=4, s=3, **extra):
    return {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": g, "num_warps": w,
            "num_stages": s, **extra}


def test_valid_config_is_canonicalised_in_numeric_order():
    cfg = {"1024": entry(m=128), "2": entry(), "16": entry(m=32, USE_TMA=True)}
    out = validate_config(cfg, "f.json")
    assert list(out) == ["2", "16", "1024"]
    assert out["16"]["USE_TMA"] is True


@pytest.mark.parametrize(
    "obj, words",
    [
        ([], "top level"),
        ({}, "empty"),
        ({"triton_version": "3.6.0", "1": entry()}, "'triton_version'"),
        ({"01": entry()}, "'01'"),
        ({"-1": entry()}, "'-1'"),
        ({"0": entry()}, "'0'"),
        ({"1.5": entry()}, "'1.5'"),
        ({" 1": entry()}, "' 1'"),
        ({"1": [1, 2]}, "value must be an object"),
        ({"1": {k: v for k, v in entry().items() if k != "GROUP_SIZE_M"}}, "missing field GROUP_SIZE_M"),
        ({"1": {k: v for k, v in entry().items() if k != "BLOCK_SIZE_K"}}, "missing field BLOCK_SIZE_K"),
        ({"1": entry(w=6)}, "num_warps must be a power of two"),
        ({"1": entry(num_ctas=0)}, "num_ctas"),
        ({"1": entry(num_ctas=1.0)}, "num_ctas"),
        ({"1": entry(m=16.0)}, "BLOCK_SIZE_M"),
        ({"1": entry(m=True)}, "BLOCK_SIZE_M"),
        ({"1": entry(m="16")}, "BLOCK_SIZE_M"),
        ({"1": entry(n=48)}, "power of two"),
        ({"1": entry(w=0)}, "num_warps"),
        ({"1": entry(g=-1)}, "GROUP_SIZE_M"),
        ({"1": entry(s=-1)}, "num_stages"),
        ({"1": entry(USE_TMA=1)}, "USE_TMA"),
        ({"1": entry(kpack=True)}, "kpack"),
        ({"1": entry(SPLIT_K=1)}, "unknown field 'SPLIT_K'"),
        ({"99999999999": entry()}, "larger"),
    ],
)
def test_invalid_configs_name_source_and_key(obj, words):
    with pytest.raises(PayloadError) as ei:
        validate_config(obj, "up.json")
    assert ei.value.kind == "bad_input"
    assert ei.value.msg.startswith("up.json: ")
    assert words in ei.value.msg


def test_launch_options_optional_when_reading_required_when_writing():
    """SGLang hands each entry to the kernel launch as keywords: num_warps/num_stages are Triton
    launch options with defaults (SGLang 0.5.23 ships 36 entries without them) and num_ctas is
    one too (shipped in triton_3_1_0/E=8,N=3584,device_name=NVIDIA_L40S.json). What orch writes
    is complete."""
    bare = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    out = validate_config({"256": bare, "1": entry(num_ctas=1)}, "x")
    assert out == {"1": entry(num_ctas=1), "256": bare}
    with pytest.raises(PayloadError, match="x: key '256': missing field num_warps"):
        validate_config({"256": bare}, "x", complete=True)
    with pytest.raises(PayloadError, match="missing field num_stages"):
        dumps_config({"1": dict(bare, num_warps=4)})
    assert json.loads(dumps_config({"1": entry(num_ctas=2)}))["1"]["num_ctas"] == 2


def test_amd_fields_accepted():
    out = validate_config({"1": entry(s=0, waves_per_eu=0, matrix_instr_nonkdim=16, kpack=2)}, "x")
    assert out["1"]["matrix_instr_nonkdim"] == 16


def test_dumps_sorted_numeric_indent4_newline_roundtrip(tmp_path):
    cfg = {10: entry(m=64), 2: entry(), "1": entry(USE_TMA=False)}
    text = dumps_config(cfg)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert list(json.loads(text)) == ["1", "2", "10"]
    assert '\n    "1": {\n        "BLOCK_SIZE_M": 16,' in text
    p = tmp_path / "c.json"
    p.write_text(text)
    assert load_config_file(p) == validate_config(json.loads(text), "again")
    with pytest.raises(PayloadError):
        dumps_config({"x": entry()})


def test_load_errors(tmp_path):
    with pytest.raises(PayloadError) as ei:
        load_config_file(tmp_path / "missing.json")
    assert ei.value.kind == "not_found" and "missing.json" in ei.value.msg
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"1": entry()}) + " " * 200)
    with pytest.raises(PayloadError, match="more than 100"):
        load_config_file(big, max_bytes=100)
    dup = tmp_path / "dup.json"
    dup.write_text('{"1": %s, "1": %s}' % (json.dumps(entry()), json.dumps(entry(m=32))))
    with pytest.raises(PayloadError, match="duplicate key '1'"):
        load_config_file(dup)
    nan = tmp_path / "nan.json"
    nan.write_text('{"1": {"BLOCK_SIZE_M": NaN}}')
    with pytest.raises(PayloadError, match="NaN"):
        load_config_file(nan)
    with pytest.raises(PayloadError, match="not a regular file"):
        load_config_file(tmp_path)
    with pytest.raises(PayloadError, match="invalid JSON"):
        loads_config(b"{", "src")


def test_down_must_share_block_size_m():
    up = {"1": entry(m=16), "64": entry(m=64)}
    assert check_down_matches_up(up, {"1": entry(m=16, n=128, USE_TMA=True), "64": entry(m=64, k=128)}) is None
    with pytest.raises(PayloadError) as ei:
        check_down_matches_up(up, {"1": entry(m=16), "64": entry(m=32)})
    assert "M=64" in ei.value.msg and ei.value.kind == "bad_input"
    with pytest.raises(PayloadError, match="batch sizes differ"):
        check_down_matches_up(up, {"1": entry(m=16)})


def test_shipped_reference_config_validates():
    files = sorted(REFERENCE.glob("*.json"))
    assert files
    for f in files:
        cfg = load_config_file(f)
        assert all(k.isdigit() for k in cfg)


def test_extra_fields_are_validated_and_kept():
    """An engine's own entry fields (vLLM's SPLIT_K) pass only when named, as non-negative ints, and
    dumps_config writes them after the shared fields."""
    from remote.engines.triton_moe.configfile import dumps_config, loads_config, validate_config
    from remote.protocol import PayloadError

    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3, "SPLIT_K": 1}
    with pytest.raises(PayloadError, match="unknown field 'SPLIT_K'"):
        validate_config({"1": entry}, "x")
    assert validate_config({"1": entry}, "x", extra_fields=("SPLIT_K",))["1"]["SPLIT_K"] == 1
    with pytest.raises(PayloadError, match="SPLIT_K must be a non-negative int"):
        validate_config({"1": dict(entry, SPLIT_K=-1)}, "x", extra_fields=("SPLIT_K",))
    text = dumps_config({"1": entry}, extra_fields=("SPLIT_K",))
    assert list(json.loads(text)["1"])[-1] == "SPLIT_K"
    assert loads_config(text, "x", extra_fields=("SPLIT_K",)) == {"1": entry}
