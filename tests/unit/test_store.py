"""The controller's config store and `orch configs` (no hosts needed)."""

import json

import pytest

from orchestrator.cli import main
from orchestrator.facts.probe import ProbeFacts
from orchestrator.store import KEY_FIELDS, ConfigStore, StoreError, key_hash
from orchestrator.store import tuning_key as _tuning_key
from tests.waiting import run_watched

CFG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}}
PROBE = {"device_name": "NVIDIA_H200", "triton_version": "3.6.0", "sglang": {"installed": True, "version": "0.5.23"},
         "model": {"E": 128, "N": 768, "hidden": 2048, "topk": 8, "dtype_selector": None, "block_shape": None},
         "tuner_provider": {"auto": "sglang", "reason": None}}


def tuning_key(probe: dict, *args):
    """The store's key of a probe given as (partial) JSON, as the probe task types it."""
    return _tuning_key(ProbeFacts.from_dict(probe), *args)


def test_key_separates_what_changes_the_files():
    k = tuning_key(PROBE, "fast", [4, 1], "auto")
    assert k["provider"] == "sglang" and k["batch_sizes"] == [1, 4] and set(k) == set(KEY_FIELDS)
    other = dict(PROBE, triton_version="3.5.1")
    assert key_hash(tuning_key(other, "fast", [1, 4], "auto")) != key_hash(k)
    no_sglang = dict(PROBE, sglang={"installed": False},
                     tuner_provider={"auto": "builtin", "reason": "sglang is not installed for this interpreter"})
    assert tuning_key(no_sglang, "fast", None, "auto")["provider"] == "builtin"


def test_auto_provider_is_the_probes_answer_not_a_guess():
    # SGLang installed, but without the fused-MoE entry the sglang provider drives (SGLang 0.5.23):
    # the payload tunes with its builtin kernel, so the key must say builtin
    no_entry = dict(PROBE, tuner_provider={"auto": "builtin", "reason": "this SGLang has no ..."})
    assert no_entry["sglang"]["installed"] is True
    assert tuning_key(no_entry, "fast", None, "auto")["provider"] == "builtin"
    assert tuning_key(no_entry, "fast", None, "sglang")["provider"] == "sglang"  # an explicit name is kept
    assert key_hash(tuning_key(no_entry, "fast", [1], "auto")) != key_hash(tuning_key(PROBE, "fast", [1], "auto"))
    unanswered = {k: v for k, v in PROBE.items() if k != "tuner_provider"}
    with pytest.raises(StoreError, match="tuner_provider"):
        tuning_key(unanswered, "fast", None, "auto")
    assert tuning_key(unanswered, "fast", None, "builtin")["provider"] == "builtin"


def test_put_get_export_import_round_trip(tmp_path, capsys):
    src = tmp_path / "tuned"
    src.mkdir()
    up = src / "E=128,N=768,device_name=NVIDIA_H200.json"
    down = src / "E=128,N=768,device_name=NVIDIA_H200_down.json"
    up.write_text(json.dumps(CFG))
    down.write_text(json.dumps(CFG))
    key = tuning_key(PROBE, "fast", [1], "builtin")
    store = ConfigStore(tmp_path / "state")
    e = store.put(key, {"up": up, "down": down}, None, {"host": "gpu-a", "run_id": "r1"})
    assert store.get(key).hash == e.hash and e.files["up"].read_text() == up.read_text()
    assert main(["configs", "list", "--json", "--state-dir", str(tmp_path / "state")]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [x["hash"] for x in listed] == [e.hash] and listed[0]["provenance"]["host"] == "gpu-a"
    out = tmp_path / "exported"
    assert main(["configs", "export", e.hash[:6], "--out", str(out), "--state-dir", str(tmp_path / "state")]) == 0
    assert (out / up.name).read_bytes() == up.read_bytes() and (out / "key.json").exists()
    # import into another controller's store: same key, same bytes
    other = tmp_path / "state2"
    assert main(["configs", "import", str(out), "--state-dir", str(other)]) == 0
    got = ConfigStore(other).get(key)
    assert got is not None and got.files["down"].read_bytes() == down.read_bytes()


def test_import_refuses_invalid_configs(tmp_path, capsys):
    src = tmp_path / "bad"
    src.mkdir()
    (src / "E=8,N=64,device_name=X.json").write_text(json.dumps({"triton_version": "3.6.0", **CFG}))
    (src / "key.json").write_text(json.dumps(tuning_key(PROBE, "fast", [1], "builtin")))
    assert main(["configs", "import", str(src), "--state-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "E=8,N=64,device_name=X.json" in err and "triton_version" in err
    assert ConfigStore(tmp_path / "s").list() == []
    with pytest.raises(StoreError):
        ConfigStore(tmp_path / "s").find("abc")


def _column(text: str, header: str) -> list[str]:
    """The cells of column ``header`` of a rich table printed as ``text``, the lines of each
    body row joined (a folded cell continues on the next lines)."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if header in ln and "┃" in ln)
    idx = [c.strip() for c in lines[head].split("┃")].index(header)
    cells, cur = [], ""
    for ln in lines[head + 2:]:
        if ln.startswith(("├", "└")):
            cells.append(cur)
            cur = ""
            continue
        if "│" in ln:
            cur += ln.split("│")[idx].strip()
    return cells


def test_configs_list_at_80_columns_keeps_the_hash_device_and_time_whole(tmp_path):
    """On an 80-column terminal (and without one: rich then takes COLUMNS or 80), `orch configs
    list` shows each entry's hash, its long device name and its timestamp each whole on one line
    (one block per entry: the table does not fit), cut nowhere and never folded over lines; at
    200 columns it is a table whose cells are whole. Into a pipe no line ends in spaces."""
    import os
    import sys

    from tests.paths import REPO

    rtx = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    src = tmp_path / "tuned"
    src.mkdir()
    up = src / f"E=128,N=768,device_name={rtx}.json"
    up.write_text(json.dumps(CFG))
    e = ConfigStore(tmp_path / "state").put(tuning_key(dict(PROBE, device_name=rtx), "fast", [1], "builtin"),
                                            {"up": up}, None, {"host": "gpu-with-a-long-name-07", "run_id": "r1"})
    stored = e.provenance["stored"]

    def listed(columns: str) -> str:
        proc = run_watched([sys.executable, "-m", "orchestrator", "configs", "list", "--state-dir",
                            str(tmp_path / "state")], cwd=REPO, env=dict(os.environ, COLUMNS=columns))
        assert proc.returncode == 0, proc.stderr
        assert all(len(ln) <= int(columns) and ln == ln.rstrip() for ln in proc.stdout.splitlines()), proc.stdout
        assert "…" not in proc.stdout
        return proc.stdout

    narrow = listed("80").splitlines()
    assert e.hash in narrow
    for label, value in (("device", rtx), ("stored", stored), ("tuned on", "gpu-with-a-long-name-07")):
        assert any(ln.split() == [*label.split(), value] for ln in narrow), (label, narrow)
    wide = listed("200")
    assert _column(wide, "hash") == [e.hash] and _column(wide, "device") == [rtx]
    assert _column(wide, "stored") == [stored]
    assert any(e.hash in ln and rtx in ln and stored in ln for ln in wide.splitlines())


def test_an_imported_export_keeps_where_it_was_tuned(tmp_path, capsys):
    """`orch configs export` then `orch configs import` elsewhere: the entry still names the host
    and run that tuned it (not ``None``), when it was tuned, and where it was imported from; the
    tune that reuses it says so and shows the kernel speedup measured there."""
    from orchestrator.store import measured_on, provenance_text

    src = tmp_path / "tuned"
    src.mkdir()
    up = src / "E=128,N=768,device_name=NVIDIA_H200.json"
    up.write_text(json.dumps(CFG))
    (src / "report.json").write_text(json.dumps({"batch_sizes": {"1": {"speedup_vs_default": 1.5}}}))
    key = tuning_key(PROBE, "fast", [1], "builtin")
    e = ConfigStore(tmp_path / "a").put(key, {"up": up}, src / "report.json",
                                        {"host": "gpu-a", "run_id": "20261203T224228Z-tune-c7eac4"})
    out = tmp_path / "exported"
    assert main(["configs", "export", e.hash, "--out", str(out), "--state-dir", str(tmp_path / "a")]) == 0
    assert main(["configs", "import", str(out), "--state-dir", str(tmp_path / "b")]) == 0
    got = ConfigStore(tmp_path / "b").get(key)
    prov = got.provenance
    assert prov["host"] == "gpu-a" and prov["run_id"] == "20261203T224228Z-tune-c7eac4"
    assert prov["tuned_at"] == e.provenance["stored"] and prov["imported_from"] == str(out)
    text = provenance_text(prov)
    assert "None" not in text
    assert text.startswith(f"tuned on gpu-a at {e.provenance['stored']}, run 20261203T224228Z-tune-c7eac4")
    assert f"imported from {out} at " in text
    assert measured_on(prov) == "gpu-a (run 20261203T224228Z-tune-c7eac4)" and got.report is not None
    # files with no record of their tuner: said, not "None"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / up.name).write_text(up.read_text())
    (bare / "key.json").write_text(json.dumps(key))
    assert main(["configs", "import", str(bare), "--state-dir", str(tmp_path / "c")]) == 0
    prov = ConfigStore(tmp_path / "c").get(key).provenance
    assert "None" not in provenance_text(prov) and "a host the import does not name" in provenance_text(prov)
    assert measured_on(prov) == f"the imported files' tuner ({bare})"
    capsys.readouterr()


def test_a_tune_reusing_an_imported_entry_names_its_tuner_and_keeps_its_speedup(tmp_path, capsys):
    """The `config_source` task on a store whose entry came from `orch configs import` of an
    export: its message names the host and run that tuned the files (never "tuned on None ... run
    None"), and the host's summary carries the speedup measured there, named."""
    from orchestrator.tasks import TASKS
    from tests.fakes import make_ctx

    src = tmp_path / "tuned"
    src.mkdir()
    up = src / "E=128,N=768,device_name=NVIDIA_H200.json"
    up.write_text(json.dumps(CFG))
    (src / "report.json").write_text(json.dumps({"batch_sizes": {"1": {"speedup_vs_default": 1.5},
                                                                 "4": {"speedup_vs_default": 2.0}}}))
    key = tuning_key(PROBE, "fast", [1], "builtin")
    e = ConfigStore(tmp_path / "a").put(key, {"up": up}, src / "report.json", {"host": "gpu-a", "run_id": "r1"})
    out = tmp_path / "exported"
    assert main(["configs", "export", e.hash, "--out", str(out), "--state-dir", str(tmp_path / "a")]) == 0
    assert main(["configs", "import", str(out), "--state-dir", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    probe = dict(PROBE, install_dir="/opt/sg/configs/triton_3_6_0", file_names={"up": up.name})
    ctx = make_ctx(tmp_path, {"orch_probe": probe}, state_dir=tmp_path / "b")
    res = TASKS["config_source"].fn(ctx, space="fast", batch_sizes=[1], provider="builtin")
    assert res.status == "ok" and "None" not in res.msg, res.msg
    assert res.msg.startswith(f"reusing stored result {e.hash} (tuned on gpu-a at {e.provenance['stored']}, run r1; "
                              f"imported from {out} at "), res.msg
    summary = ctx.run.summary
    assert summary.speedup_measured_on == "gpu-a (run r1)"
    assert summary.speedup_vs_default == {"1": 1.5, "4": 2.0}


def test_an_entry_of_a_store_before_engines_were_named_is_found(tmp_path, capsys):
    """A store written before orch named engines keyed its entries by ``sglang_version`` and no
    ``engine`` (issue 28): today's key of the same host finds that entry, read in today's names,
    and an export of it imports under today's key."""
    import hashlib

    src = tmp_path / "tuned"
    src.mkdir()
    up = src / "E=128,N=768,device_name=NVIDIA_H200.json"
    up.write_text(json.dumps(CFG))
    key = tuning_key(PROBE, "fast", [1], "builtin")
    assert key["engine"] == "sglang" and key["engine_version"] == "0.5.23"
    old = {("sglang_version" if k == "engine_version" else k): v for k, v in key.items() if k != "engine"}
    folder = tmp_path / "state" / "store" / hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    folder.mkdir(parents=True)
    (folder / up.name).write_text(up.read_text())
    (folder / "key.json").write_text(json.dumps(old))
    (folder / "provenance.json").write_text(json.dumps({"files": {"up": up.name}, "host": "gpu-old"}))
    store = ConfigStore(tmp_path / "state")
    found = store.get(key)
    assert found is not None and found.dir == folder and found.key == key
    assert store.get(dict(key, engine="vllm")) is None  # another engine's key is not an old SGLang one
    out = tmp_path / "exported"
    assert main(["configs", "export", found.hash[:6], "--out", str(out), "--state-dir", str(tmp_path / "state")]) == 0
    (out / "key.json").write_text(json.dumps(old))  # an export written by the older store
    other = tmp_path / "state2"
    assert main(["configs", "import", str(out), "--state-dir", str(other)]) == 0
    assert ConfigStore(other).get(key) is not None


def test_a_vllm_wna16_file_keeps_split_k_in_the_store(tmp_path):
    """vLLM's WNA16 files carry SPLIT_K (Engine.config_extra_fields): the store takes them under a vLLM
    key and refuses the field under an SGLang key, whose launch would fail on it."""
    up = tmp_path / "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    up.write_text(json.dumps({"1": dict(CFG["1"], SPLIT_K=1)}))
    sglang_key = tuning_key(PROBE, "fast", [1], "builtin")
    with pytest.raises(StoreError, match="SPLIT_K"):
        ConfigStore(tmp_path / "state").put(sglang_key, {"up": up}, None, {"host": "gpu-a", "run_id": "r1"})
    vllm_key = dict(sglang_key, engine="vllm", provider="vllm")
    e = ConfigStore(tmp_path / "state").put(vllm_key, {"up": up}, None, {"host": "gpu-a", "run_id": "r1"})
    assert json.loads(e.files["up"].read_text())["1"]["SPLIT_K"] == 1
