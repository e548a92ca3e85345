"""``python -m tests.testbed up|down|status``: persistent example hosts for the README.

``up [--hosts N] [--inventory PATH] [--workdir DIR] [--option NAME.KEY=JSON ...]`` creates N
hosts that stay up after the command exits (see ``tests.testbed.bed``), writes an inventory
(default ``inventories/testbed.yaml``) with the absolute key path and ``orch_known_hosts``,
writes the known_hosts file next to the inventory (``<inventory stem>.known_hosts``), and prints
what it made. ``down [--inventory PATH | BED_ID ... | --all]`` removes the persistent bed that
``up`` made for that inventory (default ``inventories/testbed.yaml``, the demo's), the named
beds, or with ``--all`` every persistent bed; then stale beds (whose owner and hosts are gone);
then, once no bed at all is left on this machine, the login user and the mount points the beds
made (:func:`tests.testbed.bed.remove_machine_setup`). Other beds (a test run's, another
checkout's demo) are left as they are. ``status`` lists them.
State: ``/run/orchtb/<bed id>/state.json``. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from . import bed as bedmod

REPO = Path(__file__).resolve().parents[2]


def _parse_option(text: str) -> tuple:
    """``gpu-b.backend="flashinfer_cutlass"`` -> ("gpu-b", "backend", "flashinfer_cutlass")."""
    left, _, value = text.partition("=")
    host, _, key = left.partition(".")
    if not host or not key or not _:
        raise argparse.ArgumentTypeError(f"expected HOST.KEY=JSON, got {text!r}")
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return host, key, parsed


def cmd_up(args: argparse.Namespace) -> int:
    """Create a persistent bed and write its inventory; print a summary."""
    options: dict = {}
    for host, key, value in args.option or []:
        options.setdefault(host, {})[key] = value
    workdir = Path(args.workdir).resolve() if args.workdir else None
    bed = bedmod.TestBed(n_hosts=args.hosts, host_options=options, workdir=workdir, persistent=True)
    inventory = Path(args.inventory)
    if not inventory.is_absolute():
        inventory = Path.cwd() / inventory
    known = inventory.with_name(inventory.stem + ".known_hosts")
    bed.extra_state = {"inventory": str(inventory), "known_hosts_copy": str(known)}
    try:
        bed.create()
        inventory.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bed.known_hosts_path, known)
        bed.known_hosts_path = known
        bed.write_inventory(inventory)
        bed.detach()
    except BaseException:  # nothing half-made stays up
        bed.destroy()
        for path in (inventory, known):
            path.unlink(missing_ok=True)
        raise
    # one fact a line, so that each reads at 80 columns (a long path stands on its own line)
    print(f"test bed {bed.bed_id}: {len(bed.hosts)} host(s), work folder {bed.workdir}")
    for h in bed.hosts:
        print(f"  {h.name}: ssh root@{h.address} (namespace {h.ns}), unit {h.unit}.service")
        print(f"    configs {h.config_dir}")
    print(f"  key: {bed.key_path}")
    print(f"  known_hosts: {known}")
    print(f"  inventory: {inventory}")
    h = bed.hosts[0]
    print(f"  try: ssh -i {bed.key_path} \\\n         -o UserKnownHostsFile={known} \\\n"
          f"         root@{h.address} 'ls /dev/nvidia*; systemctl status {h.unit}'")
    default = _same_file(str(inventory), str(REPO / "inventories" / "testbed.yaml"))
    print("  remove with: " + ("bash scripts/demo.sh down (or python -m tests.testbed down)" if default
                              else f"python -m tests.testbed down --inventory {inventory}"))
    return 0


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def cmd_down(args: argparse.Namespace) -> int:
    """Remove the selected persistent beds (see the module docstring), then anything stale, then
    the machine set-up when no bed is left."""
    beds = bedmod.load_persistent_beds()
    if args.all:
        chosen = beds
    elif args.bed_ids:
        chosen = [b for b in beds if b["bed_id"] in args.bed_ids]
        for missing in sorted(set(args.bed_ids) - {b["bed_id"] for b in chosen}):
            print(f"no persistent test bed {missing}")
    else:
        inventory = str(Path(args.inventory).absolute())
        chosen = [b for b in beds if (b.get("extra") or {}).get("inventory")
                  and _same_file(b["extra"]["inventory"], inventory)]
    for state in chosen:
        bedmod.destroy_bed_state(state["bed_id"])
        print(f"removed test bed {state['bed_id']} ({', '.join(h['name'] for h in state.get('hosts', []))})")
    removed = bedmod.cleanup_stale()
    if removed:
        print(f"removed stale: {', '.join(removed)}")
    if not chosen and not removed:
        what = "" if args.all or args.bed_ids else f" for {args.inventory}"
        print(f"no test bed to remove{what}")
    others = [b["bed_id"] for b in bedmod.load_persistent_beds()]
    if others:
        print(f"left up: persistent test bed(s) {', '.join(others)} (python -m tests.testbed status)")
    machine = bedmod.remove_machine_setup()
    if machine is None:
        print(f"kept the {bedmod.LOGIN_USER} user and the beds' mount points: another test bed is still up "
              "(python -m tests.testbed status)")
    elif machine:
        print(f"removed machine set-up: {', '.join(machine)}")
    for line in leftovers():
        print(line)
    return 0


def leftovers() -> list[str]:
    """What ``down`` leaves on this machine on purpose, one line each with its size where it
    exists and how to remove it: the SGLang wheel cache (``tests/sglang_releases.py``), orch's
    run records and config store (its default state dir), the virtual environment, the beds' lock
    file (``/run/orchtb/.lock``: kept so beds started meanwhile share one lock; tmpfs, gone at the
    next boot), and the system packages ``scripts/setup.sh`` installed (its record,
    ``.setup/installed-packages``, or ``$ORCH_SETUP_DIR``'s, with the apt-get command that removes
    them)."""
    from orchestrator.records import default_state_dir
    from tests.sglang_releases import cache_root

    def size(path: Path) -> str:
        total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        return f"{total / 1e6:.0f} MB"

    out = ["left on this machine (remove by hand if you want the space back):"]
    for path, what in ((cache_root(), "SGLang wheels and their sources (the test bed, the tests)"),
                       (default_state_dir(), "orch's run records and tuned-config store"),
                       (REPO / ".venv", "orch's virtual environment (scripts/setup.sh)")):
        if path.exists():
            out += [f"  {path} ({size(path)}): {what}", f"    remove: rm -rf {path}"]
    lock = bedmod.STATE_ROOT / ".lock"
    if lock.exists():
        out += [f"  {lock} (empty): the test beds' lock, kept so that beds started",
                "    meanwhile share one lock; on tmpfs, gone at the next boot",
                f"    remove: rm -r {bedmod.STATE_ROOT} (once no test bed runs)"]
    record = Path(os.environ.get("ORCH_SETUP_DIR") or REPO / ".setup") / "installed-packages"
    packages = list(dict.fromkeys(record.read_text().split())) if record.exists() else []
    if packages:
        out += [f"  system packages scripts/setup.sh installed: {' '.join(packages)}",
                f"    (its record: {record})",
                f"    remove: apt-get remove --autoremove {' '.join(packages)}"]
    else:
        out += ["  system packages: scripts/setup.sh installed none here (they were",
                "    present); the list and why: tests/testbed/setup.sh"]
    return out


def cmd_status(args: argparse.Namespace) -> int:
    """List persistent beds and all orchtb-* namespaces."""
    for state in bedmod.load_persistent_beds():
        alive = "up" if bedmod._bed_is_live(state) else "dead"
        inv = (state.get("extra") or {}).get("inventory")
        print(f"bed {state['bed_id']} ({alive}): " + ", ".join(f"{h['name']}={h['address']}" for h in state["hosts"])
              + (f", inventory {inv}" if inv else ""))
    print("namespaces: " + (" ".join(bedmod.list_namespaces()) or "none"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    p = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create persistent hosts and write an inventory")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--inventory", default=str(REPO / "inventories" / "testbed.yaml"))
    up.add_argument("--workdir", default=None, help="work folder (default /tmp/orchtb-<id>, removed by down)")
    up.add_argument("--option", action="append", type=_parse_option, metavar="HOST.KEY=JSON",
                    help="per-host option, e.g. gpu-b.backend=flashinfer_cutlass (repeatable)")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="remove persistent hosts (default: the bed of inventories/testbed.yaml)")
    down.add_argument("bed_ids", nargs="*", metavar="BED_ID", help="remove these beds (see status)")
    down.add_argument("--inventory", default=str(REPO / "inventories" / "testbed.yaml"),
                      help="remove the bed `up` made for this inventory (default: %(default)s)")
    down.add_argument("--all", action="store_true", help="remove every persistent bed of this machine")
    down.set_defaults(func=cmd_down)
    st = sub.add_parser("status", help="list persistent hosts")
    st.set_defaults(func=cmd_status)
    args = p.parse_args(argv)
    from tests.sglang_releases import ReleaseUnavailable

    try:
        return args.func(args)
    except ReleaseUnavailable as exc:  # no network and no cached wheel: one line, not a traceback
        print(f"python -m tests.testbed: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
