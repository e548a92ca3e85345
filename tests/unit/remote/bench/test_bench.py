"""Tests of the payload's ``bench`` command (remote/bench/: command.py, common.py, builtin.py; remote/engines/sglang/bench_tool.py).

A tiny in-test stdlib HTTP server (loopback only) plays SGLang's streaming ``/generate``
and ``/v1/completions`` and can answer 500s, stall, or send errors, so failure counting,
timeouts and metric math are checked against known server behaviour. The agreement
test against the stand-in SGLang server (tests/testbed/standin) and the independent
httpx client tests/unit/remote/bench/oracle.py is at the end; it is skipped when the stand-in
is absent.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from remote.bench import builtin as bench
from remote.bench import command, common
from remote.engines.sglang import bench_tool as bench_sglang
from remote.protocol import PayloadError
from tests.paths import REPO as _REPO
from tests.waiting import run_watched

REPO = _REPO
PY = sys.executable


# --------------------------------------------------------------------------- fake server


class FakeServer(ThreadingHTTPServer):
    """Streams ``out`` tokens per request, ``gap_s`` apart, after ``first_s``.

    ``fail_every``: every k-th request (1-based count) answers HTTP 500.
    ``stall``: send headers and one chunk, then nothing (until ``release`` is set).
    ``tokens_per_chunk``: how many tokens each chunk reports (meta_info cumulative).
    ``report_usage``: include completion_tokens/prompt_tokens; else only text.
    ``error_every``: every k-th request gets an ``{"error": ...}`` chunk mid-stream.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, **cfg):
        super().__init__(("127.0.0.1", 0), Handler)
        self.cfg = {"first_s": 0.0, "gap_s": 0.0, "fail_every": 0, "stall": False,
                    "tokens_per_chunk": 1, "report_usage": True, "error_every": 0,
                    "prompt_extra": 0, "models": ["fake-model"], "repeat_last": False}
        self.cfg.update(cfg)
        self.count = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # a client that went away (timeout tests, pooled idle connections)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        srv: FakeServer = self.server
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in srv.cfg["models"]]})
            raw = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        else:
            self.send_error(404)

    def do_POST(self):
        srv: FakeServer = self.server
        cfg = srv.cfg
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.count += 1
            k = srv.count
            srv.bodies.append(body)
            srv.paths.append(self.path)
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        self._counted = True
        try:
            self._serve(srv, cfg, body, k)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self._generation_over(srv)

    def _generation_over(self, srv) -> None:
        """The request stops counting as in flight: before its last frame is written, since a
        client may send its next request the moment it reads that frame (counting after the
        write raced with it and saw one request too many in flight under load)."""
        if getattr(self, "_counted", False):
            self._counted = False
            with srv.lock:
                srv.in_flight -= 1

    def _serve(self, srv, cfg, body, k):
        if cfg["fail_every"] and k % cfg["fail_every"] == 0:
            raw = b'{"error": "boom"}'
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        openai = self.path == "/v1/completions"
        if openai:
            out = body["max_tokens"]
            n_in = len(body["prompt"])
        else:
            out = body["sampling_params"]["max_new_tokens"]
            n_in = len(body["input_ids"])
        n_in += cfg["prompt_extra"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        time.sleep(cfg["first_s"])
        produced = 0
        step = cfg["tokens_per_chunk"]
        i = 0
        while produced < out:
            if i > 0:
                time.sleep(cfg["gap_s"])
            if cfg["error_every"] and k % cfg["error_every"] == 0 and produced >= out // 2:
                self._chunk(b'data: {"error": {"message": "scheduler died"}}\n\n')
                break
            produced = min(out, produced + step)
            if openai:
                obj = {"choices": [{"text": "x" * step, "index": 0}]}
            else:
                obj = {"text": "x" * produced}
                if cfg["report_usage"]:
                    obj["meta_info"] = {"completion_tokens": produced, "prompt_tokens": n_in}
            self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")
            i += 1
            if cfg["stall"]:
                srv.release.wait(30)
                return
        if cfg["repeat_last"] and not openai:  # a final chunk repeating the last count
            self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")
        if openai and cfg["report_usage"]:
            usage = {"choices": [], "usage": {"completion_tokens": produced, "prompt_tokens": n_in}}
            self._chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
        self._generation_over(srv)
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


@pytest.fixture
def fake():
    servers = []

    def start(**cfg) -> FakeServer:
        srv = FakeServer(**cfg)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.release.set()
        srv.shutdown()
        srv.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_run(capsys, **kw):
    data = bench.run_builtin(**kw)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    return data, lines


# --------------------------------------------------------------------------- pure helpers


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.uniform(0, 100) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert bench.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-12)
    with pytest.raises(ValueError):
        bench.percentile([], 50)


def test_compute_level_metrics_math():
    # three completed requests with known times, one failed, one timed out, one never sent
    def done(start, ttft, gaps, end, pin, pout):
        return bench.RequestRecord(status="completed", start=start, end=end, ttft=ttft, itl=list(gaps),
                                   prompt_tokens=pin, output_tokens=pout)

    recs = [
        done(0.0, 0.1, [0.01, 0.03], 0.2, 10, 3),
        done(0.0, 0.2, [0.02], 0.5, 10, 2),
        done(1.0, 0.3, [], 1.4, 12, 1),
        bench.RequestRecord(status="failed", error="HTTP 500 x", start=0, end=0.1),
        bench.RequestRecord(status="timed_out", error="slow", start=0, end=2.0),
        None,
    ]
    m = bench.compute_level_metrics(recs, 2.0, 4, 6)
    assert m["completed"] == 3 and m["failed"] == 1 and m["timed_out"] == 2 and m["not_sent"] == 1
    assert m["total_input_tokens"] == 32 and m["total_output_tokens"] == 6
    assert m["duration"] == 2.0
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(16.0)
    assert m["output_throughput"] == pytest.approx(3.0)
    assert m["total_throughput"] == pytest.approx(19.0)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    # linear interpolation: position (3-1)*0.99 = 1.98 between 200 ms and 300 ms
    assert m["p99_ttft_ms"] == pytest.approx(200.0 + 0.98 * 100.0)
    assert m["mean_itl_ms"] == pytest.approx(20.0)
    assert m["median_itl_ms"] == pytest.approx(20.0)
    lat = [0.2, 0.5, 0.4]
    assert m["mean_e2e_latency_ms"] == pytest.approx(sum(lat) / 3 * 1000)
    assert m["median_e2e_latency_ms"] == pytest.approx(400.0)
    assert m["max_concurrency"] == 4
    assert m["valid"] is False
    assert m["failure_rate"] == pytest.approx(0.5)
    assert any("HTTP 500" in e for e in m["errors"]) and any("not sent" in e for e in m["errors"])


def test_validity_threshold_is_one_percent():
    ok = bench.RequestRecord(status="completed", start=0, end=1, ttft=0.1, prompt_tokens=1, output_tokens=1)
    bad = bench.RequestRecord(status="failed", error="x")
    m = bench.compute_level_metrics([ok] * 99 + [bad], 1.0, 1, 100)
    assert m["valid"] is True  # exactly 1 %
    m = bench.compute_level_metrics([ok] * 98 + [bad] * 2, 1.0, 1, 100)
    assert m["valid"] is False
    m = bench.compute_level_metrics([], 1.0, 1, 0)
    assert m["valid"] is False and m["mean_ttft_ms"] is None


def test_metric_names_match_bench_serving():
    # the names sglang.bench_serving writes into --output-file (SGLang 0.5.x)
    expected = {"duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "input_throughput", "output_throughput", "total_throughput", "mean_ttft_ms", "median_ttft_ms",
                "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms",
                "median_e2e_latency_ms"}
    assert set(common.METRIC_NAMES) == expected
    assert set(bench_sglang.FIELD_ALIASES) >= expected


def test_prompts_are_deterministic_and_sized():
    a = bench.make_prompts(3, 17, seed=5)
    assert a == bench.make_prompts(3, 17, seed=5)
    assert a != bench.make_prompts(3, 17, seed=6)
    assert [len(p) for p in a] == [17] * 3
    assert all(bench.VOCAB_LO <= t < bench.DEFAULT_VOCAB_HI for p in a for t in p)


@pytest.mark.parametrize("url", ["ftp://x:1", "127.0.0.1:30000", "http://", "http://h:1/?q=1", "http://h:99999"])
def test_bad_url_rejected(url):
    with pytest.raises(PayloadError) as ei:
        common.parse_url(url)
    assert ei.value.kind == "bad_input"


@pytest.mark.parametrize("text", ["", "0", "1,x", "-4"])
def test_bad_concurrency_rejected(text):
    with pytest.raises(PayloadError):
        command.parse_concurrency(text)


def test_concurrency_and_default_prompts():
    assert command.parse_concurrency("1, 16,64") == [1, 16, 64]
    assert common.default_num_prompts(1) == 10 and common.default_num_prompts(16) == 80


# --------------------------------------------------------------------------- against the fake server


def test_all_ok_counts_tokens_and_concurrency(fake, capsys):
    srv = fake(first_s=0.02, gap_s=0.01)
    data, lines = quiet_run(capsys, url=srv.url, levels=[1, 4], input_len=8, output_len=5,
                            num_prompts=12, warmup=1, level_timeout=30, request_timeout=10)
    assert data["tool"] == "builtin" and data["url"] == srv.url
    assert [lv["max_concurrency"] for lv in data["levels"]] == [1, 4]
    for lv in data["levels"]:
        for name in common.METRIC_NAMES + common.LEVEL_EXTRA_NAMES:
            assert name in lv, name
        assert lv["completed"] == 12 and lv["failed"] == 0 and lv["timed_out"] == 0 and lv["valid"] is True
        assert lv["total_output_tokens"] == 12 * 5 and lv["total_input_tokens"] == 12 * 8
        # the server waits 20 ms before the first token and 10 ms between tokens
        assert lv["mean_ttft_ms"] >= 19.0 and lv["median_itl_ms"] >= 9.0
        assert lv["mean_e2e_latency_ms"] >= 20.0 + 4 * 10.0 - 1.0
        assert lv["output_throughput"] == pytest.approx(lv["total_output_tokens"] / lv["duration"])
    # 2 levels x (12 measured + 1 warm-up)
    assert srv.count == 26
    assert srv.max_in_flight <= 4
    assert all(b["stream"] is True and b["sampling_params"]["ignore_eos"] is True for b in srv.bodies)
    assert all(len(b["input_ids"]) == 8 for b in srv.bodies)
    prog = [ln for ln in lines if ln["type"] == "progress"]
    assert [(p["done"], p["total"], p["max_concurrency"]) for p in prog] == [(1, 2, 1), (2, 2, 4)]
    # concurrency 1 serialises: duration is at least the sum of latencies
    lv1 = data["levels"][0]
    assert lv1["duration"] * 1000 >= 12 * lv1["mean_e2e_latency_ms"] * 0.999


def test_concurrency_is_reached(fake, capsys):
    srv = fake(first_s=0.2, gap_s=0.0)
    data, _ = quiet_run(capsys, url=srv.url, levels=[6], input_len=2, output_len=2,
                        num_prompts=12, warmup=0, level_timeout=30, request_timeout=10)
    assert srv.max_in_flight == 6
    assert data["levels"][0]["completed"] == 12


def test_warmup_is_not_measured(fake, capsys):
    srv = fake()
    data, _ = quiet_run(capsys, url=srv.url, levels=[2], input_len=3, output_len=40,
                        num_prompts=3, warmup=2, level_timeout=30, request_timeout=10)
    lv = data["levels"][0]
    assert srv.count == 5 and lv["completed"] == 3 and lv["total_output_tokens"] == 3 * 40
    asked = sorted(b["sampling_params"]["max_new_tokens"] for b in srv.bodies)
    assert asked == [32, 32, 40, 40, 40]  # warm-up requests are capped at 32 tokens
    assert lv["warmup_failed"] == 0


def test_server_reported_tokens_win_over_chunks(fake, capsys):
    # 3 tokens per chunk: output tokens come from meta_info, ITL split per token
    srv = fake(tokens_per_chunk=3, gap_s=0.03, prompt_extra=1)
    data, _ = quiet_run(capsys, url=srv.url, levels=[2], input_len=4, output_len=9,
                        num_prompts=4, warmup=0, level_timeout=30, request_timeout=10)
    lv = data["levels"][0]
    assert lv["total_output_tokens"] == 4 * 9
    assert lv["total_input_tokens"] == 4 * 5  # the server's prompt_tokens, not the ids sent
    # 3 chunks -> 2 gaps of ~30 ms, each split into 3 ITL entries of ~10 ms
    assert 9.0 <= lv["median_itl_ms"] < 30.0


def test_stream_request_itl_per_token(fake):
    srv = fake(repeat_last=True, gap_s=0.002)
    target = common.parse_url(srv.url)
    rec = bench.stream_request(target, "generate", [5] * 7, 6, None, 10.0, time.perf_counter() + 10)
    assert rec.status == "completed", rec.error
    assert rec.output_tokens == 6 and rec.prompt_tokens == 7 and rec.chunks == 6
    assert len(rec.itl) == 5  # one gap per token after the first; the repeated chunk adds none
    assert rec.ttft is not None and 0 < rec.ttft <= rec.latency


def test_chunks_counted_when_no_usage(fake, capsys):
    srv = fake(report_usage=False, tokens_per_chunk=2)
    data, _ = quiet_run(capsys, url=srv.url, levels=[1], input_len=4, output_len=6,
                        num_prompts=3, warmup=0, level_timeout=30, request_timeout=10)
    assert data["levels"][0]["total_output_tokens"] == 3 * 3  # 3 chunks per request


def test_http_500_counted_failed_and_invalid(fake, capsys):
    srv = fake(fail_every=5)
    data, lines = quiet_run(capsys, url=srv.url, levels=[3], input_len=4, output_len=3,
                            num_prompts=20, warmup=0, level_timeout=30, request_timeout=10)
    lv = data["levels"][0]
    assert lv["failed"] == 4 and lv["completed"] == 16 and lv["timed_out"] == 0
    assert lv["valid"] is False
    assert any("HTTP 500" in e for e in lv["errors"])
    assert srv.count == 20  # no retries
    assert any(ln["type"] == "log" and ln["level"] == "warning" for ln in lines)


def test_error_chunk_counted_failed(fake, capsys):
    srv = fake(error_every=2)
    data, _ = quiet_run(capsys, url=srv.url, levels=[1], input_len=4, output_len=4,
                        num_prompts=6, warmup=0, level_timeout=30, request_timeout=10)
    lv = data["levels"][0]
    assert lv["failed"] == 3 and lv["completed"] == 3
    assert any("scheduler died" in e for e in lv["errors"])


def test_stalled_stream_times_out_within_bound(fake, capsys):
    srv = fake(stall=True)  # each stream stalls after its first chunk until the fixture ends
    data, _ = quiet_run(capsys, url=srv.url, levels=[4], input_len=4, output_len=4,
                        num_prompts=4, warmup=0, level_timeout=30, request_timeout=0.5)
    lv = data["levels"][0]
    assert lv["timed_out"] == 4 and lv["completed"] == 0 and lv["valid"] is False
    # all four in parallel, each given up at its 0.5 s bound while the server still stalled it
    # (the stall ends only at teardown): the bound, not the server, ended them
    assert srv.max_in_flight == 4 and not srv.release.is_set()
    assert lv["errors"] and all("within 0.5 s" in e for e in lv["errors"]), lv["errors"]


def test_level_deadline_bounds_the_level(fake, capsys):
    srv = fake(gap_s=0.05)  # 10 tokens: at least 0.45 s per request, serialised at C=1
    data, _ = quiet_run(capsys, url=srv.url, levels=[1], input_len=4, output_len=10,
                        num_prompts=20, warmup=0, level_timeout=1.0, request_timeout=10)
    lv = data["levels"][0]
    # the server paces each request (9 gaps of 0.05 s): in the 1 s of the level at most 3 can have
    # started, a slower machine only fewer; without the deadline all 20 would have been sent
    assert srv.count <= 3, srv.count
    assert lv["completed"] + lv["failed"] + lv["timed_out"] == 20
    assert lv["not_sent"] >= 10 and lv["completed"] >= 1 and lv["valid"] is False


def test_connection_refused_is_failed_not_raised(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    data, _ = quiet_run(capsys, url=url, levels=[2], input_len=4, output_len=4,
                        num_prompts=4, warmup=0, level_timeout=10, request_timeout=2)
    lv = data["levels"][0]
    assert lv["failed"] == 4 and lv["valid"] is False
    assert lv["output_throughput"] == 0 and lv["mean_ttft_ms"] is None


def test_openai_api_discovers_model(fake, capsys):
    srv = fake(gap_s=0.005, models=["my/model"])
    data, _ = quiet_run(capsys, url=srv.url, levels=[2], input_len=5, output_len=4, api="openai",
                        num_prompts=4, warmup=0, level_timeout=30, request_timeout=10)
    lv = data["levels"][0]
    assert lv["completed"] == 4 and lv["total_output_tokens"] == 16 and lv["total_input_tokens"] == 20
    assert set(srv.paths) == {"/v1/completions"}
    assert all(b["model"] == "my/model" and b["max_tokens"] == 4 and len(b["prompt"]) == 5 for b in srv.bodies)
    assert data["settings"]["model"] == "my/model"
    # the final usage-only chunk is a total, not 4 new tokens arriving at once
    assert lv["median_itl_ms"] >= 4.0 and lv["mean_itl_ms"] >= 4.0


def test_openai_without_models_is_runtime_error(fake):
    srv = fake(models=[])
    with pytest.raises(PayloadError) as ei:
        bench.run_builtin(url=srv.url, levels=[1], input_len=2, output_len=2, api="openai", warmup=0)
    assert ei.value.kind == "runtime"


def _cli(args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = run_watched([PY, "-m", "remote", "bench", *args], cwd=REPO, env=env)
    return p.returncode, [json.loads(x) for x in p.stdout.splitlines() if x.strip()], p.stderr


def test_cli_protocol_lines(fake):
    srv = fake()
    rc, lines, err = _cli(["--url", srv.url, "--concurrency", "1,2", "--input-len", "4", "--output-len", "3",
                           "--num-prompts", "4", "--warmup", "0", "--level-timeout", "20"])
    assert rc == 0, err
    assert all(ln["proto"] == 1 for ln in lines)
    assert lines[-1]["type"] == "result"
    data = lines[-1]["data"]
    assert [lv["completed"] for lv in data["levels"]] == [4, 4]
    assert sum(1 for ln in lines if ln["type"] == "progress") == 2


def test_cli_bad_input_exit_2():
    rc, lines, _ = _cli(["--url", "nonsense", "--concurrency", "1"])
    assert rc == 2 and lines[-1]["type"] == "error" and lines[-1]["kind"] == "bad_input"


@pytest.mark.parametrize("tool,engine,own", [("vllm", "sglang", "--tool sglang"), ("sglang", "vllm", "--tool vllm")])
def test_cli_refuses_another_engines_client(tool, engine, own):
    """An engine's own client is for its own server: ``--tool`` of another engine than
    ``--engine`` is bad input, before any request or client runs (the URL answers nothing)."""
    rc, lines, _ = _cli(["--url", "http://127.0.0.1:9", "--concurrency", "1", "--tool", tool, "--engine", engine])
    assert rc == 2 and lines[-1]["kind"] == "bad_input"
    assert f"--tool {tool} is" in lines[-1]["msg"] and own in lines[-1]["msg"] and "http://127.0.0.1:9" in lines[-1]["msg"]


# --------------------------------------------------------------------------- --tool sglang


SGLANG_NEW = {  # field list of SGLang 0.5.x bench_serving --output-file
    "backend": "sglang", "dataset_name": "random-ids", "max_concurrency": 16, "duration": 20.0,
    "completed": 80, "total_input_tokens": 81920, "total_output_tokens": 20480,
    "total_output_tokens_retokenized": 20400, "request_throughput": 4.0, "input_throughput": 4096.0,
    "output_throughput": 1024.0, "total_throughput": 5120.0, "mean_e2e_latency_ms": 3000.0,
    "median_e2e_latency_ms": 2900.0, "p99_e2e_latency_ms": 4000.0, "mean_ttft_ms": 100.0,
    "median_ttft_ms": 90.0, "p99_ttft_ms": 300.0, "mean_tpot_ms": 11.0, "mean_itl_ms": 11.5,
    "median_itl_ms": 11.0, "p99_itl_ms": 40.0, "concurrency": 15.1,
}


def test_parse_new_sglang_record():
    m = bench_sglang.parse_bench_serving_record(SGLANG_NEW)
    for k in common.METRIC_NAMES:
        assert m[k] == pytest.approx(SGLANG_NEW[k]), k
    assert isinstance(m["completed"], int)


def test_parse_old_sglang_record_computes_total_throughput():
    old = {k: v for k, v in SGLANG_NEW.items() if k != "total_throughput"}
    old["duration"] = 16.0
    m = bench_sglang.parse_bench_serving_record(old)
    assert m["total_throughput"] == pytest.approx((81920 + 20480) / 16.0)
    # present values are taken as written, not recomputed
    assert m["output_throughput"] == 1024.0


def test_parse_vllm_record():
    vllm = {"duration": 10.0, "completed": 50, "total_input_tokens": 5000, "total_output_tokens": 2500,
            "request_throughput": 5.0, "output_throughput": 250.0, "total_token_throughput": 750.0,
            "mean_ttft_ms": 20.0, "median_ttft_ms": 19.0, "p99_ttft_ms": 50.0, "mean_itl_ms": 5.0,
            "median_itl_ms": 4.0, "p99_itl_ms": 9.0, "mean_e2el_ms": 800.0, "median_e2el_ms": 790.0,
            "p99_e2el_ms": 900.0}
    m = bench_sglang.parse_bench_serving_record(vllm)
    assert m["total_throughput"] == 750.0
    assert m["mean_e2e_latency_ms"] == 800.0 and m["median_e2e_latency_ms"] == 790.0
    assert m["input_throughput"] == pytest.approx(500.0)  # derived: absent in vLLM output


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        bench_sglang.parse_bench_serving_record({"backend": "sglang"})
    with pytest.raises(ValueError):
        bench_sglang.parse_bench_serving_record([1, 2])


def test_build_command_uses_offline_dataset():
    cmd = bench_sglang.build_command("http://127.0.0.1:1", 16, 1024, 256, 80, 3, "/tmp/f.jsonl", python="py")
    assert cmd[:3] == ["py", "-m", "sglang.bench_serving"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags == {"--backend": "sglang", "--base-url": "http://127.0.0.1:1", "--dataset-name": "random-ids",
                     "--random-input-len": "1024", "--random-output-len": "256", "--random-range-ratio": "1.0",
                     "--num-prompts": "80", "--max-concurrency": "16", "--seed": "3",
                     "--output-file": "/tmp/f.jsonl"}


FAKE_BENCH_SERVING = r'''
import argparse, json, sys, time
p = argparse.ArgumentParser()
for f in ("--backend", "--base-url", "--dataset-name", "--random-input-len", "--random-output-len",
          "--random-range-ratio", "--num-prompts", "--max-concurrency", "--seed", "--output-file", "--model"):
    p.add_argument(f)
a = p.parse_args()
c = int(a.max_concurrency)
if c == 99:
    time.sleep(60)
n = int(a.num_prompts)
done = n - (1 if c == 7 else 0)
rec = {"backend": a.backend, "dataset_name": a.dataset_name, "max_concurrency": c, "duration": 2.0,
       "completed": done, "total_input_tokens": done * int(a.random_input_len),
       "total_output_tokens": done * int(a.random_output_len), "request_throughput": done / 2.0,
       "input_throughput": 1.0, "output_throughput": done * int(a.random_output_len) / 2.0,
       "mean_ttft_ms": 1.0, "median_ttft_ms": 1.0, "p99_ttft_ms": 1.0, "mean_itl_ms": 1.0,
       "median_itl_ms": 1.0, "p99_itl_ms": 1.0, "mean_e2e_latency_ms": 1.0, "median_e2e_latency_ms": 1.0}
with open(a.output_file, "a") as f:
    f.write(json.dumps({"stale": True, "duration": 1}) + "\n")
    f.write(json.dumps(rec) + "\n")
'''


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    pkg = tmp_path / "fakesg" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bench_serving.py").write_text(FAKE_BENCH_SERVING)
    monkeypatch.syspath_prepend(str(tmp_path / "fakesg"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fakesg"))
    return pkg


def test_run_sglang_levels(fake_sglang, capsys):
    data = bench_sglang.run_sglang("http://127.0.0.1:9", [2, 7], input_len=16, output_len=4, level_timeout=30)
    out = capsys.readouterr().out
    assert data["tool"] == "sglang"
    l2, l7 = data["levels"]
    assert l2["max_concurrency"] == 2 and l2["num_prompts"] == 10 and l2["completed"] == 10
    assert l2["total_throughput"] == pytest.approx((160 + 40) / 2.0)  # computed: absent in the record
    assert l2["valid"] is True and l2["failed"] == 0
    assert l7["num_prompts"] == 35 and l7["failed"] == 1 and l7["valid"] is False  # 1/35 > 1 %
    assert out.count('"type": "progress"') == 2


def test_run_sglang_timeout_kills_and_reports(fake_sglang, monkeypatch, capsys):
    monkeypatch.setattr(bench_sglang, "STARTUP_ALLOWANCE_S", 0.0)
    t0 = time.monotonic()
    data = bench_sglang.run_sglang("http://127.0.0.1:9", [99], input_len=4, output_len=4, level_timeout=1.5)
    assert time.monotonic() - t0 < 10
    lv = data["levels"][0]
    assert lv["valid"] is False and lv["timed_out"] == lv["num_prompts"]
    assert any("ran past" in e for e in lv["errors"])


def test_run_sglang_absent_is_not_found(monkeypatch):
    monkeypatch.setattr(bench_sglang, "sglang_available", lambda: False)
    with pytest.raises(PayloadError) as ei:
        bench_sglang.run_sglang("http://127.0.0.1:9", [1], input_len=4, output_len=4)
    assert ei.value.kind == "not_found"


# --------------------------------------------------------------------------- agreement with the oracle



def _wait_ready(url: str, proc: subprocess.Popen, deadline_s: float) -> None:
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"stand-in exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            c.close()
        time.sleep(0.1)  # poll interval, not a readiness assumption
    raise TimeoutError("stand-in not ready")


@pytest.fixture
def standin_factory(tmp_path):
    """Start stand-in SGLang servers on loopback; ``start(**extra_env) -> url``; stopped at teardown."""
    from tests.testbed.standin_tree import make_tree

    tree = tmp_path / "sglang-tree"
    make_tree(tree)  # the stand-in, running the real release's config-lookup module
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "moe_intermediate_size": 64,
        "hidden_size": 128, "num_experts_per_tok": 2, "torch_dtype": "bfloat16"}))
    gpu = tmp_path / "nvidia0"  # the stand-in holds this file open like a GPU device node
    gpu.write_bytes(b"")
    procs = []

    def start(**extra_env) -> str:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=f"{tree}:{REPO}", ORCH_STANDIN_WARMUP_S="0.5",
                   ORCH_STANDIN_NVIDIA_DEV=str(gpu), **extra_env)
        log_path = tmp_path / f"standin-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([PY, "-m", "sglang.launch_server", "--model-path", str(model),
                                     "--port", str(port), "--host", "127.0.0.1"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc, 60)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}: {log_path.read_text(errors='replace')[-2000:]}") from None
        return url

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def standin(standin_factory):
    return standin_factory()


def test_standin_hung_generate_is_timed_out(standin_factory, capsys):
    # /health passes but /generate never answers (facts: vllm #39863): bench must end, bounded
    url = standin_factory(ORCH_STANDIN_HANG_GENERATE="1")
    t0 = time.monotonic()
    data, _ = quiet_run(capsys, url=url, levels=[2], input_len=8, output_len=4, num_prompts=4, warmup=0,
                        level_timeout=30, request_timeout=1.0)
    assert time.monotonic() - t0 < 6.0
    lv = data["levels"][0]
    assert lv["timed_out"] == 4 and lv["completed"] == 0 and lv["valid"] is False


def test_standin_openai_api(standin, capsys):
    data, _ = quiet_run(capsys, url=standin, levels=[2], input_len=16, output_len=8, num_prompts=4, api="openai",
                        warmup=0, level_timeout=60, request_timeout=30)
    lv = data["levels"][0]
    assert lv["valid"] is True and lv["total_output_tokens"] == 4 * 8
    # the stand-in spends >= 4 ms per token, so no request ends before 7 gaps have passed on the
    # server; single ITLs are not bounded (a client slowed by other load reads tokens in bursts)
    assert lv["mean_e2e_latency_ms"] >= 7 * 4.0, lv
    assert lv["median_itl_ms"] >= 0.0


def _agreement(capsys, url: str, concurrency: int, input_len: int, output_len: int, num_prompts: int,
               rounds: int = 2) -> tuple[float, float]:
    """Run orch's bench and the oracle alternately ``rounds`` times with the same settings.

    Every run must complete every request with the same token total. Returns the best
    output tokens/s of each client: on this shared 2-core machine, load from other
    processes only ever slows a client down, so the best of a few runs is the measure.
    """
    from tests.unit.remote.bench import oracle as bench_oracle

    ours, theirs = [], []
    for _ in range(rounds):
        data, _ = quiet_run(capsys, url=url, levels=[concurrency], input_len=input_len, output_len=output_len,
                            num_prompts=num_prompts, warmup=1, level_timeout=60, request_timeout=30)
        lv = data["levels"][0]
        assert lv["valid"] is True and lv["completed"] == num_prompts, lv
        assert lv["total_output_tokens"] == num_prompts * output_len
        oracle = bench_oracle.measure(url, concurrency, input_len, output_len, num_prompts, timeout_s=60)
        assert oracle["completed"] == num_prompts and oracle["output_tokens"] == lv["total_output_tokens"], oracle
        ours.append(lv["output_throughput"])
        theirs.append(oracle["output_tokens_per_s"])
    return max(ours), max(theirs)


def _agrees(ours: float, oracle: float, server_max: float) -> None:
    """orch's output tokens/s against the independent client's and the server's physical limit:
    never above what the server can deliver (1% clock slack: tokens or clock not inflated), and
    never more than 5% below the independent client (its timing not inflated). Not symmetric: on
    a loaded CPU the heavier httpx client falls behind first, which says nothing about orch."""
    assert ours <= server_max * 1.01, (ours, server_max)
    assert ours >= 0.95 * oracle, (ours, oracle)
    assert oracle <= server_max * 1.01, (oracle, server_max)


def _agreement_until_settled(capsys, url: str, server_max: float, **kw) -> tuple[float, float]:
    """:func:`_agreement` round after round until orch's best agrees with the oracle's (:func:`_agrees`),
    or a round improves neither best (issue 32 row 17: load from other work only ever slows a client,
    so while a best still improves the machine's load, not the client, is what is measured; the
    result then is what the least-loaded rounds saw, and a client that inflates or loses time fails)."""
    ours, theirs = _agreement(capsys, url, rounds=3, **kw)
    while True:
        try:
            _agrees(ours, theirs, server_max)
            return ours, theirs
        except AssertionError:
            if ours > server_max * 1.01 or theirs > server_max * 1.01:
                raise  # above the server's limit: no load explains that
        a, b = _agreement(capsys, url, rounds=1, **kw)
        if a <= ours and b <= theirs:  # no better round: what is left is the clients' own
            _agrees(ours, theirs, server_max)
        ours, theirs = max(ours, a), max(theirs, b)


def test_agreement_with_independent_oracle(standin_factory, capsys):
    # 15 ms per token (about a decode step of a large MoE at this batch) so that client-side
    # overhead on this shared CPU is small next to what is measured: the server's rate
    url = standin_factory(ORCH_STANDIN_TOKEN_DELAY_MS_DEFAULT="15", ORCH_STANDIN_TOKEN_DELAY_MS_TUNED="15")
    # 16 prompts of 32 tokens (about 2 s a run, best of 3 runs each): long enough that a scheduling
    # hiccup of the shared CPU (the suite runs in parallel) is small next to the run
    # 4 waves of 4 requests, each at least 31 gaps of 15 ms after its first token
    a, b = _agreement_until_settled(capsys, url, 16 * 32 / (4 * 31 * 0.015), concurrency=4, input_len=32,
                                    output_len=32, num_prompts=16)
    assert a > 0 and b > 0


def test_agreement_with_oracle_on_fake_server(fake, capsys):
    """Same check as above, against the in-test server (runs without the stand-in)."""
    srv = fake(first_s=0.02, gap_s=0.025)
    # about 2.4 s a run, best of 3 each (as above: a hiccup of the shared CPU is small next to it)
    # the server needs 20 + 23 * 25 ms per request: four waves of 4 requests at best
    _agreement_until_settled(capsys, srv.url, 16 * 24 / (4 * 0.595), concurrency=4, input_len=16, output_len=24,
                             num_prompts=16)
