"""PID 1 of one test-bed host (orch test bed). Standard library only.

Started by ``tests.testbed.bed`` as::

    ip netns exec NS unshare --mount --pid --uts --fork --mount-proc --propagation private \\
        PYTHON hostinit.py SPEC.json READY_FD

so it runs in the host's own network, mount, UTS and PID namespaces. It then
1. sets the host name and bind-mounts the host's own folders/files over the shared root
   file system (``spec["binds"]``: ``/etc/systemd/system``, ``/root/.ssh``, ``/opt/sglang``,
   ``/var/lib/orch``, ``/models``, ``/run``, ``/var/log``, ``/tmp``, ``/srv``,
   ``/usr/bin/systemctl``, ``/usr/bin/journalctl``), after an overlay on ``/usr/bin`` adding
   ``spec["usr_bin_overlay"]``'s programs (``[upper, work]``: the docker stand-in) when given;
2. mounts a private tmpfs on ``/dev`` holding the usual nodes (bound from the real ones) and
   the host's fake GPU files ``/dev/nvidia0..``, ``/dev/nvidiactl`` (plain files), so they exist
   only inside this host;
3. starts sshd (foreground child) with the host's own config and key, the units in
   ``spec["start_units"]`` via ``systemctl start`` and those of ``spec["user_units"]`` via
   ``systemctl --user start`` as ``spec["login_user"]`` (its own manager), and, when ``spec["strays"]``, two
   processes re-parented to this PID 1 that hold ``/dev/nvidia0``: a leftover SGLang scheduler
   (cmdline ``sglang::scheduler_TP0 ...``) and ``nvidia-persistenced ...``;
4. writes ``READY\\n`` (or ``FAILED <reason>\\n``) to READY_FD and reaps children until killed.
SIGTERM kills every process of the host, then exits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=sys.stderr, stderr=sys.stderr)


def _bind(src_fd: int, is_dir: bool, dst: str) -> None:
    """Bind the file/folder open as O_PATH ``src_fd`` over ``dst`` (immune to earlier binds
    hiding the source path, e.g. a work folder under /tmp once /tmp is bound). ``--no-canonicalize``:
    mount would otherwise resolve ``/proc/self/fd/N`` to its path name and bind whatever that name
    means now (a clone under /tmp, once /tmp is bound, is the host's own empty /tmp/<name>)."""
    if is_dir:
        os.makedirs(dst, exist_ok=True)
    elif not os.path.exists(dst):
        raise FileNotFoundError(f"mount point {dst} missing for a file bind")
    subprocess.run(["mount", "--bind", "--no-canonicalize", f"/proc/self/fd/{src_fd}", dst], check=True,
                   pass_fds=[src_fd], stdout=sys.stderr, stderr=sys.stderr)


def _setup_dev(hostdir: str, nvidia: list[str]) -> None:
    """Private /dev: tmpfs with the usual nodes bound from the real /dev, plus fake GPU files."""
    staging = os.path.join(hostdir, ".olddev")
    os.makedirs(staging, exist_ok=True)
    _run(["mount", "--rbind", "/dev", staging])
    _run(["mount", "-t", "tmpfs", "-o", "mode=755,nosuid", "orchtb-dev", "/dev"])
    for node in ("null", "zero", "full", "random", "urandom", "tty", "ptmx"):
        src = os.path.join(staging, node)
        if os.path.exists(src):
            open(os.path.join("/dev", node), "w").close()
            _run(["mount", "--bind", src, os.path.join("/dev", node)])
    os.makedirs("/dev/pts", exist_ok=True)
    _run(["mount", "--rbind", os.path.join(staging, "pts"), "/dev/pts"])
    os.makedirs("/dev/shm", exist_ok=True)
    _run(["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "orchtb-shm", "/dev/shm"])
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join("/dev", name))
    for name in nvidia:
        src = os.path.join(hostdir, "dev", name)
        dst = os.path.join("/dev", name)
        open(dst, "w").close()
        os.chmod(dst, 0o666)
        _run(["mount", "--bind", src, dst])
    _run(["umount", "-l", staging])


def _spawn_holder(python: str, argv0: str, extra_args: list[str], paths: list[str], comm: str) -> None:
    """Start ``holder.py`` as ``argv0``: it forks (re-parented to this PID 1) and holds ``paths`` open."""
    proc = subprocess.Popen([argv0, HOLDER] + extra_args + ["--comm", comm] + paths, executable=python,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=sys.stderr, close_fds=True)
    proc.wait()


def _systemctl(spec: dict, env: dict, unit: str, *args: str) -> list[str]:
    """``systemctl ARGS`` for ``unit``: the system manager's, or for a unit of ``spec["user_units"]``
    the login user's own (``systemctl --user``, run as that user with its home)."""
    if unit not in spec.get("user_units", []):
        return ["/usr/bin/systemctl", *args]
    user, home = spec["login_user"], spec["login_home"]
    return ["runuser", "-u", user, "--", "env", f"HOME={home}", f"USER={user}", f"LOGNAME={user}",
            f"PATH={env['PATH']}", "/usr/bin/systemctl", "--user", *args]
#: seconds without any log growth after which a unit's start counts as hung (tests/waiting.py's stall)
STALL_S = float(os.environ.get("ORCH_TEST_STALL_S") or 600)


def _logs_state() -> tuple:
    """Sizes of the host's logs (the units' journal, their StandardOutput= files): they grow while
    a unit starts."""
    out = []
    for d, _, files in os.walk("/var/log"):
        for n in files:
            try:
                out.append((n, os.stat(os.path.join(d, n)).st_size))
            except OSError:
                pass
    return tuple(sorted(out))


def _wait_port(port: int, timeout: float, address: str = "127.0.0.1") -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((address, port)) == 0:
                return True
        time.sleep(0.05)
    return False


def main(argv: list[str]) -> int:
    """Entry point (see module docstring). ``argv``: [SPEC.json, READY_FD]."""
    with open(argv[0]) as f:
        spec = json.load(f)
    ready = os.fdopen(int(argv[1]), "w")
    log = open(spec["init_log"], "a", buffering=1)
    os.dup2(log.fileno(), 2)
    sys.stderr = log

    def on_term(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    try:
        socket.sethostname(spec["name"])
        if spec.get("usr_bin_overlay"):
            # more programs in /usr/bin of this host only (the docker stand-in): an overlay whose
            # upper folder holds them, so this machine's own /usr/bin is left as it is
            upper, work = spec["usr_bin_overlay"]
            _run(["mount", "-t", "overlay", "orchtb-usr-bin", "-o",
                  f"lowerdir=/usr/bin,upperdir={upper},workdir={work}", "/usr/bin"])
        sources = [(os.open(src, os.O_PATH), os.path.isdir(src), dst) for src, dst in spec["binds"]]
        _setup_dev(spec["hostdir"], spec["nvidia"])
        for fd, is_dir, dst in sources:
            _bind(fd, is_dir, dst)
            os.close(fd)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8"}
        sshd_log = open("/var/log/sshd.log", "a")
        subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", spec["sshd_config"]], stdin=subprocess.DEVNULL,
                         stdout=sshd_log, stderr=sshd_log, env=env, close_fds=True)
        if not _wait_port(22, STALL_S):  # a hang guard: it listens as soon as it is scheduled
            raise RuntimeError(f"sshd did not listen on port 22 within {STALL_S:g} s (see /var/log/sshd.log)")
        for cmd in spec.get("setup_cmds", []):
            subprocess.run(cmd, shell=True, check=True, env=env, stdout=sys.stderr, stderr=sys.stderr)
        units = spec.get("start_units", []) + spec.get("user_units", [])
        for unit in units:
            subprocess.run(_systemctl(spec, env, unit, "start", unit), check=False, env=env, timeout=max(STALL_S, 900),
                           stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr)
        # strays come after the unit has opened its GPU (bound its port) or died, so that a
        # unit with ORCH_STANDIN_GPU_EXCLUSIVE starts cleanly at bed creation
        for unit in units:
            port = (spec.get("unit_ports") or {}).get(unit, spec.get("unit_port", 30000))
            address = (spec.get("unit_addresses") or {}).get(unit, "127.0.0.1")
            # no wall time: while the unit starts its logs grow; STALL_S of silence is a hang
            seen, moved = _logs_state(), time.monotonic()
            while not _wait_port(port, 0.5, address):
                state = subprocess.run(_systemctl(spec, env, unit, "is-active", unit), env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
                if state not in ("active", "activating"):
                    break
                now = _logs_state()
                if now != seen:
                    seen, moved = now, time.monotonic()
                elif time.monotonic() - moved > STALL_S:
                    break
        if spec.get("strays"):
            gpus = [os.path.join("/dev", n) for n in spec["nvidia"]]
            _spawn_holder(spec["python"], "sglang::scheduler_TP0", [], ["/dev/nvidia0", "/dev/nvidiactl"],
                          "sglang::scheduler_TP0")
            _spawn_holder(spec["python"], "nvidia-persistenced", ["--user", "nvidia-persistenced"], gpus,
                          "nvidia-persistenced")
    except BaseException as exc:  # tell the bed, then die (the PID namespace goes with us)
        import traceback

        traceback.print_exc()
        ready.write(f"FAILED {type(exc).__name__}: {exc}\n")
        ready.close()
        return 1
    ready.write("READY\n")
    ready.close()
    try:
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(1)
    except SystemExit:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
