"""The stand-in SGLang server (orch test bed): ``python -m sglang.launch_server``.

What it does at start, in SGLang's order:
1. parse SGLang's flags (unknown ones tolerated), log ``server_args=...``;
2. open and hold the GPU device file(s) (``$ORCH_STANDIN_NVIDIA_DEV``, default ``/dev/nvidia0``;
   with ``--tp K`` and the default path also ``/dev/nvidia1..K-1``); none -> exit 1;
3. read ``<model-path>/config.json``, derive E and N (``sglang._standin.model``);
4. with the ``triton``/``auto`` MoE runner, ask the release's real lookup module (copied into
   the tree from its wheel: ``try_get_optimal_moe_config``, its folder search, file names and
   log lines, see ``sglang._standin.lookup``) for the up and down configs of every batch size of
   ``CAPTURE_BATCH_SIZES``, as CUDA-graph capture does. An invalid file raises (the real loader's
   ``int(key)`` or JSON error, or a launch check for a missing tile field): the process dies with
   a traceback and exit status 1, like SGLang;
5. bind the HTTP port (``/v1/models``, ``/get_model_info``, ``/get_server_info`` answer 200 at
   once), warm up for ``$ORCH_STANDIN_WARMUP_S`` seconds (default 2; ``/health`` and
   ``/health_generate`` answer 503 until then), then log
   ``The server is fired up and ready to roll!`` and answer 200.

Generation is simulated on a clock-driven schedule (a token is sent when its due time comes, and
a late one does not delay the next: the simulated rate holds on a loaded CPU, see
``Engine.generate``): each output token of a request costs a step time that depends on the
loaded configs and on the number of requests decoding at once (throughput rises with
concurrency up to ``$ORCH_STANDIN_MAX_BATCH`` (default 8) and then plateaus):
``step_ms = base_ms * (1 + 0.1 * (min(b, B) - 1)) * max(1, b / B)``, with ``base_ms`` the mean
of the up and down GEMMs' per-token costs: exact file ``$ORCH_STANDIN_TOKEN_DELAY_MS_TUNED``
(default 4.0 ms), default heuristic ``$ORCH_STANDIN_TOKEN_DELAY_MS_DEFAULT`` (default 6.0 ms),
fallback folder the mean of both, down file missing (up reused) tuned * 1.1.
``ORCH_STANDIN_REGRESSION=1`` makes a tuned config 1.5x slower than the default.
A runner other than Triton reads no file and costs the default. Per-runner knobs (the runner trial,
issue 18), keyed by the effective MoE runner (``triton`` for ``auto``/``triton``, else the
``--moe-runner-backend`` value): ``ORCH_STANDIN_RUNNER_SPEED="runner=factor,..."`` multiplies the
per-token cost (``flashinfer_cutlass=0.6`` is faster, ``cutlass=1.5`` slower; unlisted runners 1);
``ORCH_STANDIN_WRONG_RUNNERS="runner,..."``: greedy answers under that runner differ (every output
token id is shifted by one), as a runner with broken numerics would answer.
Prefill costs ``$ORCH_STANDIN_PREFILL_MS_PER_TOKEN`` (default 0.02 ms) per prompt token.

GPU occupancy knobs: ``ORCH_STANDIN_GPU_EXCLUSIVE=1``: start-up fails like SGLang's
"The memory capacity is unbalanced" when another process (not nvidia-persistenced,
nv-hostengine, dcgm or Xorg) holds a GPU device file, so a leftover must be reaped first;
``ORCH_STANDIN_LEAK_SCHEDULER=1``: at start, leave an orphaned ``sglang::scheduler_TP0``
process (re-parented to PID 1) holding the GPU that outlives the server, like sglang #23627.

``ORCH_STANDIN_FAULT_ON_CHANGE=unreadable``: the first start records the config files on disk
(path, sha256, in the shipped ``configs/`` and ``$SGLANG_MOE_CONFIG_DIR/configs``); a later start
cannot read a file that is new or changed since (as under a security policy that labels only the
files present at deployment): SGLang's lookup sees it as absent and logs the fallback or the default.

``ORCH_STANDIN_FAULT_ON_CHANGE=crash|never_ready|hang_generate``: the first start records which config files
it loaded (path, sha256, outcome of each lookup) in ``$ORCH_STANDIN_STATE_DIR`` (default
``/run/sglang-standin``, per-host on the bed; set it when running outside the bed); a later start whose loaded files differ from that baseline
crashes like a Triton ``OutOfResources`` at CUDA-graph capture (``crash``) or never becomes
healthy (``never_ready``); the same files as the first start load fine (for rollback tests).

Real-fleet shapes (issue 13): ``--config FILE.yaml`` is merged into the flags by the release's own
``ConfigArgumentMerger`` (copied unchanged into the tree as ``sglang._standin.release_config_parser``
by ``standin_tree``), as ``prepare_server_args`` does: command line over file over defaults.
``$ORCH_STANDIN_NVIDIA_DEV`` may list several device files (comma separated). With
``--nnodes N > 1`` and ``--node-rank R >= 1`` the node serves only ``/health`` (and
``/health_generate``), like SGLang's non-zero ranks; everything else answers 404. With
``SGLANG_USE_MODELSCOPE`` true, a ``--model-path`` that is not a local path is looked up as SGLang
0.5.23's ``handle_modelscope_paths`` does: ``<ModelScope model cache root>/<model-path>`` (the root is
``$MODELSCOPE_CACHE/models``, default ``~/.cache/modelscope/hub/models``, as modelscope 1.40's
``get_model_cache_root``), then ``<--download-dir>/<model-path>``; a miss would download, which the
stand-in refuses (exit 1). ``ORCH_STANDIN_LEAK_PORT_HOLDER=1``: once the port is bound, a child
process keeps the listening socket open, holds no GPU, and outlives the server (re-parented to PID 1,
same command line as the server), so the next start fails with "address already in use".

Fault knobs: ``ORCH_STANDIN_FAIL_START=1`` (exit 1 at start), ``ORCH_STANDIN_NEVER_READY=1``
(``/health`` stays 503; logged as ``(stand-in) never ready`` once the port is bound),
``ORCH_STANDIN_IGNORE_SIGTERM=1`` (SIGTERM ignored; only SIGKILL stops it),
``ORCH_STANDIN_HANG_GENERATE=1`` (``/generate`` and completions never answer after warm-up,
while ``/health`` passes, like sglang #4191; SGLang 0.5.23's ``/health`` does not generate),
``ORCH_STANDIN_FAULT_ON_CHANGE=hang_generate`` (the same, only for a start that loaded other config
files than the first start), ``ORCH_STANDIN_HEALTH_503_S=S`` (after warm-up ``/health`` answers 503
for S more seconds while generation works, like a health probe queued behind a long chunked prefill
or a DeepGEMM JIT warm-up, sglang #22511, #10856; logged once as SGLang's ``Health check failed``
line). A generation request sent during warm-up waits until it ends.
``ORCH_STANDIN_LEAK_SCHEDULER=stubborn``: the leftover scheduler also ignores SIGTERM (only
SIGKILL ends it) and leaves a marker in ``$ORCH_STANDIN_STATE_DIR``; with
``ORCH_STANDIN_NO_TOKENS_AFTER_SIGKILL=N``, a start that finds the marker of such a leftover that
is gone (it was SIGKILLed) answers its N-th generation request with no token: it stands in for the
stall of sglang #22779 after a SIGKILL restart (a request that hangs would cost a test its whole
request timeout).
Multi-node start-up faults (issue 32 row 9): ``$ORCH_STANDIN_STATE_DIR/dist-faults.json`` (written by a
test, read at each start: ``listen_delay_s``, ``join: fail_fast``, ``eaddrinuse_once``; ``sglang._standin.dist``).
``ORCH_STANDIN_REUSE_PORT=1``: the listening socket is bound with ``SO_REUSEPORT`` (SGLang's is
not), so a leaked second server can listen on the same port and the kernel spreads the
connections between the two: a test bed's way to have a server that is not the unit's answer.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from sglang.version import __version__

from . import dist, lookup
from . import model as model_mod
from . import numerics, runners

#: Batch sizes M for which the start "captures CUDA graphs" (asks the lookup module for a config).
CAPTURE_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160)
#: The fused-MoE kernel's ``tl.constexpr`` parameters set from a config (no default: a launch
#: without one fails); the other fields are Triton launch options with defaults.
TILE_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
TRITON_BACKENDS = ("auto", "triton")
# Holders of /dev/nvidia* that do not take GPU memory (never count as occupying a GPU).
NON_COMPUTE_HOLDERS = ("nvidia-persistenced", "nv-hostengine", "dcgm", "Xorg")
LEAK_CODE = (
    "import os,signal,sys,time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "args=sys.argv[1:]\n"
    "if args[0]=='--stubborn':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    os.makedirs(args[1], exist_ok=True)\n"
    "    open(os.path.join(args[1], 'leaked-scheduler-%d' % os.getpid()), 'w').close()\n"
    "    args=args[2:]\n"
    "fds=[os.open(p, os.O_RDWR) for p in args]\n"
    "while True: time.sleep(3600)\n"
)
#: the straggler of ORCH_STANDIN_STRAGGLER: a process of this invocation (double-forked out of the
#: main process's tree, as a child left by ``KillMode=process`` outlives a stop) that waits for the
#: unit's next invocation (``systemctl show -p InvocationID``) and its lookups, then writes this
#: start's lookup lines again to the stderr it inherited: the old stdout stream, which journald
#: tags with the metadata it cached for the stream's dead process, this invocation's ID
#: (``/run/orchtb/journal-streams``, tests/testbed/journalctl_shim.py)
STRAGGLER_CODE = (
    "import json,os,subprocess,sys,time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "unit,lines=sys.argv[1],json.loads(sys.argv[2])\n"
    "mine=os.environ.get('INVOCATION_ID','')\n"
    "def show():\n"
    "    out=subprocess.run(['systemctl','show','-p','InvocationID',unit],stdout=subprocess.PIPE,text=True).stdout\n"
    "    return out.strip().partition('=')[2]\n"
    "def log():\n"
    "    return subprocess.run(['journalctl','-u',unit,'--no-pager'],stdout=subprocess.PIPE,text=True).stdout.splitlines()\n"
    "deadline=time.time()+3600\n"
    "while time.time()<deadline and show() in ('',mine): time.sleep(0.5)\n"
    "after=len(log())\n"
    "end=time.time()+120\n"
    "while time.time()<end and not any('Capture cuda graph end' in x for x in log()[after:]): time.sleep(0.1)\n"
    "os.makedirs('/run/orchtb/journal-streams',exist_ok=True)\n"
    "with open('/run/orchtb/journal-streams/'+unit+'.jsonl','a') as f:\n"
    "    f.write(json.dumps({'after':after,'lines':lines,'_SYSTEMD_INVOCATION_ID':mine})+'\\n')\n"
    "sys.stderr.write(''.join(x+'\\n' for x in lines)); sys.stderr.flush()\n"
)
WORDS = numerics.WORDS
VOCAB = numerics.VOCAB

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
sched_logger = logging.getLogger("sglang.srt.managers.scheduler")


class _Formatter(logging.Formatter):
    """SGLang-like prefix: ``[YYYY-MM-DD HH:MM:SS TP0] msg`` in the scheduler, ``[...] msg`` else."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        rank = " TP0" if record.name.startswith("sglang.srt.layers") or record.name.startswith(
            "sglang.srt.managers") else ""
        msg = record.getMessage()
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        return f"[{stamp}{rank}] {msg}"


class _Capture(logging.Handler):
    """Keeps the lines the records it sees are logged as (:class:`_Formatter`), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Formatter())
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "MoE" in record.getMessage() or "config" in record.getMessage():
            self.lines.append(self.format(record))


def _setup_logging(level: str = "info") -> None:
    """Every logger at ``level`` (``--log-level``), as SGLang 0.5.23's ``configure_logger``
    (``srt/utils/common.py``: ``logging.basicConfig(level=getattr(logging, log_level.upper()))``):
    with ``warning`` the start line, the ``Using MoE kernel config from`` lines and the ready line
    (INFO) are not logged, the fallback, default and missing-down lines (WARNING) are."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "False", "no")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """SGLang's server flags that matter here; unknown flags are tolerated (and logged)."""
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server", allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--ep-size", "--ep", "--expert-parallel-size", dest="ep_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--moe-runner-backend", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--disable-shared-experts-fusion", action="store_true")
    p.add_argument("--disable-flashinfer-autotune", action="store_true")
    p.add_argument("--flashinfer-autotune-skip-ops", nargs="+", default=None)
    p.add_argument("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    p.add_argument("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int, default=1)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    p.add_argument("--dist-timeout", type=int, default=None)
    p.add_argument("--download-dir", default=None)
    p.add_argument("--config", default=None, help="YAML file of flags (merged by the release's own code)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--enable-deterministic-inference", action="store_true")
    if argv is None:
        argv = sys.argv[1:]
    if "--config" in argv:  # the release's rule: only a separate --config token triggers the merge
        from . import release_config_parser

        argv = release_config_parser.ConfigArgumentMerger(p).merge_config_with_args(list(argv))
    args, unknown = p.parse_known_args(argv)
    args.unknown = unknown
    return args


def launch_check(config: Dict[str, Any], m: int) -> None:
    """Fail like the kernel launch would for a config without one of :data:`TILE_FIELDS`
    (the real launch raises there too; the stand-in runs no kernel). Raises KeyError."""
    missing = [f for f in TILE_FIELDS if f not in config]
    if missing:
        raise KeyError(f"fused_moe_kernel launch at M={m}: config {config} has no {', '.join(missing)}")


def runner_speed(runner: str, spec: Optional[str] = None) -> float:
    """The per-token cost factor of ``runner`` from ``ORCH_STANDIN_RUNNER_SPEED`` (``spec``; e.g.
    ``"flashinfer_cutlass=0.6,cutlass=1.5"``); 1.0 when unlisted. ValueError for a malformed entry."""
    spec = os.environ.get("ORCH_STANDIN_RUNNER_SPEED", "") if spec is None else spec
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        name, sep, factor = item.partition("=")
        if not sep or float(factor) <= 0:
            raise ValueError(f"ORCH_STANDIN_RUNNER_SPEED: bad entry {item!r} (want runner=factor)")
        if name.strip() == runner:
            return float(factor)
    return 1.0


def runner_is_wrong(runner: str, spec: Optional[str] = None) -> bool:
    """True when ``runner`` is listed in ``ORCH_STANDIN_WRONG_RUNNERS`` (``spec``, comma separated)."""
    spec = os.environ.get("ORCH_STANDIN_WRONG_RUNNERS", "") if spec is None else spec
    return runner in {x.strip() for x in spec.split(",") if x.strip()}


class Engine:
    """Simulated scheduler: counts decoding requests and turns configs into token timings."""

    def __init__(self, base_ms: float, max_batch: int, prefill_ms: float, wrong: bool = False,
                 answers: Optional[numerics.Numerics] = None):
        self.wrong = wrong
        self.answers = answers or numerics.Numerics("triton", 0)
        self.base_ms = base_ms
        self.max_batch = max(1, max_batch)
        self.prefill_ms = prefill_ms
        self.active = 0
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.hang = _env_flag("ORCH_STANDIN_HANG_GENERATE")
        self.requests = 0  # generation requests (prompts) of this start
        self.empty_at = 0  # this request number returns no token (0: none)

    def step_s(self) -> float:
        """Seconds one decode step takes now, for ``self.active`` concurrent requests."""
        b = max(1, self.active)
        eff = min(b, self.max_batch)
        return self.base_ms * (1 + 0.1 * (eff - 1)) * max(1.0, b / self.max_batch) / 1000.0

    def generate(self, prompt_tokens: int, max_new: int, prompt: Optional[str] = None):
        """Yield ``(index, token_id)`` for each output token when the simulated schedule says it is
        done: the prefill ends ``prefill_ms`` per prompt token after the call, and each token one
        :meth:`step_s` after the previous token's due time (not after it was sent). A wake-up that a
        busy CPU delays, or the time the HTTP writes take, is made up by the next tokens instead of
        adding up: a request takes its scheduled time, whatever the load, as long as the CPU keeps up
        on average, and never less (a late token is sent at once, an early one waits). ``prompt``
        (its text, when the request sent text): the known answer, the variant of an unstable prompt
        (:mod:`sglang._standin.numerics`)."""
        if self.hang:
            threading.Event().wait()
        self.ready.wait()  # a request sent during warm-up waits for it, as SGLang's scheduler queue does
        if self.answers.crash:
            self.answers.die()
        with self.lock:
            self.requests += 1
            empty = self.requests == self.empty_at
            variant = self.answers.variant(prompt)
        if empty:
            return
        known = numerics.answer_ids(prompt) if prompt is not None else []
        due = time.monotonic() + self.prefill_ms * prompt_tokens / 1000.0
        _sleep_until(due)
        with self.lock:
            self.active += 1
        try:
            for i in range(max_new):
                due += self.step_s()
                _sleep_until(due)
                off = (1 if self.wrong else 0) + self.answers.shift(self.active)
                if i < len(known):
                    yield i, known[i] + off
                    continue
                late = 2 * variant if i >= max_new // 2 else 0
                yield i, (i * 7919 + prompt_tokens * 31 + 13 + off + late) % VOCAB
        finally:
            with self.lock:
                self.active -= 1


def _sleep_until(due: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``due`` (no sleep when it is past)."""
    left = due - time.monotonic()
    if left > 0:
        time.sleep(left)


def _token_text(token_id: int) -> str:
    return numerics.token_text(token_id)


def _prompt_text(prompt: Any) -> Optional[str]:
    """The prompt's text (None for token ids)."""
    return prompt if isinstance(prompt, str) else None


def _count_prompt_tokens(text: Any) -> int:
    if isinstance(text, list):
        return max(1, len(text))
    return max(1, len(str(text).split()))


class StandinServer:
    """The whole stand-in: arguments, lookups, timings, HTTP server."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.served_name = args.served_model_name or args.model_path
        self.created = int(time.time())
        self.gpu_fds: List[int] = []
        self.moe: Dict[str, Any] = {"backend": args.moe_runner_backend, "lookups": []}
        self.shape: Optional[model_mod.MoeShape] = None
        self.engine: Optional[Engine] = None
        self.httpd: Optional[ThreadingHTTPServer] = None
        self.ranks: Optional[dist.Ranks] = None  # a multi-node server's other ranks, once met

    # --- start-up -------------------------------------------------------------------------
    @staticmethod
    def other_holders(paths: List[str]) -> List[Tuple[int, str]]:
        """``[(pid, cmdline)]`` of other processes holding one of ``paths`` that take GPU memory."""
        found = []
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                links = {os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")}
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                continue
            if links & set(paths) and not any(n in cmd for n in NON_COMPUTE_HOLDERS):
                found.append((int(entry), cmd))
        return found

    def open_gpus(self) -> None:
        """Open the GPU device file(s) and keep them open. RuntimeError if one is missing, or
        (``ORCH_STANDIN_GPU_EXCLUSIVE``) already used by another compute process."""
        explicit = os.environ.get("ORCH_STANDIN_NVIDIA_DEV")
        paths = ([p for p in explicit.split(",") if p] if explicit
                 else [f"/dev/nvidia{i}" for i in range(max(1, self.args.tp_size))])
        if _env_flag("ORCH_STANDIN_GPU_EXCLUSIVE"):
            busy = self.other_holders(paths)
            if busy:
                raise RuntimeError(
                    "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
                    f"min_per_gpu_memory=2.31, local_gpu_memory=139.72, local_gpu_memory * 0.9=125.75 "
                    f"(stand-in: held by {', '.join(f'pid {p} ({c[:60]})' for p, c in busy)})")
        for path in paths:
            try:
                self.gpu_fds.append(os.open(path, os.O_RDWR))
            except OSError as exc:
                raise RuntimeError(f"No CUDA GPUs are available (cannot open {path}: {exc.strerror})") from exc

    def load_moe_configs(self) -> Tuple[str, str]:
        """Run the release's own ``try_get_optimal_moe_config`` as CUDA-graph capture does (every
        batch size of :data:`CAPTURE_BATCH_SIZES`, asking for the down config), launch-check each
        config it returns, and return the outcomes of the up and down lookups (``exact``,
        ``fallback``, ``reuse_up``, ``default``). Lookups are recorded in ``self.moe["lookups"]``."""
        loader = lookup.import_lookup_module()
        self.moe["loader"] = loader.__file__
        s = self.shape
        # the selectors this release has (older ones name no per-channel or _down file)
        params = inspect.signature(loader.try_get_optimal_moe_config).parameters
        kw = {"block_shape": s.block_shape}
        if "per_channel_quant" in params:
            kw["per_channel_quant"] = s.per_channel_quant
        reads_down = "return_down_config" in params
        name_kw = {k: v for k, v in kw.items() if k != "block_shape"}
        names = {"up": loader.get_config_file_name(s.E, s.N, s.dtype, s.block_shape, **name_kw),
                 "down": (loader.get_config_file_name(s.E, s.N, s.dtype, s.block_shape, **name_kw, down_moe=True)
                          if reads_down else None)}
        w1, w2 = (s.E, 2 * s.N, s.hidden), (s.E, s.hidden, s.N)
        hidden = (self.files_changed_since_first_start(loader)
                  if os.environ.get("ORCH_STANDIN_FAULT_ON_CHANGE", "").strip() == "unreadable" else frozenset())
        with lookup.watching(loader, hidden) as watch:
            for m in CAPTURE_BATCH_SIZES:
                if reads_down:
                    up_cfg, (down_cfg, _) = loader.try_get_optimal_moe_config(
                        w1, w2, s.topk, s.dtype, m, return_down_config=True, **kw)
                else:
                    up_cfg, down_cfg = loader.try_get_optimal_moe_config(w1, w2, s.topk, s.dtype, m, **kw), None
                for cfg in (up_cfg, down_cfg or up_cfg):  # what fused_moe.py hands to each GEMM's launch
                    launch_check(cfg, m)
        up = watch.outcome(names["up"])
        down = watch.outcome(names["down"]) if names["down"] else {"wanted": None, "path": None, "outcome": "none"}
        up["outcome"] = "default" if up["outcome"] == "none" else up["outcome"]
        if down["outcome"] == "none":  # the down GEMM runs the up config (tuned or default)
            down["outcome"] = "reuse_up" if up["path"] else "default"
        self.moe["lookups"] = [dict(up, down_moe=False), dict(down, down_moe=True)]
        return up["outcome"], down["outcome"]

    def token_delay_ms(self, up: str, down: str) -> float:
        """Per-token base cost in ms from the two lookups' outcomes (see module docstring)."""
        default = _env_float("ORCH_STANDIN_TOKEN_DELAY_MS_DEFAULT", 6.0)
        tuned = _env_float("ORCH_STANDIN_TOKEN_DELAY_MS_TUNED", 4.0)
        if _env_flag("ORCH_STANDIN_REGRESSION"):
            tuned = default * 1.5
        cost = {"exact": tuned, "fallback": (tuned + default) / 2, "default": default, "reuse_up": tuned * 1.1}
        return (cost.get(up, default) + cost.get(down, default)) / 2

    def start(self) -> None:
        """Everything before the port is bound (see module docstring); raises on failure."""
        a = self.args
        a.quantization_resolved = a.quantization
        try:  # server-argument resolution reads the model config (runners.AUTO_RULES)
            early = model_mod.load_config(model_mod.resolve_model_path(a.model_path, a.download_dir))
        except Exception:  # noqa: BLE001 - the load below fails the start with its own error
            early = None
        if early is not None:
            a.moe_runner_backend, a.quantization_resolved, line = runners.resolve(a.moe_runner_backend, a.quantization,
                                                                                  early)
            if line:
                logging.getLogger("sglang.srt.arg_groups.overrides").info(line)
        self.moe["runner"] = runners.runner_of(a.moe_runner_backend)
        logger.info(f"server_args=ServerArgs(model_path='{a.model_path}', tp_size={a.tp_size}, "
                    f"ep_size={a.ep_size}, host='{a.host}', port={a.port}, moe_runner_backend='{a.moe_runner_backend}', "
                    f"quantization={a.quantization_resolved!r}, dtype='{a.dtype}', served_model_name='{self.served_name}', "
                    f"disable_shared_experts_fusion={a.disable_shared_experts_fusion})")
        if a.unknown:
            logger.info(f"(stand-in) ignoring flags: {' '.join(a.unknown)}")
        if _env_flag("ORCH_STANDIN_FAIL_START"):
            raise RuntimeError("ORCH_STANDIN_FAIL_START is set: simulated start-up failure")
        self.open_gpus()
        self.killed_predecessor = self.reap_leak_markers()
        if _env_flag("ORCH_STANDIN_LEAK_SCHEDULER"):
            import subprocess

            dev = (os.environ.get("ORCH_STANDIN_NVIDIA_DEV") or "/dev/nvidia0").split(",")[0]
            stubborn = (["--stubborn", self.state_dir()]
                        if os.environ.get("ORCH_STANDIN_LEAK_SCHEDULER", "").strip() == "stubborn" else [])
            subprocess.run(["sglang::scheduler_TP0", "-c", LEAK_CODE, *stubborn, dev], executable=sys.executable,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        cfg = model_mod.load_config(model_mod.resolve_model_path(a.model_path, a.download_dir))
        self.shape = model_mod.moe_shape(cfg, a.tp_size, a.ep_size, a.quantization, a.dtype,
                                         a.disable_shared_experts_fusion, a.moe_runner_backend)
        if a.nnodes > 1:  # every rank meets at --dist-init-addr before loading (sglang._standin.dist)
            self.ranks = dist.Ranks(a.node_rank, a.nnodes, a.dist_init_addr or "127.0.0.1:5000", a.dist_timeout,
                                    self.dist_faults())
            self.ranks.meet()
        sched_logger.info("Load weight begin. avail mem=139.72 GB")
        sched_logger.info(f"Load weight end. type={(cfg.get('architectures') or ['?'])[0]}, dtype=torch.bfloat16, "
                          f"avail mem=120.10 GB, mem usage=19.62 GB.")
        sched_logger.info("Capture cuda graph begin. This can take up to several minutes. avail mem=20.00 GB")
        if runners.runner_of(a.moe_runner_backend) in TRITON_BACKENDS:
            lookup_lines = _Capture()
            logging.getLogger().addHandler(lookup_lines)
            try:
                up, down = self.load_moe_configs()
            finally:
                logging.getLogger().removeHandler(lookup_lines)
            self.leave_straggler(lookup_lines.lines)
        else:
            up = down = "not_triton"
            self.moe["lookups"] = []
            sched_logger.info(f"MoE runner backend {a.moe_runner_backend}: Triton fused-MoE configs are not used.")
            self.moe["autotune_cache"] = runners.autotune(a, a.moe_runner_backend, cfg,
                                                          list(a.flashinfer_autotune_skip_ops or []))
        self.moe.update({"up": up, "down": down, "E": self.shape.E, "N": self.shape.N})
        sched_logger.info("Capture cuda graph end. Time elapsed: 1.00 s. mem usage=1.20 GB. avail mem=18.80 GB.")
        base = self.token_delay_ms(up, down) if up != "not_triton" else _env_float(
            "ORCH_STANDIN_TOKEN_DELAY_MS_DEFAULT", 6.0)
        runner = self.effective_runner()
        factor = runner_speed(runner)
        base *= factor
        self.moe.update({"runner": runner, "runner_speed": factor, "wrong_answers": runner_is_wrong(runner)})
        self.moe["token_delay_ms"] = base
        self.never_ready = _env_flag("ORCH_STANDIN_NEVER_READY")
        fault = os.environ.get("ORCH_STANDIN_FAULT_ON_CHANGE", "").strip()
        hang = False
        if fault in ("crash", "never_ready", "hang_generate"):
            if self.configs_changed_since_first_start():
                self.moe["fault"] = fault
                if fault == "crash":
                    self.raise_out_of_resources()
                self.never_ready = fault == "never_ready"
                hang = fault == "hang_generate"
        answers = numerics.Numerics(runner)
        if answers.unstable_k:
            answers.start = numerics.count_start(self.state_dir())
        self.moe.update({"start": answers.start, "nondeterministic": answers.unstable_k,
                         "wrong_batched": answers.wrong_batched, "wrong_single": answers.wrong_single,
                         "crash_on_request": answers.crash})
        self.engine = Engine(base, int(_env_float("ORCH_STANDIN_MAX_BATCH", 8)),
                             _env_float("ORCH_STANDIN_PREFILL_MS_PER_TOKEN", 0.02), wrong=self.moe["wrong_answers"],
                             answers=answers)
        self.engine.hang = self.engine.hang or hang
        n = int(_env_float("ORCH_STANDIN_NO_TOKENS_AFTER_SIGKILL", 0))
        if n > 0 and self.killed_predecessor:
            self.engine.empty_at = n
            sched_logger.info(f"(stand-in) a leftover scheduler was killed by SIGKILL ({self.killed_predecessor}): "
                              f"generation request {n} of this start will return no token")
        self.health_503_s = _env_float("ORCH_STANDIN_HEALTH_503_S", 0.0)
        self.health_503_until = float("inf")

    @staticmethod
    def state_dir() -> str:
        """``$ORCH_STANDIN_STATE_DIR`` (default ``/run/sglang-standin``), created."""
        path = os.environ.get("ORCH_STANDIN_STATE_DIR", "/run/sglang-standin")
        os.makedirs(path, exist_ok=True)
        return path

    def dist_faults(self) -> dict:
        """The multi-node start-up faults a test wrote to ``$ORCH_STANDIN_STATE_DIR/dist-faults.json``
        (``sglang._standin.dist``; {} when none); ``eaddrinuse_once`` is taken out of the file as it is
        read, so it fails one start only."""
        path = os.path.join(self.state_dir(), "dist-faults.json")
        try:
            with open(path) as f:
                faults = json.load(f)
        except (OSError, ValueError):
            return {}
        if faults.get("eaddrinuse_once"):
            with open(path, "w") as f:
                json.dump(dict(faults, eaddrinuse_once=False), f)
        return faults

    def leave_straggler(self, lines: List[str]) -> None:
        """``ORCH_STANDIN_STRAGGLER=UNIT`` (once per state folder: the first start that has it):
        leave :data:`STRAGGLER_CODE` behind, which writes ``lines`` (this start's MoE lookup lines,
        as logged) again once the next invocation of UNIT has logged its own lookups."""
        unit = os.environ.get("ORCH_STANDIN_STRAGGLER", "").strip()
        marker = os.path.join(self.state_dir(), "straggler-left")
        if not unit or not lines or os.path.exists(marker):
            return
        import subprocess

        open(marker, "w").close()
        subprocess.run(["sglang::straggler", "-c", STRAGGLER_CODE, unit, json.dumps(lines)], executable=sys.executable,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)

    def reap_leak_markers(self) -> list:
        """PIDs of stubborn leftover schedulers (``ORCH_STANDIN_LEAK_SCHEDULER=stubborn``) that are
        gone: they ignore SIGTERM and cannot remove their marker, so gone means SIGKILL. Their
        markers are removed (the fault they arm is for this start only)."""
        gone = []
        folder = self.state_dir()
        for name in sorted(os.listdir(folder)):
            if not name.startswith("leaked-scheduler-"):
                continue
            pid = int(name.rsplit("-", 1)[1])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                gone.append(pid)
                os.unlink(os.path.join(folder, name))
            except PermissionError:
                pass
        return gone

    def effective_runner(self) -> str:
        """The MoE runner this start runs: ``triton`` for ``auto``/``triton``, else the flag's value."""
        backend = self.args.moe_runner_backend
        return "triton" if backend in TRITON_BACKENDS else backend

    def loaded_fingerprint(self) -> list:
        """What the lookups loaded: ``[[down_moe, outcome, path, sha256 or None], ...]``."""
        import hashlib

        out = []
        for x in self.moe.get("lookups", []):
            digest = None
            if x.get("path"):
                with open(x["path"], "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out.append([x["down_moe"], x["outcome"], x.get("path"), digest])
        return out

    def files_changed_since_first_start(self, loader) -> frozenset:
        """Real paths of config files new or changed since the first start (which records the
        files then, under the loader's ``configs/`` and ``$SGLANG_MOE_CONFIG_DIR/configs``)."""
        import hashlib

        roots = [os.path.join(os.path.dirname(os.path.realpath(loader.__file__)), "configs")]
        if os.environ.get("SGLANG_MOE_CONFIG_DIR"):
            roots.append(os.path.join(os.environ["SGLANG_MOE_CONFIG_DIR"], "configs"))
        now = {}
        for root in roots:
            for dirpath, _dirs, files in os.walk(root):
                for name in files:
                    path = os.path.realpath(os.path.join(dirpath, name))
                    with open(path, "rb") as f:
                        now[path] = hashlib.sha256(f.read()).hexdigest()
        state_dir = os.environ.get("ORCH_STANDIN_STATE_DIR", "/run/sglang-standin")
        os.makedirs(state_dir, exist_ok=True)
        baseline = os.path.join(state_dir, "files-baseline.json")
        if not os.path.exists(baseline):
            with open(baseline, "w") as f:
                json.dump(now, f)
            return frozenset()
        with open(baseline) as f:
            first = json.load(f)
        return frozenset(p for p, digest in now.items() if first.get(p) != digest)

    def configs_changed_since_first_start(self) -> bool:
        """True when this start loaded other config files than the first start (recorded then)."""
        state_dir = os.environ.get("ORCH_STANDIN_STATE_DIR", "/run/sglang-standin")
        os.makedirs(state_dir, exist_ok=True)
        path = os.path.join(state_dir, "baseline.json")
        now = self.loaded_fingerprint()
        if not os.path.exists(path):
            with open(path, "w") as f:
                json.dump(now, f)
            return False
        with open(path) as f:
            return json.load(f) != now

    def raise_out_of_resources(self) -> None:
        """Fail like a Triton launch whose config needs more shared memory than the GPU has."""
        sched_logger.error("Scheduler hit an exception during CUDA graph capture with the new MoE config.")
        try:
            from triton.runtime.errors import OutOfResources
        except ImportError:  # pragma: no cover - triton is installed where the stand-in runs
            raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448. "
                               "Reducing block sizes or `num_stages` may help.")
        raise OutOfResources(262144, 232448, "shared memory")

    def serve(self) -> None:
        """Bind the port, warm up in a thread, serve until SIGTERM/SIGINT."""
        server = self
        handler = type("Handler", (_Handler,), {"standin": server})
        self.httpd = _HTTPServer((self.args.host, self.args.port), handler)
        logger.info(f"Uvicorn running on http://{self.args.host}:{self.args.port} (Press CTRL+C to quit)")
        if _env_flag("ORCH_STANDIN_LEAK_PORT_HOLDER"):
            self.leak_port_holder()
        threading.Thread(target=self._warmup, daemon=True).start()

        def on_term(signum, frame):
            logger.info(f"Received signal {signum}; shutting down.")
            if self.ranks is not None:  # rank 0: the ShutdownReq broadcast stops every rank
                self.ranks.shutdown()
            threading.Thread(target=self.httpd.shutdown, daemon=True).start()

        def on_term_rank(signum, frame):  # SGLang 0.5.23 srt/entrypoints/engine.py, a rank >= 1
            logging.getLogger("sglang.srt.entrypoints.engine").warning(
                f"SIGTERM received on node_rank {self.args.node_rank}; waiting for the rank-0 ShutdownReq "
                "broadcast to stop the schedulers.")

        if _env_flag("ORCH_STANDIN_IGNORE_SIGTERM"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif self.health_only:
            signal.signal(signal.SIGTERM, on_term_rank)
        else:
            signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        if self.ranks is not None:
            self.ranks.watch(lambda: threading.Thread(target=self.httpd.shutdown, daemon=True).start())
        self.httpd.serve_forever(poll_interval=0.2)
        self.httpd.server_close()
        if self.ranks is not None:
            self.ranks.close()

    @property
    def health_only(self) -> bool:
        """True on a non-zero rank of a multi-node server: it serves only ``/health``."""
        return self.args.nnodes > 1 and self.args.node_rank >= 1

    def leak_port_holder(self) -> None:
        """Fork a child that keeps the listening socket (and nothing else of note: no GPU file) open
        and outlives the server: it starts a new session and is re-parented to PID 1, so a stop of
        the unit does not reach it. Its command line is the server's (a fork, no exec)."""
        if os.fork():
            return
        if os.fork():
            os._exit(0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(null, std)
        for fd in self.gpu_fds:
            os.close(fd)
        keep = self.httpd.socket.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, 4096)
        while True:
            time.sleep(3600)

    def _warmup(self) -> None:
        if self.never_ready:  # said once, so a test can wait for the decision instead of for a while
            logger.info("(stand-in) never ready: /health answers 503 until the server stops")
            return
        time.sleep(_env_float("ORCH_STANDIN_WARMUP_S", 2.0))
        self.health_503_until = time.monotonic() + self.health_503_s
        self.engine.ready.set()
        logger.info("The server is fired up and ready to roll!")
        if self.health_503_s > 0:  # said once, so a test can see the fault is on
            logger.error("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. "
                         f"(stand-in: /health answers 503 for {self.health_503_s:g} s more; generation works)")

    def healthy(self) -> bool:
        """What ``/health`` says: warm-up over and past ``ORCH_STANDIN_HEALTH_503_S``."""
        return self.engine.ready.is_set() and time.monotonic() >= self.health_503_until

    # --- API payloads ---------------------------------------------------------------------
    def model_info(self) -> Dict[str, Any]:
        return {"model_path": self.args.model_path, "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False, "model_type": None,
                "architectures": None}

    def server_info(self) -> Dict[str, Any]:
        a = self.args
        return {"model_path": a.model_path, "served_model_name": self.served_name, "tp_size": a.tp_size,
                "ep_size": a.ep_size, "dp_size": a.dp_size, "host": a.host, "port": a.port,
                "moe_runner_backend": a.moe_runner_backend, "quantization": a.quantization, "dtype": a.dtype,
                "disable_shared_experts_fusion": a.disable_shared_experts_fusion,
                # the stand-in says what it is where SGLang reports its version: orch prints it beside
                # the throughput it measured, which here comes from the model of speed above
                "version": f"{__version__} (orch test-bed stand-in: throughput simulated, not a model)",
                "internal_states": [{"last_gen_throughput": 0.0}],
                "standin_moe": self.moe}


class _HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer without the reverse DNS lookup of ``HTTPServer.server_bind``
    (``socket.getfqdn``), which would query a name server."""

    daemon_threads = True
    request_queue_size = 2048  # uvicorn's listen backlog (socketserver's default is 5)

    def server_bind(self) -> None:
        import socket
        import socketserver

        if _env_flag("ORCH_STANDIN_REUSE_PORT"):  # a second server may listen on the same port
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    standin: StandinServer = None  # set on the subclass
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet access log, like --log-requests off
        pass

    # --- helpers --------------------------------------------------------------------------
    def _send_json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj: Any) -> None:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        self._chunk(b"data: " + text.encode() + b"\n\n")

    def _end_stream(self) -> None:
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw.strip() else {}

    # --- routes ---------------------------------------------------------------------------
    def do_GET(self) -> None:
        s = self.standin
        path = self.path.split("?", 1)[0]
        if s.health_only and path not in ("/health", "/health_generate"):
            self._send_json(404, {"detail": "Not Found"})
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": s.served_name, "object": "model", "created": s.created, "owned_by": "sglang",
                "root": s.served_name, "max_model_len": s.args.context_length or 40960}]})
        elif path in ("/health", "/health_generate"):
            if s.healthy():
                self._send_empty(200)
            else:
                self._send_empty(503)
        elif path in ("/get_model_info", "/model_info"):
            self._send_json(200, s.model_info())
        elif path in ("/get_server_info", "/server_info"):
            self._send_json(200, s.server_info())
        elif path == "/flush_cache":
            self._send_empty(200)
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if self.standin.health_only:
            self._send_json(404, {"detail": "Not Found"})
            return
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError) as exc:
            self._send_json(400, {"error": {"message": f"invalid JSON: {exc}"}})
            return
        if path == "/generate":
            self._generate(body)
        elif path == "/v1/completions":
            self._completions(body, chat=False)
        elif path == "/v1/chat/completions":
            self._completions(body, chat=True)
        elif path == "/flush_cache":
            self._send_empty(200)
        else:
            self._send_json(404, {"detail": "Not Found"})

    def _generate(self, body: Dict[str, Any]) -> None:
        """SGLang native ``/generate``: ``text`` | ``input_ids`` (single or batch), ``sampling_params``, ``stream``."""
        s = self.standin
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text")
        if prompt is None:
            self._send_json(400, {"error": {"message": "Either text or input_ids should be provided."}})
            return
        batch = isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str))
        prompts = prompt if batch else [prompt]
        if body.get("stream") and not batch:
            self._start_stream()
            rid = uuid.uuid4().hex
            p_tokens = _count_prompt_tokens(prompts[0])
            text, ids, t0 = "", [], time.time()
            for i, tok in s.engine.generate(p_tokens, max_new, _prompt_text(prompts[0])):
                text += _token_text(tok)
                ids.append(tok)
                done = i == max_new - 1
                self._event({"text": text, "output_ids": list(ids), "meta_info": {
                    "id": rid, "finish_reason": {"type": "length", "length": max_new} if done else None,
                    "prompt_tokens": p_tokens, "completion_tokens": len(ids), "cached_tokens": 0,
                    "e2e_latency": time.time() - t0}})
            if max_new == 0:
                self._event({"text": "", "output_ids": [], "meta_info": {
                    "id": rid, "finish_reason": {"type": "length", "length": 0}, "prompt_tokens": p_tokens,
                    "completion_tokens": 0, "cached_tokens": 0, "e2e_latency": time.time() - t0}})
            self._end_stream()
            return
        outs = []
        for p in prompts:
            p_tokens = _count_prompt_tokens(p)
            t0 = time.time()
            ids = [tok for _, tok in s.engine.generate(p_tokens, max_new, _prompt_text(p))]
            outs.append({"text": "".join(_token_text(t) for t in ids), "output_ids": ids, "meta_info": {
                "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": max_new},
                "prompt_tokens": p_tokens, "completion_tokens": len(ids), "cached_tokens": 0,
                "e2e_latency": time.time() - t0}})
        self._send_json(200, outs if batch else outs[0])

    def _completions(self, body: Dict[str, Any], chat: bool) -> None:
        """OpenAI ``/v1/completions`` (and chat), streaming or not, with ``usage``."""
        s = self.standin
        if chat:
            msgs = body.get("messages") or []
            prompt: Any = " ".join(str(m.get("content", "")) for m in msgs)
        else:
            prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or (128 if chat else 16))
        p_tokens = _count_prompt_tokens(prompt)
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        model = body.get("model") or s.served_name
        created = int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._start_stream()
            n = 0
            for i, tok in s.engine.generate(p_tokens, max_new, _prompt_text(prompt)):
                n += 1
                done = i == max_new - 1
                if chat:
                    choice = {"index": 0, "delta": {"role": "assistant", "content": _token_text(tok)} if i == 0
                              else {"content": _token_text(tok)}, "logprobs": None,
                              "finish_reason": "length" if done else None}
                else:
                    choice = {"index": 0, "text": _token_text(tok), "logprobs": None,
                              "finish_reason": "length" if done else None}
                self._event({"id": cid, "object": obj + ".chunk" if chat else obj, "created": created,
                             "model": model, "choices": [choice], "usage": None})
            if include_usage:
                self._event({"id": cid, "object": obj + ".chunk" if chat else obj, "created": created,
                             "model": model, "choices": [], "usage": {
                                 "prompt_tokens": p_tokens, "completion_tokens": n, "total_tokens": p_tokens + n}})
            self._end_stream()
            return
        ids = [tok for _, tok in s.engine.generate(p_tokens, max_new, _prompt_text(prompt))]
        text = "".join(_token_text(t) for t in ids)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        self._send_json(200, {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice],
                              "usage": {"prompt_tokens": p_tokens, "completion_tokens": len(ids),
                                        "total_tokens": p_tokens + len(ids)}})


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m sglang.launch_server``. Returns 0 after a clean shutdown;
    start-up errors propagate (traceback, exit status 1)."""
    _setup_logging()
    args = parse_args(argv)
    _setup_logging(args.log_level)
    if args.enable_deterministic_inference:  # what the release's lookup reads (sglang.srt.server_args)
        os.environ["ORCH_STANDIN_DETERMINISTIC"] = "1"
    server = StandinServer(args)
    server.start()
    server.serve()
    for fd in server.gpu_fds:
        os.close(fd)
    return 0
