"""The ``orch`` command line: one module per command (Ansible's ``lib/ansible/cli/`` layout).

Commands are thin: they run a playbook through :func:`orchestrator.cli.run.run_playbook` (the
one entry point, with the signal handling) and print what the hosts report.

Exit status: 0 when every host ended well, 1 when a host failed or was unreachable,
2 for bad input (inventory, playbook, flags; every :class:`~orchestrator.errors.OrchError`
names what was wrong in one line), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import re
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
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:  # a misspelt command or choice: the closest one, as for an option (:func:`suggestion`)
            close = difflib.get_close_matches(m.group(1), re.findall(r"'([^']*)'", m.group(2)), n=1, cutoff=0.6)
            if close:
                message += f" (did you mean {close[0]}?)"
        raise UsageError(f"{message}; see '{self.prog} --help'")

    def parse_args(self, args=None, namespace=None):
        """argparse's ``parse_args``, whose error for an unknown option names the command it was
        given to and the closest option that command has (``--chek``: did you mean ``--check``?),
        as git does for a misspelt command (argparse of Python 3.11 suggests nothing)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(ns) or self
            raise UsageError(f"unrecognized arguments: {' '.join(extras)}{suggestion(parser, extras)}; "
                             f"see '{parser.prog} --help'")
        return ns

    def _command_parser(self, ns) -> argparse.ArgumentParser | None:
        """The sub-parser of the command ``ns`` was parsed for, or None."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(getattr(ns, action.dest, None) or "")
        return None


def options_of(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` (``--check``, ``-l``, ...)."""
    return [o for a in parser._actions for o in a.option_strings]


def suggestion(parser: argparse.ArgumentParser, words: list[str]) -> str:
    """`` (did you mean --check?)`` for the first of ``words`` that looks like a misspelt option
    of ``parser`` (difflib's closest match, ratio at least 0.75), else ``""``. The close choices of
    a misspelt command come from the same rule (:func:`main`)."""
    for word in words:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            close = difflib.get_close_matches(flag, [o for o in options_of(parser) if o.startswith("--")],
                                              n=1, cutoff=0.75)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


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
    from ..records.controller import quiet_library_logs

    quiet_library_logs()  # no library traceback on the operator's terminal (a run's debug.log keeps it)
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except OrchError as exc:
        print(f"orch: error: {exc}", file=sys.stderr)
        return exc.exit_status


if __name__ == "__main__":
    sys.exit(main())
