"""vLLM's start-up log as orch reads it: where a start begins, its MoE config lookups and its MoE
backend line (standard library only).

vLLM 0.32.0-0.34.0:

- a start: the API server logs ``vLLM server version X, serving model Y`` (``VLLM_DISABLE_LOG_LOGO=1``
  or no formatter), else the logo whose line holds ``version X`` (``entrypoints/common/startup.py``
  in 0.33.0/0.34.0, ``entrypoints/serve/utils/api_utils.py`` in 0.32.0 ``log_version_and_model``),
  at INFO; :data:`START_MARKERS`;
- ready: ``Starting vLLM server on <address>`` (``entrypoints/launchers/api_server/entry.py``),
  logged once the engine is up, just before uvicorn serves; :data:`READY_LINE`;
- lookups (:mod:`remote.engines.vllm.lookup`): ``Using configuration from <path> for MoE layer.``
  (INFO) and ``Using default MoE config. Performance might be sub-optimal! Config file not found at
  <p1>, <p2>`` (WARNING; ``p1`` the ``VLLM_TUNED_CONFIG_FOLDER`` path when set). One file serves
  both GEMMs, so every lookup line is the ``up`` role's, but for 0.34.0's ``_down.json``;
- the MoE backend (:func:`remote.engines.vllm.runner.parse_backend_line`): ``Using <backend>
  <Format> MoE backend ...`` at INFO.

The level: ``--log-level`` (or ``VLLM_LOGGING_LEVEL``) above INFO hides the start, the loaded
lines and the backend line; the default line is WARNING and stays.
"""

from __future__ import annotations

import re

from ..records import MoeLogLine, MoeLogReport, RunnerLine
from .lookup import parse_line
from .runner import backend_flag, parse_backend_line

#: what opens a start in the log (either form of ``log_version_and_model``)
START_MARKERS = ("vLLM server version ",)
_LOGO_VERSION = re.compile(r"█\s+version\s+\S+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: the line logged once the server serves HTTP
READY_LINE = "Starting vLLM server on "
#: levels above INFO (``--log-level`` takes Python's names, any case)
QUIET_LEVELS = frozenset({"warning", "error", "critical"})
#: the name of the MoE backend in the records (``--moe-backend``'s server argument)
RUNNER_FIELD = "moe_backend"


def _start_offsets(text: str) -> list[int]:
    plain = _ANSI.sub(lambda m: " " * len(m.group(0)), text)  # same length: offsets stay valid
    found = [plain.rfind(m) for m in START_MARKERS]
    logo = list(_LOGO_VERSION.finditer(plain))
    if logo:
        found.append(logo[-1].start())
    return [i for i in found if i >= 0]


def last_start_at(text: str) -> int:
    """Offset in ``text`` of the line that opens the last server start (the version line, or the
    line of the logo's first row, which carries the logger's prefix), or -1 when none."""
    found = _start_offsets(text)
    if not found:
        return -1
    idx = max(found)
    line_start = text.rfind("\n", 0, idx) + 1
    if not any(text[idx:].startswith(m) for m in START_MARKERS):
        # the logo: the logger's prefix line opens it, three lines up (" \n  █ ... \n  ▄▄ ... version")
        for _ in range(2):
            prev = text.rfind("\n", 0, max(0, line_start - 1)) + 1
            line_start = prev
    return line_start


def role_of(path: str) -> str:
    """``down`` for 0.34.0's ``..._down.json`` (``get_config_file_name(..., down=True)``), else ``up``."""
    return "down" if path.endswith("_down.json") else "up"


def parse_moe_log(text: str) -> MoeLogReport:
    """One start's log as a :class:`~remote.engines.records.MoeLogReport`: each lookup line (loaded:
    ``wanted`` and ``used`` the path read; default: ``wanted`` the first path tried), the backend
    lines as runner lines and the last one's ``--moe-backend`` value as ``start_runner``
    (:func:`~remote.engines.vllm.runner.backend_flag`), ``ready`` for :data:`READY_LINE`."""
    rep = MoeLogReport()
    for raw in text.splitlines():
        line = raw.strip()
        hit = parse_line(line)
        if hit is not None and hit["kind"] == "loaded":
            rep.lines.append(MoeLogLine(role_of(hit["path"]), "loaded", hit["path"], hit["path"], None, "vllm", line))
        elif hit is not None:
            wanted = hit["paths"][0] if hit["paths"] else None
            rep.lines.append(MoeLogLine(role_of(wanted) if wanted else None, "default", wanted, None, None, "vllm",
                                        line))
            rep.suboptimal.append(line)
        backend = parse_backend_line(line)
        if backend is not None:
            rep.runner_lines.append(RunnerLine(backend["backend"], "oracle", line))
            # the backend this start resolved to, as its --moe-backend value (what a runner trial compares)
            rep.start_runner = backend_flag(backend["backend"])
        if READY_LINE in line:
            rep.ready = True
    return rep


def verify_loaded(rep: MoeLogReport, expected_paths: list[str]) -> list[str]:
    """Why a start does not count as running ``expected_paths`` ([] when it does): each path must
    appear in a ``Using configuration from <path> for MoE layer.`` line, and no default line may
    name it."""
    problems = []
    for p in expected_paths:
        if p not in rep.loaded:
            problems.append(f"log does not show 'Using configuration from {p} for MoE layer.'")
    for ln in rep.lines:
        if ln.action == "default" and any(p in ln.text for p in expected_paths):
            problems.append(f"server used vLLM's default MoE config; not found: {ln.wanted}")
    return problems


def hidden_load_lines(log_level: str | None) -> str | None:
    """Why a server started with ``--log-level log_level`` logs no loaded-file line, None when it
    logs them: vLLM's lookup logs a loaded file at INFO (``fused_moe.py`` ``get_moe_configs``
    ``logger.info_once``) and its default at WARNING."""
    if str(log_level or "info").lower() not in QUIET_LEVELS:
        return None
    return f"--log-level {log_level}: vLLM logs the MoE config file it loaded at INFO"
