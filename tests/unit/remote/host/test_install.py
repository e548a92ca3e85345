"""install / restore / runs of the payload: byte-exact round trips, failures leave no trace.

Local only (no namespaces); the ENOSPC tests use an in-process fault and, when the test runs
as root and may mount, a tiny real tmpfs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from remote.host import changes
from remote.host import install as inst
from remote.host import restore as rest
from remote.host import runs as runs_mod
from remote.host.fs import TMP_MARK
from remote.protocol import PayloadError
from tests.paths import REPO
from tests.waiting import run_watched

ROOT = str(REPO)
UP = "E=128,N=768,device_name=NVIDIA_H200.json"
DOWN = "E=128,N=768,device_name=NVIDIA_H200_down.json"


def cfg_text(bm: int, pad: int = 0) -> str:
    """A valid SGLang config as JSON text (``pad`` extra spaces make it bigger, still valid)."""
    obj = {str(m): {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                    "num_warps": 4, "num_stages": 3} for m in (1, 64, 4096)}
    return json.dumps(obj, indent=4) + " " * pad + "\n"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def env(tmp_path):
    root = tmp_path / "sglang" / "configs"
    root.mkdir(parents=True)
    return {"root": root, "dest": root / "triton_3_6_0", "state": tmp_path / "state"}


def req(env, files, run_id="r1", **kw):
    r = {"run_id": run_id, "state_dir": str(env["state"]), "dest_dir": str(env["dest"]),
         "files": [{"name": n, "content": c} for n, c in files], "create_dest": True}
    r.update(kw)
    return r


def snapshot(folder) -> dict:
    """{name: bytes} of every entry in ``folder`` (None when it does not exist)."""
    if not os.path.isdir(folder):
        return None
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_replace_and_create_then_restore_byte_exact(env):
    dest = env["dest"]
    dest.mkdir()
    old_up = b'{"1": {"BLOCK_SIZE_M": 16}}  \n  odd bytes kept exactly \x00\xff'
    (dest / UP).write_bytes(old_up)
    os.chmod(dest / UP, 0o640)
    (dest / "unrelated.json").write_bytes(b"{}")
    new_up, new_down = cfg_text(64), cfg_text(32)

    m = inst.install(req(env, [(UP, new_up), (DOWN, new_down)]))

    assert (dest / UP).read_bytes() == new_up.encode()
    assert (dest / DOWN).read_bytes() == new_down.encode()
    assert mode(dest / UP) == 0o640 and mode(dest / DOWN) == 0o644
    assert m["status"] == "installed" and m["dest_existed_before"] and not m["dest_created"]
    by = {f["name"]: f for f in m["files"]}
    assert by[UP]["action"] == "replaced" and by[UP]["sha256_before"] == sha(old_up)
    assert by[UP]["sha256_after"] == sha(new_up.encode()) and by[UP]["backup"] == f"backup/{UP}"
    assert by[DOWN]["action"] == "created" and by[DOWN]["existed"] is False and by[DOWN]["backup"] is None
    rdir = env["state"] / "runs" / "r1"
    assert (rdir / "backup" / UP).read_bytes() == old_up
    assert json.loads((rdir / "manifest.json").read_text())["status"] == "installed"
    for d in (env["state"], env["state"] / "runs", rdir):
        assert mode(d) == 0o700
    assert not [n for n in os.listdir(dest) if TMP_MARK in n]

    r = rest.restore(str(env["state"]), "r1")
    assert {f["path"]: f["action"] for f in r["files"]} == {str(dest / UP): "restored", str(dest / DOWN): "deleted"}
    assert snapshot(dest) == {UP: old_up, "unrelated.json": b"{}"}
    assert mode(dest / UP) == 0o640
    st = json.loads((rdir / "state.json").read_text())
    assert st["restored_at"] and len(st["restores"]) == 1 and st["state"] == "restored"
    assert st["restores"][0]["changed"] == 2

    # idempotent
    r2 = rest.restore(str(env["state"]), "r1")
    assert all(f["action"] == "unchanged" for f in r2["files"])
    assert snapshot(dest) == {UP: old_up, "unrelated.json": b"{}"}


def test_missing_triton_folder_created_and_removed(env):
    dest = env["dest"]
    assert not dest.exists()
    m = inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(64))]))
    assert m["dest_created"] is True and m["dest_existed_before"] is False
    assert sorted(os.listdir(dest)) == sorted([UP, DOWN]) and mode(dest) == 0o755
    r = rest.restore(str(env["state"]), "r1")
    assert r["dest_removed"] is True and not dest.exists()
    assert sorted(os.listdir(env["root"])) == []


def test_restore_keeps_created_folder_when_someone_added_a_file(env):
    inst.install(req(env, [(UP, cfg_text(64))]))
    (env["dest"] / "other.json").write_text("{}")
    r = rest.restore(str(env["state"]), "r1")
    assert r["dest_removed"] is False and snapshot(env["dest"]) == {"other.json": b"{}"}


def test_missing_parent_is_not_found(env, tmp_path):
    bad = req(env, [(UP, cfg_text(64))], dest_dir=str(tmp_path / "nope" / "configs" / "triton_3_6_0"))
    with pytest.raises(PayloadError) as ei:
        inst.install(bad)
    assert ei.value.kind == "not_found"
    assert not (tmp_path / "nope").exists()


def test_identical_content_is_unchanged_and_reinstall_reattaches(env):
    env["dest"].mkdir()
    text = cfg_text(64)
    (env["dest"] / UP).write_text(text)
    m = inst.install(req(env, [(UP, text), (DOWN, cfg_text(16))]))
    acts = {f["name"]: f["action"] for f in m["files"]}
    assert acts == {UP: "unchanged", DOWN: "created"}
    again = inst.install(req(env, [(UP, text), (DOWN, cfg_text(16))]))
    assert again["reattached"] is True and again["created"] == m["created"]
    # same run id, different content: refused, nothing changes
    before = snapshot(env["dest"])
    with pytest.raises(PayloadError) as ei:
        inst.install(req(env, [(UP, cfg_text(128))]))
    assert ei.value.kind == "bad_input" and snapshot(env["dest"]) == before


@pytest.mark.parametrize("files", [
    [(UP, cfg_text(64)), (DOWN, '{"1": {"BLOCK_SIZE_M": 16,')],          # second file broken JSON
    [(UP, '{"triton_version": "3.6.0"}')],                                  # SGLang int(key) crash
    [(UP, cfg_text(64)), (UP, cfg_text(32))],                                # duplicate name
    [("../x.json", cfg_text(64))], [("a/b.json", cfg_text(64))], [("x.txt", cfg_text(64))],
    [("x\n.json", cfg_text(64))], [("x\x00.json", cfg_text(64))], [(".hidden.json", cfg_text(64))],
    [(UP, cfg_text(64, pad=4 * 1024 * 1024))],                              # over 4 MiB
    [(UP, '{"1": {"BLOCK_SIZE_M": 16}, "1": {}}')],                          # duplicate key
])
def test_invalid_input_refused_before_anything_changes(env, files):
    env["dest"].mkdir()
    (env["dest"] / UP).write_bytes(b"old")
    with pytest.raises(PayloadError) as ei:
        inst.install(req(env, files))
    assert ei.value.kind == "bad_input"
    assert snapshot(env["dest"]) == {UP: b"old"}
    assert not env["state"].exists()


@pytest.mark.parametrize("patch", [
    {"run_id": "../evil"}, {"run_id": "a b"}, {"action": "delete"}, {"dest_dir": "relative/triton_3_6_0"},
    {"files": []}, {"dest_dir": "/tmp/x/../triton_3_6_0"},
])
def test_bad_request_fields(env, patch):
    with pytest.raises(PayloadError) as ei:
        inst.install(dict(req(env, [(UP, cfg_text(64))]), **patch))
    assert ei.value.kind == "bad_input"
    assert not env["state"].exists()


def test_dest_must_be_a_triton_version_folder(env):
    r = req(env, [(UP, cfg_text(64))], dest_dir=str(env["root"] / "triton_3.6.0"))
    with pytest.raises(PayloadError, match="triton_<int>"):
        inst.install(r)


def _enospc_on(monkeypatch, dest, name, call="write"):
    """Make os.write (or os.replace) fail with ENOSPC for our temp file of ``name`` in ``dest``."""
    real_write, real_replace = os.write, os.replace
    prefix = f".{name}{TMP_MARK}"

    def fake_write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if os.path.dirname(target) == str(dest) and os.path.basename(target).startswith(prefix):
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real_write(fd, data)

    def fake_replace(src, dst, *a, **kw):
        if os.path.dirname(str(src)) == str(dest) and os.path.basename(str(src)).startswith(prefix):
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real_replace(src, dst, *a, **kw)

    if call == "write":
        monkeypatch.setattr(os, "write", fake_write)
    else:
        monkeypatch.setattr(os, "replace", fake_replace)


@pytest.mark.parametrize("call", ["write", "replace"])
def test_enospc_mid_install_rolls_back(env, monkeypatch, call):
    dest = env["dest"]
    dest.mkdir()
    (dest / UP).write_bytes(b"old up")
    (dest / DOWN).write_bytes(b"old down")
    before = snapshot(dest)
    # UP is written first and succeeds; DOWN fails: UP must be put back
    _enospc_on(monkeypatch, dest, DOWN, call)
    with pytest.raises(PayloadError) as ei:
        inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(32))]))
    monkeypatch.undo()
    assert ei.value.kind == "runtime" and "No space" in ei.value.msg
    assert snapshot(dest) == before                      # old files intact, no temp files
    m = json.loads((env["state"] / "runs" / "r1" / "manifest.json").read_text())
    assert m["status"] == "failed" and m["undo_problems"] == []
    # the failed run can be retried under the same id once space is back
    m2 = inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(32))]))
    assert m2["status"] == "installed" and (dest / DOWN).read_text() == cfg_text(32)


def test_enospc_new_folder_removed(env, monkeypatch):
    _enospc_on(monkeypatch, env["dest"], DOWN)
    with pytest.raises(PayloadError):
        inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(32))]))
    monkeypatch.undo()
    assert not env["dest"].exists()


@pytest.mark.parametrize("twice", [False, True])
def test_sigterm_mid_install_rolls_back(env, monkeypatch, twice):
    """SIGTERM after the first config: put back; a 2nd SIGTERM during the put-back is deferred."""
    env["dest"].mkdir()
    (env["dest"] / UP).write_bytes(b"old up")
    real = changes.atomic_write
    calls = []

    def atomic_then_term(path, data, **kw):
        real(path, data, **kw)
        calls.append(path)
        if path == str(env["dest"] / UP) and (twice or calls.count(path) == 1):
            os.kill(os.getpid(), signal.SIGTERM)      # arrives after UP, before DOWN is written

    monkeypatch.setattr(changes, "atomic_write", atomic_then_term)
    with pytest.raises(PayloadError, match="SIGTERM"):
        inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(32))]))
    monkeypatch.undo()
    assert calls.count(str(env["dest"] / UP)) == 2          # written, then put back
    assert not any(c.endswith(DOWN) for c in calls)
    assert snapshot(env["dest"]) == {UP: b"old up"}
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {cp.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_real_enospc_on_tiny_tmpfs(tiny_tmpfs, tmp_path):
    dest = tiny_tmpfs / "configs" / "triton_3_6_0"
    dest.mkdir(parents=True)
    (dest / UP).write_bytes(b"old up")
    before = snapshot(dest)
    env = {"dest": dest, "state": tmp_path / "state"}
    big = cfg_text(32, pad=200 * 1024)  # valid JSON, larger than the whole file system
    with pytest.raises(PayloadError) as ei:
        inst.install(req(env, [(UP, cfg_text(64)), (DOWN, big)]))
    assert ei.value.kind == "runtime" and "No space" in ei.value.msg
    assert snapshot(dest) == before


def test_rollback_as_new_run_and_undo_it(env):
    state = str(env["state"])
    inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(32))], run_id="tune1"))
    installed = snapshot(env["dest"])
    r = rest.restore(state, "tune1", as_run_id="rb1")
    assert r["as_run_id"] == "rb1" and r["dest_removed"] is True and not env["dest"].exists()
    assert {f["action"] for f in r["files"]} == {"deleted"}
    m = json.loads((env["state"] / "runs" / "rb1" / "manifest.json").read_text())
    assert m["action"] == "rollback" and m["restores"] == "tune1"
    assert all(f["existed"] and f["sha256_after"] is None for f in m["files"])
    # undo the rollback: the tuned files come back byte-exact
    r2 = rest.restore(state, "rb1")
    assert snapshot(env["dest"]) == installed
    assert {f["action"] for f in r2["files"]} == {"restored"}
    listed = runs_mod.list_runs(state)["runs"]
    assert [x["run_id"] for x in listed] == ["rb1", "tune1"]
    assert listed[0]["action"] == "rollback" and len(listed[0]["changed"]) == 2
    assert listed[1]["restored_at"] and listed[1]["state"]["state"] == "restored"
    assert listed[1]["state"]["data"] == {"restored_by": "rb1"}


def test_restore_refuses_corrupt_backup_without_touching(env):
    env["dest"].mkdir()
    (env["dest"] / UP).write_bytes(b"old")
    inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(32))]))
    (env["state"] / "runs" / "r1" / "backup" / UP).write_bytes(b"tampered")
    before = snapshot(env["dest"])
    with pytest.raises(PayloadError, match="does not match"):
        rest.restore(str(env["state"]), "r1")
    assert snapshot(env["dest"]) == before


def test_restore_unknown_run_not_found(env):
    with pytest.raises(PayloadError) as ei:
        rest.restore(str(env["state"]), "nope")
    assert ei.value.kind == "not_found"


def test_install_refused_while_another_run_holds_lock(env):
    from remote.host import lock

    lock.acquire(str(env["state"]), "other", "ctl@a")
    with pytest.raises(PayloadError) as ei:
        inst.install(req(env, [(UP, cfg_text(64))]))
    assert ei.value.kind == "locked" and "other" in ei.value.msg and not env["dest"].exists()
    assert inst.install(req(env, [(UP, cfg_text(64))]), ignore_lock=True)["status"] == "installed"


def test_a_runs_triton_sub_run_installs_under_its_lock_another_runs_does_not(env):
    """A runner trial installs its Triton files as ``RUN.triton`` (its own manifest) while RUN holds
    the host lock; the sub-run of another run, or a look-alike id, is still refused."""
    from remote.host import lock
    from remote.protocol import parent_run

    assert parent_run("r1.triton") == "r1" and parent_run("r1") == "r1" and parent_run(".triton") == ".triton"
    lock.acquire(str(env["state"]), "r1", "ctl@a")
    got = inst.install(req(env, [(UP, cfg_text(64))], run_id="r1.triton"))
    assert got["status"] == "installed" and os.path.exists(env["state"] / "runs" / "r1.triton" / "manifest.json")
    for other in ("r2.triton", "r1x"):
        with pytest.raises(PayloadError) as ei:
            inst.install(req(env, [(UP, cfg_text(32))], run_id=other))
        assert ei.value.kind == "locked"
    assert rest.restore(str(env["state"]), "r1.triton")["files"][0]["action"] == "deleted"


def test_runs_set_state_and_listing(env):
    state = str(env["state"])
    runs_mod.set_state(state, "r1", "started")
    inst.install(req(env, [(UP, cfg_text(64))]))
    runs_mod.set_state(state, "r1", "completed", {"total_throughput": 1234.5})
    with pytest.raises(PayloadError):
        runs_mod.set_state(state, "r1", "finished")
    (one,) = runs_mod.list_runs(state)["runs"]
    assert one["run_id"] == "r1" and one["action"] == "tune" and one["status"] == "installed"
    assert one["state"]["state"] == "completed"
    assert [h["state"] for h in one["state"]["history"]] == ["started", "completed"]
    assert one["state"]["data"] == {"total_throughput": 1234.5}
    assert one["changed"] == [{"path": str(env["dest"] / UP), "action": "created"}]


def _cli(*args, stdin=None):
    cp = run_watched([sys.executable, "-m", "remote", *args], cwd=ROOT, input=stdin)
    lines = [json.loads(x) for x in cp.stdout.splitlines()]
    return cp.returncode, lines[-1]


def test_cli_install_restore_runs(env, tmp_path):
    env["dest"].mkdir()
    (env["dest"] / UP).write_bytes(b"old")
    rq = tmp_path / "req.json"
    rq.write_text(json.dumps(req(env, [(UP, cfg_text(64))])))
    rc, last = _cli("install", "--request", str(rq))
    assert rc == 0 and last["type"] == "result" and last["data"]["files"][0]["action"] == "replaced"
    rc, last = _cli("runs", "--state-dir", str(env["state"]), "--set-state", "r1", "installed",
                    "--data", '{"note": "x"}')
    assert rc == 0 and last["data"]["state"] == "installed"
    rc, last = _cli("restore", "--run-id", "r1", "--state-dir", str(env["state"]))
    assert rc == 0 and (env["dest"] / UP).read_bytes() == b"old"
    rc, last = _cli("install", "--request", "-", stdin=json.dumps(req(env, [(UP, "{")], run_id="r2")))
    assert rc == 2 and last["type"] == "error" and last["kind"] == "bad_input"


def test_symlinked_target_refused_and_never_read_through(env, tmp_path, monkeypatch):
    """A config path that is a symlink (another user planting a link to a root-only file in a
    folder it can write) is refused before anything changes; a link swapped in between the
    lstat check and the read is not followed either (O_NOFOLLOW)."""
    secret = tmp_path / "secret"
    secret.write_text("root-only\n")
    env["dest"].mkdir()
    (env["dest"] / UP).symlink_to(secret)
    before = snapshot(env["dest"])
    with pytest.raises(PayloadError, match="not a regular file"):
        inst.install(req(env, [(UP, cfg_text(64))]))
    assert snapshot(env["dest"]) == before and not (env["state"] / "runs" / "r1" / "backup").exists()
    # the race: lstat sees a regular file, the read then meets a symlink
    (env["dest"] / UP).unlink()
    (env["dest"] / UP).write_text(cfg_text(32))
    real_lstat = os.lstat

    def lstat_then_swap(path, *a, **kw):
        st = real_lstat(path, *a, **kw)
        if str(path).endswith(UP) and stat.S_ISREG(st.st_mode):
            os.unlink(path)
            os.symlink(secret, path)
        return st
    monkeypatch.setattr(inst.os, "lstat", lstat_then_swap)
    with pytest.raises(PayloadError, match="without following links"):
        inst.install(req(env, [(UP, cfg_text(64))], run_id="r2"))
    assert os.path.islink(env["dest"] / UP) and secret.read_text() == "root-only\n"
    backups = list((env["state"]).rglob("backup/*"))
    assert not any(b.read_text() == "root-only\n" for b in backups)


def test_dry_run_compares_by_sha256_and_writes_nothing(env, tmp_path):
    """``install --dry-run`` says per file whether an install would create, replace or leave it,
    and writes nothing: no file, no run folder, no lock (orch tune's no-op check)."""
    text = cfg_text(64)
    r = req(env, [(UP, text), (DOWN, cfg_text(16))])
    got = inst.install(dict(r, dry_run=True))
    assert got["dry_run"] and not got["dest_exists"] and got["unchanged"] is False
    assert {f["name"]: f["action"] for f in got["files"]} == {UP: "created", DOWN: "created"}
    assert not env["dest"].exists() and not env["state"].exists()
    env["dest"].mkdir()
    (env["dest"] / UP).write_text(text)
    (env["dest"] / DOWN).write_text(cfg_text(32))
    got = inst.install(dict(r, dry_run=True))
    assert {f["name"]: f["action"] for f in got["files"]} == {UP: "unchanged", DOWN: "replaced"}
    assert got["unchanged"] is False
    assert [f["sha256_before"] for f in got["files"]] == [sha(text.encode()), sha(cfg_text(32).encode())]
    (env["dest"] / DOWN).write_text(cfg_text(16))
    assert inst.install(dict(r, dry_run=True))["unchanged"] is True
    # a link in place of a file is never unchanged (nor read through)
    (env["dest"] / DOWN).unlink()
    (tmp_path / "elsewhere.json").write_text(cfg_text(16))
    os.symlink(tmp_path / "elsewhere.json", env["dest"] / DOWN)
    got = inst.install(dict(r, dry_run=True))
    assert got["unchanged"] is False and got["files"][1]["action"] == "replaced"
    assert not env["state"].exists()
    # bad content is refused as in a real install
    with pytest.raises(PayloadError) as ei:
        inst.install(dict(req(env, [(UP, "{")]), dry_run=True))
    assert ei.value.kind == "bad_input"
    # the command-line flag
    rq = tmp_path / "req.json"
    rq.write_text(json.dumps(req(env, [(UP, text)])))
    rc, last = _cli("install", "--request", str(rq), "--dry-run")
    assert rc == 0 and last["data"]["unchanged"] is True and not env["state"].exists()


@pytest.mark.parametrize("name", ["triton_3_6_0.bak", "triton_3_6_0_bak", "triton_old", "triton_3_6_0+git"])
def test_orch_never_makes_an_entry_sglangs_sort_cannot_parse(env, monkeypatch, name):
    """Issue 32 row 12: SGLang 0.5.23 lists every ``triton_*`` entry of the configs root on a miss and
    dies on one it cannot parse. An install into such a name is refused, and through an install, a
    failed install (ENOSPC, rolled back) and a restore the root only ever holds entries SGLang's
    sort parses (backups live in the state folder, temp files inside the Triton folder)."""
    from remote.engines.sglang.naming import unparsable_triton_folders

    with pytest.raises(PayloadError, match="triton_<int>"):
        inst.install(req(env, [(UP, cfg_text(64))], dest_dir=str(env["root"] / name)))

    def clean() -> bool:
        return unparsable_triton_folders(os.listdir(env["root"])) == []

    env["dest"].mkdir()
    (env["dest"] / UP).write_text(cfg_text(16))
    inst.install(req(env, [(UP, cfg_text(64)), (DOWN, cfg_text(64))]))
    assert clean() and sorted(os.listdir(env["root"])) == ["triton_3_6_0"]
    with monkeypatch.context() as m:
        _enospc_on(m, env["dest"], DOWN)
        with pytest.raises(PayloadError):
            inst.install(req(env, [(UP, cfg_text(128)), (DOWN, cfg_text(128))], run_id="r2"))
    assert clean() and sorted(os.listdir(env["root"])) == ["triton_3_6_0"]
    rest.restore(str(env["state"]), "r1")
    assert clean() and sorted(os.listdir(env["root"])) == ["triton_3_6_0"]


def test_extra_fields_are_the_engines(env):
    """``extra_fields`` (Engine.config_extra_fields): a vLLM WNA16 file's SPLIT_K is installed when
    the request names it and refused otherwise (SGLang's launch would fail on it); a malformed list
    is refused before anything is written."""
    obj = json.loads(cfg_text(16))
    text = json.dumps({k: dict(v, SPLIT_K=1) for k, v in obj.items()}, indent=4) + "\n"
    name = "E=128,N=768,device_name=NVIDIA_H200,dtype=int4_w4a16.json"
    with pytest.raises(PayloadError, match="unknown field 'SPLIT_K'"):
        inst.install(req(env, [(name, text)]))
    for bad in (["split_k"], "SPLIT_K", [1]):
        with pytest.raises(PayloadError, match="extra_fields"):
            inst.install(req(env, [(name, text)], extra_fields=bad))
    assert snapshot(env["dest"]) is None
    m = inst.install(req(env, [(name, text)], extra_fields=["SPLIT_K"]))
    assert m["status"] == "installed" and (env["dest"] / name).read_text() == text


def test_restore_of_a_run_without_a_manifest_says_so_in_its_error_lines_detail(tmp_path):
    """The controller tells "the run changed nothing" from other failures by the error line's detail
    (remote.protocol.NO_MANIFEST), never by its message (orchestrator.host.runner_trial)."""
    from remote.protocol import NO_MANIFEST
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    p = subprocess.run([sys.executable, "-m", "remote", "restore", "--run-id", "R1.triton", "--state-dir",
                        str(tmp_path)], cwd=root, capture_output=True, text=True)
    line = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 2 and line["type"] == "error" and line["kind"] == "not_found"
    assert line["detail"] == NO_MANIFEST
