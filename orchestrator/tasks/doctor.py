"""Task ``diagnose``: why a host does or does not run tuned fused-MoE kernels (read-only).

Verdicts (one per host):

- ``not-triton``: the unit's ``--moe-runner-backend`` does not read Triton config files
  (SGLang 0.5.23: only the ``triton`` runner does); ``orch tune`` would change nothing.
- ``broken``: a config file SGLang would read is invalid (the server crashes at start),
  or an unparsable ``configs/triton_*`` folder breaks SGLang's fallback sort (ValueError).
- ``restart-needed``: the files on disk differ from what the server logged at its last
  start, or a file it loaded was modified after the unit's main process started
  (configs are cached in-process: a restart picks them up).
- ``tuned``: the up (and down) file is in the installed Triton's folder, valid, and the
  last start logged ``Using MoE kernel config from <path>.`` for it.
- ``fallback``: found only in another Triton's folder, or the down file is missing
  (sub-optimal line at start).
- ``default``: no file anywhere: the built-in default config runs.
"""

from __future__ import annotations

import json
import posixpath

from ..engine.results import TaskResult
from ..facts.moe_log import parse_moe_log
from .probe import TRITON_BACKENDS

START_MARKER = "server_args=ServerArgs("
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: quantizations whose MoE does not run through the Triton fused_moe path on NVIDIA by default
NON_TRITON_QUANT = {"mxfp4", "modelopt_fp4", "w4afp8", "modelopt_fp8"}


def last_start_log(text: str) -> str | None:
    """Lines from the last server start (``server_args=ServerArgs(``) on; None if none logged."""
    idx = text.rfind(START_MARKER)
    if idx < 0:
        return None
    return text[text.rfind("\n", 0, idx) + 1:]


def _validate_remote(ctx, path: str) -> str | None:
    from remote.configio import validate_config
    from remote.protocol import PayloadError

    # config files are world-readable (orch installs them 0644): sudo only when the folder is not
    argv = ["head", "-c", str(MAX_CONFIG_BYTES + 1), "--", path]
    res = ctx.transport.run(argv, check=False, timeout=60)
    if not res.ok and "Permission denied" in res.stderr:
        res = ctx.transport.run(argv, check=False, become=True, timeout=60)
    if not res.ok:
        return f"cannot read: {res.stderr.strip()[:100]}"
    if len(res.stdout.encode()) > MAX_CONFIG_BYTES:
        return "larger than 4 MiB"
    try:
        validate_config(json.loads(res.stdout), posixpath.basename(path))
    except ValueError as exc:
        return f"not JSON: {exc}"
    except PayloadError as exc:
        prefix = posixpath.basename(path) + ": "  # validate_config names the source first
        return exc.msg[len(prefix):] if exc.msg.startswith(prefix) else exc.msg
    return None


def _run_that_wrote(ctx, paths: list[str]) -> str | None:
    """Id of the newest orch run on the host (not yet restored) that wrote one of ``paths``
    (read from the host's run records, ``python -m remote runs``), else None. ``orch rollback``
    can undo only such a run; any other invalid file is fixed by ``orch tune`` writing a valid one."""
    want = {p for p in paths if p}
    if not want:
        return None
    try:
        runs = ctx.payload.call("runs", ["--state-dir", ctx.payload.state_dir], timeout=60).get("runs") or []
    except Exception:  # noqa: BLE001 - advisory only: the verdict stands without it
        return None
    for r in runs:  # newest first
        if r.get("restored_at") or ((r.get("state") or {}).get("state") == "restored"):
            continue
        if any(c.get("path") in want for c in r.get("changed") or []):
            return r.get("run_id")
    return None


def _changed_since_start(ctx, main_pid: int, paths: list[str]) -> list[str]:
    """Those of ``paths`` whose mtime (``stat -c %Y``, s) is later than the start of the
    unit's main process (``ps -o etimes=`` subtracted from the host's ``date +%s``): files
    replaced after the last start, which the server (configs cached in-process) has not read.
    [] when it cannot be told (no main PID, a command failed)."""
    if not main_pid or not paths:
        return []
    res = ctx.transport.run(["sh", "-c", 'date +%s; ps -o etimes= -p "$1"; shift; stat -c %Y -- "$@"', "sh",
                             str(main_pid), *paths], check=False, timeout=30)
    vals = res.stdout.split()
    if not res.ok or len(vals) != 2 + len(paths) or not all(v.isdigit() for v in vals):
        return []
    started = int(vals[0]) - int(vals[1])
    return [p for p, m in zip(paths, vals[2:]) if int(m) > started]


def _holders(ctx, unit_pids: set[int]) -> list[dict]:
    """GPU holders now that are not processes of the unit (reap in check mode: kills nothing)."""
    data = ctx.payload.call("reap", ["--check"], timeout=120)
    cands = data.get("killed") or data.get("would_kill") or []
    return [p for p in cands if int(p.get("pid", 0)) not in unit_pids]


def _unit_pids(ctx, main_pid: int) -> set[int]:
    if not main_pid:
        return set()
    out = ctx.transport.run(["ps", "-e", "-o", "pid=,ppid="], check=False, timeout=30).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    seen, todo = set(), [main_pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(children.get(p, []))
    return seen


def diagnose(ctx, unit: str) -> TaskResult:
    """Classify the host; store the row in the host summary as ``doctor``."""
    facts = ctx.vars.get("orch_unit") or {}
    server = facts.get("server") or {}
    probe = ctx.vars.get("orch_probe") or {}
    backend = server.get("moe_runner_backend") or "auto"
    sg = probe.get("sglang") or {}
    names = probe.get("file_names") or {}
    existing = probe.get("existing") or {}
    model = probe.get("model") or {}
    install_dir = probe.get("install_dir") or ""
    notes: list[str] = list(probe.get("warnings") or [])
    row = {
        "gpus": [g.get("name") for g in probe.get("gpus") or []], "device_name": probe.get("device_name"),
        "capability": ((probe.get("gpus") or [{}])[0]).get("capability"),
        "triton_version": probe.get("triton_version"), "sglang_version": sg.get("version"),
        "configs_root": sg.get("configs_root"), "moe_config_dir": (facts.get("environment") or {}).get(
            "SGLANG_MOE_CONFIG_DIR"), "backend": backend, "tp": server.get("tp"), "ep": server.get("ep"),
        "E": model.get("E"), "N": model.get("N"), "dtype_selector": model.get("dtype_selector"),
        "file_names": names, "files": {}, "log": {}, "orphans": [], "unit_state": facts.get("active_state"),
        "installed_by_run": None,
    }
    log_text = ctx.transport.run(["journalctl", "-u", unit, "--no-pager", "-n", "20000"], check=False,
                                 become=True, timeout=60).stdout
    last = last_start_log(log_text)
    rep = parse_moe_log(last) if last is not None else None
    row["log"] = ({"loaded": rep.loaded, "fallback": rep.fallback, "default": rep.default,
                   "down_missing": rep.down_missing, "suboptimal": rep.suboptimal} if rep else None)
    row["orphans"] = _holders(ctx, _unit_pids(ctx, int(facts.get("main_pid") or 0)))

    # per file: where it is, is it valid
    invalid = []
    for role in ("up", "down"):
        ex = existing.get(role) or {}
        path = posixpath.join(install_dir, names[role]) if names.get(role) and install_dir else None
        info = {"name": names.get(role), "in_installed_folder": bool(ex.get("in_installed_folder")),
                "other_folders": [f for f in ex.get("folders") or [] if f != probe.get("triton_folder")],
                "sglang_would_load": ex.get("sglang_would_load"), "fallback_error": ex.get("fallback_error"),
                "error": None}
        target = ex.get("sglang_would_load")
        if target:
            info["error"] = _validate_remote(ctx, target)
            if info["error"]:
                invalid.append(f"{posixpath.basename(posixpath.dirname(target))}/{posixpath.basename(target)} "
                               f"is invalid (a start would crash): {info['error']}")
        info["path"] = path
        row["files"][role] = info

    up, down = row["files"]["up"], row["files"]["down"]
    if backend not in TRITON_BACKENDS:
        verdict = "not-triton"
        why = (f"--moe-runner-backend {backend}: Triton MoE config files are not used by this server; "
               "orch tune would change nothing")
        if backend.startswith("flashinfer"):
            cache = (facts.get("environment") or {}).get("SGLANG_CACHE_DIR") or "~/.cache/sglang"
            why += (f". FlashInfer autotunes at start-up on SM90+ (cache {cache}/flashinfer/autotune/)"
                    + ("; --disable-flashinfer-autotune is SET, so it runs untuned" if server.get(
                        "disable_flashinfer_autotune") else ""))
    elif backend == "auto" and (server.get("quantization") in NON_TRITON_QUANT):
        verdict = "not-triton"
        why = f"backend auto with --quantization {server.get('quantization')}: not the Triton fused_moe path"
    elif backend == "auto" and rep is not None and not rep.any_lookup:
        verdict = "not-triton"
        why = "backend auto: the last start logged no Triton MoE config lookup, so it resolved to another runner"
    elif invalid or any("unparsable" in str(f.get("fallback_error") or "") for f in (up, down)):
        verdict = "broken"
        why = "; ".join(invalid) or f"{up.get('fallback_error') or down.get('fallback_error')}"
    else:
        if up["in_installed_folder"] and down["in_installed_folder"]:
            disk = "tuned"
        elif up["sglang_would_load"]:
            disk = "fallback"
        else:
            disk = "default"
        if rep is None:
            logged = None
        elif up["sglang_would_load"] and up["sglang_would_load"] in rep.loaded and (
                not down["sglang_would_load"] or down["sglang_would_load"] in rep.loaded) and not rep.suboptimal:
            logged = "tuned"
        elif rep.loaded or rep.fallback or rep.down_missing:
            logged = "fallback" if (rep.fallback or rep.down_missing or rep.suboptimal) else "other"
        elif rep.default:
            logged = "default"
        else:
            logged = "none"
        newer = (_changed_since_start(ctx, int(facts.get("main_pid") or 0),
                                      [f["sglang_would_load"] for f in (up, down) if f["sglang_would_load"]])
                 if logged is not None and logged == disk else [])
        if logged is not None and logged != disk:
            verdict = "restart-needed"
            why = f"files on disk say {disk}, but the last start logged {logged}: restart the unit to load them"
        elif newer:
            verdict = "restart-needed"
            why = ("changed after the last start (the server caches configs): "
                   + ", ".join(posixpath.basename(p) for p in newer) + "; restart the unit to load them")
        else:
            verdict = disk
            why = {"tuned": "up and down files in the installed Triton folder, valid, loaded at the last start",
                   "fallback": ("only in " + ", ".join(up["other_folders"]) if not up["in_installed_folder"]
                                else f"down file missing: {down['name']}") + " (sub-optimal)",
                   "default": "no up file in any Triton folder: SGLang's default config (sub-optimal)"}[disk]
            if logged is None:
                notes.append("no server start found in the unit log")
    if backend == "auto" and verdict != "not-triton" and rep is None:
        notes.append("backend auto: no start logged, so it is unknown whether it resolves to the Triton runner")
    if row["unit_state"] and row["unit_state"] != "active":
        notes.append(f"unit is {row['unit_state']}: the verdict reflects the files and its last logged start")
    if verdict == "broken" and "unparsable" in why:  # the probe's warning says it again
        notes = [n for n in notes if "unparsable" not in n]
    if verdict == "broken":
        row["installed_by_run"] = _run_that_wrote(ctx, [f.get("sglang_would_load") for f in (up, down) if f["error"]])
    if row["orphans"]:
        notes.append(f"{len(row['orphans'])} GPU holder(s) outside the unit: "
                     + ", ".join(f"pid {p.get('pid')} ({str(p.get('cmdline') or '?')})" for p in row["orphans"])
                     + " (not killed; orch tune reaps them)")
    if sg.get("other_layout_configs_root"):
        notes.append(f"stale configs of another SGLang layout at {sg['other_layout_configs_root']}")
    row.update(verdict=verdict, why=why, notes=notes)
    ctx.state.setdefault("summary", {})["doctor"] = row
    return TaskResult.ok(f"{verdict}: {why}", **row)


diagnose.check_safe = True
