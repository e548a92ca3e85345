"""Put back every file a run changed, from its manifest and backups (``restore``).

``python -m remote restore --run-id ID [--state-dir D] [--as-run-id NEW_ID]``

Reads ``<state_dir>/runs/<ID>/manifest.json`` (written by ``install``, any status, also a run
that crashed mid-way), checks every backup against its recorded ``sha256_before`` before
touching anything, then for each file:

- it existed before the run: its exact earlier bytes are written back atomically (with the
  earlier mode/owner), unless it already has them (``unchanged``);
- it did not exist before: it is deleted (``deleted``), or ``unchanged`` when already absent.

A ``dest_dir`` the run created (``dest_existed_before`` false) is removed when it is empty
afterwards; one that existed before but is gone is re-created when a file must go back into it.
Every file is verified by sha256 afterwards. ``state.json`` of the run gets ``state``
``restored``, ``restored_at`` and a ``restores`` list (``{"at", "as_run_id", "changed"}``). Running it twice is harmless (everything ``unchanged`` the second time).

With ``--as-run-id NEW_ID`` the restore itself is recorded as run ``NEW_ID`` (action ``rollback``,
manifest with before/after hashes and backups of the content it replaced, ``"restores": ID``),
written by the same code path as ``install``; ``restore --run-id NEW_ID`` then undoes the rollback.

Result ``data``::

    {"run_id", "as_run_id": str|null, "dest_dir", "dest_removed": bool,
     "files": [{"path", "action": "restored"|"deleted"|"unchanged", "sha256": str|null}]}

``sha256`` is the file's hash after the restore (``null`` = absent).
"""

from __future__ import annotations

from .fs import DEFAULT_STATE_DIR
from .undo import restore  # noqa: F401  (the command's work, shared with remote/host/deadman.py)


def add_arguments(parser) -> None:
    """Flags of ``restore``."""
    parser.add_argument("--run-id", required=True, help="run whose changes to undo")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--as-run-id", default=None,
                        help="record this restore as a new run (action rollback) so it can be undone")
    parser.add_argument("--ignore-lock", action="store_true",
                        help="do not refuse when the host lock is held by another run")


def run(args) -> dict:
    """``restore`` command: see the module docstring."""
    return restore(args.state_dir, args.run_id, as_run_id=args.as_run_id,
                   ignore_lock=args.ignore_lock)
