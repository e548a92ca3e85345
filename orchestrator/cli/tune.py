"""``orch tune``, ``orch rollback`` and ``orch recover``: the commands that change hosts.

Each runs its bundled playbook (``playbooks/tune.yaml``, ``rollback.yaml``, ``recover.yaml``;
``tune --playbook`` another) through :func:`orchestrator.cli.run.run_playbook`, prints the play
recap and the per-host summary, and writes the HTML report of the run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from .common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, add_batch_flags, add_host_flags, batching, checked_as
from .run import RunResult, check_run_id, recap_dict, run_playbook
from ..ui import make_console


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="retune every host's MoE configs and leave the servers running on them")
    add_host_flags(t)
    add_batch_flags(t)
    t.add_argument("--check", action="store_true", help="probe and print what would happen; change nothing")
    t.add_argument("--playbook", type=Path, help="playbook to run instead of the bundled playbooks/tune.yaml")
    t.add_argument("--leave-stopped", action="store_true", help="after a failure, do not start the unit again")
    t.add_argument("--regression-threshold", type=float,
                   help="roll back when output tok/s falls by more than this percent (default 3)")
    t.add_argument("--retune", action="store_true", help="tune again even if the store has a result for the key")
    t.add_argument("--tune-on", metavar="HOST", help="host that tunes for its group (default: the first in order)")
    t.add_argument("--shard-tuning", action="store_true",
                   help="split the batch sizes across the idle hosts of a group and merge the results")
    t.add_argument("--moe-runners", metavar="LIST",
                   help="runner trial: start these MoE runners (comma separated, or auto) and keep the fastest "
                        "whose answers agree (docs/runners-trial.md)")
    t.add_argument("--runner-prompts", type=Path, metavar="FILE",
                   help="runner trial: check prompts, one per line (default: the set shipped with orch)")
    t.add_argument("--run-id", help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_tune)

    r = sub.add_parser("rollback", help="restore the configs a run replaced, restart, verify")
    add_host_flags(r)
    add_batch_flags(r)
    r.add_argument("--to", dest="to_run", help="run id to undo (default: the most recent run on each host)")
    r.add_argument("--check", action="store_true")
    r.add_argument("--run-id", help=argparse.SUPPRESS)
    r.set_defaults(func=cmd_rollback)

    rc = sub.add_parser("recover", help="restore hosts a killed controller left stopped or half-changed")
    add_host_flags(rc)
    add_batch_flags(rc)
    rc.add_argument("--break-lock", action="store_true",
                    help="take over a host lock even if its holder may still run (you checked it is gone)")
    rc.add_argument("--check", action="store_true")
    rc.add_argument("--run-id", help=argparse.SUPPRESS)
    rc.set_defaults(func=cmd_recover)


def _finish(args, res: RunResult, console: Console, check: bool) -> int:
    """Print the recap (and summary), write the report, ``--json``; the exit status."""
    from ..report import report_after_run
    from ..ui import print_recap, print_summary, print_wrapped

    res.record.close()
    print_recap(console, res.recaps)
    if not check:
        print_summary(console, res.recaps)
    print_wrapped(console, f"run record: {res.record.dir}")
    if not check:
        report_after_run(res.record.dir, console)  # never raises
    if args.json:
        print(json.dumps({"run_id": res.record.run_id, "run_dir": str(res.record.dir),
                          "hosts": {n: recap_dict(r) for n, r in res.recaps.items()}}, indent=2, default=str))
    if res.cancelled:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if res.failed else EXIT_OK


def _run(args, playbook, extra: dict, **kw) -> int:
    console = make_console(stderr=True)
    res = run_playbook(playbook, args.inventory, limit=args.limit, service=args.service, extra=extra,
                       check=args.check, batching=batching(args), state_dir=args.state_dir,
                       accept_new_host_keys=args.accept_new_host_keys, run_id=args.run_id, verbose=args.verbose,
                       console=console, **kw)
    return _finish(args, res, console, args.check)


def cmd_tune(args) -> int:
    """``orch tune``: the whole retune (see the README)."""
    from ..fleet import GroupCoordinator

    extra = {}
    if args.regression_threshold is not None:
        extra["orch_regression_threshold"] = checked_as("--regression-threshold", args.regression_threshold,
                                                        "orch_regression_threshold")
    if args.runner_prompts is not None:
        extra["orch_runner_check_prompts"] = checked_as("--runner-prompts", str(args.runner_prompts),
                                                        "orch_runner_check_prompts")
    if args.moe_runners is not None:
        extra["orch_moe_runners"] = checked_as("--moe-runners", args.moe_runners, "orch_moe_runners")
        # one trial per tuning group (identical hosts): the others reuse its verdict
        return _run(args, args.playbook or "runner-trial", extra, label="tune", leave_stopped=args.leave_stopped,
                    retune=args.retune, fleet=GroupCoordinator(tune_on=args.tune_on))
    return _run(args, args.playbook or "tune", extra, label="tune", leave_stopped=args.leave_stopped,
                retune=args.retune, fleet=GroupCoordinator(shard_tuning=args.shard_tuning, tune_on=args.tune_on))


def cmd_rollback(args) -> int:
    """``orch rollback``: restore the files of the most recent (or ``--to``) run, restart, verify."""
    return _run(args, "rollback", {"rollback_to": check_run_id("--to", args.to_run)}, multi_node=True)


def cmd_recover(args) -> int:
    """``orch recover``: finish what a killed controller left on the hosts."""
    return _run(args, "recover", {"recover_break_lock": args.break_lock}, multi_node=True)
