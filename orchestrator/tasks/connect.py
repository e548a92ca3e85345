"""Task ``connect``: open the host's connection (SSH with verified host keys, or local)."""

from __future__ import annotations

import hashlib
import json

from ..connection import PrefixPrinter
from ..connection import connect as _connect
from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..inventory.variables import var


@task("connect", check_mode=READ_ONLY)
def connect(ctx, require_root: bool = True) -> TaskResult:
    """Open the host's connection from its inventory variables and check who orch is there.

    A connection the discovery pass left open for the host (``RunOptions.connections``,
    :func:`orchestrator.cli.run.find_servers`) is taken over instead of logging in again when it
    was opened from the same login variables (:func:`login_key`; play ``vars:`` may set them: then
    it is closed and the host logged in to again); it reconnects by itself if its link dropped since. Commands run as the login user (``ansible_user``). With ``ansible_become``, sudo is tried
    once here (``id -un`` as the become user) so a wrong or missing ``ansible_become_password``
    or missing sudo rights fail now, naming the host, before anything is read or changed.
    ``require_root`` (default): orch's state folder (``orch_state_dir``, root-only), the unit and
    the GPU processes need root, so a login user that is not root without ``ansible_become``
    fails here with the reason.

    Raises :class:`orchestrator.connection.HostUnreachable` (the host is then reported
    unreachable) on a refused or changed host key, failed auth or timeout;
    :class:`orchestrator.connection.BecomeFailed` when sudo refuses; :class:`TaskFailed` when
    root is needed and not available.
    """
    login = login_key(ctx.vars)
    if ctx.connection is None:
        # the discovery pass's login, when there was one (RunOptions.connections): one login per host
        handed = ctx.options.connections.pop(ctx.name, None)
        if handed is not None and getattr(handed, "orch_login", None) == login:
            handed.echo = PrefixPrinter(ctx.name, enabled=ctx.options.echo_output)
            ctx.connection = handed
        elif handed is not None:
            # opened from other variables (the play's `vars:` set a login variable the discovery
            # pass never saw): another endpoint, user or sudo; log in again as the play says
            try:
                handed.close()
            except Exception:  # noqa: BLE001 - a dead link's close must not fail the new login
                pass
    if ctx.connection is None:
        ctx.connection = _connect(ctx.name, ctx.vars, accept_new_host_keys=ctx.options.accept_new_host_keys,
                                 echo_output=ctx.options.echo_output,
                                 remember_host_keys=ctx.options.remember_host_keys)
        ctx.connection.orch_login = login
    t = ctx.connection
    # the host keys this login accepted (added to known_hosts, or in check mode trusted for the
    # run only); the discovery pass leaves them for the play's own connect to say
    notes = getattr(t, "host_key_notes", lambda clear=True: [])(clear=not ctx.options.keep_connections)
    keys = "".join(f"\n{n}" for n in notes)
    who = t.run(["id", "-un"], timeout=30).stdout.strip()
    if t.become:
        as_ = t.run(["id", "-un"], become=True, timeout=60).stdout.strip()
        if require_root and who != "root" and as_ != "root":
            raise TaskFailed(f"{ctx.name}: logged in as {who} and ansible_become_user is {as_}, not root: orch "
                             f"needs root on the host for {_state_dir(ctx)}, the unit and the GPU processes")
        return TaskResult.ok(f"connected as {who}, sudo to {as_} for the steps that need root{keys}", user=who,
                             become_user=as_, host_keys=notes)
    if require_root and who != "root":
        raise TaskFailed(f"{ctx.name}: logged in as {who}, not root, and ansible_become is not set: permission "
                         f"denied for {_state_dir(ctx)} (root-only), the unit and the GPU processes; set "
                         f"ansible_become: true (and ansible_become_password) for {who}")
    return TaskResult.ok(f"connected as {who}{keys}", user=who, host_keys=notes)


#: the variables a connection is built from (orchestrator.connection.connect and
#: orchestrator.connection.route.resolve_route read these and no others)
LOGIN_VARS = ("ansible_connection", "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
              "ansible_ssh_common_args", "orch_jump_host", "orch_jump_private_key_file", "ansible_become",
              "ansible_become_user", "ansible_become_password", "orch_known_hosts", "orch_connect_timeout",
              "orch_command_timeout", "orch_ssh_max_handshakes", "orch_ssh_max_sessions")


def login_key(variables: dict) -> str:
    """A digest (SHA-256 hex) of the host's :data:`LOGIN_VARS` in ``variables``: two passes with the
    same digest would open the same connection, so the play may take over the discovery pass's.
    A digest, so the become password is not kept in the clear a second time."""
    picked = {k: variables.get(k) for k in LOGIN_VARS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()


def _state_dir(ctx) -> str:
    return str(var(ctx.vars, "orch_state_dir"))
