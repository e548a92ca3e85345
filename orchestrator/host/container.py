"""Acting on a container unit through its runtime (docker or podman), shared by the tasks.

A container unit's server (:class:`orchestrator.facts.container.ContainerRun`) runs inside the
image: its SGLang, Python and Triton are the image's, files written into a ``--rm`` container's
layer vanish at the next start, and its processes are the runtime's to end, not orch's by host
PID. So:

- the probe and the tuner run in a fresh ``--rm`` container of the same image, with the unit's
  own GPU, mount, environment and IPC options and the payload bind-mounted read-only
  (:func:`payload_container`);
- files are installed only into a host folder bind-mounted writable into the container, mapped
  back to the host through the mounts (:func:`install_target`); without one the host is refused
  before the stop, and the message gives the exact ``-v``/``-e`` to add;
- after ``systemctl stop`` the container must be gone (``RUNTIME ps -a --filter name=^NAME$``);
  one left is ended with ``RUNTIME stop`` and removed with ``RUNTIME rm`` (:func:`end_container`).

Every command is an argument list (the connection quotes each word).
"""

from __future__ import annotations

import re

from remote.engines import Engine, container_command, engine_named

from ..engine.results import TaskFailed
from ..facts.container import ContainerRun

#: options of the unit's run command NOT given to the payload's container: its identity, its
#: ports, how it attaches and restarts, its health checks (the payload container is a fresh,
#: unnamed-by-the-unit ``--rm`` one that publishes nothing)
NOT_COPIED = frozenset({
    "name", "detach", "publish", "publish-all", "rm", "restart", "interactive", "tty", "attach", "replace",
    "cidfile", "conmon-pidfile", "pidfile", "sdnotify", "entrypoint", "sig-proxy", "detach-keys", "hostname",
    "requires", "pod-id-file", "preserve-fd", "preserve-fds", "stop-signal", "stop-timeout", "health-cmd",
    "health-interval", "health-retries", "health-start-interval", "health-start-period", "health-timeout",
    "health-on-failure", "health-log-destination", "health-max-log-count", "health-max-log-size",
    "health-startup-cmd", "health-startup-interval", "health-startup-retries", "health-startup-success",
    "health-startup-timeout", "no-healthcheck", "label", "label-file", "annotation", "mac-address", "ip", "ip6",
    "network-alias", "net-alias", "pull", "quiet", "rmi",
})
#: folders suggested for the MoE configs when the unit mounts none (``{engine}``: the engine's name)
SUGGESTED_HOST_DIR = "/srv/{engine}-moe"
SUGGESTED_CONTAINER_DIR = "/{engine}-moe"
#: a container name both runtimes accept
NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")


def runtime_argv(run: ContainerRun, *words: str) -> list[str]:
    """``[RUNTIME, GLOBAL OPTIONS..., *words]``: a runtime command with the unit's own global
    options (``--root``, ``--host``), so it talks to the same storage or daemon."""
    return [run.runtime_path, *run.global_options, *words]


def copied_options(run: ContainerRun) -> list[str]:
    """The unit's run options the payload's container gets too (all but :data:`NOT_COPIED`), as
    ``--name=value`` words (a boolean as ``--name=true``), in the unit's order."""
    return [f"--{k}={v}" for k, v in run.options if k not in NOT_COPIED and v is not None]


def payload_container(run: ContainerRun, root: str, state_dir: str, name: str,
                      extra: list[str] | None = None) -> list[str]:
    """The words before the payload's own command: ``RUNTIME run --rm --name NAME [the unit's GPU,
    mount, env, IPC, network... options] -v ROOT:ROOT:ro -v STATE:STATE IMAGE`` (the payload
    mounted read-only at its host path; the state folder, where the tuner writes, writable;
    ``extra``: more run options). ``--sig-proxy`` (both runtimes' default) passes a SIGTERM of the client to the payload."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"not a container name: {name!r}")
    # an engine's own server image starts its server by its ENTRYPOINT (vLLM's vllm/vllm-openai): the
    # payload's command must run instead, so the entry point is cleared (docker-run(1)/podman-run(1):
    # an empty --entrypoint resets it)
    clear = ["--entrypoint="] if container_command(run.image, None, []) else []
    return runtime_argv(run, "run", "--rm", "--name", name, *copied_options(run), *clear,
                        "-v", f"{root}:{root}:ro", "-v", f"{state_dir}:{state_dir}", *(extra or []), run.image)


def require_name(run: ContainerRun, unit: str) -> str:
    """The container's ``--name``; :class:`TaskFailed` (before anything is stopped) when the run
    command gives none: orch checks the stop and ends leftovers by that name."""
    if not run.name:
        raise TaskFailed(f"unit {unit} runs a container without --name: orch checks that it is gone after the stop "
                         f"and ends a leftover through {run.runtime} by its name. Add --name (e.g. --name "
                         f"{unit.removesuffix('.service')}) to ExecStart; nothing was stopped")
    return run.name


def install_target(run: ContainerRun, container_dir: str, env: dict[str, str], engine: Engine | None = None) -> str:
    """The host folder where files for the container folder ``container_dir`` (where the server
    looks for its MoE configs) must be written so that they survive a restart: through a
    writable bind mount. Raises :class:`TaskFailed` naming the exact ``-v``/``-e`` to add when
    no writable bind mount holds it (``env``: the container's environment; ``engine``: whose
    config-dir variable moves the folder, ``Engine.config_dir_env``; None: the default engine)."""
    found = run.host_path(container_dir)
    if found is not None and not found[1].read_only:
        return found[0]
    engine = engine or engine_named(None)
    var = engine.config_dir_env
    host_dir, in_dir = SUGGESTED_HOST_DIR.format(engine=engine.name), SUGGESTED_CONTAINER_DIR.format(engine=engine.name)
    head = (f"the server reads its MoE configs from {container_dir} inside the {run.runtime} container, ")
    if found is not None:
        raise TaskFailed(head + f"through the read-only bind mount '{found[1].spec}': orch cannot write there. "
                         "Make that mount writable (drop ':ro'/readonly), or mount a writable host folder at "
                         f"{var}: -v {host_dir}:{in_dir} -e {var}={in_dir}; nothing was stopped")
    moe_dir = env.get(var) if var else None
    if moe_dir:
        fix = f"-v {host_dir}:{moe_dir} ({var} is {moe_dir})"
    else:
        fix = f"-v {host_dir}:{in_dir} -e {var}={in_dir}"
    raise TaskFailed(head + "which no host folder is bind-mounted to: a file written there lives in the "
                     f"container's own layer{' and vanishes at the next start (--rm)' if run.remove else ''}. "
                     f"Add {fix} to the unit's '{run.runtime} run' ({engine.config_dir_note()}), "
                     "reload systemd and restart the unit once; nothing was stopped")


def container_states(connection, run: ContainerRun, name: str) -> list[str]:
    """States of the containers named exactly ``name`` (``running``, ``exited``, ``created``,
    ...; [] when none), from ``RUNTIME ps -a --filter name=^/?NAME$ --format '{{.Names}} {{.State}}'``
    (both runtimes filter names by regular expression). Raises :class:`TaskFailed` when the
    runtime does not answer."""
    # docker before 18.09 matched "^" against its names' leading "/" (docker/cli#1201, moby/moby#37728):
    # "^/?" fits every docker and podman; its failure is raised below with the runtime's words
    res = connection.run(runtime_argv(run, "ps", "-a", "--filter", f"name=^/?{re.escape(name)}$",
                                      "--format", "{{.Names}} {{.State}}"), check=False, become=True, timeout=60)
    if not res.ok:
        raise TaskFailed(f"{run.runtime} ps failed: {(res.stderr or res.stdout).strip()[:300]}")
    out = []
    for line in res.stdout.splitlines():
        parts = line.split()
        if parts and parts[0].lstrip("/") == name:
            out.append(_state_word(parts[1] if len(parts) > 1 else "unknown"))
    return out


def _state_word(text: str) -> str:
    """A container state as docker prints ``{{.State}}`` (``running``, ``exited``); podman 4.3
    prints its status there (``Up 3 seconds ago``, ``Exited (0) ...``): ``Up`` is ``running``."""
    word = text.lower()
    return "running" if word == "up" else word


def end_container(connection, run: ContainerRun, name: str, timeout: float) -> list[str]:
    """End the container ``name`` through its runtime: ``RUNTIME stop -t TIMEOUT NAME`` (SIGTERM,
    then SIGKILL after TIMEOUT s, by the runtime) when it runs, then ``RUNTIME rm -f NAME`` so the
    unit's next ``run --name`` does not fail on the name. Returns what was done (``stopped``,
    ``removed``); [] when no such container exists. Raises :class:`TaskFailed` when it still
    exists afterwards. Never signals a host PID."""
    states = container_states(connection, run, name)
    if not states:
        return []
    done = []
    if any(s in ("running", "paused", "restarting", "stopping") for s in states):
        # a container that ended meanwhile makes stop or rm fail: what is left is read after each
        connection.run(runtime_argv(run, "stop", "-t", str(int(timeout)), name), check=False, become=True,
                       timeout=timeout + 60)
        done.append("stopped")
    if container_states(connection, run, name):  # rm of one gone meanwhile fails: read again below
        connection.run(runtime_argv(run, "rm", "-f", name), check=False, become=True, timeout=120)
        done.append("removed")
    left = container_states(connection, run, name)
    if left:
        raise TaskFailed(f"the {run.runtime} container {name} is still there ({', '.join(left)}) after "
                         f"'{run.runtime} stop' and '{run.runtime} rm -f'")
    return done


def payload_container_prefix(run_id: str) -> str:
    """The name prefix of run ``run_id``'s payload containers (probe, tune:
    :meth:`orchestrator.payload.client.PayloadClient.argv` names them ``orch-RUNID-...``, dots
    as dashes)."""
    return f"orch-{run_id.replace('.', '-')}-"


def end_payload_containers(connection, run: ContainerRun, run_id: str, wait: float) -> list[str]:
    """End run ``run_id``'s payload containers still running (a dropped link or a SIGKILL of the
    runtime client leaves a ``--rm`` container running) through the runtime: ``stop -t WAIT``,
    then ``rm -f``. Returns their names ([] when none)."""
    prefix = payload_container_prefix(run_id)
    # best effort (a rescue's cleanup): a runtime that does not answer leaves nothing to end here
    res = connection.run(runtime_argv(run, "ps", "-a", "--filter", f"name=^/?{re.escape(prefix)}",
                                      "--format", "{{.Names}}"), check=False, become=True, timeout=60)
    names = [n.lstrip("/") for n in res.stdout.split() if n.lstrip("/").startswith(prefix)] if res.ok else []
    for n in names:
        end_container(connection, run, n, wait)
    return names


def end_leftover_container(ctx, unit: str, timeout: float) -> list[str]:
    """For a container unit: make sure its container is gone (the unit inactive is not enough: a
    stop can return while the container still runs), ending one left through the runtime
    (:func:`orchestrator.host.container.end_container`: ``stop``, then ``rm -f``), never by host
    PID. Returns what was done ([] for a host unit or when the container was gone)."""
    facts = ctx.facts.unit
    if facts is None or facts.container is None or not facts.container.name:
        return []
    c = facts.container
    done = end_container(ctx.connection, c, c.name, timeout)
    if done:
        ctx.emit("container_ended", unit=unit, container=c.name, runtime=c.runtime, actions=done)
        ctx.say(f"the {c.runtime} container {c.name} of {unit} was still there after the unit stopped: "
                f"{' and '.join(done)} it through {c.runtime}")
    return done
