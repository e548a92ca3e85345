"""The root of every error the controller raises: :class:`OrchError`.

Every controller error class derives from :class:`OrchError` (the module that raises it
defines it, beside its rule):

- bad input, printed as one line and exit status 2: ``UsageError`` (command line, here),
  ``InventoryError`` (:mod:`orchestrator.inventory.errors`), ``PlaybookError``
  (:mod:`orchestrator.engine.playbook`), ``TemplateError`` (:mod:`orchestrator.templating`),
  ``SerialError`` (:mod:`orchestrator.engine.batching`), ``StoreError`` (:mod:`orchestrator.store`),
  ``ReportError`` (:mod:`orchestrator.report`), ``UnitError`` (:mod:`orchestrator.facts.unit`),
  ``ConfigFileError`` (:mod:`orchestrator.facts.server_config`);
- a host that failed or could not be reached, which the engine turns into a failed or
  unreachable host (it never reaches the command line as such): ``ConnectError`` and its
  subclasses (:mod:`orchestrator.connection.base`), ``TaskFailed`` and ``PayloadFailed``
  (:mod:`orchestrator.engine.results`, :mod:`orchestrator.payload.client`), ``Cancelled``.

The payload (``remote/``) has its own root, ``remote.protocol.PayloadError``: it imports
nothing from the controller. The command line turns one that reaches it into a
:class:`UsageError` naming what was wrong.

An exception class that derives from neither root never leaves the code that raises it: it is
declared with :func:`internal_error` (the payload's decorator, one rule for both roots), which
says where it is caught. ``tests/unit/cli/test_errors.py`` imports every module and fails on a
class that is neither.
"""

from __future__ import annotations

from remote.protocol import internal_error  # noqa: F401 (re-exported: the controller's classes use it)


class OrchError(Exception):
    """Base of every controller error. ``exit_status`` is what ``orch`` exits with when one
    reaches the command line (2: bad input, nothing was changed)."""

    exit_status = 2


class UsageError(OrchError):
    """Bad command-line input (a flag, a file named by a flag); one line, exit status 2."""
