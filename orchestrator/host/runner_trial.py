"""Shared logic of the runner trial (``orch tune --moe-runners``) and of the rollback of a runner
change: the drop-in's text, ``systemctl daemon-reload`` with the NVIDIA container toolkit check, a
restart with readiness, the greedy answers of the output check, and FlashInfer's autotune cache.

The drop-in (``/etc/systemd/system/UNIT.service.d/orch-moe-runner.conf``, payload
``runner_change``) resets ``ExecStart=`` and repeats the unit's own command line (as its unit file
and drop-ins give it, variables and specifiers left for systemd) with the engine's runner flag set to
the candidate (``Engine.with_runner``: SGLang's ``--moe-runner-backend X`` instead of any such flag it
had; its parser takes the command line over a ``--config`` file, so the flag wins there too).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from remote.engines import Engine, engine_named
from remote.protocol import NO_MANIFEST

from ..engine.results import Cancelled, TaskFailed
from ..payload.client import PayloadFailed
from ..facts.bench import BenchResult
from ..facts.journal import mark_start, note_invocation, text_since, unit_log
from ..facts.plan import Endpoint
from ..facts.systemd_unit import Unit
from ..facts.unit import UnitError, parse_unit_settings, read_host_file
from ..records.layout import bench_file
from .autotune import autotune_cache_root, service_home, workdir_of
from .endpoint import ask, ask_json

#: the check prompts shipped with orch (one per line; ``#`` lines and blank lines skipped)
SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "runner_check_prompts.txt"
_VAR_WORD = re.compile(r"^\$(\w+|\{\w+\})$")
POLL_S = 1.0


#: a check prompt with a known answer: ``expect: VALUE | PROMPT`` (the file's format, docs/runners-trial.md)
_EXPECT = re.compile(r"^expect:\s*(?P<value>[^|]*?)\s*\|\s*(?P<prompt>.+)$")


def load_checks(path: str | None) -> tuple[list[str], list[str | None]]:
    """The check prompts from ``path`` (a file on the controller; None: :data:`SHIPPED_PROMPTS`) and,
    for each, its known answer (None for a prompt without one): ``(prompts, expected)``. A line
    ``expect: 391 | Question: What is 17 multiplied by 23? Answer:`` is the prompt after ``|``, whose
    answer must hold ``391`` (:func:`has_answer`); ``#`` lines and blank lines are skipped. Raises
    TaskFailed naming the file when it cannot be read, holds no prompt, or a known answer is empty."""
    p = Path(path) if path else SHIPPED_PROMPTS
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFailed(f"runner check prompts {p}: cannot read it ({exc})") from None
    prompts: list[str] = []
    expected: list[str | None] = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _EXPECT.match(line)
        if line.startswith("expect:") and (m is None or not m.group("value")):
            raise TaskFailed(f"runner check prompts {p} line {n}: want `expect: ANSWER | PROMPT`, got {line[:80]!r}")
        prompts.append(m.group("prompt").strip() if m else line)
        expected.append(m.group("value") if m else None)
    if not prompts:
        raise TaskFailed(f"runner check prompts {p}: no prompt in it (one per line)")
    return prompts, expected


def load_prompts(path: str | None) -> list[str]:
    """The check prompts' texts of :func:`load_checks`."""
    return load_checks(path)[0]


def has_answer(text: str, value: str) -> bool:
    """``value`` appears in the answer ``text`` as a whole word or number (``391`` in ``" 17 x 23 =
    391."``, not in ``"3910"``)."""
    return re.search(r"(?<![\w.])" + re.escape(value) + r"(?![\w])", text or "") is not None


def _word(w: str) -> str:
    """One ExecStart word as systemd reads it back: ``$VAR`` left bare (systemd splits it as it
    would in the unit), anything else quoted like a shell word (systemd accepts the same quotes)."""
    return w if _VAR_WORD.match(w) else shlex.quote(w)


def raw_exec_start(connection, unit: Unit) -> list[str]:
    """The unit's ExecStart words as its files give them (``systemctl cat``: unit file and drop-ins,
    the last non-empty ``ExecStart=`` winning), variables not expanded. Raises TaskFailed when none."""
    words = parse_unit_settings(unit.cat(connection).stdout).exec_start
    if not words:
        raise TaskFailed(f"{unit.name}: `systemctl cat` shows no ExecStart=; orch cannot write a drop-in for it")
    return words


def with_runner(words: list[str], runner: str, engine: Engine | None = None) -> list[str]:
    """``words`` with the MoE runner backend set to ``runner`` by ``engine``'s rule
    (``Engine.with_runner``; None: the default engine)."""
    return (engine or engine_named(None)).with_runner(words, runner)


def dropin_text(words: list[str], runner: str, run_id: str, engine: Engine | None = None) -> str:
    """The drop-in that starts the unit with the MoE runner backend ``runner`` (:func:`with_runner`)."""
    line = " ".join(_word(w) for w in with_runner(words, runner, engine))
    return (f"# written by orch (run {run_id}): MoE runner trial; `orch rollback` removes it\n"
            f"[Service]\nExecStart=\nExecStart={line}\n")


def daemon_reload(ctx, unit: Unit) -> dict:
    """``systemctl daemon-reload`` of the manager of ``unit`` (the system's through sudo; a user
    unit's ``systemctl --user daemon-reload`` as the login user), after the payload's
    ``reload-check``: where the NVIDIA
    container toolkit is installed and a container process holds a GPU, a reload can cut that
    container off its devices (NVIDIA/nvidia-container-toolkit #48), so it is refused (TaskFailed,
    nothing reloaded) unless ``orch_allow_daemon_reload``. Returns the check's answer."""
    check = ctx.payload.call("runner_change", ["--op", "reload-check"], timeout=120)
    if check.get("risky"):
        pids = ", ".join(f"{c['pid']} ({c['cmdline'][:60]})" for c in check.get("gpu_containers") or [])
        if not ctx.vars.get("orch_allow_daemon_reload"):
            raise TaskFailed("systemctl daemon-reload refused: the NVIDIA container toolkit is installed "
                             f"({', '.join(check.get('toolkit') or [])}) and GPU containers run ({pids}); a reload "
                             "can take their GPUs away (NVIDIA/nvidia-container-toolkit #48). Set "
                             "orch_allow_daemon_reload: true once they use CDI devices or can restart")
        ctx.emit("daemon_reload_risky", containers=check.get("gpu_containers"))
        ctx.say(f"WARNING: daemon-reload with GPU containers running ({pids}), allowed by orch_allow_daemon_reload")
    res = unit.daemon_reload(ctx.connection)
    if not res.ok:
        raise TaskFailed(f"{' '.join(unit.systemctl_argv('daemon-reload'))} failed: "
                         f"{(res.stderr or res.stdout).strip()[-300:]}")
    ctx.emit("daemon_reload", toolkit=check.get("toolkit"), scope=unit.scope)
    return check


class AutotuneHung(TaskFailed):
    """A start whose autotune reads a warm cache (``path``, a file that existed when it started) and
    logged nothing for ``quiet_s`` seconds since its start line, with no end line (issue 32 row 6)."""

    def __init__(self, unit: str, path: str, quiet_s: float):
        super().__init__(f"{unit}: the start-up autotune on the warm cache {path} logged nothing for "
                         f"{quiet_s:.0f} s and did not end (orch_autotune_stall_timeout)")
        self.path = path
        self.quiet_s = quiet_s


class _AutotuneWatch:
    """The stall bound of :func:`restart_ready`: the engine's reading of the start's log
    (``MoeLogReport.autotune``, :class:`remote.engines.AutotuneLog`): while the autotune is
    unfinished on a cache file that exists on the host (warm: the cache is written at its end), the
    log must grow at least every ``bound_s`` seconds."""

    def __init__(self, ctx, unit: Unit, bound_s: float):
        self.ctx, self.unit, self.bound_s = ctx, unit, bound_s
        self.warm: dict[str, bool] = {}
        self.size, self.since = -1, time.monotonic()

    def check(self, text: str) -> None:
        """Raise :class:`AutotuneHung` when the bound is past (module docstring)."""
        tune = self.ctx.facts.engine.parse_log(text).autotune
        if tune is None or not tune.unfinished or not tune.reuse or not tune.path:
            self.size = -1
            return
        if tune.path not in self.warm:
            try:
                self.warm[tune.path] = read_host_file(self.ctx.connection, tune.path, "autotune cache") is not None
            except UnitError:  # too large to read, or unreadable: it is there
                self.warm[tune.path] = True
        if not self.warm[tune.path]:
            return  # a cold autotune may be quiet for long: ready_timeout bounds it
        now = time.monotonic()
        if len(text) != self.size:
            self.size, self.since = len(text), now
        elif now - self.since > self.bound_s:
            raise AutotuneHung(self.unit.name, tune.path, now - self.since)


def restart_ready(ctx, unit: Unit, endpoint: Endpoint, start_timeout: float,
                  ready_timeout: float, autotune_stall_s: float | None = None) -> tuple[float, str]:
    """Restart ``unit`` on its own manager and wait until its server answers ``/health`` 200
    (readiness allows for FlashInfer's autotune pass: ``ready_timeout`` s). With
    ``autotune_stall_s``, a start whose autotune on a warm cache logs nothing for that many seconds
    and no end line raises :class:`AutotuneHung` (:class:`_AutotuneWatch`). Returns ``(seconds to
    ready, the log lines of this start: its journal and its log files)``. Raises TaskFailed with
    the log tail when the unit fails or is not ready in time."""
    ctx.run.start_mark = mark_start(ctx.connection, unit)  # what verify-log reads after this start
    mark = ctx.run.log_mark = ctx.run.start_mark.text
    # this run's restart from here on, even if a command after it fails (a timeout, a lost link):
    # the rescue (only_if_stopped_by_orch) then starts the unit again
    ctx.run.stopped_by_orch = ctx.run.started_by_orch = True
    # a failed restart is told from the unit's state below, with its log tail
    res = unit.systemctl(ctx.connection, "restart", timeout=start_timeout + 30, check=False)
    note_invocation(ctx.connection, ctx.run.start_mark, unit)  # verify-log keeps to this start's entries
    start = time.monotonic()
    deadline = ctx.deadline(ready_timeout)
    stage = "/v1/models"
    name = unit.name
    watch = _AutotuneWatch(ctx, unit, float(autotune_stall_s)) if autotune_stall_s else None
    while True:
        state = unit.is_active(ctx.connection)
        if state in ("failed", "inactive") or (not res.ok and state != "active"):
            tail = text_since(mark, unit_log(ctx.connection, unit)).strip().splitlines()[-8:]
            raise TaskFailed(f"{name} became {state} after the restart; log tail:\n" + "\n".join(tail))
        if watch is not None and stage == "/v1/models":
            watch.check(text_since(mark, unit_log(ctx.connection, unit)))
        status, last = ask(ctx, endpoint, stage)
        if status == 200:
            if stage == "/health":
                break
            stage = "/health"
            continue
        if ctx.cancelled():
            raise Cancelled()
        if time.monotonic() > deadline:
            raise TaskFailed(f"{name} not ready after {ready_timeout:.0f} s at {endpoint.url} (last: {last})")
        ctx.progress(stage=f"waiting for {stage}", done=0, total=0)
        time.sleep(POLL_S)
    return round(time.monotonic() - start, 1), text_since(mark, unit_log(ctx.connection, unit))


def logged_runner(text: str, engine: Engine | None = None) -> str | None:
    """The MoE runner backend this start's server-arguments line shows (``MoeLogReport.start_runner``
    of ``engine``'s log model; None when none)."""
    return (engine or engine_named(None)).parse_log(text).start_runner


def greedy_answers(ctx, endpoint: Endpoint, prompts: list[str], max_new_tokens: int,
                   concurrent: bool = False) -> list[dict]:
    """The server's greedy answers to ``prompts`` (the engine's generation request,
    ``Engine.generate_request``, read by ``Engine.parse_generation``): asked from the controller
    when the endpoint is reached there (:func:`orchestrator.host.endpoint.ask_json`), else through
    the payload's ``answers``. One prompt at a time (batch size 1), or with ``concurrent`` all of
    them sent at once, so the server decodes them as one batch (issue 32 row 5: a runner wrong only
    batched, or only alone). ``[{"text", "output_ids"}]`` in prompt order. Raises TaskFailed."""
    engine = ctx.facts.engine
    if endpoint.via == "controller":
        def one(p: str) -> dict:
            req = engine.generate_request(p, max_new_tokens)
            status, data, what = ask_json(ctx, endpoint, req.path, req.method, req.body, timeout=120)
            if status is None:
                raise TaskFailed(f"{req.path} at {endpoint.url}: {what}")
            if status != 200:
                raise TaskFailed(f"{req.path} at {endpoint.url} answered {status}")
            return engine.parse_generation(data).to_dict()

        if not concurrent:
            return [one(p) for p in prompts]
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            return list(pool.map(one, prompts))
    args = ["--url", endpoint.url, "--engine", engine.name] + (["--concurrent"] if concurrent else [])
    data = ctx.payload.call("answers", args, request={"prompts": prompts, "max_new_tokens": int(max_new_tokens)},
                            timeout=120 * (1 if concurrent else len(prompts)) + 60)
    return list(data.get("answers") or [])


def known_misses(expected: list[str | None], answers: list[dict]) -> list[int]:
    """The indexes of the prompts with a known answer (``expected``, :func:`load_checks`) whose
    answer does not hold it (:func:`has_answer`)."""
    return [i for i, (want, got) in enumerate(zip(expected, answers))
            if want is not None and not has_answer(got.get("text") or "", want)]


def agreement(reference: list[dict], candidate: list[dict]) -> float:
    """The share (0..1) of prompts whose two answers are identical: the output token ids when both
    have them, else the text."""
    if not reference:
        return 0.0
    same = 0
    for a, b in zip(reference, candidate):
        if a.get("output_ids") is not None and b.get("output_ids") is not None:
            same += a["output_ids"] == b["output_ids"]
        else:
            same += a.get("text") == b.get("text")
    return same / len(reference)


def bench(ctx, url: str, concurrency: list[int], input_len: int, output_len: int, label: str,
          level_timeout: float = 300) -> BenchResult:
    """The payload's ``bench`` (orch's own client) at ``url``, as the ``bench`` task runs it; the
    answer is written to the host's run folder as ``bench_<label>.json``. Raises TaskFailed."""
    conc = [int(c) for c in concurrency]
    args = ["--url", url, "--concurrency", ",".join(map(str, conc)), "--input-len", str(int(input_len)),
            "--output-len", str(int(output_len)), "--level-timeout", str(level_timeout), "--tool", "builtin",
            "--engine", ctx.facts.engine.name]
    data = ctx.payload.call("bench", args, timeout=float(level_timeout) * (len(conc) + 1) + 120, interruptible=True,
                            on_progress=lambda m: ctx.progress(stage=f"bench {label}", done=m.get("done", 0),
                                                               total=m.get("total", 0)))
    (ctx.host_dir / bench_file(label)).write_text(json.dumps(data, indent=2, sort_keys=True))
    return BenchResult.parse(data, "bench")


def autotune_cache_dir(ctx, unit: Unit | str) -> str:
    """The folder of the unit's server that holds its start-up autotune cache (SGLang: FlashInfer's
    ``<$SGLANG_CACHE_DIR>/flashinfer/autotune``): ``Engine.autotune_cache_dir`` of the cache root
    as the server resolves it (:func:`orchestrator.host.autotune.autotune_cache_root`, the root the
    probe and ``orch doctor`` give too), or the folder the server's environment names instead (vLLM:
    ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``). ``unit``: the unit's handle or name (its ``User=``'s home
    when the engine's default root or that folder needs one)."""
    engine = ctx.facts.engine
    root = autotune_cache_root(ctx, engine, unit)
    env, workdir = ctx.facts.environment, workdir_of(getattr(ctx.facts, "unit", None))
    # the engine may name another folder in the server's environment (vLLM's
    # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, `~` the server user's home)
    return (engine.autotune_cache_dir(root, environment=env, workdir=workdir)
            or engine.autotune_cache_dir(root, environment=env, workdir=workdir, home=service_home(ctx, unit)))


def backup_autotune_cache(ctx, unit: Unit) -> dict:
    """Back FlashInfer's autotune cache up into this run's folder on the host (payload
    ``runner_change --op cache-backup``), before a restart orch makes; kept in the summary."""
    data = ctx.payload.call("runner_change", ["--op", "cache-backup", "--run-id", ctx.options.run_id,
                                              "--state-dir", ctx.payload.state_dir,
                                              "--cache-dir", autotune_cache_dir(ctx, unit)], timeout=300)
    ctx.run.summary.autotune_cache = {"dir": data.get("dir"), "backed_up": len(data.get("files") or [])}
    return data


def restore_autotune_cache_exact(ctx, unit: Unit) -> dict:
    """FlashInfer's autotune cache back exactly as this run backed it up (payload ``runner_change
    --op cache-restore --exact``: changed files back to their bytes, the files this run's starts made
    removed; the run holds the host lock, so every start since the backup was its own), with the
    unit stopped. Returns the payload's answer."""
    return ctx.payload.call("runner_change", ["--op", "cache-restore", "--run-id", ctx.options.run_id,
                                              "--state-dir", ctx.payload.state_dir, "--cache-dir",
                                              autotune_cache_dir(ctx, unit), "--exact"], timeout=300)


def trial_group_key(ctx, candidates: list[str], settings: dict) -> str | None:
    """The key of the hosts whose runner trials would measure the same thing (``runner:<hash>``), or
    None when the probe does not say enough (then the host measures on its own). Hosts share it when
    the GPU kind and compute capability, the engine and its release (``<engine>_version``), the
    FlashInfer release, the model's MoE shape, the unit's model path, dtype, quantization, TP/EP/PP,
    what the engine says decides the runners' measurement (``Engine.trial_key``: for SGLang the
    attention DP and DP replicas, the all-to-all backend and runner flag, whether FlashInfer
    autotunes, the speculative-decoding and autotune flags,
    :func:`remote.engines.sglang.autotune.trial_key`), the candidates and the trial's ``settings``
    (benchmark levels and lengths, check prompts, thresholds) are the same: what the verdict
    depends on."""
    probe, server, engine = ctx.facts.probe, ctx.facts.server, ctx.facts.engine
    if probe is None or server is None or not probe.device_name:
        return None
    model = probe.model
    key = {
        "device_name": probe.device_name, "capability": probe.capability, f"{engine.name}_version": probe.engine.version,
        "flashinfer_version": probe.flashinfer_version,
        "shape": {k: getattr(model, k, None) for k in ("E", "N", "hidden", "topk", "dtype_selector", "block_shape",
                                                      "model_type")} if model is not None else None,
        "model_path": server.model_path, "dtype": server.dtype, "quantization": server.quantization,
        "tp": server.tp, "ep": server.ep, "pp": server.pp, **engine.trial_key(server),
        "candidates": list(candidates), "settings": settings,
    }
    return "runner:" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def triton_subrun(ctx) -> str:
    """The id of this run's sub-run that holds the Triton files a trial installs (``<run id>.triton``,
    :data:`remote.protocol.TRITON_SUBRUN_SUFFIX`): one manifest per folder a run changes."""
    from remote.protocol import TRITON_SUBRUN_SUFFIX

    return ctx.options.run_id + TRITON_SUBRUN_SUFFIX


def install_rules(ctx) -> dict:
    """The payload ``install`` request's engine rules for the Triton candidate's files (as ``orch
    tune``'s install gives them): ``any_dest_name`` for an engine that keeps no folder per Triton
    release (the probe's ``triton_folder`` None: vLLM's ``VLLM_TUNED_CONFIG_FOLDER`` has any name),
    ``extra_fields`` for an engine whose entries carry more keys (``Engine.config_extra_fields``)."""
    probe = ctx.facts.probe
    extra = list(ctx.facts.engine.config_extra_fields)
    return {**({"any_dest_name": True} if probe is not None and probe.triton_folder is None else {}),
            **({"extra_fields": extra} if extra else {})}


def install_triton_files(ctx, texts: dict[str, str], paths: dict[str, str], install_dir: str) -> list[str]:
    """Install the Triton config files ``texts`` (role -> JSON text) as ``paths`` (role -> the file the
    server reads, ``orch_plan.paths``) in ``install_dir``, as this run's sub-run :func:`triton_subrun`
    (payload ``install``: every file it replaces backed up and a manifest written before the first
    write, each file written atomically). The sub-run is recorded on the host (state ``installed``)
    at once, so ``orch recover`` restores it after a killed controller, and kept in
    ``ctx.run.sub_runs``, so the rescue does. For a container unit the files go to the host folder
    bind-mounted there (:func:`orchestrator.host.container.install_target`). Returns the paths as the
    server sees them. Raises TaskFailed (a role without a file) or PayloadFailed."""
    from .container import install_target
    from .records import records

    missing = sorted(set(paths) - set(texts))
    if missing:
        raise TaskFailed(f"no Triton {', '.join(missing)} file to install for the trial")
    write_dir = install_dir
    unit = ctx.facts.unit
    if unit is not None and unit.container is not None:
        write_dir = install_target(unit.container, install_dir, unit.environment, ctx.facts.engine)
    sub = triton_subrun(ctx)
    files = [{"name": paths[r].rsplit("/", 1)[-1], "content": texts[r], "role": r} for r in sorted(paths)]
    if sub not in ctx.run.sub_runs:
        ctx.run.sub_runs.append(sub)
    ctx.run.install_attempted = True
    ctx.payload.call("install", request={"run_id": sub, "state_dir": ctx.payload.state_dir, "action": "tune",
                                         "dest_dir": write_dir, "files": files, "create_dest": True,
                                         **install_rules(ctx)}, timeout=300)
    records(ctx).set_state(sub, "installed", {"action": "tune", "sub_run_of": ctx.options.run_id,
                                              "note": "the Triton files of a MoE runner trial"})
    return [paths[r] for r in sorted(paths)]


def restore_triton_files(ctx) -> list[dict]:
    """Put the files :func:`install_triton_files` replaced back to their bytes (payload ``restore`` of
    the sub-run; its host record then says ``restored``, so neither ``orch rollback`` nor ``orch
    recover`` touches it again) and drop it from ``ctx.run.sub_runs``. Returns the restore's files."""
    sub = triton_subrun(ctx)
    if sub not in ctx.run.sub_runs:
        return []
    try:
        data = ctx.payload.call("restore", ["--run-id", sub, "--state-dir", ctx.payload.state_dir], timeout=300)
    except PayloadFailed as exc:
        # no manifest: the install was refused before its first write (it writes the manifest
        # first), so the sub-run changed nothing to put back
        if exc.data.get("kind") != "not_found" or exc.data.get("detail") != NO_MANIFEST:
            raise
        data = {"files": []}
    ctx.run.sub_runs.remove(sub)
    ctx.emit("configs_restored", run_id=sub, files=data.get("files"))
    return list(data.get("files") or [])
