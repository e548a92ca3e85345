"""SGLang's start-up log, one model for every release: where a start begins, which MoE runner it
chose, and every fused-MoE config lookup it logged. Standard library only.

Each lookup line becomes a :class:`MoeLogLine` that says which file (``up`` or ``down``,
from the ``_down`` suffix of the path) and what SGLang did:

``loaded``
    read the file in the installed Triton's folder.
``fallback``
    read the same name from another ``configs/triton_*`` folder (``triton_version``).
``reuse_up``
    (down file only) found no down file anywhere: the down GEMM runs the up GEMM's
    config table, whatever that is (tuned, fallen back, or the default heuristic). Every
    release that reads ``_down`` files does this (``fused_moe.py``: ``down_config or config``);
    only the wording differs.
``default``
    (up file) found the file nowhere: the default heuristic; also the deterministic-
    inference line, which names no file (``role`` None).

Wordings, from the real code of each release (``docs/sglang-releases.md``; the oracle tests
``tests/unit/remote/engines/sglang/test_oracle.py`` hold them against every covered release):

* ``found`` (all): ``Using MoE kernel config from {path}.``
* ``fallback`` (all): ``Config file not found at {path}. Fallback to triton version {v} and use
  MoE kernel config from {path2}. Performance might be sub-optimal!``
* ``default`` (all): ``Using default MoE kernel config. Performance might be sub-optimal! Config
  file not found at {path}, you can create them with https://...`` For a ``_down`` path
  (0.5.5, and 0.5.16+ when the up file is missing too) this is ``reuse_up``.
* ``down_moe=False`` (0.5.6 ... 0.5.15): ``Using MoE kernel config with down_moe=False.
  Performance might be sub-optimal! Config file not found at {path}, you can create them with
  https://...`` (``reuse_up``).
* ``down-reuse`` (0.5.16+): ``Down MoE config file not found at {path}; reusing the tuned
  up-projection config without TMA. Performance might be sub-optimal.`` (``reuse_up``).
* ``deterministic`` (0.5.5+): ``Deterministic inference is enabled, using default MoE kernel
  config.`` (``default``, no file).

Paths contain spaces and brackets (``block_shape=[128, 128]``), so a path is taken as
everything up to the fixed text that follows it, never with ``\\S+``. A line may carry any
prefix (timestamps, ``TP0``); the text is searched, not anchored at the start.

Where a start begins (:data:`START_MARKERS`, :func:`last_start_at`): every release logs its
resolved server arguments once per start, ``srt/entrypoints/engine.py``: ``f"{server_args=}"``
(``server_args=ServerArgs(model_path=..., moe_runner_backend='auto', ...)``, up to 0.5.16 at
least) or, in 0.5.23, ``f"server_args={_server_args_for_logging(server_args)}"`` (a dict:
``server_args={'model_path': ..., 'moe_runner_backend': 'flashinfer_trtllm', ...}``). Both show
the runner backend as resolution left it (:attr:`MoeLogReport.start_runner`).

Which runner the server chose (:class:`RunnerLine`), the lines SGLang 0.5.23's server-argument
resolution logs when it sets ``moe_runner_backend`` (before the start line):

* ``use`` (``srt/arg_groups/overrides.py`` ``_deepseek_moe_quant_resolution``,
  ``_moe_runner_backend_quant_constraints``, ``model_overrides/*.py``): ``Use {runner} as MoE
  runner backend ...``, e.g. ``Use flashinfer_trtllm as MoE runner backend on sm100 for
  DeepseekV3ForCausalLM``, ``Use flashinfer_cutlass as MoE runner backend on SM110/SM120 for
  modelopt_fp4 (trtllm-gen MoE kernels are SM100-only)``;
* ``auto-set`` (``srt/arg_groups/moe_hook.py`` ``handle_a2a_moe``): ``auto set
  moe_runner_backend=`{runner}` for PPLX EP``;
* ``resolved`` (the same, DeepEP v2): ``DeepEP v2 MoE: resolved --moe-runner-backend auto ->
  {runner}.``; ``a2a-routed`` (the same, FlashInfer all-to-all): ``... Using {runner} because A2A
  dispatch provides top-k ids and weights.``;
* ``assigned`` (``model_overrides/`` bailing_moe_v3, cohere2_moe, kimi_k3, mimo_v2):
  ``... moe_runner_backend={runner} ...`` (never the start line's quoted ``moe_runner_backend='auto'``);
  ``overriding`` (``model_overrides/minimax_m3.py``): ``... overriding --moe-runner-backend to '{runner}'.``;
* ``gpt-oss`` (``model_overrides/gpt_oss.py``): its ``Detected ... GPT-OSS model ...`` lines.

The oracle test ``tests/unit/remote/engines/sglang/test_runner_oracle.py`` holds these wordings against
the wheel's source.
"""

from __future__ import annotations

import re

from ..records import ACTIONS, MoeLogLine, MoeLogReport, RunnerLine

_HINT = r"(?:, you can create them with .*|\s*)$"
_WORDINGS = (
    ("found", re.compile(r"Using MoE kernel config from (?P<path>.+?\.json)\.\s*$")),
    ("fallback", re.compile(r"Config file not found at (?P<path>.+?\.json)\. Fallback to triton version "
                            r"(?P<version>\S+) and use MoE kernel config from (?P<path2>.+?\.json)\. "
                            r"Performance might be sub-optimal!")),
    ("default", re.compile(r"Using default MoE kernel config\. Performance might be sub-optimal! "
                           r"Config file not found at (?P<path>.+?\.json)" + _HINT)),
    ("down_moe=False", re.compile(r"Using MoE kernel config with down_moe=False\. Performance might be "
                                  r"sub-optimal! Config file not found at (?P<path>.+?\.json)" + _HINT)),
    ("down-reuse", re.compile(r"Down MoE config file not found at (?P<path>.+?\.json); reusing the tuned "
                              r"up-projection config without TMA\. Performance might be sub-optimal\.")),
    ("deterministic", re.compile(r"Deterministic inference is enabled, using default MoE kernel config\.")),
)
READY_LINE = "The server is fired up and ready to roll!"
#: the text of the line that opens each start (module docstring), oldest form first
START_MARKERS = ("server_args=ServerArgs(", "server_args={")
_START_RUNNER = re.compile(r"""server_args=.*?\bmoe_runner_backend['"]?(?:=|: )['"](?P<runner>[^'"]+)['"]""")
_RUNNER_WORDINGS = (
    ("use", re.compile(r"\bUse (?P<runner>[a-z0-9_]+) as MoE runner backend\b")),
    ("auto-set", re.compile(r"auto set moe_runner_backend=`(?P<runner>[a-z0-9_]+)`")),
    ("resolved", re.compile(r"resolved --moe-runner-backend auto -> (?P<runner>[a-z0-9_]+)\.")),
    ("a2a-routed", re.compile(r"Using (?P<runner>[a-z0-9_]+) because A2A dispatch provides top-k ids")),
    ("assigned", re.compile(r"(?<![\w'\"])moe_runner_backend=(?P<runner>[a-z0-9_]+)\b")),
    ("overriding", re.compile(r"overriding --moe-runner-backend to '(?P<runner>[a-z0-9_]+)'")),
)
#: gpt-oss's own lines (``model_overrides/gpt_oss.py``): fixed text -> the runner it set
_GPT_OSS_LINES = (
    ("Detected SM100 and MXFP4 quantization format for GPT-OSS model, enabling FlashInfer MXFP4 MOE kernel.",
     "flashinfer_mxfp4"),
    ("Detected SM120 and MXFP4 quantization format for GPT-OSS model, enabling FlashInfer CUTLASS MXFP4 MOE kernel.",
     "flashinfer_mxfp4"),
    ("Detected GPT-OSS model on Blackwell with driver >= 595, using triton MOE kernel to avoid triton_kernels "
     "SIGSEGV.", "triton"),
    ("Detected GPT-OSS model, enabling triton_kernels MOE kernel.", "triton_kernel"),
    ("Detected ROCm with SGLANG_USE_AITER for GPT-OSS bf16 model, using triton MOE kernel.", "triton"),
    ("Detected MUSA with SGLANG_DEEPEP_BF16_DISPATCH for bf16 model, using deep_gemm kernel.", "deep_gemm"),
)


def last_start_at(text: str) -> int:
    """Offset in ``text`` of the line that opens the last server start (the line holding one of
    :data:`START_MARKERS`), or -1 when the text holds no start."""
    idx = max(text.rfind(m) for m in START_MARKERS)
    return -1 if idx < 0 else text.rfind("\n", 0, idx) + 1


def parse_runner_line(line: str) -> RunnerLine | None:
    """The :class:`RunnerLine` of one log line, or None when it announces no runner choice."""
    for wording, rx in _RUNNER_WORDINGS:
        m = rx.search(line)
        if m:
            return RunnerLine(m.group("runner"), wording, line.strip())
    for text, runner in _GPT_OSS_LINES:
        if text in line:
            return RunnerLine(runner, "gpt-oss", line.strip())
    return None


def role_of(path: str) -> str:
    """``down`` for a ``..._down.json`` path (SGLang's down selector, last before ``.json``), else ``up``."""
    return "down" if path.endswith("_down.json") else "up"


def parse_line(line: str) -> MoeLogLine | None:
    """The :class:`MoeLogLine` of one log line, or None when it is not a lookup line."""
    for wording, rx in _WORDINGS:
        m = rx.search(line)
        if not m:
            continue
        text = line.strip()
        if wording == "deterministic":
            return MoeLogLine(None, "default", None, None, None, wording, text)
        path = m.group("path")
        role = role_of(path)
        if wording == "found":
            return MoeLogLine(role, "loaded", path, path, None, wording, text)
        if wording == "fallback":
            return MoeLogLine(role, "fallback", path, m.group("path2"), m.group("version"), wording, text)
        if role == "down" or wording != "default":
            # every not-found wording for a down file: the down GEMM runs the up config table
            return MoeLogLine("down", "reuse_up", path, None, None, wording, text)
        return MoeLogLine("up", "default", path, None, None, wording, text)
    return None


def parse_moe_log(text: str) -> MoeLogReport:
    """Scan log ``text`` (one server start) and return a :class:`MoeLogReport`. Pure."""
    rep = MoeLogReport()
    for line in text.splitlines():
        if READY_LINE in line:
            rep.ready = True
        if "sub-optimal" in line:
            rep.suboptimal.append(line.strip())
        start = _START_RUNNER.search(line)
        if start:
            rep.start_runner = start.group("runner")
        choice = parse_runner_line(line)
        if choice is not None:
            rep.runner_lines.append(choice)
        parsed = parse_line(line)
        if parsed is not None:
            rep.lines.append(parsed)
    return rep


def verify_loaded(rep: MoeLogReport, expected_paths: list[str]) -> list[str]:
    """Problems that make a start count as NOT running the installed configs.

    Each expected path must appear in a ``Using MoE kernel config from`` line, and no
    lookup line may report a fallback, the default or a missing down file for one of them
    (nor may the start run deterministic inference, which reads no file).
    Returns a list of human-readable problems (empty when verified).
    """
    problems = []
    for p in expected_paths:
        if p not in rep.loaded:
            problems.append(f"log does not show 'Using MoE kernel config from {p}.'")
    if rep.deterministic and expected_paths:
        problems.append("deterministic inference is enabled: SGLang uses the default MoE config")
    for ln in rep.lines:
        if ln.wanted not in expected_paths:
            continue
        if ln.action == "fallback":
            problems.append(f"server fell back to Triton {ln.triton_version} config {ln.used} (sub-optimal)")
        elif ln.action == "default":
            problems.append(f"server used the default MoE config; not found: {ln.wanted}")
        elif ln.action == "reuse_up":
            problems.append(f"server did not find the down config {ln.wanted}")
    return problems
