"""What the command modules share: exit statuses and the flags of commands that work on hosts."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..inventory.variables import KNOWN_VARS, BadValue
from .run import Batching

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_host_flags(p: argparse.ArgumentParser) -> None:
    """Flags of every command that works on inventory hosts."""
    p.add_argument("inventory", help="Ansible-style YAML inventory")
    p.add_argument("--service", required=False,
                   help="systemd unit running the inference server (default: each host's orch_service)")
    p.add_argument("--limit", "-l", help="host/group patterns: names, globs, !exclusions, &intersections")
    p.add_argument("--state-dir", type=Path, help="controller run records (default $XDG_STATE_HOME/orch)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="accept and remember unknown host keys (a changed key is always refused)")
    p.add_argument("--forks", type=int, default=5, help="hosts worked on in parallel within a batch (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="echo remote output, prefixed with the host")


def add_batch_flags(p: argparse.ArgumentParser) -> None:
    """Ansible's rolling-batch flags, for the commands that change hosts or load them."""
    p.add_argument("--serial", help="batch size: a number, a percentage, or a list like 1,5,25%%")
    p.add_argument("--max-fail-percentage", type=float, help="stop when a batch's failed share exceeds this")
    p.add_argument("--any-errors-fatal", action="store_true", help="stop after the batch where any host failed")
    p.add_argument("--order", choices=["inventory", "sorted", "reverse_sorted", "reverse_inventory", "shuffle"])


def batching(args):
    """The :class:`~orchestrator.cli.run.Batching` of a command's flags."""
    return Batching(serial=getattr(args, "serial", None), forks=args.forks,
                    max_fail_percentage=getattr(args, "max_fail_percentage", None),
                    any_errors_fatal=getattr(args, "any_errors_fatal", False) or None,
                    order=getattr(args, "order", None))


def checked_as(flag: str, value: Any, var: str) -> Any:
    """``value`` of ``flag`` checked by the rule of inventory variable ``var`` (the flag sets it,
    e.g. ``--regression-threshold`` = ``orch_regression_threshold``); None passes. Returns the
    normalised value; a :class:`UsageError` naming ``flag`` and what it must be otherwise."""
    spec = KNOWN_VARS[var]
    try:
        return spec.check(value)
    except BadValue:
        raise UsageError(f"{flag}: must be {spec.expect}, got {value!r}") from None


def positive_seconds(flag: str, value: float | None) -> float | None:
    """``value`` of ``flag`` when None or a finite number of seconds above 0; UsageError otherwise."""
    if value is not None and not 0 < value < math.inf:
        raise UsageError(f"{flag}: must be a positive number of seconds, got {value!r}")
    return value
