"""Entry point: ``python -m remote <command> [flags]``.

Each command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> dict`` (the ``data`` of the final ``result`` line); :data:`COMMANDS` maps
command names to those modules. Every command module is imported to build the parser, so
none may import torch or triton at import time. A module raises
``remote.protocol.PayloadError`` for errors the controller should show as they are.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from . import PAYLOAD_VERSION, PROTO
from .protocol import PayloadError, error, exit_code, result

# command name -> module (relative to this package)
COMMANDS = {
    "probe": ".probe",
    "names": ".names",
    "tune": ".tuning.command",
    "prepare": ".tuning.prepare",
    "reap": ".host.reap",
    "xid": ".host.xid",
    "port": ".host.port",
    "install": ".host.install",
    "restore": ".host.restore",
    "runner_change": ".host.runner_change",
    "answers": ".bench.answers",
    "runs": ".host.runs",
    "lock": ".host.lock",
    "deadman": ".host.deadman",
    "bench": ".bench.command",
    "reach": ".bench.reach",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (an unknown flag, a missing or malformed value) end the
    command like every other bad input: a :class:`~remote.protocol.PayloadError` ``bad_input``
    naming the flag, so the output is one ``error`` line (argparse's own ``error`` prints the usage
    text and no protocol line). Sub-parsers are of this class too."""

    def error(self, message: str):
        raise PayloadError("bad_input", f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: ``version`` and one sub-parser per :data:`COMMANDS` entry (a module that
    cannot be imported gives a command that reports it as ``runtime``)."""
    parser = ArgumentParser(prog="python -m remote", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="payload and protocol version")
    for name, modname in COMMANDS.items():
        try:
            mod = importlib.import_module(modname, __package__)
        except ImportError as exc:  # a command whose module is absent in this build
            p = sub.add_parser(name, help=f"(unavailable: {exc})")
            p.set_defaults(_unavailable=str(exc))
            continue
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0] if mod.__doc__ else None)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run one command, print its protocol lines; return the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except PayloadError as err:
        error(err)
        return exit_code(err)
    if args.command == "version":
        result({"payload_version": PAYLOAD_VERSION, "proto": PROTO})
        return 0
    if getattr(args, "_unavailable", None):
        err = PayloadError("runtime", f"command {args.command} unavailable: {args._unavailable}")
        error(err)
        return exit_code(err)
    try:
        data = args._run(args)
    except PayloadError as err:
        error(err)
        return exit_code(err)
    except Exception as exc:  # crash: report it, keep the traceback on stderr
        traceback.print_exc()
        err = PayloadError("runtime", f"{type(exc).__name__}: {exc}")
        error(err)
        return 1
    result(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
