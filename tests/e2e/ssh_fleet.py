"""Helpers for the fleet-SSH end-to-end tests (bastions, host keys, sshd without SFTP).

orch runs as a real subprocess with its own ``HOME`` (so ``~/.ssh/config``, ``~/.ssh/known_hosts``
and ``~/.ssh/id_*`` are the test's, never the machine's) and, through ``unshare --mount``, its own
``/etc/ssh`` (so ``/etc/ssh/ssh_known_hosts`` is the test's: orch reads the real path, and nothing
of the machine is changed or read).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from tests.e2e.helpers import inventory, orch, recap


def home(tmp: Path, name: str, ssh_config: str | None = None, files: dict | None = None) -> Path:
    """A fresh home folder ``tmp/name`` with ``.ssh/config`` (``ssh_config``) and more files in
    ``.ssh`` (``{name: text or Path to copy}``, mode 0600)."""
    h = tmp / name
    ssh = h / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    if ssh_config is not None:
        (ssh / "config").write_text(ssh_config)
    for fname, content in (files or {}).items():
        if isinstance(content, Path):
            shutil.copy(content, ssh / fname)
        else:
            (ssh / fname).write_text(content)
        os.chmod(ssh / fname, 0o600)
    return h


def etc_ssh(tmp: Path, name: str, known_hosts: str | None = None) -> Path:
    """A folder to mount over /etc/ssh for orch: no ssh_config, ``ssh_known_hosts`` = ``known_hosts``."""
    d = tmp / name
    d.mkdir(parents=True)
    if known_hosts is not None:
        (d / "ssh_known_hosts").write_text(known_hosts)
    return d


def run_orch(*args: str, state: Path, home_dir: Path, etc: Path, agent_sock: str | None = None):
    """``orch ARGS --json`` with ``HOME=home_dir``, ``/etc/ssh`` = ``etc`` (private mount), the
    ssh-agent at ``agent_sock`` or none. Returns (completed process, recap dict or None)."""
    prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
              'mount --bind "$0" /etc/ssh && exec "$@"', str(etc)]
    env = {"HOME": str(home_dir), "SSH_AUTH_SOCK": agent_sock or ""}
    proc = orch(*args, "--json", state_dir=state, env=env, prefix=prefix)
    try:
        res = json.loads(proc.stdout)
    except ValueError:
        res = None
    return proc, res


def check(inv: Path, state: Path, home_dir: Path, etc: Path, *flags: str, agent_sock: str | None = None):
    """``orch tune INV --service sglang-qwen --check`` (connects, reads the unit, pushes and checks the
    payload, probes): (process, this one host's recap entry or None)."""
    proc, res = run_orch("tune", str(inv), "--service", "sglang-qwen", "--check", *flags, state=state,
                         home_dir=home_dir, etc=etc, agent_sock=agent_sock)
    hosts = (res or {}).get("hosts") or {}
    return proc, (next(iter(hosts.values())) if len(hosts) == 1 else hosts or None)


def write_inventory(bed, path: Path, names: list[str], host_vars: dict | None = None, **group_vars) -> Path:
    """The bed's inventory (tests.e2e.helpers.inventory) with only the hosts ``names``; a value None
    in ``host_vars`` (applied to each host) or ``group_vars`` REMOVES that variable (to leave it to
    ~/.ssh/config or orch's default)."""
    inventory(bed, path, **{k: v for k, v in group_vars.items() if v is not None})
    data = yaml.safe_load(path.read_text())
    for group in data["all"]["children"].values():
        group["hosts"] = {n: hv for n, hv in group["hosts"].items() if n in names}
        for hv in group["hosts"].values():
            for k, v in (host_vars or {}).items():
                if v is None:
                    hv.pop(k, None)
                else:
                    hv[k] = v
        for k, v in group_vars.items():
            if v is None:
                group["vars"].pop(k, None)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sshd_log(h) -> str:
    """The host's sshd log (``sshd -D -e``, /var/log/sshd.log inside the host)."""
    return h.sh("cat /var/log/sshd.log", check=False).stdout


def events(res: dict) -> list[dict]:
    """The run's events (``events.jsonl`` of its run folder)."""
    return [json.loads(x) for x in (Path(res["run_dir"]) / "events.jsonl").read_text().splitlines()]


__all__ = ["home", "etc_ssh", "run_orch", "check", "write_inventory", "sshd_log", "events", "recap"]
