"""Push the payload to a host and call its commands (protocol v1, docs/protocol.md).

Module ``payload``: builds the tarball, uploads it to ``<state_dir>/payload/``,
verifies its sha256 on the host (``sha256sum``), unpacks it into a folder named by
the checksum (mode 0700) and checks ``python -m remote version`` answers with the
same payload version. On every later run the unpacked files are checked one by one
against the bundle's sha256 (changed, missing or added files: pushed again, event
``payload_tampered``). Later tasks call ``ctx.payload.call(...)``.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import tempfile
import threading
from typing import Any, Callable

from ..engine.results import Cancelled, TaskFailed, TaskResult
from ..payload_bundle import build_bundle

PROTO = 1


class PayloadFailed(TaskFailed):
    """The payload ended with an ``error`` line or crashed.

    ``kind`` is the protocol error kind (``bad_input``, ``not_found``, ``locked``,
    ``runtime``, or ``crash`` when no final line came); ``stderr_tail`` the last lines
    of its stderr (kept for the report).
    """

    def __init__(self, command: str, kind: str, msg: str, stderr_tail: str = "", detail: Any = None):
        text = f"payload {command} failed ({kind}): {msg}"
        if stderr_tail and kind in ("crash", "runtime"):
            text += "\n" + stderr_tail
        super().__init__(text, {"kind": kind, "stderr_tail": stderr_tail, "detail": detail})
        self.kind = kind


class PayloadClient:
    """Runs ``python -m remote <command>`` on a host with the unit's interpreter.

    ``root`` is the unpacked payload folder (``<state_dir>/payload/<sha12>``);
    ``env`` extra environment (``TRITON_INTERPRET=1`` on test beds).
    """

    def __init__(self, transport, interpreter: str, root: str, state_dir: str, env: dict[str, str] | None = None,
                 cancel: threading.Event | None = None):
        self.transport = transport
        self.cancel = cancel
        #: prefix of the ORCH_TAG of this run's long commands (see :func:`stop_payload`)
        self.run_tag = "orch"
        self.interpreter = interpreter
        self.root = root
        self.state_dir = state_dir
        self.env = dict(env or {})

    def argv(self, command: str, args: list[str], timeout: float | None = None, tag: str | None = None) -> list[str]:
        """The full argument list run on the host (quoted by the transport).

        ``tag`` (``ORCH_TAG=<random>``) marks the command line so an interrupted run can
        signal exactly this process (``pkill -f``), never another.
        """
        extra = dict(self.env)
        # the unit's own PYTHONPATH (where its sglang may live) follows the payload's root
        pythonpath = ":".join(p for p in (self.root, extra.pop("PYTHONPATH", "")) if p)
        # no __pycache__ in the verified payload tree (an added file counts as tampering)
        env = [f"PYTHONPATH={pythonpath}", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"]
        env += [f"{k}={v}" for k, v in sorted(extra.items())]
        if tag:
            env.append(f"ORCH_TAG={tag}")
        argv = ["env", *env, self.interpreter, "-m", "remote", command, *[str(a) for a in args]]
        if timeout:
            # a dropped SSH channel does not stop a remote command: bound it on the host too
            argv = ["timeout", "--kill-after=30", str(int(timeout)), *argv]
        return argv

    def push_request(self, name: str, data: dict) -> str:
        """Upload ``data`` as JSON into the payload's request folder (root-only: through sudo
        when the host uses ``ansible_become``); return its path."""
        req_dir = posixpath.join(self.state_dir, "payload", "requests")
        self.transport.run(["mkdir", "-p", req_dir], become=True)
        self.transport.run(["chmod", "700", req_dir], become=True)
        remote = posixpath.join(req_dir, f"{name}-{secrets.token_hex(4)}.json")
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(data, fh)
            local = fh.name
        try:
            self.transport.put(local, remote, become=True)
        finally:
            os.unlink(local)
        return remote

    def call(self, command: str, args: list[str] | None = None, *, request: dict | None = None,
             timeout: float | None = None, on_progress: Callable[[dict], None] | None = None,
             on_log: Callable[[dict], None] | None = None, become: bool = True,
             interruptible: bool = False) -> dict:
        """Run one payload command and return the ``data`` of its ``result`` line.

        ``timeout`` (s) bounds it on the host (``timeout``) and on the controller.
        ``interruptible`` (long commands: tune, bench): an operator interrupt sends SIGTERM
        to it on the host, so the rescue steps can run at once.
        Raises :class:`PayloadFailed` on an ``error`` line, a crash or a missing result;
        transport errors (:class:`HostUnreachable`, :class:`CommandTimeout`) pass through;
        :class:`Cancelled` when an operator interrupt stopped an ``interruptible`` command.
        """
        args = list(args or [])
        if request is not None:
            args += ["--request", self.push_request(command, request)]
        final: dict = {}

        def on_line(line: str) -> None:
            line = line.strip()
            if not line.startswith("{"):
                return
            try:
                msg = json.loads(line)
            except ValueError:
                return
            if msg.get("proto") != PROTO:
                return
            kind = msg.get("type")
            if kind == "progress" and on_progress:
                on_progress(msg)
            elif kind == "log" and on_log:
                on_log(msg)
            elif kind in ("result", "error"):
                final.update(msg)

        tag = None
        if interruptible and timeout:
            tag = f"{self.run_tag}.{secrets.token_hex(4)}"
        done = threading.Event()
        watcher = None
        if tag and self.cancel is not None and not self.cancel.is_set():
            watcher = threading.Thread(target=self._stop_on_cancel, args=(tag, done), daemon=True)
            watcher.start()
        try:
            res = self.transport.run(self.argv(command, args, timeout, tag), check=False, become=become,
                                     timeout=(timeout + 60) if timeout else None, on_stdout_line=on_line)
        finally:
            done.set()
            if watcher is not None:
                watcher.join(timeout=30)
        tail = "\n".join(res.stderr.strip().splitlines()[-20:])
        if final.get("type") == "result":
            return final.get("data") or {}
        if tag and self.cancel.is_set():  # we stopped it ourselves: say so, not "crash"
            raise Cancelled(f"payload {command} stopped: interrupted by the operator")
        if final.get("type") == "error":
            raise PayloadFailed(command, final.get("kind", "runtime"), final.get("msg", ""), tail, final.get("detail"))
        why = "killed by timeout" if res.exited in (124, 137) else f"exit {res.exited}"
        raise PayloadFailed(command, "crash", f"no result line ({why})", tail)


    def _stop_on_cancel(self, tag: str, done: threading.Event) -> None:
        """On operator interrupt, SIGTERM the tagged payload (``timeout`` forwards it to Python)."""
        while not done.wait(0.5):
            if self.cancel.is_set():
                # the `timeout` wrapper keeps the tag on its command line and forwards the signal
                self.transport.run(["pkill", "-TERM", "-f", f"ORCH_TAG={tag}"], check=False, become=True, timeout=30)
                return


def push(ctx, interpreter: str | None = None, state_dir: str | None = None) -> TaskResult:
    """Task ``payload``: upload, verify and unpack the payload; set ``ctx.payload``.

    ``interpreter`` defaults to ``ansible_python_interpreter`` or the unit's Python;
    ``state_dir`` to ``orch_state_dir`` (``/var/lib/orch``). Changed when the payload was
    not yet on the host.
    """
    t = ctx.transport
    interpreter = (interpreter or ctx.vars.get("orch_interpreter") or ctx.vars.get("ansible_python_interpreter")
                   or "/usr/bin/python3")
    if not interpreter:
        raise TaskFailed("no Python interpreter known for the payload (set ansible_python_interpreter)")
    state_dir = state_dir or ctx.vars.get("orch_state_dir") or "/var/lib/orch"
    bundle = build_bundle()
    base = posixpath.join(state_dir, "payload")
    if ctx.check:
        # check mode leaves nothing behind: a private temp folder, removed by ``cleanup``
        base = t.run(["mktemp", "-d", "/tmp/orch-check.XXXXXXXX"], become=True).stdout.strip()
        ctx.state["payload_tmp"] = base
    root = posixpath.join(base, bundle.short)
    env = {}
    if ctx.vars.get("orch_triton_interpret"):
        env["TRITON_INTERPRET"] = "1"
    client = PayloadClient(t, interpreter, root, state_dir, env, cancel=ctx.options.cancel)
    client.run_tag = ctx.options.run_id
    marker = posixpath.join(root, ".verified")
    changed = False
    present = t.run(["test", "-f", marker], check=False, become=True).ok
    if present:
        # verified at unpack; check again before every run that nothing was changed or added since
        bad = _tree_mismatch(t, root, bundle)
        if bad:
            ctx.emit("payload_tampered", root=root, files=bad[:20])
            ctx.say(f"payload at {root} differs from its checksummed bundle ({', '.join(bad[:3])}); pushing it again")
            present = False
    if not present:
        changed = True
        for d in ((base,) if ctx.check else (state_dir, base)):
            t.run(["mkdir", "-p", d], become=True)
            t.run(["chmod", "700", d], become=True)
        remote_tar = posixpath.join(base, bundle.filename)
        with tempfile.NamedTemporaryFile(suffix=".tar.gz", delete=False) as fh:
            fh.write(bundle.data)
            local = fh.name
        try:
            t.put(local, remote_tar, become=True)
        finally:
            os.unlink(local)
        got = t.run(["sha256sum", remote_tar], become=True).stdout.split()
        if not got or got[0] != bundle.sha256:
            t.run(["rm", "-f", remote_tar], check=False, become=True)
            raise TaskFailed(f"payload checksum mismatch on host: expected {bundle.sha256}, got {got[:1]}")
        t.run(["rm", "-rf", root], become=True)
        t.run(["mkdir", "-p", root], become=True)
        t.run(["chmod", "700", root], become=True)
        t.run(["tar", "-xzf", remote_tar, "-C", root, "--no-same-owner"], become=True)
        t.run(["touch", marker], become=True)
    ver = client.call("version", timeout=120)
    if ver.get("payload_version") != bundle.version or ver.get("proto") != PROTO:
        raise TaskFailed(f"payload on host answers {ver}, expected version {bundle.version} proto {PROTO}")
    ctx.payload = client
    ctx.state["payload_root"] = root
    ctx.state["payload"] = {"version": bundle.version, "sha256": bundle.sha256}
    return TaskResult("changed" if changed else "ok", f"payload {bundle.version} ({bundle.short}) at {root}",
                      {"root": root, "sha256": bundle.sha256, "version": bundle.version})


push.check_safe = True  # in check mode it works in a temp folder that ``cleanup`` removes


def bundle_file_hashes(bundle) -> dict[str, str]:
    """``{relative path: sha256 hex}`` of every file in the payload tarball (``remote/...``)."""
    import hashlib
    import io
    import tarfile

    out = {}
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[m.name] = hashlib.sha256(tar.extractfile(m).read()).hexdigest()
    return out


def _tree_mismatch(t, root: str, bundle) -> list[str]:
    """Paths under the unpacked payload ``root`` on the host that are changed, missing or extra
    (``sha256sum`` of every file there against :func:`bundle_file_hashes`); ``[]`` when intact."""
    want = bundle_file_hashes(bundle)
    res = t.run(["find", root, "-type", "f", "!", "-name", ".verified", "-exec", "sha256sum", "--", "{}", "+"],
                check=False, become=True, timeout=120)
    got = {}
    for line in res.stdout.splitlines():
        digest, _, path = line.partition("  ")
        got[posixpath.relpath(path, root)] = digest
    return sorted(p for p in set(want) | set(got) if want.get(p) != got.get(p))


def cleanup(ctx) -> TaskResult:
    """Task ``cleanup``: remove the temp payload folder of a check-mode run (if any)."""
    tmp = ctx.state.pop("payload_tmp", None)
    if tmp and ctx.transport is not None and tmp.startswith("/tmp/orch-check."):
        ctx.transport.run(["rm", "-rf", "--", tmp], check=False, become=True)
        return TaskResult.ok(f"removed {tmp}")
    return TaskResult.skipped("nothing to clean")


cleanup.check_safe = True


def tag_pattern(run_id: str) -> str:
    """``pgrep -f`` pattern (POSIX ERE) matching the command lines tagged ``ORCH_TAG=<run_id>.``
    by :meth:`PayloadClient.call` (the ``timeout`` wrapper of a long payload command). Raises
    ValueError for a run id that is not a plain name (recover reads run ids from a host's
    records: no pattern syntax may slip in)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", run_id or "") or run_id in (".", ".."):
        raise ValueError(f"not a run id: {run_id!r}")
    return "ORCH_TAG=" + run_id.replace(".", "[.]") + "[.]"


def stop_tagged(t, run_id: str, wait: float = 30) -> str | None:
    """Stop run ``run_id``'s tagged payload commands (tune, bench) still running on the host.

    SIGTERM to the tagged ``timeout`` wrappers (they forward it to the payload's Python, whose
    own command line carries no tag); after ``wait`` s, SIGKILL to their children and then to
    them (SIGKILL is not forwarded). Returns ``None`` when none ran, else ``"SIGTERM"`` or
    ``"SIGKILL"`` (what ended them). Raises ValueError as :func:`tag_pattern`.
    """
    import time

    pattern = tag_pattern(run_id)
    if not t.run(["pkill", "-TERM", "-f", pattern], check=False, become=True, timeout=30).ok:
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not t.run(["pgrep", "-f", pattern], check=False, become=True, timeout=30).ok:
            return "SIGTERM"
        time.sleep(1)
    pids = [p for p in t.run(["pgrep", "-f", pattern], check=False, become=True, timeout=30).stdout.split()
            if p.isdigit()]
    if pids:
        t.run(["pkill", "-KILL", "-P", ",".join(pids)], check=False, become=True, timeout=30)
    t.run(["pkill", "-KILL", "-f", pattern], check=False, become=True, timeout=30)
    return "SIGKILL"


def stop_payload(ctx, wait: float = 30) -> TaskResult:
    """Task ``stop_payload`` (rescue): end this run's tune/bench still running on the host.

    A dropped SSH link does not stop a remote command; before the unit is started again,
    the tuner must not hold the GPUs. Matches only ``ORCH_TAG=<run_id>.`` (this run's
    commands), see :func:`stop_tagged`.
    """
    if ctx.transport is None:
        return TaskResult.skipped("not connected")
    how = stop_tagged(ctx.transport, ctx.options.run_id, wait)
    if how is None:
        return TaskResult.ok("no payload of this run is running")
    return TaskResult.changed(f"stopped this run's payload ({how})")
