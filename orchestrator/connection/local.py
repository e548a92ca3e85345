"""Local connection on Invoke's ``Context`` (``ansible_connection: local``).

Same ``run`` API as the SSH connection: Fabric's ``Connection`` subclasses Invoke's
``Context``, so one code path serves both.
"""

from __future__ import annotations

import os
import shutil

from .base import Connection


class LocalConnection(Connection):
    """Run commands on this machine through ``invoke.Context`` (``/bin/sh -c``)."""

    def __init__(self, host: str, **kw):
        super().__init__(host, **kw)
        import getpass

        import invoke

        self.login_user = getpass.getuser()
        self._ctx = invoke.Context()

    def open(self) -> None:
        """Nothing to open for a local host."""

    def _invoke_run(self, command: str, **kwargs):
        # Invoke starts the command in orch's own process group, so a terminal's Ctrl-C (SIGINT to
        # the whole group) would also kill it, e.g. the payload's install, or the rescue's restore
        # after a second Ctrl-C. Ignored signals stay ignored across exec (Python then keeps
        # SIGINT ignored too): orch alone handles the interrupt, as it does for SSH hosts.
        return self._ctx.run(f"trap '' INT QUIT; {command}", **kwargs)

    def _put_file(self, local_path: str, remote_path: str) -> None:
        """Copy ``local_path`` to ``remote_path`` (same machine)."""
        if os.path.abspath(local_path) != os.path.abspath(remote_path):
            shutil.copyfile(local_path, remote_path)

    def _get_file(self, remote_path: str, local_path: str) -> None:
        """Copy ``remote_path`` to ``local_path`` (same machine)."""
        if os.path.abspath(local_path) != os.path.abspath(remote_path):
            shutil.copyfile(remote_path, local_path)
