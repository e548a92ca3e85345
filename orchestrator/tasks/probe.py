"""Task ``probe``: ask the payload what the host is (GPUs, Triton, the engine, model shape, names).

Inventory variables override what is probed: ``orch_device_name`` (the device name in the
engine's file names), ``orch_model_config`` (model config path or repo id), ``orch_gpu_capability``
(GPU 0's compute capability, which decides the MoE runner the engine picks). The result is stored as
``orch_probe`` and written to the run record. Task ``plan`` derives what a tune would
write and, in check mode, says so.
"""

from __future__ import annotations

import json
import posixpath
import shlex

from remote.engines import Engine, MoeLogReport, MoeRunner, engine_named, probe_view
from remote.gpus import vendor_for
from remote.protocol import CONFIGS_DROPIN_NAME

from ..engine.results import TaskFailed, TaskResult
from ..engine.task import READ_ONLY, task
from ..facts.journal import last_start_log
from ..facts.plan import Plan
from ..facts.probe import ProbeFacts
from ..facts.schema import FactError
from ..facts.server_group import ServerGroup
from ..facts.unit import ServerArgs
from ..host.autotune import autotune_cache_root
from ..host.cdi import cdi_refusal
from ..host.container import install_target, require_name
from ..host.endpoint import find_endpoint
from ..host.hazards import bypass_reason, plan_refusal, root_hazards, server_triton_cache_dir
from ..payload.model_args import model_flags, payload_env
from ..records.layout import PROBE


@task("probe", rerun=True, check_mode=READ_ONLY, sets=("orch_probe", "orch_gpu_vendor"))
def probe(ctx) -> TaskResult:
    """Ask the host what it is (payload ``probe``, with the unit's engine, model, TP/EP and
    environment): GPUs, Triton, the engine and its config folder, the model's E/N/top-k and the
    exact file names the engine looks for, FlashInfer's version and the autotune caches under the
    unit's cache root (``Engine.autotune_cache_root``, as the server resolves it: SGLang's
    ``$SGLANG_CACHE_DIR``) (``orch_probe``), and the host's GPU vendor chosen from the device name
    its GPUs go by (``orch_gpu_vendor``, :func:`remote.gpus.vendor_for`).

    Refused when the tuner's work folder (``<orch_state_dir>/work``) is on a ``noexec`` mount
    (Triton could not load the kernels it compiles there), and, before anything runs, for a
    container unit whose GPUs come through a CDI spec that no longer fits the driver
    (:func:`orchestrator.host.cdi.cdi_refusal`: its next start would fail; the message gives the
    ``nvidia-ctk cdi generate`` command). Fails naming the field when the answer lacks one, or carries one this controller does not
    know (:class:`orchestrator.facts.probe.ProbeFacts`: the payload is this controller's own)."""
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        # a container whose GPUs come through a stale CDI spec would not start again (issue 32 row 7);
        # the probe's own container would fail the same way, so this is asked first
        stale = cdi_refusal(ctx.connection, unit.container)
        if stale:
            raise TaskFailed(stale)
    env = ctx.facts.environment
    engine = ctx.facts.engine
    flags = model_flags(ctx)
    if engine.config_dir_env and env.get(engine.config_dir_env):
        flags += ["--moe-config-dir", env[engine.config_dir_env]]
    if ctx.vars.get("orch_gpu_capability"):
        flags += ["--capability", str(ctx.vars["orch_gpu_capability"])]
    root = autotune_cache_root(ctx) if ctx.facts.unit is not None else None
    if root:
        flags += ["--autotune-cache-root", root]
    # the tuner's work folder holds its Triton cache and temp files: it must allow exec
    flags += ["--work-dir", posixpath.join(ctx.payload.state_dir, "work")]
    cache = server_triton_cache_dir(ctx.facts.unit)
    if cache:  # read only, for doctor's warning (issue 32 row 16); the tuner never uses it
        flags += ["--server-triton-cache", cache]
    ctx.payload.env.update(payload_env(ctx))
    data = ctx.payload.call("probe", flags, timeout=300)
    (ctx.host_dir / PROBE).write_text(json.dumps(data, indent=2, sort_keys=True))
    try:
        found = ProbeFacts.parse(data, "probe")
    except FactError as exc:
        raise TaskFailed(f"{exc}: the payload's probe answer does not fit this controller "
                         f"({ctx.host_dir / PROBE})") from None
    gpus, model = found.gpus, found.model
    where = (f"{len(gpus)}x {gpus[0].name}" if gpus else "no CUDA GPU visible") + (
        f" (files named for {found.device_name})" if found.device_name else "")
    return TaskResult.ok(f"{where}, triton {found.triton_version}, {engine.name} {found.engine.version}, "
                         f"E={model.E if model else None} N={model.N if model else None}",
                         facts={"orch_probe": found,
                                "orch_gpu_vendor": vendor_for(found.device_name or (gpus[0].name if gpus else None))},
                         **data)


def logged_lookups(rep: MoeLogReport | None) -> dict[str, str]:
    """role -> the path the server looked for first (``wanted``) in the lookup lines of one start's
    parsed log (``Engine.parse_log``; None: no start logged); the first line of each role counts. Pure."""
    out: dict[str, str] = {}
    for ln in rep.lines if rep else []:
        if ln.role and ln.wanted and ln.role not in out:
            out[ln.role] = ln.wanted
    return out


def reconcile(derived: dict[str, str], logged: dict[str, str],
              engine: Engine | None = None) -> tuple[dict[str, str], str, list[str]]:
    """The paths to write: ``derived`` (role -> path from the unit and the model config) checked
    against ``logged`` (role -> path the server's last start looked for, :func:`logged_lookups`).

    The engine's own lookup is ground truth: where the server logged one, its path is used. A different
    folder (a config-dir variable orch could not see) or a different device name is followed;
    a different shape (E, N, dtype, block, per-channel) means the files orch would tune are for
    another GEMM, so it raises :class:`TaskFailed` naming both, before anything is stopped.
    Returns ``(paths, source, notes)`` with ``source`` ``log`` or ``derived``; names are read by
    ``engine``'s rule (``Engine.parse_config_file_name``; None: the default engine). Pure.
    """
    parse_name = (engine or engine_named(None)).parse_config_file_name
    if not any(role in logged for role in derived):
        return dict(derived), "derived", []
    paths, notes = dict(derived), []
    for role, path in derived.items():
        want = logged.get(role)
        if want is None or want == path:
            continue
        mine, theirs = parse_name(posixpath.basename(path)), parse_name(posixpath.basename(want))
        shape = ("E", "N", "dtype", "block_shape", "per_channel_quant", "down")
        if mine is None or theirs is None or any(mine[k] != theirs[k] for k in shape):
            raise TaskFailed(f"the server's last start looked for {want}, but orch derives {path} from the unit "
                             "and the model config (another E, N or dtype): its tune would be for another GEMM. "
                             "Check the model config (orch_model_config), --tp/--ep and the quantization; nothing "
                             "was changed")
        paths[role] = want
        notes.append(f"{role}: using the server's own lookup {want} (orch derived {path})")
    return paths, "log", notes


def own_folder(ctx, name: str, install_dir: str) -> dict | None:
    """Where orch puts the files of a unit whose engine keeps no folder per Triton release (the
    probe's ``triton_folder`` is None) when the folder the server would read them from is the
    engine package's own (``engine.shipped_configs_root``) and the unit sets no config-dir variable
    (``Engine.config_dir_env``): a folder orch owns, ``<orch_state_dir>/configs-<unit>`` (created
    0755 by the install, removed by ``orch rollback``), which a drop-in gives the unit through that
    variable (``orch_plan.dropin``: ``env``, ``folder``, ``name``, ``text``). None otherwise (the
    install goes to ``install_dir``), and for a container unit (its package is the image's: the
    variable and a bind mount are the operator's, :func:`orchestrator.host.container.install_target`
    says which). Raises :class:`TaskFailed` (nothing stopped) for a system unit run as another
    user than root: orch's state folder is private (0700), that user could not read the files."""
    probe, engine, unit = ctx.facts.probe, ctx.facts.engine, ctx.facts.unit
    if probe is None or probe.triton_folder is not None or not engine.config_dir_env:
        return None
    if unit is None or unit.container is not None or ctx.facts.environment.get(engine.config_dir_env):
        return None
    shipped = probe.engine.shipped_configs_root if probe.engine is not None else None
    if not shipped or posixpath.normpath(install_dir) != posixpath.normpath(shipped):
        return None
    handle = ctx.facts.unit_handle(name)
    if unit.user not in ("", "root") and handle.scope == "system":
        raise TaskFailed(f"{install_dir} is the {engine.display_name} package's own folder, which orch does not write "
                         f"into, and the unit runs as {unit.user!r}, who cannot read orch's private state folder: set "
                         f"{engine.config_dir_env} in the unit to a folder {unit.user!r} can read and root can write; "
                         "nothing was stopped")
    folder = posixpath.join(ctx.payload.state_dir, f"configs-{handle.name}")
    text = (f"# written by orch (run {ctx.options.run_id}): the folder {engine.display_name} reads tuned MoE "
            "configs from; `orch rollback` removes it\n"
            f"[Service]\nEnvironment=\"{engine.config_dir_env}={folder}\"\n")
    return {"env": engine.config_dir_env, "folder": folder, "name": CONFIGS_DROPIN_NAME, "text": text}


def skip_reason(runner: MoeRunner, engine: Engine | None = None) -> str:
    """Why ``plan`` skips a server whose MoE runner reads no Triton config file (``runner``:
    ``Engine.moe_runner``; ``engine``: whose flag names it, None: the default), the same reason
    ``orch doctor`` gives. Pure."""
    if runner.source == "flag":
        why = f"{(engine or engine_named(None)).runner_flag} {runner.runner} does not read Triton MoE config files"
    else:
        why = runner.reason
    why += "; installing them would change nothing"
    if runner.autotunes:
        why += " (FlashInfer autotunes at start-up on SM90+)"
    return why + (f" ({runner.disagreement})" if runner.disagreement else "")


def multi_node_reason(server: ServerArgs, group: ServerGroup | None = None, coordinated: bool = False) -> str | None:
    """Why orch refuses a server spread over several hosts (``--nnodes N > 1``), or None. Pure.

    The nodes are ONE server: stopping any rank stops it, and each node loads the MoE configs of
    its own GPUs. A retune must stop every node, install on every node and start them together,
    ready through rank 0. Without ``group`` (a playbook run whose ranks were not found and do
    not meet) such a unit is refused, on every rank, before anything is stopped. ``group``: the server's
    ranks as found among the run's hosts (:mod:`orchestrator.facts.server_group`); its refusal
    (a rank missing from the run, ranks that disagree) is given first; with none and
    ``coordinated`` (the run's ranks meet at a :class:`orchestrator.fleet.ServerBarrier`) the
    server is tuned as one unit of work (docs/multi-node.md)."""
    nnodes = int(server.nnodes or 1)
    if nnodes <= 1:
        return None
    if group is not None and group.refusal:
        return group.refusal
    if group is not None and coordinated:
        return None
    return (f"multi-node server (--nnodes {nnodes}, this host is --node-rank {server.node_rank or 0}, "
            f"--dist-init-addr {server.dist_init_addr or '?'}): its {nnodes} nodes are one server, and orch "
            "retunes one host at a time, so it does not stop, tune, install and start the nodes together. Nothing "
            "was stopped. Tune on one node (`python -m remote tune`, or `orch tune` on a single-node unit of the "
            "same model, GPU and TP), `orch configs export`, install the files on every node, restart all ranks")


def steps_line(prepare: bool, capability: str | None) -> str:
    """What a tune run would do from here, for ``--check`` (playbooks/tune.yaml): with ``prepare``
    (``orch_prepare``) the candidates are compiled before the stop, so the unit is down for the GPU
    timing only (docs/tuning.md). Pure."""
    target = f"compute capability {capability}" if capability else "the GPU's compute capability"
    if prepare:
        return (f"would prepare the tune before the stop (compile its candidates for {target} on the host's CPUs "
                "while the unit serves: no CUDA context, niced, half the cores), then stop the unit, time the "
                "prepared kernels on the GPU, install, start and wait for readiness")
    return "would stop the unit, compile and time the candidates (orch_prepare is false), install, start and wait"


@task("plan", rerun=True, check_mode=READ_ONLY, sets=("orch_plan", "orch_endpoint"), aliases={"unit": "name", "service": "name"})
def plan(ctx, name: str, runner: str | None = None) -> TaskResult:
    """Decide what a tune does on this host (``orch_plan``): tune, or skip for a MoE runner that
    does not read Triton config files; which exact files it would write, and which exist.

    ``orch_plan.action`` is ``tune`` or ``skip`` (the server's MoE runner reads no Triton config
    file: the files would change nothing; nothing is stopped). The runner is SGLang's answer,
    :func:`remote.engines.sglang.runner.moe_runner`, from the unit, the probe and the last start's log
    (``orch_plan.runner``), the one ``orch doctor`` gives; when it cannot be told, the host is
    refused before anything is stopped. ``orch_plan.paths`` are the exact files that would be
    written: only those the host's SGLang release reads (a release before 0.5.5 reads no ``_down``
    file), named as the unit's last start looked them up when its log shows one
    (``orch_plan.names_source`` ``log``; else ``derived`` from the unit and the model config, see
    :func:`reconcile`).
    ``orch_plan.existing`` says which exist already. A server that never reads the files whatever
    its runner (``--enable-deterministic-inference`` on SGLang 0.5.5+, KTransformers' kt-kernel:
    :func:`orchestrator.host.hazards.bypass_reason`) is skipped with the reason, before anything
    else is asked. ``runner``: plan as if the unit ran with
    ``--moe-runner-backend runner`` (the runner trial's Triton candidate); the last start's log then
    names the config files it looked up but not this runner.
    Refuses (fails, before anything is stopped) a multi-node server (:func:`multi_node_reason`),
    a configs root holding a ``triton_*`` entry SGLang's version sort cannot parse, or an empty or
    relative ``SGLANG_MOE_CONFIG_DIR`` (:func:`orchestrator.host.hazards.plan_refusal`),
    a container unit without ``--name`` or whose config folder is on no writable host bind mount
    (:func:`orchestrator.host.container.install_target` gives the ``-v``/``-e`` to add), and
    a running server that answers at none of its addresses; ``orch_endpoint`` is where it answers
    (:func:`orchestrator.host.endpoint.find_endpoint`), used by readiness and the benchmarks.
    """
    probe_data = ctx.facts.probe or ProbeFacts.from_dict({})  # none ran: refused below, as a probe naming no folder
    server = ctx.facts.server
    group = ctx.facts.server_group
    why_not = multi_node_reason(server, group, coordinated=ctx.options.barrier is not None)
    if why_not:
        raise TaskFailed(why_not)
    engine = ctx.facts.engine
    backend = runner or server.moe_backend
    names = probe_data.file_names or {}
    install_dir = probe_data.install_dir
    if not install_dir or not names.get("up"):
        raise TaskFailed("probe did not report the config folder and file names")
    bypass = bypass_reason(engine, ctx.facts.unit, probe_data)
    if bypass:  # the server never reads the files (issue 32 row 13): nothing to tune, nothing stopped
        p = Plan(action="skip", reason=bypass, backend=backend, install_dir=install_dir)
        ctx.run.summary.plan = p
        return TaskResult.skipped(bypass, facts={"orch_plan": p}, **p.to_dict())
    text = last_start_log(ctx.connection, ctx.facts.unit_handle(name), engine)
    rep = engine.parse_log(text) if text is not None else None
    as_unit = runner is None or runner == server.moe_backend
    runner = engine.moe_runner(server, probe_view(probe_data), backend=backend, log=rep if as_unit else None)
    if not runner.known:
        # every signal the host gave, and what each said (issue 32 row 18)
        seen = ("the unit's log holds no server start" if rep is None else
                "the last start's log shows no Triton MoE lookup, no ready line and no runner choice")
        tried = "; ".join([seen] + list(probe_data.capability_tried))
        raise TaskFailed(f"cannot tell which MoE runner this server uses, so nothing was stopped: {runner.reason}. "
                         f"Tried: {tried}. Name it with {engine.runner_flag} in the unit, set orch_gpu_capability, "
                         "or start the unit once so its log shows its MoE config lookups")
    read = {k for k in names if probe_data.existing_file(k).read_by_engine}
    skipped_roles = sorted(set(names) - read)
    derived = {k: posixpath.join(install_dir, v) for k, v in names.items() if k in read}
    paths, source, notes = reconcile(derived, logged_lookups(rep), engine)
    existing = {k: probe_data.existing_file(k).in_installed_folder and paths[k] == derived[k] for k in paths}
    dirs = {posixpath.dirname(v) for v in paths.values()}
    if len(dirs) != 1:
        raise TaskFailed(f"the server looks for its up and down files in different folders: {sorted(dirs)}")
    install_dir = dirs.pop()
    dropin = own_folder(ctx, name, install_dir)
    if dropin is not None:  # the engine's package is never written where a folder can be given
        notes.append(f"{install_dir} is the {engine.display_name} package's own folder: orch writes into "
                     f"{dropin['folder']} and points the unit at it ({dropin['env']}, drop-in {dropin['name']})")
        install_dir = dropin["folder"]
        paths = {k: posixpath.join(install_dir, posixpath.basename(v)) for k, v in paths.items()}
        existing = {k: False for k in paths}
    action = "tune" if runner.reads_triton_configs else "skip"
    if action == "tune":  # issue 32 row 12: a root the engine's lookup crashes on, or reads from elsewhere
        refusal = plan_refusal(root_hazards(ctx.connection, engine, ctx.facts.unit, probe_data), install_dir,
                               probe_data.engine.configs_root)
        if refusal:
            raise TaskFailed(refusal)
    reason = "" if action == "tune" else skip_reason(runner, engine)
    same_dir = install_dir == probe_data.install_dir
    p = Plan(action=action, reason=reason, backend=backend, runner=runner.to_dict(), install_dir=install_dir,
             paths=paths, existing=existing, names_source=source, notes=notes,
             # None: a folder the server's log named, not probed (the install creates it when missing)
             install_dir_exists=bool(probe_data.install_dir_exists) if same_dir else None, dropin=dropin)
    ctx.run.summary.plan = p
    # an installed file is replaced only when the new bytes differ: the compare step (or the
    # install) tells, so the plan does not say "replace" before anything is known
    lines = [(f"installed {paths[k]} (replaced only if the new file differs)" if existing.get(k)
              else f"would write {paths[k]} (new)") for k in sorted(paths)]
    lines += [f"no {r} file: {engine.display_name} {probe_data.engine.version or ''} does not read one".replace(
        "  ", " ") for r in skipped_roles]
    if dropin is not None:
        lines.append(f"would write the drop-in {dropin['name']} ({dropin['env']}={dropin['folder']})")
    elif p.install_dir_exists is False:
        lines.append(f"would create {install_dir} (this Triton's folder is missing)")
    lines.append("names from the server's own lookup at its last start" if source == "log"
                 else "names derived from the unit and the model config (the server logged no lookup)")
    lines += notes
    lines.append(f"MoE runner: {runner.reason}"
                 + (f" (the log disagrees with orch's rule: {runner.disagreement})" if runner.disagreement else ""))
    if action == "skip":
        return TaskResult.skipped(reason, facts={"orch_plan": p}, **p.to_dict())
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        c = unit.container
        require_name(c, name)
        lines.append(f"{install_dir} in the {c.runtime} container {c.name} is the host folder "
                     f"{install_target(c, install_dir, unit.environment, engine)}")
    # a rank >= 1 of a multi-node server answers only /health (SGLang 0.5.23 srt/utils/common.py
    # launch_dummy_health_check_server)
    endpoint = find_endpoint(ctx, health_only=group is not None and group.rank > 0)
    ctx.run.summary.endpoint = endpoint
    lines.append(f"server answers at {endpoint.url} (from the {endpoint.via})" if endpoint.checked
                 else f"server not running: readiness will be asked at {endpoint.url} (from the {endpoint.via})")
    if ctx.check:
        cmd = shlex.join(ctx.facts.unit.exec_start if ctx.facts.unit is not None else [])
        lines = [f"check mode: unit runs `{cmd}`", f"MoE backend {backend}"] + lines
        lines.append(steps_line(bool(ctx.vars.get("orch_prepare", True)),
                                ctx.vars.get("orch_gpu_capability") or probe_data.capability))
    # one statement a line: at 80 columns each path then stands on its own line, whole
    return TaskResult.ok("\n".join(lines), facts={"orch_plan": p, "orch_endpoint": endpoint}, **p.to_dict())
