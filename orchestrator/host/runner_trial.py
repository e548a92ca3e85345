"""Shared logic of the runner trial (``orch tune --moe-runners``) and of the rollback of a runner
change: the drop-in's text, ``systemctl daemon-reload`` with the NVIDIA container toolkit check, a
restart with readiness, the greedy answers of the output check, and FlashInfer's autotune cache.

The drop-in (``/etc/systemd/system/UNIT.service.d/orch-moe-runner.conf``, payload
``runner_change``) resets ``ExecStart=`` and repeats the unit's own command line (as its unit file
and drop-ins give it, variables and specifiers left for systemd) with ``--moe-runner-backend X``
instead of any such flag it had. SGLang's parser takes the command line over a ``--config`` file
(SGLang 0.5.23 ``srt/utils/server_args_config_parser.py`` ``ConfigArgumentMerger.merge_config_with_args``
puts the file's flags before the command line's, and argparse keeps the last), so the flag wins there too.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from pathlib import Path

import httpx

from remote.engines.sglang.moe_log import parse_moe_log

from ..engine.results import Cancelled, TaskFailed
from ..facts.bench import BenchResult
from ..facts.journal import mark_start, note_invocation, text_since, unit_log
from ..facts.plan import Endpoint
from ..facts.systemd_unit import Unit
from ..facts.unit import parse_unit_settings
from ..records.layout import bench_file
from .endpoint import ask

#: the check prompts shipped with orch (one per line; ``#`` lines and blank lines skipped)
SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "runner_check_prompts.txt"
_VAR_WORD = re.compile(r"^\$(\w+|\{\w+\})$")
POLL_S = 1.0


def load_prompts(path: str | None) -> list[str]:
    """The check prompts from ``path`` (a file on the controller; None: :data:`SHIPPED_PROMPTS`).
    Raises TaskFailed naming the file when it cannot be read or holds no prompt."""
    p = Path(path) if path else SHIPPED_PROMPTS
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFailed(f"runner check prompts {p}: cannot read it ({exc})") from None
    prompts = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise TaskFailed(f"runner check prompts {p}: no prompt in it (one per line)")
    return prompts


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


def with_runner(words: list[str], runner: str) -> list[str]:
    """``words`` without any ``--moe-runner-backend V`` / ``--moe-runner-backend=V`` and with
    ``--moe-runner-backend runner`` at the end."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w == "--moe-runner-backend":
            skip = True
            continue
        if w.startswith("--moe-runner-backend="):
            continue
        out.append(w)
    return out + ["--moe-runner-backend", runner]


def dropin_text(words: list[str], runner: str, run_id: str) -> str:
    """The drop-in that starts the unit with ``--moe-runner-backend runner``."""
    line = " ".join(_word(w) for w in with_runner(words, runner))
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


def restart_ready(ctx, unit: Unit, endpoint: Endpoint, start_timeout: float,
                  ready_timeout: float) -> tuple[float, str]:
    """Restart ``unit`` on its own manager and wait until its server answers ``/health`` 200
    (readiness allows for FlashInfer's autotune pass: ``ready_timeout`` s). Returns ``(seconds to
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
    while True:
        state = unit.is_active(ctx.connection)
        if state in ("failed", "inactive") or (not res.ok and state != "active"):
            tail = text_since(mark, unit_log(ctx.connection, unit)).strip().splitlines()[-8:]
            raise TaskFailed(f"{name} became {state} after the restart; log tail:\n" + "\n".join(tail))
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


def logged_runner(text: str) -> str | None:
    """The ``moe_runner_backend`` this start's server-arguments line shows (None when none)."""
    return parse_moe_log(text).start_runner


def greedy_answers(ctx, endpoint: Endpoint, prompts: list[str], max_new_tokens: int) -> list[dict]:
    """The server's greedy answers (payload ``answers``, or from the controller when the endpoint
    is reached there): ``[{"text", "output_ids"}]`` in prompt order. Raises TaskFailed."""
    if endpoint.via == "controller":
        out = []
        with httpx.Client(timeout=120) as client:
            for p in prompts:
                try:
                    r = client.post(f"{endpoint.url}/generate", json={"text": p, "sampling_params": {
                        "temperature": 0, "max_new_tokens": max_new_tokens}})
                except httpx.HTTPError as exc:
                    raise TaskFailed(f"/generate at {endpoint.url}: {type(exc).__name__}") from None
                if r.status_code != 200:
                    raise TaskFailed(f"/generate at {endpoint.url} answered {r.status_code}")
                data = r.json()
                data = data[0] if isinstance(data, list) and data else data
                out.append({"text": str(data.get("text", "")), "output_ids": data.get("output_ids")})
        return out
    data = ctx.payload.call("answers", ["--url", endpoint.url], request={
        "prompts": prompts, "max_new_tokens": int(max_new_tokens)}, timeout=120 * len(prompts) + 60)
    return list(data.get("answers") or [])


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
            "--output-len", str(int(output_len)), "--level-timeout", str(level_timeout), "--tool", "builtin"]
    data = ctx.payload.call("bench", args, timeout=float(level_timeout) * (len(conc) + 1) + 120, interruptible=True,
                            on_progress=lambda m: ctx.progress(stage=f"bench {label}", done=m.get("done", 0),
                                                               total=m.get("total", 0)))
    (ctx.host_dir / bench_file(label)).write_text(json.dumps(data, indent=2, sort_keys=True))
    return BenchResult.parse(data, "bench")


def autotune_cache_dir(ctx, unit: Unit) -> str:
    """FlashInfer's autotune cache folder of the unit's server: ``$SGLANG_CACHE_DIR/flashinfer/autotune``,
    ``SGLANG_CACHE_DIR`` defaulting to ``~/.cache/sglang`` of the unit's user (SGLang 0.5.23
    ``srt/environ.py`` ``SGLANG_CACHE_DIR``, ``srt/model_executor/runner/flashinfer_autotune.py``
    ``flashinfer_autotune_cache_path``). ``~`` is the unit's ``HOME``, else its ``User=``'s home
    (root's ``/root`` without one)."""
    env = ctx.facts.environment
    root = env.get("SGLANG_CACHE_DIR") or "~/.cache/sglang"
    if root.startswith("~"):
        home = env.get("HOME")
        if not home:
            user = unit.show(ctx.connection, "User").get("User", "").strip() or "root"
            # an unknown user has no passwd entry: the fallback below names its usual home
            got = ctx.connection.run(["getent", "passwd", user], check=False).stdout.split(":")
            home = got[5] if len(got) > 5 and got[5] else ("/root" if user == "root" else f"/home/{user}")
        root = home.rstrip("/") + root[1:]
    return root.rstrip("/") + "/flashinfer/autotune"


def backup_autotune_cache(ctx, unit: Unit) -> dict:
    """Back FlashInfer's autotune cache up into this run's folder on the host (payload
    ``runner_change --op cache-backup``), before a restart orch makes; kept in the summary."""
    data = ctx.payload.call("runner_change", ["--op", "cache-backup", "--run-id", ctx.options.run_id,
                                              "--state-dir", ctx.payload.state_dir,
                                              "--cache-dir", autotune_cache_dir(ctx, unit)], timeout=300)
    ctx.run.summary.autotune_cache = {"dir": data.get("dir"), "backed_up": len(data.get("files") or [])}
    return data


#: flags (besides those :class:`remote.engines.sglang.server_args.ServerArgs` reads) that change FlashInfer's
#: autotune of the server, so hosts that differ in them measure apart: ``--flashinfer-autotune-skip-ops``
#: (SGLang 0.5.23 ``srt/arg_groups/fields/exec_.py``; the ``skip_ops=`` part of the cache hash in
#: ``srt/model_executor/runner/flashinfer_autotune.py`` ``flashinfer_autotune_cache_path``)
TRIAL_FLAGS = ("--flashinfer-autotune-skip-ops",)
#: prefixes of the speculative-decoding flags (``srt/arg_groups/fields/spec.py``): the draft worker
#: autotunes with ``--speculative-moe-runner-backend`` / ``--speculative-moe-a2a-backend`` (else the
#: target's), its quantization enters its cache hash (``draft_quant=``), and the draft token count
#: sets the autotune shapes (``should_run_flashinfer_autotune``, ``max_speculative_num_draft_tokens``);
#: every one of them is kept, spelled as the unit spells it (``--no-`` forms of the boolean ones too)
SPECULATIVE_PREFIXES = ("--speculative-", "--no-speculative-")


def trial_flags(launch_args: list[str]) -> list[list[str]]:
    """The flags of ``launch_args`` (the server's arguments, ``--config`` merged: ``ServerArgs.launch_args``)
    that enter the trial group key besides the parsed sizes: :data:`TRIAL_FLAGS` and every flag
    starting with one of :data:`SPECULATIVE_PREFIXES`, each as ``[flag, value]`` (``value`` the next
    word when it is not itself a flag, ``""`` for a switch, the part after ``=`` for ``--flag=value``),
    sorted. Pure."""
    out: list[list[str]] = []
    for i, tok in enumerate(launch_args):
        name, eq, val = tok.partition("=")
        if not (name in TRIAL_FLAGS or name.startswith(SPECULATIVE_PREFIXES)):
            continue
        if not eq:
            nxt = launch_args[i + 1] if i + 1 < len(launch_args) else ""
            val = "" if nxt.startswith("--") else nxt
        out.append([name, val])
    return sorted(out)


def attention_dp(server) -> tuple[int, int]:
    """``(attention data-parallel size, data-parallel replicas)`` as SGLang 0.5.23 runs the server:
    ``--attn-dp-size`` (``attn_dp_size``, a part of FlashInfer's cache hash in
    ``flashinfer_autotune_cache_path``) and ``--dp-size``; the deprecated ``--dp-size N
    --enable-dp-attention`` is ``attn_dp_size N`` with one replica
    (``srt/arg_groups/parallel_hook.py`` ``_handle_deprecated_dp_attention``). Pure."""
    attn, dp = int(server.attn_dp_size or 1), int(server.dp or 1)
    if "--enable-dp-attention" in (server.launch_args or []) and attn == 1:
        return dp, 1
    return attn, dp


def trial_group_key(ctx, candidates: list[str], settings: dict) -> str | None:
    """The key of the hosts whose runner trials would measure the same thing (``runner:<hash>``), or
    None when the probe does not say enough (then the host measures on its own). Hosts share it when
    the GPU kind and compute capability, the SGLang and FlashInfer releases, the model's MoE shape,
    the unit's model path, dtype, quantization, TP/EP/PP, attention DP and DP replicas (:func:`attention_dp`), all-to-all backend and runner flag, whether FlashInfer autotunes (``--disable-flashinfer-autotune``,
    ``--enable-deterministic-inference``), the speculative-decoding and other flags of
    :func:`trial_flags`, the candidates and the trial's ``settings`` (benchmark levels and lengths,
    check prompts, thresholds) are the same: what SGLang's runner rules and FlashInfer's autotune key read
    (:mod:`remote.engines.sglang.runner`, :mod:`remote.engines.sglang.autotune`), and what the verdict depends on."""
    probe, server = ctx.facts.probe, ctx.facts.server
    if probe is None or server is None or not probe.device_name:
        return None
    model = probe.model
    key = {
        "device_name": probe.device_name, "capability": probe.capability, "sglang_version": probe.sglang.version,
        "flashinfer_version": probe.flashinfer_version,
        "shape": {k: getattr(model, k, None) for k in ("E", "N", "hidden", "topk", "dtype_selector", "block_shape",
                                                      "model_type")} if model is not None else None,
        "model_path": server.model_path, "dtype": server.dtype, "quantization": server.quantization,
        "tp": server.tp, "ep": server.ep, "pp": server.pp, "attn_dp_dp": list(attention_dp(server)),
        "a2a": server.moe_a2a_backend, "autotune_off": bool(server.disable_flashinfer_autotune),
        "deterministic": bool(server.enable_deterministic_inference), "flags": trial_flags(server.launch_args),
        "runner": server.moe_runner_backend or "auto", "candidates": list(candidates), "settings": settings,
    }
    return "runner:" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def triton_subrun(ctx) -> str:
    """The id of this run's sub-run that holds the Triton files a trial installs (``<run id>.triton``,
    :data:`remote.protocol.TRITON_SUBRUN_SUFFIX`): one manifest per folder a run changes."""
    from remote.protocol import TRITON_SUBRUN_SUFFIX

    return ctx.options.run_id + TRITON_SUBRUN_SUFFIX


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
        write_dir = install_target(unit.container, install_dir, unit.environment)
    sub = triton_subrun(ctx)
    files = [{"name": paths[r].rsplit("/", 1)[-1], "content": texts[r], "role": r} for r in sorted(paths)]
    if sub not in ctx.run.sub_runs:
        ctx.run.sub_runs.append(sub)
    ctx.run.install_attempted = True
    ctx.payload.call("install", request={"run_id": sub, "state_dir": ctx.payload.state_dir, "action": "tune",
                                         "dest_dir": write_dir, "files": files, "create_dest": True}, timeout=300)
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
    data = ctx.payload.call("restore", ["--run-id", sub, "--state-dir", ctx.payload.state_dir], timeout=300)
    ctx.run.sub_runs.remove(sub)
    ctx.emit("configs_restored", run_id=sub, files=data.get("files"))
    return list(data.get("files") or [])
