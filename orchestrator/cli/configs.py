"""``orch configs list|show|export|import``: inspect and move tuned results of the store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..records import default_state_dir
from ..store import KEY_FIELDS, KEY_FILE, PROVENANCE_FILE, ConfigStore, StoreError, read_key


def add_parser(sub) -> None:
    st = sub.add_parser("configs", help="the controller's store of tuned configs: list, show, export, import")
    st.add_argument("action", choices=["list", "show", "export", "import"])
    st.add_argument("target", nargs="?", help="entry hash prefix (show/export) or a folder (import)")
    st.add_argument("--out", type=Path, help="export: destination folder")
    st.add_argument("--key", type=Path, help="import: JSON file with the tuning key the files were tuned for")
    st.add_argument("--state-dir", type=Path)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_configs)


def cmd_configs(args) -> int:
    """Run one ``configs`` action; StoreError for a bad target or import, and for a path that cannot
    be read or written (``--state-dir``, ``--out``, the folder to import), named."""
    try:
        return _action(args)
    except OSError as exc:
        where = exc.filename or args.target or args.out or args.state_dir
        raise StoreError(f"configs {args.action}: {where}: {exc.strerror or exc}") from None


def _action(args) -> int:
    store = ConfigStore(args.state_dir or default_state_dir())
    out = Console()
    if args.action == "list":
        entries = store.list()
        if args.json:
            print(json.dumps([{"hash": e.hash, "key": e.key, "provenance": e.provenance} for e in entries], indent=2))
            return 0
        t = Table(title=f"tuned configs in {store.root}")
        # the hash is what `orch configs show/export` take: never wrapped or cut; every other
        # column folds (all its characters kept, over several lines) on a narrow terminal
        t.add_column("hash", no_wrap=True, min_width=max([len(e.hash) for e in entries] or [4]))
        for col in ("device", "triton", "E/N", "selectors", "space", "tuned on", "stored"):
            t.add_column(col, overflow="fold")
        for e in entries:
            k, p = e.key, e.provenance
            sel = ",".join(str(x) for x in (k.get("dtype_selector"), k.get("block_shape")) if x) or "-"
            t.add_row(e.hash, str(k.get("device_name")), str(k.get("triton_version")), f"{k.get('E')}/{k.get('N')}",
                      sel, str(k.get("space")), str(p.get("host") or p.get("imported_from")), str(p.get("stored")))
        out.print(t)
        return 0
    if not args.target:
        raise StoreError(f"configs {args.action}: give an entry hash prefix" + (" or a folder" if args.action == "import" else ""))
    if args.action == "show":
        e = store.find(args.target)
        print(json.dumps({"hash": e.hash, "key": e.key, "provenance": e.provenance,
                          "files": {r: str(p) for r, p in e.files.items()}}, indent=2))
        return 0
    if args.action == "export":
        e = store.find(args.target)
        dest = args.out or Path(f"orch-configs-{e.hash}")
        dest.mkdir(parents=True, exist_ok=True)
        for p in list(e.files.values()) + [e.dir / KEY_FILE, e.dir / PROVENANCE_FILE] + ([e.report] if e.report else []):
            shutil.copyfile(p, dest / p.name)
        print(dest)
        return 0
    # import
    src = Path(args.target)
    key_file = args.key or (src / KEY_FILE)
    if not key_file.exists():
        raise StoreError(f"{key_file}: missing; import needs the tuning key ({', '.join(KEY_FIELDS)})")
    try:
        key = json.loads(key_file.read_text())
    except ValueError as exc:
        raise StoreError(f"{key_file}: not JSON: {exc}") from None
    if not isinstance(key, dict):
        raise StoreError(f"{key_file}: a tuning key is a JSON object ({', '.join(KEY_FIELDS)}), got {type(key).__name__}")
    key = read_key(key)
    missing = [f for f in KEY_FIELDS if f not in key]
    if missing:
        raise StoreError(f"{key_file}: key lacks {missing}")
    e = store.import_tree(src, {f: key[f] for f in KEY_FIELDS}, {"host": None})
    print(e.hash)
    return 0
