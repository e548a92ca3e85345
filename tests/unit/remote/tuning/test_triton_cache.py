"""The tuner's own Triton cache (issue 21 row 4): fresh per run, moved aside and retried once on a cache error."""

import os

from remote.tuning.cache import fresh_cache, is_cache_error, tune_with_cache


def test_cache_errors_are_told_from_other_errors(tmp_path):
    cache = str(tmp_path / "triton-cache-x")
    assert is_cache_error("json.decoder.JSONDecodeError: Expecting value: line 1 column 1", cache)
    assert is_cache_error("OSError: [Errno 116] Stale file handle", cache)
    assert is_cache_error("OSError: [Errno 16] Device or resource busy: '/nfs/.triton/cache/x.json.tmp'", cache)
    assert is_cache_error(f"FileNotFoundError: [Errno 2] No such file or directory: '{cache}/ab/k.so'", cache)
    assert not is_cache_error("FileNotFoundError: [Errno 2] No such file or directory: '/models/x'", cache)
    assert not is_cache_error("torch.OutOfMemoryError: CUDA out of memory", cache)


def test_each_run_gets_a_new_cache_never_the_inherited_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/srv/server-cache")
    monkeypatch.setenv("TMPDIR", "/tmp")
    a = fresh_cache(tmp_path, "run1.")
    b = fresh_cache(tmp_path, "run1.")
    assert a != b and a.is_dir() and b.is_dir() and [p.name for p in a.iterdir()] == ["tmp"]
    assert os.environ["TRITON_CACHE_DIR"] == str(b) != "/srv/server-cache"
    assert os.environ["TMPDIR"] == str(b / "tmp")  # Triton's build folder is on the same mount


def test_a_cache_error_moves_the_cache_aside_and_retries_once(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", "/tmp")
    seen, logs = [], []

    def run_once():
        cache = os.environ["TRITON_CACHE_DIR"]
        seen.append((cache, os.listdir(cache)))
        (open(os.path.join(cache, "k.json"), "w")).write("{half")  # what a crash mid-write leaves
        return {"4": "JSONDecodeError: Unterminated string"} if len(seen) == 1 else {}

    out = tune_with_cache(run_once, tmp_path / "c", "r.", lambda msg, level: logs.append((level, msg)))
    assert [files for _, files in seen] == [["tmp"], ["tmp"]]  # the retry starts from an empty cache
    assert out["errors"] == {} and out["moved_aside"] == seen[0][0] + ".broken"
    assert os.path.isfile(os.path.join(out["moved_aside"], "k.json"))  # kept to look at
    assert not os.path.exists(seen[1][0])  # the run's own cache is removed at the end
    assert logs and logs[0][0] == "warning" and "retrying once" in logs[0][1]


def test_other_errors_are_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", "/tmp")
    calls = []
    out = tune_with_cache(lambda: calls.append(1) or {"8": "RuntimeError: bad config"}, tmp_path, "r", print)
    assert len(calls) == 1 and out["moved_aside"] is None and out["errors"] == {"8": "RuntimeError: bad config"}


def test_a_noexec_mount_is_found_for_a_path():
    from remote.probe import mount_of

    info = ("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
            "30 22 0:27 / /tmp rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,size=1g\n"
            "31 22 0:28 / /var/lib/orch rw,relatime - xfs /dev/sdb1 rw\n"
            "32 31 0:28 / /var/lib/orch rw,noexec,relatime - xfs /dev/sdb1 rw\n")
    assert mount_of("/tmp/x", info)["target"] == "/tmp" and "noexec" in mount_of("/tmp/x", info)["options"]
    assert mount_of("/tmpfoo", info)["target"] == "/"  # a prefix of the name is not a parent
    assert "noexec" in mount_of("/var/lib/orch/work", info)["options"]  # the last mount over it wins
    assert mount_of("/srv", info)["fstype"] == "ext4"


def test_server_cache_report_names_a_shared_copied_or_truncated_cache(tmp_path):
    """Issue 32 row 16: the server's own Triton cache read as Triton 3.x writes it (a kernel folder per
    hash, ``<kernel>.json`` metadata with ``target: {backend, arch, warp_size}``, the binary beside it):
    kernels of another architecture, truncated files and a network filesystem are reported; nothing
    is changed."""
    import json as _json

    from remote.tuning.cache import server_cache_report

    cache = tmp_path / "cache"

    def kernel(h, arch, binary=b"\x7fELF..."):
        d = cache / h
        d.mkdir(parents=True)
        (d / "fused_moe_kernel.json").write_text(_json.dumps({"name": "fused_moe_kernel", "target": {
            "backend": "cuda", "arch": arch, "warp_size": 32}}))
        (d / "__grp__fused_moe_kernel.json").write_text("{}")
        (d / "fused_moe_kernel.cubin").write_bytes(binary)

    kernel("A", 90)
    kernel("B", 80)
    kernel("C", 90, binary=b"")
    (cache / "D").mkdir()
    (cache / "D" / "fused_moe_kernel.json").write_text('{"name": "fused_moe_ker')
    before = sorted(p.name for p in cache.rglob("*"))
    rep = server_cache_report(str(cache), "9.0", {"fstype": "nfs4"})
    assert rep["exists"] and rep["shared"] and rep["fstype"] == "nfs4" and rep["entries"] == 4
    assert rep["archs"] == {"80": 1, "90": 2} and rep["other_arch"] == 1
    assert rep["truncated_count"] == 2 and {p.rsplit("/", 2)[-2] for p in rep["truncated"]} == {"C", "D"}
    assert sorted(p.name for p in cache.rglob("*")) == before
    local = server_cache_report(str(cache), "8.0", {"fstype": "ext4"})
    assert not local["shared"] and local["other_arch"] == 2
    assert server_cache_report(str(tmp_path / "none"), "9.0", None)["exists"] is False
