"""The SGLang wheel cache the tests and the demo read (tests/sglang_releases.py): a release that
can be neither found nor downloaded is one error naming it and the cache folder; ``python -m
tests.sglang_releases`` fills the cache and says what it holds. No network: pip is told to use
no index, so a download fails at once the way an offline machine's does."""

from __future__ import annotations

import sys
import zipfile

import pytest

from tests import sglang_releases as sr
from tests.paths import REPO
from tests.waiting import run_watched


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ORCH_SGLANG_CACHE", str(root))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds nothing: an offline machine
    return root


def _fake_wheel(root, version):
    (root / "wheels").mkdir(parents=True, exist_ok=True)
    path = root / "wheels" / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("sglang/version.py", f'__version__ = "{version}"\n')
        zf.writestr("sglang/lib.so", b"\x7fELF")
    return path


def test_failed_download_names_the_release_and_the_cache(cache):
    with pytest.raises(sr.ReleaseUnavailable) as ei:
        sr.wheel("0.0.1")
    msg = str(ei.value)
    assert "\n" not in msg
    assert "SGLang 0.0.1" in msg and str(cache / "wheels") in msg
    assert "python -m tests.sglang_releases" in msg and "ORCH_SGLANG_CACHE" in msg


def test_prefill_command_uses_the_cache_and_reports_failures(cache):
    _fake_wheel(cache, "9.9.9")
    env = {"ORCH_SGLANG_CACHE": str(cache), "PIP_NO_INDEX": "1", "PATH": "/usr/bin:/bin"}
    ok = run_watched([sys.executable, "-m", "tests.sglang_releases", "9.9.9"], cwd=REPO, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "ok  9.9.9" in ok.stdout and f"cache: {cache}" in ok.stdout
    # unpacked: the .py files only
    assert (cache / "src" / "9.9.9" / "sglang" / "version.py").is_file()
    assert not (cache / "src" / "9.9.9" / "sglang" / "lib.so").exists()
    bad = run_watched([sys.executable, "-m", "tests.sglang_releases", "9.9.9", "0.0.1"], cwd=REPO, env=env)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "error: SGLang 0.0.1" in bad.stderr and "ok  9.9.9" in bad.stdout


def test_needed_releases_are_the_ones_the_tests_read():
    from tests.sglang_loader import ORACLE_RELEASES
    from tests.testbed.standin_tree import DEFAULT_RELEASES

    got = sr.needed_releases()
    assert set(got) == set(ORACLE_RELEASES) | set(DEFAULT_RELEASES.values()) and len(got) == len(set(got))


def test_testbed_down_says_what_it_leaves(cache, tmp_path, monkeypatch):
    """`bash scripts/demo.sh down` (python -m tests.testbed down) ends by naming what stays: the
    wheel cache and orch's state dir, each with its size and the command that removes it."""
    from tests.testbed.__main__ import leftovers

    _fake_wheel(cache, "9.9.9")
    state = tmp_path / "xdg-state"
    (state / "orch" / "runs").mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    lines = leftovers()
    assert lines[0].startswith("left on this machine")
    text = "\n".join(lines)
    assert f"{cache} (0 MB): SGLang wheels" in text and f"rm -rf {cache}" in text
    assert f"{state / 'orch'} (0 MB): orch's run records" in text
    import shutil
    shutil.rmtree(cache)
    assert str(cache) not in "\n".join(leftovers())  # only what exists is named


def test_testbed_down_names_the_lock_and_the_packages_setup_installed(tmp_path, monkeypatch):
    """`down` names the beds' lock file it keeps (``/run/orchtb/.lock``) and the system packages
    scripts/setup.sh installed (its record), with the command that removes each; with no record,
    that set-up installed none."""
    from tests.testbed import bed as bedmod
    from tests.testbed.__main__ import leftovers

    monkeypatch.setattr(bedmod, "STATE_ROOT", tmp_path / "orchtb")
    monkeypatch.setenv("ORCH_SETUP_DIR", str(tmp_path / "setup"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    text = "\n".join(leftovers())
    assert "lock" not in text and "system packages: scripts/setup.sh installed none here" in text
    (tmp_path / "orchtb").mkdir()
    (tmp_path / "orchtb" / ".lock").write_text("")
    (tmp_path / "setup").mkdir()
    (tmp_path / "setup" / "installed-packages").write_text("numactl\npodman\ncrun\npodman\n")
    lines = leftovers()
    assert f"  {tmp_path / 'orchtb' / '.lock'} (empty): the test beds' lock, kept so that beds started" in lines
    assert f"    remove: rm -r {tmp_path / 'orchtb'} (once no test bed runs)" in lines
    assert "  system packages scripts/setup.sh installed: numactl podman crun" in lines
    assert "    remove: apt-get remove --autoremove numactl podman crun" in lines


def test_a_download_says_what_why_and_the_size_in_one_line(cache, tmp_path, monkeypatch, capsys):
    """A wheel fetched (here from a local folder pip is pointed at, as a mirror would serve it) is
    announced in one line on stderr: the release, the file and its size, the cache folder, and why
    the tests and the demo need it. A cached wheel is used silently."""
    built = _fake_wheel(tmp_path / "mirror", "9.9.8")
    with zipfile.ZipFile(built, "a") as zf:  # the metadata pip checks before it saves a wheel
        info = "sglang-9.9.8.dist-info"
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.8\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    monkeypatch.setenv("PIP_FIND_LINKS", str(built.parent))
    got = sr.wheel("9.9.8")
    assert got.read_bytes() == built.read_bytes()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("download:")]
    size = f"{built.stat().st_size / 1e6:.1f} MB"
    assert lines == [f"download: SGLang 9.9.8 ({built.name}, {size}) into {cache / 'wheels'}: {sr.WHY}"]
    assert "stand-in SGLang" in sr.WHY and "downloaded once" in sr.WHY
    sr.wheel("9.9.8")
    assert "download:" not in capsys.readouterr().err
