"""The payload's ``runner_change`` (the runner trial's drop-in, the daemon-reload check, FlashInfer's
autotune cache) and the ``restore`` of a runner change: byte-exact round trips on local folders."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from remote.host import restore as rest
from remote.host import runner_change as rc
from remote.host import runs as runs_mod
from remote.protocol import PayloadError

TEXT_A = "[Service]\nExecStart=\nExecStart=/usr/bin/python -m sglang.launch_server --moe-runner-backend cutlass\n"
TEXT_B = TEXT_A.replace("cutlass", "flashinfer_cutlass")


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def dirs(tmp_path):
    systemd, state = tmp_path / "systemd", tmp_path / "state"
    systemd.mkdir()
    state.mkdir()
    return systemd, str(state)


def test_new_dropin_then_candidates_then_restore_removes_it_and_its_folder(dirs):
    systemd, state = dirs
    folder = rc.dropin_dir("sglang-qwen", str(systemd))
    assert folder.endswith("/sglang-qwen.service.d")
    before = tree(systemd)
    m = rc.set_dropin(state, "r1", folder, TEXT_A.encode())
    assert m["action"] == "runner" and m["files"][0]["action"] == "created"
    m = rc.set_dropin(state, "r1", folder, TEXT_B.encode())  # the next candidate
    assert (Path(folder) / rc.DROPIN_NAME).read_text() == TEXT_B
    assert m["files"][0]["sha256_after"] == hashlib.sha256(TEXT_B.encode()).hexdigest()
    listed = runs_mod.list_runs(state)["runs"]
    assert listed[0]["action"] == "runner" and listed[0]["dest_dir"] == folder and listed[0]["changed"]
    rest.restore(state, "r1")
    assert tree(systemd) == before  # the drop-in and the folder the run made are gone


def test_existing_dropin_is_put_back_to_its_bytes_also_as_a_rollback_run(dirs):
    systemd, state = dirs
    folder = Path(rc.dropin_dir("sglang-qwen.service", str(systemd)))
    folder.mkdir()
    (folder / rc.DROPIN_NAME).write_bytes(b"[Service]\n# the operator's own bytes\r\n")
    (folder / "other.conf").write_text("[Service]\nNice=5\n")
    os.chmod(folder / rc.DROPIN_NAME, 0o640)
    before = tree(systemd)
    rc.set_dropin(state, "r1", str(folder), TEXT_A.encode())
    rc.set_dropin(state, "r1", str(folder), None)  # a candidate step may remove it too
    rc.set_dropin(state, "r1", str(folder), TEXT_B.encode())
    done = rest.restore(state, "r1", as_run_id="r2")  # orch rollback
    assert tree(systemd) == before and oct(os.stat(folder / rc.DROPIN_NAME).st_mode & 0o777) == "0o640"
    assert {f["action"] for f in done["files"]} == {"restored"}
    rest.restore(state, "r2")  # the rollback rolled back: the trial's runner again
    assert (folder / rc.DROPIN_NAME).read_text() == TEXT_B


def test_one_runner_change_per_run(dirs):
    systemd, state = dirs
    rc.set_dropin(state, "r1", rc.dropin_dir("a", str(systemd)), TEXT_A.encode())
    with pytest.raises(PayloadError, match="one runner change per run"):
        rc.set_dropin(state, "r1", rc.dropin_dir("b", str(systemd)), TEXT_A.encode())


def test_removing_an_absent_dropin_changes_nothing(dirs):
    systemd, state = dirs
    got = rc.set_dropin(state, "r1", rc.dropin_dir("a", str(systemd)), None)
    assert got["status"] == "unchanged" and tree(systemd) == {}


def test_locked_by_another_run(dirs):
    systemd, state = dirs
    Path(state, "lock.json").write_text(json.dumps({"run_id": "other", "controller": "c"}))
    with pytest.raises(PayloadError) as exc:
        rc.set_dropin(state, "r1", rc.dropin_dir("a", str(systemd)), TEXT_A.encode())
    assert exc.value.kind == "locked"


def test_autotune_cache_restored_to_its_bytes_never_deleted(tmp_path):
    state = str(tmp_path / "state")
    cache = tmp_path / "cache" / "flashinfer" / "autotune"
    one = cache / "0.6.0" / "sm90" / "abc" / "rank_tp0_pp0_dp0.json"
    one.parent.mkdir(parents=True)
    one.write_text('{"t": 1}')
    got = rc.cache_backup(state, "r1", str(cache))
    assert got["files"] == [{"path": "0.6.0/sm90/abc/rank_tp0_pp0_dp0.json",
                             "sha256": hashlib.sha256(b'{"t": 1}').hexdigest()}]
    assert rc.cache_backup(state, "r1", str(cache))["kept_earlier"]  # the first backup stays
    one.write_text('{"t": 2}')
    new = one.parent / "rank_tp1_pp0_dp0.json"
    new.write_text("{}")
    out = rc.cache_restore(state, "r1", str(cache))
    assert one.read_text() == '{"t": 1}' and new.exists()
    assert out["files"][0]["action"] == "restored" and out["kept_new"] == [str(new)]
    one.unlink()  # a missing file comes back too
    assert rc.cache_restore(state, "r1", str(cache))["files"][0]["action"] == "restored" and one.exists()
    assert rc.cache_restore(state, "r1", str(cache))["files"][0]["action"] == "unchanged"


def test_exact_cache_restore_removes_the_runs_new_files_and_their_folders(tmp_path):
    """``--exact`` (orch recover): the folder as backed up, a new hash folder and file removed."""
    state = str(tmp_path / "state")
    cache = tmp_path / "cache" / "flashinfer" / "autotune"
    one = cache / "0.6.0" / "sm90" / "abc" / "rank_tp0_pp0_dp0.json"
    one.parent.mkdir(parents=True)
    one.write_text('{"t": 1}')
    rc.cache_backup(state, "r1", str(cache))
    one.write_text('{"t": 2}')
    beside = one.parent / "rank_tp1_pp0_dp0.json"
    beside.write_text("{}")
    made = cache / "0.6.0" / "sm90" / "def" / "rank_tp0_pp0_dp0.json"
    made.parent.mkdir()
    made.write_text("{}")
    out = rc.cache_restore(state, "r1", str(cache), exact=True)
    assert one.read_text() == '{"t": 1}' and not beside.exists() and not made.parent.exists()
    assert (cache / "0.6.0" / "sm90").is_dir() and out["kept_new"] == []
    assert sorted((f["path"], f["action"]) for f in out["files"]) == sorted(
        [(str(one), "restored"), (str(beside), "removed"), (str(made), "removed")])
    assert rc.cache_restore(state, "r1", str(cache), exact=True)["files"] == [
        {"path": str(one), "action": "unchanged"}]


def test_cache_restore_without_backup_and_of_another_folder(tmp_path):
    state = str(tmp_path / "state")
    assert rc.cache_restore(state, "r9", str(tmp_path / "c"))["files"] == []
    rc.cache_backup(state, "r1", str(tmp_path / "c"))  # an absent cache: an empty backup
    with pytest.raises(PayloadError, match="backed up"):
        rc.cache_restore(state, "r1", str(tmp_path / "d"))


def test_reload_check_on_this_machine():
    got = rc.reload_check()
    assert set(got) == {"toolkit", "gpu_containers", "risky"}
    assert got["risky"] == bool(got["toolkit"] and got["gpu_containers"])


def _proc(root: Path, pid: int, cgroup: str, dev: str, cmd: bytes) -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    os.symlink(dev, d / "fd" / "3")
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(cmd)


def test_reload_check_finds_gpu_containers_where_the_toolkit_is(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 10, "0::/system.slice/docker-abc.scope\n", "/dev/nvidia0", b"python\0serve.py")
    _proc(proc, 11, "0::/system.slice/sglang-qwen.service\n", "/dev/nvidia1", b"sglang")  # not a container
    _proc(proc, 12, "0::/kubepods/pod1/x\n", "/dev/null", b"sleep")  # a container without a GPU
    hook = tmp_path / "nvidia-container-runtime-hook"
    hook.write_text("")
    got = rc.reload_check((str(hook),), str(proc))
    assert got["risky"] and got["toolkit"] == [str(hook)]
    assert [c["pid"] for c in got["gpu_containers"]] == [10] and got["gpu_containers"][0]["cmdline"] == "python serve.py"
    assert not rc.reload_check((str(tmp_path / "absent"),), str(proc))["risky"]  # no toolkit: no risk


@pytest.mark.parametrize("existed", [False, True])
def test_as_before_leaves_a_record_of_no_change(dirs, existed):
    systemd, state = dirs
    folder = Path(rc.dropin_dir("u", str(systemd)))
    if existed:
        folder.mkdir()
        (folder / rc.DROPIN_NAME).write_text("[Service]\nNice=1\n")
    before = tree(systemd)
    rc.set_dropin(state, "r1", str(folder), TEXT_A.encode())
    rc.set_dropin(state, "r1", str(folder), TEXT_B.encode())
    rc.set_dropin_as_before(state, "r1", str(folder))
    assert tree(systemd) == before
    assert runs_mod.list_runs(state)["runs"][0]["changed"] == []  # nothing for orch rollback to undo
    m = json.loads((Path(state) / "runs" / "r1" / "manifest.json").read_text())
    assert [f["action"] for f in m["files"]] == ["unchanged" if existed else "absent"]
    assert rc.set_dropin_as_before(state, "r2", str(folder))["status"] == "unchanged"  # a run that wrote nothing


ENV_TEXT = b"# runner of the unit\nMODEL=/m\nMOE_RUNNER=triton\r\n# end\n"


def test_set_file_edits_the_units_own_file_and_restore_puts_it_back_byte_identical(dirs):
    """``set-file``: the unit's EnvironmentFile= (not a .json, not the drop-in) is changed through
    the backup/manifest machinery: its mode kept, restore (and a rollback run, and the rollback of
    that) byte-exact, the file never removed."""
    systemd, state = dirs
    etc = systemd.parent / "default"
    etc.mkdir()
    path = etc / "sglang-qwen"
    path.write_bytes(ENV_TEXT)
    os.chmod(path, 0o600)
    before = tree(etc)
    new = ENV_TEXT.replace(b"=triton", b"=flashinfer_cutlass")
    m = rc.set_dropin(state, "r1", str(etc), new, name="sglang-qwen")
    assert m["unit_file"] and m["files"][0]["action"] == "replaced"
    rc.set_dropin(state, "r1", str(etc), ENV_TEXT.replace(b"=triton", b"=cutlass"), name="sglang-qwen")
    rc.set_dropin(state, "r1", str(etc), new, name="sglang-qwen")
    assert path.read_bytes() == new and oct(os.stat(path).st_mode & 0o777) == "0o600"
    with pytest.raises(PayloadError, match="only be rewritten"):
        rc.set_dropin(state, "r1", str(etc), None, name="sglang-qwen")
    listed = runs_mod.list_runs(state)["runs"]
    assert listed[0]["unit_file"] and listed[0]["dest_dir"] == str(etc)
    done = rest.restore(state, "r1", as_run_id="r2")  # orch rollback
    assert tree(etc) == before and path.read_bytes() == ENV_TEXT
    assert {f["action"] for f in done["files"]} == {"restored"}
    rest.restore(state, "r2")  # the rollback rolled back
    assert path.read_bytes() == new


def test_set_file_as_before_records_no_change(dirs):
    systemd, state = dirs
    path = systemd / "q.yaml"
    path.write_bytes(b"moe-runner-backend: triton  # ours\n")
    before = tree(systemd)
    rc.set_dropin(state, "r1", str(systemd), b"moe-runner-backend: cutlass  # ours\n", name="q.yaml")
    m = rc.set_dropin_as_before(state, "r1", str(systemd), name="q.yaml")
    assert tree(systemd) == before and [f["action"] for f in m["files"]] == ["unchanged"]


def test_set_file_command_refuses_a_missing_or_relative_path(dirs, tmp_path):
    systemd, state = dirs
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"content": "X=1\n"}))
    import argparse
    for bad in ("relative/file", str(systemd / "missing"), str(systemd / ".." / "systemd" / "x")):
        args = argparse.Namespace(op="set-file", run_id="r1", state_dir=state, path=bad, request=str(req),
                                  as_before=False, remove=False, unit=None, cache_dir=None, exact=False,
                                  systemd_dir=str(systemd))
        with pytest.raises(PayloadError, match="existing regular file"):
            rc.run(args)


def test_the_config_folder_dropin_is_orchs_own_and_restore_removes_it(dirs):
    from remote.host.changes import check_name
    from remote.protocol import CONFIGS_DROPIN_NAME

    systemd, state = dirs
    folder = rc.dropin_dir("vllm-qwen", str(systemd))
    before = tree(systemd)
    text = '[Service]\nEnvironment="VLLM_TUNED_CONFIG_FOLDER=/var/lib/orch/configs-vllm-qwen.service"\n'
    m = rc.set_dropin(state, "r2", folder, text.encode(), name=CONFIGS_DROPIN_NAME)
    assert m["files"][0]["action"] == "created" and (Path(folder) / CONFIGS_DROPIN_NAME).read_text() == text
    assert check_name(CONFIGS_DROPIN_NAME) == CONFIGS_DROPIN_NAME
    with pytest.raises(PayloadError, match="must end in .json"):
        check_name("other.conf")
    rest.restore(state, "r2")
    assert tree(systemd) == before
