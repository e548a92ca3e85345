"""Tasks on the payload itself: ``payload`` (put it on the host, verified) and ``stop_payload``
(rescue: end this run's tune/bench still running there).

The mechanism lives in :mod:`orchestrator.payload` (bundle, deploy, client); these tasks decide
where and with which interpreter, and record what they did.
"""

from __future__ import annotations

import posixpath

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import AWARE, task
from ..facts.hostfiles import command_path
from ..host.container import end_payload_containers
from ..inventory.variables import var
from ..payload.bundle import build_bundle
from ..payload.client import PROTO, PayloadClient, stop_tagged
from ..payload.deploy import check_mode_folder, deploy, remove_check_mode_folder
from ..payload.model_args import unit_path, wrapper_activates


def _remove_check_folder(ctx) -> None:
    folder, ctx.run.payload_tmp = ctx.run.payload_tmp, None
    if folder and ctx.connection is not None:
        remove_check_mode_folder(ctx.connection, folder)
        ctx.emit("check_mode_folder_removed", folder=folder)


def absolute_interpreter(ctx, interpreter: str) -> str:
    """``interpreter`` as an absolute path on the host: a bare name (``python3``, as a unit's
    ``ExecStart=`` may give it) is looked up as systemd does, on the unit's PATH
    (:func:`orchestrator.payload.model_args.unit_path`), never on sudo's ``secure_path``.
    Raises TaskFailed when it is not found there."""
    if interpreter.startswith("/"):
        return interpreter
    found = command_path(ctx.connection, interpreter, unit_path(ctx))
    if found is None:
        raise TaskFailed(f"the interpreter {interpreter!r} is not on the unit's PATH ({unit_path(ctx)}); set "
                         "ansible_python_interpreter to its absolute path")
    return found


@task("payload", rerun=True, check_mode=AWARE)
def payload(ctx, interpreter: str | None = None, state_dir: str | None = None) -> TaskResult:
    """Upload, verify and unpack the payload; later tasks call it through ``ctx.payload``.

    ``interpreter``: the Python that runs it (default ``ansible_python_interpreter``, else the
    unit's own Python from ``unit_facts``, else ``/usr/bin/python3``), run under the unit's launch
    wrappers (``numactl``, ``taskset``, ``nice``, ``stdbuf``, ``conda run``, ``env``: the
    unit's ``Launch.wrapper``); ``state_dir``: the host's
    orch folder (default ``orch_state_dir``). In check mode it works in a private temp folder that
    is removed when the host's play ends, and reports ``ok`` (nothing of the host changed).
    Changed when the payload was not yet on the host (or was tampered with and pushed again).
    Fails when the unpacked payload does not answer with this payload version and protocol.
    For a container unit (``orch_unit.container``) the probe and the tuner run inside a fresh
    ``--rm`` container of the unit's image with its GPUs and mounts, the payload mounted
    read-only (:meth:`orchestrator.payload.client.PayloadClient.in_container`).
    Every command names the absolute interpreter and the unit's ``PATH`` (sudo's ``secure_path``
    would replace it), except under ``conda run``, which activates its environment and finds
    the environment's own interpreter on that environment's ``PATH``, as it does for the server.
    """
    conn = ctx.connection
    interpreter = (interpreter or ctx.facts.interpreter or ctx.vars.get("ansible_python_interpreter")
                   or "/usr/bin/python3")
    state_dir = state_dir or var(ctx.vars, "orch_state_dir")
    bundle = build_bundle()
    base = posixpath.join(state_dir, "payload")
    if ctx.check:
        base = check_mode_folder(conn)
        ctx.run.payload_tmp = base
        ctx.run.when_done(_remove_check_folder)

    def tampered(root: str, bad: list[str]) -> None:
        ctx.emit("payload_tampered", root=root, files=bad[:20])
        ctx.say(f"payload at {root} differs from its checksummed bundle ({', '.join(bad[:3])}); pushing it again")

    unit = ctx.facts.unit
    wrapper = unit.launch.wrapper if unit is not None and unit.launch is not None else []
    # `conda run` activates its environment, then finds the command on that environment's PATH
    # (the server's `python` is the environment's own): the interpreter is resolved there and the
    # activated PATH is kept, not replaced by the unit's
    activates = wrapper_activates(ctx)
    if not activates:
        interpreter = absolute_interpreter(ctx, interpreter)
    root, pushed = deploy(conn, bundle, base, state_dir, check=ctx.check, on_tampered=tampered)
    env = {"TRITON_INTERPRET": "1"} if var(ctx.vars, "orch_triton_interpret") else {}
    if not activates:
        env["PATH"] = unit_path(ctx)  # every command names its PATH: sudo's secure_path would replace it
    client = PayloadClient(conn, interpreter, root, state_dir, env, cancel=ctx.options.cancel, wrapper=wrapper)
    client.run_tag = ctx.options.run_id
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None and unit.server is not None:
        # the image's SGLang, Python and Triton: probe and tune inside it, with the unit's GPUs
        client.in_container(unit.container, unit.server.interpreter)
    ver = client.call("version", timeout=120)
    if ver.get("payload_version") != bundle.version or ver.get("proto") != PROTO:
        raise TaskFailed(f"payload on host answers {ver}, expected version {bundle.version} proto {PROTO}")
    ctx.payload = client
    ctx.run.payload = {"version": bundle.version, "sha256": bundle.sha256, "root": root}
    data = {"root": root, "sha256": bundle.sha256, "version": bundle.version}
    where = "a temp folder (check mode)" if ctx.check else root
    msg = f"payload {bundle.version} ({bundle.short}) at {where}"
    return TaskResult.changed(msg, **data) if pushed and not ctx.check else TaskResult.ok(msg, **data)


@task("stop_payload", rerun=True, check_mode=AWARE)
def stop_payload(ctx, wait: float = 30) -> TaskResult:
    """End this run's tune/bench payload commands still running on the host (rescue).

    A dropped SSH link does not stop a remote command; before the unit is started again, the
    tuner must not hold the GPUs. Matches only ``ORCH_TAG=<run_id>.`` (this run's commands,
    :func:`orchestrator.payload.client.stop_tagged`); ``wait`` is the seconds between SIGTERM and
    SIGKILL. For a container unit, this run's payload containers are then ended through the
    runtime (:func:`orchestrator.host.container.end_payload_containers`).
    """
    if ctx.connection is None:
        return TaskResult.skipped("not connected")
    if ctx.check:
        return TaskResult.ok("check mode: no payload of this run runs")
    how = stop_tagged(ctx.connection, ctx.options.run_id, wait)
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        ended = end_payload_containers(ctx.connection, unit.container, ctx.options.run_id, wait)
        if ended:
            return TaskResult.changed(f"stopped this run's payload containers {', '.join(ended)} through "
                                      f"{unit.container.runtime}")
    if how is None:
        return TaskResult.ok("no payload of this run is running")
    return TaskResult.changed(f"stopped this run's payload ({how})")
