"""The payload push on a real (local) host: staged, verified, renamed into place, race-safe."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from orchestrator.connection.local import LocalConnection
from orchestrator.payload.bundle import build_bundle
from orchestrator.payload.deploy import deploy, tree_mismatch


def _leftovers(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.name.startswith(".push."))


def test_push_then_reuse(tmp_path):
    bundle = build_bundle()
    conn = LocalConnection("local")
    base, state = tmp_path / "state" / "payload", tmp_path / "state"
    root, pushed = deploy(conn, bundle, str(base), str(state))
    assert pushed and root == str(base / bundle.short)
    assert (Path(root) / ".verified").is_file() and tree_mismatch(conn, root, bundle) == []
    assert oct(os.stat(root).st_mode & 0o777) == "0o700"
    assert _leftovers(base) == []
    assert deploy(conn, bundle, str(base), str(state)) == (root, False)


def test_tampered_tree_is_replaced_whole(tmp_path):
    bundle = build_bundle()
    conn = LocalConnection("local")
    base, state = tmp_path / "payload", tmp_path
    root, _ = deploy(conn, bundle, str(base), str(state))
    (Path(root) / "remote" / "__main__.py").write_text("import os; os.system('evil')\n")
    (Path(root) / "extra.py").write_text("")
    told = []
    root2, pushed = deploy(conn, bundle, str(base), str(state), on_tampered=lambda r, p: told.append(sorted(p)))
    assert pushed and root2 == root
    assert told == [["extra.py", "remote/__main__.py"]]
    assert tree_mismatch(conn, root, bundle) == [] and _leftovers(base) == []


def test_concurrent_pushes_to_one_folder(tmp_path):
    """Two hosts that mount one state folder push at once (the CI failure: one push's `rm -rf`
    deleted the other's half-unpacked tree). Both must end with the same intact tree."""
    bundle = build_bundle()
    base, state = tmp_path / "payload", tmp_path
    results, errors = [], []

    def push():
        try:
            results.append(deploy(LocalConnection("local"), bundle, str(base), str(state)))
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(exc)

    for _ in range(5):
        shutil.rmtree(base, ignore_errors=True)
        threads = [threading.Thread(target=push) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert {r[0] for r in results} == {str(base / bundle.short)}
    assert tree_mismatch(LocalConnection("local"), str(base / bundle.short), bundle) == []
    assert _leftovers(base) == []


def test_staging_folders_of_killed_pushes_are_removed(tmp_path):
    """A push killed before its cleanup leaves ``.push.*``; the next push removes it once it is
    older than STALE_PUSH_MIN, and leaves a young one (a push in progress) alone."""
    import time

    from orchestrator.payload.deploy import STALE_PUSH_MIN

    bundle = build_bundle()
    base = tmp_path / "payload"
    (base / ".push.dead0000" / "tree").mkdir(parents=True)
    (base / ".push.live0000").mkdir()
    old = time.time() - (STALE_PUSH_MIN + 5) * 60
    os.utime(base / ".push.dead0000", (old, old))
    deploy(LocalConnection("local"), bundle, str(base), str(tmp_path))
    assert _leftovers(base) == [".push.live0000"]
