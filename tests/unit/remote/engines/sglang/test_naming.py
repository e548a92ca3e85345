"""remote.engines.sglang.naming: SGLang 0.5.23 file-name and Triton-folder rules."""

from __future__ import annotations

import pytest

from remote.protocol import BadInput
from remote.engines.sglang.naming import (
    config_file_name,
    parse_triton_folder,
    sglang_device_name,
    sglang_version_dir,
    sort_triton_folders,
    torch_form_hint,
    triton_folder,
    unparsable_triton_folders,
)


@pytest.mark.parametrize(
    "torch_name, expected",
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200_NVL"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("Tesla V100 (PCIe)", "Tesla_V100_(PCIe)"),
        ("NVIDIA_H200", "NVIDIA_H200"),  # already in SGLang form: unchanged
    ],
)
def test_device_name_only_spaces_change(torch_name, expected):
    assert sglang_device_name(torch_name) == expected


@pytest.mark.parametrize(
    "hostile",
    ["", "   ", ".", "..", "../etc", "a/b", "/etc/passwd", "a\\b", "x\x00y", "NVIDIA\nH200", "tab\there",
     "NVIDIA..H200", "cr\rlf", 42, None],
)
def test_hostile_device_names_refused(hostile):
    with pytest.raises(ValueError):
        sglang_device_name(hostile)
    with pytest.raises(BadInput):  # the payload reports it as bad_input, the controller as bad input
        sglang_device_name(hostile)


@pytest.mark.parametrize("name, hint", [
    ("NVIDIA H200", None), ("NVIDIA_H200", None), ("AMD Instinct MI300X", None), ("Tesla T4", None),
    ("Intel(R) Arc(TM) Pro B60 Graphics", None), ("NVIDIA", None),
    ("H200", "NVIDIA H200"), ("H100_80GB_HBM3", "NVIDIA H100 80GB HBM3"), ("nvidia h200", "NVIDIA h200"),
    ("MI300X", "AMD Instinct MI300X"), ("NVIDIAH200", "NVIDIA NVIDIAH200"), ("tesla t4", "Tesla t4"),
])
def test_torch_form_hint(name, hint):
    assert torch_form_hint(name) == hint


def test_config_file_name_plain_and_down():
    assert config_file_name(128, 768, "NVIDIA_H200") == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert config_file_name(128, 768, "NVIDIA_H200", down=True) == "E=128,N=768,device_name=NVIDIA_H200_down.json"


def test_config_file_name_all_selectors_in_order():
    assert (
        config_file_name(257, 256, "NVIDIA_H200", "fp8_w8a8", [128, 128], down=True)
        == "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"
    )
    assert (
        config_file_name(161, 192, "NVIDIA_H200", "fp8_w8a8", None, per_channel_quant=True)
        == "E=161,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json"
    )
    assert (
        config_file_name(8, 14336, "NVIDIA_H200", "float32")
        == "E=8,N=14336,device_name=NVIDIA_H200,dtype=float32.json"
    )
    assert (
        config_file_name(64, 1024, "NVIDIA_H200", "int8_w8a8", [64, 128], per_channel_quant=True, down=True)
        == "E=64,N=1024,device_name=NVIDIA_H200,dtype=int8_w8a8,block_shape=[64, 128],per_channel_quant=True_down.json"
    )


@pytest.mark.parametrize("block", [[0, 0], [0, 128], [128, 0], []])
def test_block_shape_with_zero_is_omitted(block):
    # SGLang passes [block_n, block_k] = [0, 0] for unquantized models; "not all(block)" drops it
    assert config_file_name(128, 768, "NVIDIA_H200", "int4_w4a16", block) == (
        "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    )


def test_tuple_block_shape_written_as_list():
    assert config_file_name(1, 1, "D", "fp8_w8a8", (128, 128)) == "E=1,N=1,device_name=D,dtype=fp8_w8a8,block_shape=[128, 128].json"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(E=0, N=1, device_name="D"),
        dict(E=1, N=-1, device_name="D"),
        dict(E=True, N=1, device_name="D"),
        dict(E=1.0, N=1, device_name="D"),
        dict(E=1, N=1, device_name="NVIDIA H200"),  # not converted
        dict(E=1, N=1, device_name="../x"),
        dict(E=1, N=1, device_name="D", dtype="bf16"),
        dict(E=1, N=1, device_name="D", dtype="fp8"),
        dict(E=1, N=1, device_name="D", block_shape=[-1, 128]),
    ],
)
def test_config_file_name_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        config_file_name(**kwargs)


@pytest.mark.parametrize(
    "version, folder",
    [
        ("3.6.0", "triton_3_6_0"),
        ("3.10.1", "triton_3_10_1"),
        ("3.6.0+cu130", "triton_3_6_0"),
        ("3.6.0+git1a2b3c4d", "triton_3_6_0"),
        ("3.5.0.dev20250101", "triton_3_5_0"),
        ("3.6.0rc1", "triton_3_6_0"),
        ("3.6.0.post1", "triton_3_6_0"),
    ],
)
def test_triton_folder(version, folder):
    assert triton_folder(version) == folder


def test_sglang_version_dir_is_verbatim():
    assert sglang_version_dir("3.6.0") == "triton_3_6_0"
    assert sglang_version_dir("3.6.0+git1a2b") == "triton_3_6_0+git1a2b"


@pytest.mark.parametrize("bad", ["", "abc", "v3.6.0", "+3.6"])
def test_triton_folder_rejects_non_versions(bad):
    with pytest.raises(ValueError):
        triton_folder(bad)


def test_parse_triton_folder():
    assert parse_triton_folder("triton_3_6_0") == (3, 6, 0)
    assert parse_triton_folder("triton_3_10_0") == (3, 10, 0)
    assert parse_triton_folder("triton_3_6") == (3, 6)  # SGLang's int() parse accepts it
    for bad in ("triton_", "triton_3__6", "triton_3_6_0+git", "triton_latest", "triton_3_6_0 ", "configs", "README.md"):
        assert parse_triton_folder(bad) is None, bad


def test_sort_newest_first_numeric_not_lexicographic():
    names = ["triton_3_1_0", "README.md", "triton_3_10_0", "triton_3_9_0", "triton_2_0_0", "triton_3_6_0+git", "triton_3_2_0"]
    assert sort_triton_folders(names) == ["triton_3_10_0", "triton_3_9_0", "triton_3_2_0", "triton_3_1_0", "triton_2_0_0"]
    assert unparsable_triton_folders(names) == ["triton_3_6_0+git"]
    assert unparsable_triton_folders(["triton_3_1_0"]) == []


@pytest.mark.parametrize("dtype", [None, "fp8_w8a8", "int8_w8a8", "int4_w4a16", "int8_w8a16", "float32"])
@pytest.mark.parametrize("block", [None, [128, 128], [0, 128]])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("down", [False, True])
def test_parse_config_file_name_inverts_the_name(dtype, block, per_channel, down):
    from remote.engines.sglang.naming import config_file_name, parse_config_file_name

    for device in ("NVIDIA_H200", "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition", "NVIDIA_A100-SXM4-80GB"):
        name = config_file_name(257, 256, device, dtype, block, per_channel, down)
        got = parse_config_file_name(name)
        assert got == {"E": 257, "N": 256, "device_name": device, "dtype": dtype,
                       "block_shape": block if block and all(block) else None,
                       "per_channel_quant": per_channel, "down": down}, name


def test_parse_config_file_name_refuses_what_sglang_cannot_name():
    from remote.engines.sglang.naming import parse_config_file_name

    for bad in ("E=8,N=64.json", "E=0,N=64,device_name=X.json", "E=8,N=64,device_name=X,dtype=bf16.json",
                "E=8,N=64,device_name=X,block_shape=[128,128].json", "notes.txt", "E=8,N=64,device_name=a b.json"):
        assert parse_config_file_name(bad) is None, bad
