"""The ``orch`` command line. Commands are thin: they load an inventory and a playbook
and hand both to the engine (:mod:`orchestrator.engine.runner`).

Exit status: 0 when every host ended well, 1 when a host failed or was unreachable,
2 for bad input (inventory, playbook, flags), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from rich.console import Console

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad command-line input; printed as one line, exit status 2."""


def _serial(value: str | None):
    """``--serial`` value checked with the engine's own parser (``1``, ``25%``, ``1,5,25%``)."""
    from .engine.batching import SerialError, parse_serial

    if value is None:
        return None
    try:
        parse_serial(value)
    except SerialError as exc:
        raise UsageError(f"--serial: {exc}") from None
    return value


def _add_fleet_flags(p: argparse.ArgumentParser, service_required: bool = True) -> None:
    p.add_argument("inventory", help="Ansible-style YAML inventory")
    p.add_argument("--service", required=False,
                   help="systemd unit running sglang.launch_server (default: each host's orch_service)")
    p.add_argument("--limit", "-l", help="host/group patterns: names, globs, !exclusions, &intersections")
    p.add_argument("--state-dir", type=Path, help="controller run records (default $XDG_STATE_HOME/orch)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="accept and remember unknown host keys (a changed key is always refused)")
    p.add_argument("--forks", type=int, default=5, help="hosts worked on in parallel within a batch (default 5)")
    p.add_argument("--serial", help="batch size: a number, a percentage, or a list like 1,5,25%%")
    p.add_argument("--max-fail-percentage", type=float, help="stop when a batch's failed share exceeds this")
    p.add_argument("--any-errors-fatal", action="store_true", help="stop after the batch where any host failed")
    p.add_argument("--order", choices=["inventory", "sorted", "reverse_sorted", "reverse_inventory", "shuffle"])
    p.add_argument("--json", action="store_true", help="print the recap as JSON on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="echo remote output, prefixed with the host")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of ``orch``."""
    ap = argparse.ArgumentParser(prog="orch", description="Retune SGLang fused-MoE Triton kernels across GPU hosts.")
    ap.add_argument("--version", action="version", version=f"orch {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("tune", help="retune every host's MoE configs and leave the servers running on them")
    _add_fleet_flags(t)
    t.add_argument("--check", action="store_true", help="probe and print what would happen; change nothing")
    t.add_argument("--playbook", type=Path, help="playbook to run instead of the bundled playbooks/tune.yaml")
    t.add_argument("--leave-stopped", action="store_true", help="after a failure, do not start the unit again")
    t.add_argument("--regression-threshold", type=float,
                   help="roll back when output tok/s falls by more than this percent (default 3)")
    t.add_argument("--retune", action="store_true", help="tune again even if the store has a result for the key")
    t.add_argument("--tune-on", metavar="HOST", help="host that tunes for its group (default: the first in order)")
    t.add_argument("--shard-tuning", action="store_true",
                   help="split the batch sizes across the idle hosts of a group and merge the results")
    t.add_argument("--run-id", help=argparse.SUPPRESS)

    r = sub.add_parser("rollback", help="restore the configs a run replaced, restart, verify")
    _add_fleet_flags(r)
    r.add_argument("--to", dest="to_run", help="run id to undo (default: the most recent run on each host)")
    r.add_argument("--check", action="store_true")
    r.add_argument("--run-id", help=argparse.SUPPRESS)

    rc = sub.add_parser("recover", help="restore hosts a killed controller left stopped or half-changed")
    _add_fleet_flags(rc)
    rc.add_argument("--break-lock", action="store_true",
                    help="take over a host lock even if its holder may still run (you checked it is gone)")
    rc.add_argument("--check", action="store_true")
    rc.add_argument("--run-id", help=argparse.SUPPRESS)

    h = sub.add_parser("runs", help="history of orch runs, read from the hosts' own run records")
    h.add_argument("inventory")
    h.add_argument("--host", help="only this host")
    h.add_argument("--service", help="unit whose Python runs the payload (default: ansible_python_interpreter)")
    h.add_argument("--limit", "-l")
    h.add_argument("--accept-new-host-keys", action="store_true")
    h.add_argument("--json", action="store_true")

    d = sub.add_parser("doctor", help="find hosts that silently run untuned MoE kernels, and say why (read-only)")
    _add_fleet_flags(d)
    d.add_argument("--fix", action="store_true", help="print the command that would fix each host (runs nothing)")

    b = sub.add_parser("bench", help="throughput benchmark of each host's unit, run on the host")
    _add_fleet_flags(b)
    b.add_argument("--concurrency", help="levels, e.g. 1,16,64,256 (default orch_bench_concurrency)")
    b.add_argument("--input-len", type=int, help="prompt tokens (default orch_bench_input_len)")
    b.add_argument("--output-len", type=int, help="output tokens (default orch_bench_output_len)")
    b.add_argument("--level-timeout", type=float, help="seconds per concurrency level (default 600)")
    b.add_argument("--bench-tool", choices=["builtin", "sglang"], help="orch's client or sglang.bench_serving")

    st = sub.add_parser("configs", help="the controller's store of tuned configs: list, show, export, import")
    st.add_argument("action", choices=["list", "show", "export", "import"])
    st.add_argument("target", nargs="?", help="entry hash prefix (show/export) or a folder (import)")
    st.add_argument("--out", type=Path, help="export: destination folder")
    st.add_argument("--key", type=Path, help="import: JSON file with the tuning key the files were tuned for")
    st.add_argument("--state-dir", type=Path)
    st.add_argument("--json", action="store_true")

    rp = sub.add_parser("report", help="write an HTML report of a run (an earlier, different one is kept)")
    rp.add_argument("run_id", help="run id, 'latest', or a run folder")
    rp.add_argument("--state-dir", type=Path, help="controller run records (default $XDG_STATE_HOME/orch)")
    rp.add_argument("--out", type=Path, help="output file (default <run dir>/report.html)")

    c = sub.add_parser("config-names", help="print the exact up and down config file names SGLang looks for")
    c.add_argument("--model-config", required=True, help="config.json, its folder, or an offline HF repo id")
    c.add_argument("--tp", type=int, default=1)
    c.add_argument("--ep", type=int, default=1)
    c.add_argument("--device-name", required=True, help="torch.cuda.get_device_name(), e.g. 'NVIDIA H200'")
    c.add_argument("--dtype")
    c.add_argument("--quantization")
    c.add_argument("--disable-shared-experts-fusion", action="store_true")
    c.add_argument("--json", action="store_true")
    return ap


def _load_hosts(args):
    from .inventory import load_inventory

    inv = load_inventory(args.inventory)
    hosts = inv.select(getattr(args, "limit", None))
    return inv, hosts


def _install_signal_handlers(options, console: Console):
    def handler(signum, _frame):
        if options.cancel.is_set():
            console.print("[red]interrupted again: still restoring hosts, please wait[/]")
            return
        options.cancel.set()
        console.print(f"[yellow]{signal.Signals(signum).name}: finishing the current step, then restoring every "
                      "host that was changed[/]")

    # a dropped terminal (SIGHUP) must not leave units stopped either
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    return old


def run_playbook_command(args, playbook_name: str, extra: dict, check: bool) -> int:
    """Shared body of ``tune`` and ``rollback``: run a playbook over the selected hosts."""
    from .engine.context import RunOptions
    from .engine.playbook import builtin_playbook, load_playbook
    from .engine.runner import Engine
    from .inventory import effective_vars
    from .records import RunRecord, default_state_dir, new_run_id
    from .tasks import MODULES
    from .ui import Reporter, print_summary, recap_table

    console = Console(stderr=True, highlight=False)
    inv, hosts = _load_hosts(args)
    pb_path = getattr(args, "playbook", None) or builtin_playbook(playbook_name)
    plays = load_playbook(pb_path, set(MODULES))
    run_id = args.run_id or new_run_id(playbook_name)
    state_dir = args.state_dir or default_state_dir()
    record = RunRecord(state_dir, run_id)
    from .engine.groups import GroupCoordinator

    options = RunOptions(run_id=run_id, run_dir=record.dir, check=check,
                         accept_new_host_keys=args.accept_new_host_keys,
                         leave_stopped=getattr(args, "leave_stopped", False), echo_output=args.verbose,
                         extra=extra, state_dir=Path(state_dir), retune=getattr(args, "retune", False),
                         groups=GroupCoordinator(shard_tuning=getattr(args, "shard_tuning", False),
                                                 tune_on=getattr(args, "tune_on", None)))
    record.write_json("run.json", {"run_id": run_id, "command": sys.argv, "inventory": str(args.inventory),
                                   "playbook": str(pb_path), "check": check, "hosts": [h.name for h in hosts]})
    old = _install_signal_handlers(options, console)
    all_recaps = {}
    try:
        with Reporter(console, verbose=args.verbose) as reporter:
            console.print(f"orch {playbook_name} run [bold]{run_id}[/] on {len(hosts)} host(s)"
                          + (" [cyan](check mode)[/]" if check else ""))
            engine = Engine(MODULES, options, reporter, record.emit)
            for play in plays:
                wanted = {h.name for h in inv.select(play.hosts)}
                play_hosts = [h for h in hosts if h.name in wanted]
                recaps = engine.run_play(play, play_hosts, effective_vars, serial=_serial(args.serial),
                                         forks=args.forks, max_fail_percentage=args.max_fail_percentage,
                                         any_errors_fatal=args.any_errors_fatal or None, order=args.order)
                all_recaps.update(recaps)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    result = {n: {"outcome": r.outcome, "cause": r.cause, "ok": r.ok, "changed": r.changed, "failed": r.failed,
                  "unreachable": r.unreachable, "skipped": r.skipped, "rescued": r.rescued, "summary": r.summary}
              for n, r in all_recaps.items()}
    record.write_json("recap.json", result)
    for n, r in all_recaps.items():
        record.write_json(f"hosts/{n}/result.json", result[n])
    record.close()
    console.print(recap_table(all_recaps))
    if not check:
        print_summary(console, all_recaps)
    console.print(f"run record: {record.dir}")
    if not check:
        from .report import report_after_run  # never raises

        report_after_run(record.dir, console)
    if args.json:
        print(json.dumps({"run_id": run_id, "run_dir": str(record.dir), "hosts": result}, indent=2, default=str))
    if options.cancel.is_set():
        return EXIT_INTERRUPTED
    return EXIT_FAILED if any(r.is_failure or r.outcome == "not started" for r in all_recaps.values()) else EXIT_OK


def cmd_config_names(args) -> int:
    """``orch config-names``: the same naming code the payload runs (remote.models/remote.naming)."""
    from remote.models import load_model_config, moe_shape
    from remote.naming import sglang_device_name

    cfg = load_model_config(args.model_config)
    shape = moe_shape(cfg, tp=args.tp, ep=args.ep, quantization=args.quantization, dtype=args.dtype,
                      disable_shared_experts_fusion=args.disable_shared_experts_fusion)
    names = shape.file_names(sglang_device_name(args.device_name))
    if args.json:
        print(json.dumps({"model": shape.to_dict(), "file_names": names}, indent=2))
    else:
        print(names["up"])
        print(names["down"])
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``orch`` console script."""
    from .engine.playbook import PlaybookError
    from .engine.templating import TemplateError
    from .inventory import InventoryError
    from .store import StoreError

    args = build_parser().parse_args(argv)
    try:
        if args.command == "tune":
            extra = {"service": args.service} if args.service else {}
            if args.regression_threshold is not None:
                extra["orch_regression_threshold"] = args.regression_threshold
            return run_playbook_command(args, "tune", extra, args.check)
        if args.command == "rollback":
            extra = {"rollback_to": args.to_run, **({"service": args.service} if args.service else {})}
            return run_playbook_command(args, "rollback", extra, args.check)
        if args.command == "recover":
            extra = {"recover_break_lock": args.break_lock, **({"service": args.service} if args.service else {})}
            return run_playbook_command(args, "recover", extra, args.check)
        if args.command == "runs":
            from .history import cmd_runs

            return cmd_runs(args)
        if args.command == "doctor":
            from .doctor import cmd_doctor

            return cmd_doctor(args)
        if args.command == "bench":
            from .bench_cmd import cmd_bench

            return cmd_bench(args)
        if args.command == "configs":
            from .configs_cmd import cmd_configs

            return cmd_configs(args)
        if args.command == "config-names":
            return cmd_config_names(args)
        if args.command == "report":
            from .report import cmd_report

            return cmd_report(args)
    except (InventoryError, PlaybookError, TemplateError, UsageError, StoreError) as exc:
        print(f"orch: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # payload-side naming errors (remote.protocol.PayloadError) and the like
        from remote.protocol import PayloadError

        if isinstance(exc, PayloadError):
            print(f"orch: error: {exc.msg}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
