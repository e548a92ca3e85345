"""``orch configs list|show|export|import``: inspect and move tuned results of the store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..records import default_state_dir
from ..store import KEY_FIELDS, KEY_FILE, PROVENANCE_FILE, ConfigStore, StoreError, read_key
from ..ui import field_block, make_console, print_table_or_blocks


def add_parser(sub) -> None:
    st = sub.add_parser("configs", help="the controller's store of tuned configs: list, show, export, import")
    st.add_argument("action", choices=["list", "show", "export", "import"])
    st.add_argument("target", nargs="?", help="entry hash prefix (show/export) or a folder (import)")
    st.add_argument("--out", type=Path, help="export: destination folder")
    st.add_argument("--key", type=Path, help="import: JSON file with the tuning key the files were tuned for")
    st.add_argument("--state-dir", type=Path)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_configs)


ENTRY_COLUMNS = ("hash", "device", "triton", "E/N", "selectors", "space", "tuned on", "stored")


def entry_fields(e) -> list[tuple[str, str]]:
    """``(column, text)`` of one store entry (:data:`ENTRY_COLUMNS`): the hash ``orch configs
    show/export`` take, the key's device, Triton, E/N, selectors and space, who tuned it (or the
    folder it was imported from) and when it was stored, each whole."""
    k, p = e.key, e.provenance
    sel = ",".join(str(x) for x in (k.get("dtype_selector"), k.get("block_shape")) if x) or "-"
    who = p.get("host") or (f"imported from {p['imported_from']}" if p.get("imported_from") else "-")
    return [("hash", e.hash), ("device", str(k.get("device_name"))), ("triton", str(k.get("triton_version"))),
            ("E/N", f"{k.get('E')}/{k.get('N')}"), ("selectors", sel), ("space", str(k.get("space"))),
            ("tuned on", str(who)), ("stored", str(p.get("stored")))]


def print_entries(console: Console, store: ConfigStore, entries: list) -> None:
    """The store's entries as a table when it fits ``console.width`` (no cell is wrapped or cut),
    else one block per entry: the hash on its own line, then one ``label  value`` row per field,
    so a timestamp or a device name is never split across lines."""
    title = f"tuned configs in {store.root}"
    t = Table(title=title)
    for col in ENTRY_COLUMNS:
        t.add_column(col, no_wrap=True)
    for e in entries:
        t.add_row(*(Text(v) for _, v in entry_fields(e)))
    blocks = [field_block(e.hash, entry_fields(e)[1:]) for e in entries]
    print_table_or_blocks(console, t, blocks)


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
    out = make_console()
    if args.action == "list":
        entries = store.list()
        if args.json:
            print(json.dumps([{"hash": e.hash, "key": e.key, "provenance": e.provenance} for e in entries], indent=2))
            return 0
        print_entries(out, store, entries)
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
