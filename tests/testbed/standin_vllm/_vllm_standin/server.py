"""The stand-in vLLM server: vLLM's CLI, HTTP API and start-up log, running a real release's MoE
config lookup (tests/testbed/README.md, "Stand-in vLLM").

Real (the release's own code, imported from its source through ``tests/vllm_standins.py``):
``FlexibleArgumentParser`` (underscores, ``vllm serve``'s ``--model`` rewrite, ``--config`` YAML),
vLLM's logger (format ``(APIServer pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message`` on stdout,
``VLLM_LOGGING_LEVEL``, ``VLLM_CONFIGURE_LOGGING``), ``get_config_file_name``, ``get_moe_configs``,
``try_get_optimal_moe_config`` (the files on disk, ``VLLM_TUNED_CONFIG_FOLDER``,
``VLLM_BATCH_INVARIANT``, the loaded/default lines at their levels, once per process) and, for the
unquantized backend list, the release's ``_get_priority_backends`` (``oracle/unquantized.py``) run
with the stand-in platform.

Stood in: the flags (the stand-in's parser has only the flags below, in vLLM's spellings; others
are accepted and ignored, where vLLM would refuse a misspelled one); ``--log-level`` (applied as
``VLLM_LOGGING_LEVEL`` before vLLM's logger starts); the model (``config.json`` only: E, N per
rank, hidden, top-k; no weights); the GPU (``ORCH_STANDIN_GPU_NAME``, ``ORCH_STANDIN_GPU_CAPABILITY``);
which backend runs (``--moe-backend`` named: that one; ``auto``: the first of the release's
priority list the stand-in can run: Triton, since no FlashInfer is installed here; fp8 weights:
``TRITON``); the CUDA-graph capture sizes (vLLM's default list up to 512: each asks the lookup);
generation (token ids from the prompt, not a model); uvicorn's own lines.

Start-up order, as vLLM's: the port is bound and listening first (``setup_server``), then the
engine starts (model shape, backend line, config lookup, capture), and only then does HTTP answer:
a request sent earlier waits. ``/health`` 200, ``/v1/models``, ``/version``, ``/v1/completions``,
``/metrics``; ``stream: true`` completions as server-sent events (:meth:`_Handler._stream`).
SIGTERM: ``Shutting down FastAPI HTTP server.``, exit 0.

The server holds the GPU files it is given (``ORCH_STANDIN_NVIDIA_DEV``, else ``/dev/nvidia0`` to
``TP x DP - 1`` where they exist), as vLLM's workers hold their GPUs.

Knobs: ``ORCH_STANDIN_VLLM_SRC`` (folder holding the release's ``vllm`` package: a tree of
``tests/testbed/vllm_tree.py``, which is the default when the server runs from one, else the
test cache's :data:`tests.vllm_releases.NEWEST`), ``ORCH_STANDIN_REPO`` (the repo root, for
``tests.vllm_standins`` outside a tree; default this file's repo), ``ORCH_STANDIN_WARMUP_S`` (1),
``ORCH_STANDIN_TOKEN_DELAY_MS`` (1.0), ``ORCH_STANDIN_FAIL_START=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: vLLM's default CUDA-graph capture sizes up to 512 (``config/vllm.py`` ``_set_cudagraph_sizes``)
CAPTURE_SIZES = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))


def _repo() -> Path:
    return Path(os.environ.get("ORCH_STANDIN_REPO") or Path(__file__).resolve().parents[3])


def _source() -> Path:
    if os.environ.get("ORCH_STANDIN_VLLM_SRC"):
        return Path(os.environ["ORCH_STANDIN_VLLM_SRC"])
    tree = Path(__file__).resolve().parents[1]  # a tree of tests/testbed/vllm_tree.py holds the release's files
    if (tree / "vllm/model_executor/layers/fused_moe/fused_moe.py").is_file():
        return tree
    from tests.vllm_releases import NEWEST, source_tree
    return source_tree(os.environ.get("ORCH_STANDIN_VLLM_RELEASE") or NEWEST)


def _pre_log_level(argv: list[str]) -> None:
    """``--log-level X`` (any spelling vLLM's parser accepts) becomes ``VLLM_LOGGING_LEVEL`` before
    vLLM's logger configures itself (the stand-in's form of ``configure_logging_from_args``)."""
    for i, a in enumerate(argv):
        name = a.split("=", 1)[0].replace("_", "-")
        if name == "--log-level":
            val = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            os.environ["VLLM_LOGGING_LEVEL"] = val.upper()


def _parser(flexible_cls, serve: bool):
    """The stand-in's parser: the release's ``FlexibleArgumentParser`` with the flags it reads."""

    class Tolerant(flexible_cls):
        def parse_known_args(self, args=None, namespace=None):
            ns, rest = super().parse_known_args(args, namespace)
            ns._ignored = [a for a in rest if a.startswith("-")]
            return ns, []

    def add(p):
        p.add_argument("model_tag", nargs="?")
        p.add_argument("--model", default="Qwen/Qwen3-0.6B")
        p.add_argument("--served-model-name", nargs="+", default=None)
        p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
        p.add_argument("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, default=False)
        p.add_argument("--quantization", "-q", default=None)
        p.add_argument("--dtype", default="auto")
        p.add_argument("--moe-backend", type=lambda s: s.lower().replace("-", "_"), default="auto")
        p.add_argument("--port", type=int, default=8000)
        p.add_argument("--host", default=None)
        p.add_argument("--log-level", default=None)
        p.add_argument("--max-model-len", type=int, default=None)
        return p
    if not serve:
        return add(Tolerant(description="vLLM OpenAI-Compatible RESTful API server."))
    top = Tolerant()
    sub = top.add_subparsers(dest="subparser")
    add(sub.add_parser("serve"))
    return top


def _shape(cfg: dict, tp: int, dp: int, ep: bool) -> tuple[int, int, int, int]:
    """(E, N per rank, hidden, top-k) of a config.json (the stand-in's own reading)."""
    c = cfg.get("text_config") or cfg
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts") or c["moe_num_experts"]
    inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    topk = c.get("num_experts_per_tok") or c.get("moe_k") or c["top_k_experts"]
    flat = tp * dp
    if ep and flat > 1:
        return experts // flat + (1 if experts % flat else 0), inter, c["hidden_size"], topk
    return experts, inter // flat, c["hidden_size"], topk


def _backend(fm_pkg_root: Path, flag: str, fp8: bool, dp: int) -> tuple[str, list[str] | None]:
    """(backend value, the list the line names or None) as the release would log them; ``dp``:
    the data-parallel size the release's priority function reads (SiLU activation assumed)."""
    names = {"triton": "TRITON", "batched_triton": "BATCHED_TRITON", "flashinfer_trtllm": "FlashInfer TRTLLM",
             "flashinfer_cutlass": "FlashInfer CUTLASS", "marlin": "Marlin", "deep_gemm": "DeepGEMM",
             "cutlass": "CUTLASS"}
    if fp8:
        return (names.get(flag, flag.upper()) if flag != "auto" else "TRITON"), None
    import ast
    from enum import Enum

    from tests.vllm_standins import CudaPlatformStandin
    src = (fm_pkg_root / "oracle" / "unquantized.py").read_text()
    keep = [n for n in ast.parse(src).body if (isinstance(n, ast.ClassDef) and n.name == "UnquantizedMoeBackend")
            or (isinstance(n, ast.FunctionDef) and n.name == "_get_priority_backends")]
    import types
    ns = {"Enum": Enum, "current_platform": _platform(CudaPlatformStandin()), "FusedMoEConfig": object,
          "MoEActivation": types.SimpleNamespace(SWIGLUOAI="swigluoai")}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(fm_pkg_root / "oracle/unquantized.py"), "exec"), ns)
    cfg = types.SimpleNamespace(moe_parallel_config=types.SimpleNamespace(dp_size=dp), activation="silu")
    order = [b.value for b in ns["_get_priority_backends"](cfg)]
    if flag not in ("auto", "marlin", "humming"):  # quantization-only names fall through to auto; a named backend: the line still names the priority list (0.34.0
        # ``select_unquantized_moe_backend`` -> ``return_or_raise(requested, AVAILABLE_BACKENDS)``;
        # 0.32.0/0.33.0 ``_return_or_raise`` -> ``_make_log_backend``, which always lists them)
        return names.get(flag, flag.upper()), order
    runnable = [b for b in order if b in ("TRITON", "BATCHED_TRITON")]
    return runnable[0], order


def _platform(p):
    cap = os.environ.get("ORCH_STANDIN_GPU_CAPABILITY", "9.0").split(".")
    p._cc = lambda: (int(cap[0]), int(cap[1]) if len(cap) > 1 else 0)
    return p


class _State:
    ready = threading.Event()
    names: list[str] = []
    model = ""
    release = ""
    max_model_len = 4096
    delay_s = 0.001


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # uvicorn's access line, on stdout
        print(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {args[1]}',
              flush=True)

    def _send(self, code: int, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        _State.ready.wait()
        if self.path == "/health":
            return self._send(200)
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [
                {"id": n, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": _State.model,
                 "parent": None, "max_model_len": _State.max_model_len} for n in _State.names]})
        if self.path == "/version":
            return self._send(200, {"version": _State.release})
        if self.path == "/metrics":
            data = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        return self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        _State.ready.wait()
        n = int(self.headers.get("content-length") or 0)
        try:
            req = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            return self._send(400, {"error": {"message": "invalid JSON", "type": "BadRequestError", "code": 400}})
        if self.path != "/v1/completions":
            return self._send(404, {"detail": "Not Found"})
        # vLLM's _is_model_supported: a request naming no model is the served model's
        if req.get("model") and req.get("model") not in _State.names:
            return self._send(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                              "type": "NotFoundError", "param": "model", "code": 404}})
        prompt = str(req.get("prompt", ""))
        k = max(1, int(req.get("max_tokens") or 16))
        seed = zlib.crc32(prompt.encode())
        ids = [(seed + 7919 * i) % 32000 for i in range(k)]
        # a token-id prompt is its ids; a text prompt counts its words (the stand-in's tokenizer)
        p = len(req["prompt"]) if isinstance(req.get("prompt"), list) else len(prompt.split())
        if req.get("stream"):
            return self._stream(req, seed, ids, p)
        time.sleep(_State.delay_s * k)
        choice = {"index": 0, "text": "".join(f" t{t}" for t in ids), "logprobs": None, "finish_reason": "length",
                  "stop_reason": None}
        if req.get("return_token_ids"):
            choice["token_ids"] = ids
        self._send(200, {"id": f"cmpl-{seed:x}", "object": "text_completion", "created": int(time.time()),
                         "model": req.get("model") or _State.names[0], "choices": [choice],
                         "usage": {"prompt_tokens": p, "completion_tokens": k, "total_tokens": p + k}})


    def _stream(self, req: dict, seed: int, ids: list[int], p: int) -> None:
        """A streamed completion as vLLM's ``completion/serving.py`` sends it: server-sent events
        (``data: {chunk}``), one text chunk per token (``finish_reason`` on the last), with
        ``stream_options.include_usage`` a last chunk with no choices and the ``usage``, then
        ``data: [DONE]``; chunked transfer encoding, as uvicorn sends a streamed response."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        head = {"id": f"cmpl-{seed:x}", "object": "text_completion", "created": int(time.time()),
                "model": req.get("model") or _State.names[0]}

        def event(data: str) -> None:
            raw = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()
        for i, t in enumerate(ids):
            time.sleep(_State.delay_s)
            choice = {"index": 0, "text": f" t{t}", "logprobs": None,
                      "finish_reason": "length" if i == len(ids) - 1 else None, "stop_reason": None}
            if req.get("return_token_ids"):
                choice["token_ids"] = [t]
            event(json.dumps({**head, "choices": [choice]}))
        if (req.get("stream_options") or {}).get("include_usage"):
            event(json.dumps({**head, "choices": [],
                              "usage": {"prompt_tokens": p, "completion_tokens": len(ids),
                                        "total_tokens": p + len(ids)}}))
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main(argv: list[str]) -> int:
    """Run the stand-in with vLLM's parser input ``argv`` (a leading ``serve`` for ``vllm serve``)."""
    try:
        import tests.vllm_standins  # noqa: F401 - a tree carries its own copy
    except ImportError:
        sys.path.insert(0, str(_repo()))
    _pre_log_level(argv)
    from tests import vllm_standins as vs
    src = _source()
    fm = vs.fused_moe_module(src, cpu=True)
    import logging
    import vllm.logger as vlog
    # the entry point's configure_logging_from_args, with no config object: the release's own
    # root-logger set-up from VLLM_LOGGING_LEVEL / VLLM_CONFIGURE_LOGGING / VLLM_LOGGING_STREAM
    vlog._configure_vllm_root_logger(None)
    if hasattr(vlog, "set_vllm_process_name"):
        vlog.set_vllm_process_name("APIServer")
    logger = vlog.init_logger("vllm.entrypoints.launchers.api_server.entry")
    flexible = __import__("vllm.utils.argparse_utils", fromlist=["x"]).FlexibleArgumentParser
    serve = argv[:1] == ["serve"]
    args = _parser(flexible, serve).parse_args(list(argv))
    model = (args.model_tag if serve and args.model_tag else args.model)
    # the sdist's version.py reads a generated _version module: the cache folder names the release
    _State.model = model
    _State.release = src.name if src.name[:1].isdigit() else vs._version(src)
    _State.names = list(args.served_model_name or [model])
    _State.delay_s = float(os.environ.get("ORCH_STANDIN_TOKEN_DELAY_MS", "1.0")) / 1000
    if args.max_model_len:
        _State.max_model_len = args.max_model_len
    logger.info("vLLM server version %s, serving model %s", _State.release, model)
    if args._ignored:
        logger.info("stand-in: flags it does not model, ignored: %s", args._ignored)
    host = args.host or ""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, args.port))
    sock.listen(128)  # vLLM's setup_server: the port is held before the engine starts
    httpd = ThreadingHTTPServer((host or "0.0.0.0", args.port), _Handler, bind_and_activate=False)
    httpd.socket = sock
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def stop(signum, frame):
        logger.info("Shutting down FastAPI HTTP server.")
        logging.shutdown()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)

    # the GPUs the engine opens (as vLLM's worker holds /dev/nvidiaN): ORCH_STANDIN_NVIDIA_DEV, else 0..TP x DP-1
    devs = os.environ.get("ORCH_STANDIN_NVIDIA_DEV") or ",".join(
        f"/dev/nvidia{i}" for i in range(args.tensor_parallel_size * args.data_parallel_size))
    held = [open(d, "rb") for d in devs.split(",") if d and os.path.exists(d)]  # noqa: SIM115 - held for life
    if os.environ.get("ORCH_STANDIN_FAIL_START") == "1":
        raise RuntimeError("Engine core initialization failed. See root cause above. (stand-in fault)")
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config") or {}
    method = (qc.get("quant_method") or args.quantization or "").lower()
    fp8 = method == "fp8"
    block = [int(x) for x in qc["weight_block_size"]] if fp8 and qc.get("weight_block_size") else None
    E, N, hidden, topk = _shape(cfg, args.tensor_parallel_size, args.data_parallel_size, args.enable_expert_parallel)
    backend, order = _backend(Path(fm.__file__).resolve().parent, args.moe_backend, fp8, args.data_parallel_size)
    kind = "Fp8" if fp8 else "Unquantized"
    avail = f" out of potential backends: {order}" if order is not None else ""
    engine_log = vlog.init_logger(f"vllm.model_executor.layers.fused_moe.oracle.{kind.lower()}")
    engine_log.info("Using %s %s MoE backend%s.", backend, kind, avail)
    if backend in ("TRITON", "BATCHED_TRITON"):
        dtype = "fp8_w8a8" if fp8 else None
        w1, w2 = (E, 2 * N, hidden), (E, hidden, N)
        import inspect
        down = fp8 and block == [128, 128] and "down_moe" in inspect.signature(fm.get_moe_configs).parameters
        for M in CAPTURE_SIZES:
            fm.try_get_optimal_moe_config(w1, w2, topk, dtype, M, block)
            if down:  # 0.34.0 TritonExperts.apply: the down GEMM's TMA config
                fm.get_moe_configs(E, N, dtype, block[0], block[1], down_moe=True)
    time.sleep(float(os.environ.get("ORCH_STANDIN_WARMUP_S", "1")))
    shown = host or "0.0.0.0"
    logger.info("Starting vLLM server on http://%s:%d", shown, args.port)
    print(f"INFO:     Started server process [{os.getpid()}]\nINFO:     Waiting for application startup.\n"
          "INFO:     Application startup complete.", flush=True)
    _State.ready.set()
    threading.Event().wait()
    del held
    return 0
