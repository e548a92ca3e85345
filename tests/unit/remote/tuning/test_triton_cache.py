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
