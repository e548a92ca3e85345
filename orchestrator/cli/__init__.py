"""The ``orch`` command line: one module per command (Ansible's ``lib/ansible/cli/`` layout).

Commands are thin: they run a playbook through :func:`orchestrator.cli.run.run_playbook` (the
one entry point, with the signal handling) and print what the hosts report.

Exit status: 0 when every host ended well, 1 when a host failed or was unreachable,
2 for bad input (inventory, playbook, flags; every :class:`~orchestrator.errors.OrchError`
names what was wrong in one line), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import OrchError, UsageError
from .common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401 (the exit codes)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (an unknown flag, a missing or malformed value) are a
    :class:`~orchestrator.errors.UsageError` like every other bad input: one line naming the flag,
    exit status 2 (argparse's own ``error`` prints the usage text before it and exits). Sub-parsers
    are of this class too (``add_subparsers`` makes them with the parent's class)."""

    def error(self, message: str):
        raise UsageError(f"{message}; see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of ``orch`` (each command module adds its own sub-parser)."""
    from . import bench, config_names, configs, doctor, report, runs, tune

    ap = ArgumentParser(prog="orch", description="Retune the fused-MoE Triton kernels of inference servers across GPU hosts.")
    ap.add_argument("--version", action="version", version=f"orch {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    for mod in (tune, doctor, runs, bench, configs, report, config_names):
        mod.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``orch`` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except OrchError as exc:
        print(f"orch: error: {exc}", file=sys.stderr)
        return exc.exit_status


if __name__ == "__main__":
    sys.exit(main())
