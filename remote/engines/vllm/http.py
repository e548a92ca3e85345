"""vLLM's HTTP API as orch uses it: readiness, one greedy generation, the benchmark's metric names
(standard library only).

vLLM 0.32.0-0.34.0 (``vllm/entrypoints/``):

- readiness: the API server reserves its port first (``launcher.py`` ``setup_server``: the socket
  is bound and listening) but answers no HTTP until the engine is up (model loaded, CUDA graphs
  captured: ``serve_http`` runs only after ``build_async_engine_client``), so a TCP connect
  succeeds while requests wait; then ``GET /health`` is 200 (503 once the engine died,
  ``serve/instrumentator/health.py``) and ``GET /v1/models`` lists the served names
  (``openai/models/api_router.py``). Unlike SGLang there is no "up but still warming" phase:
  the first HTTP answer means the engine is up. :data:`READY_PATHS`;
- generation: ``POST /v1/completions`` (``openai/completion/protocol.py`` ``CompletionRequest``)
  with ``model`` (a served name: :attr:`ServerArgs.api_name`), ``prompt``, ``max_tokens``,
  ``temperature: 0`` (greedy), ``return_token_ids: true`` (the answer's ``choices[0].token_ids``)
  and ``ignore_eos`` for an exact length; the answer's ``choices[0].text`` and
  ``usage.completion_tokens`` (:func:`generate_request`, :func:`parse_generation`);
- ``vllm bench serve`` (``vllm/benchmarks/serve.py`` ``benchmark``): its result JSON's names
  (:data:`BENCH_METRICS`: ``request_throughput``, ``output_throughput``, ``mean_ttft_ms``, ...).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..records import Generation, HttpRequest

#: answers once the engine is up (200), 503 after the engine died
HEALTH_PATH = "/health"
#: the served model names (OpenAI's model list)
MODELS_PATH = "/v1/models"
#: the OpenAI completion endpoint every vLLM server has
COMPLETIONS_PATH = "/v1/completions"
#: vLLM's release (``{"version": ...}``)
VERSION_PATH = "/version"
#: Prometheus metrics (``vllm:`` names)
METRICS_PATH = "/metrics"
#: what orch polls for readiness, in order
READY_PATHS = (HEALTH_PATH, MODELS_PATH)

#: ``vllm bench serve``'s throughput and count names (``benchmark``'s result dict)
BENCH_TOTALS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput",
                "max_output_tokens_per_s", "max_concurrent_requests")
#: its latency metrics (``process_one_metric``: ``mean_/median_/std_/pNN_<name>_ms``)
BENCH_LATENCIES = ("ttft", "tpot", "itl", "e2el")
#: every name orch reads from a ``vllm bench serve`` result (percentile 99, its default)
BENCH_METRICS = BENCH_TOTALS + tuple(f"{stat}_{m}_ms" for m in BENCH_LATENCIES
                                     for stat in ("mean", "median", "std", "p99"))


def generate_request(model: str, prompt: str, max_new_tokens: int, exact: bool = False,
                     stream: bool = False) -> HttpRequest:
    """A greedy completion of ``prompt``: at most ``max_new_tokens`` tokens (exactly that many with
    ``exact``: ``ignore_eos``), asking for the output token ids; ``model`` is a served name."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": int(max_new_tokens), "temperature": 0,
                            "return_token_ids": True}
    if exact:
        body["ignore_eos"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return HttpRequest("POST", COMPLETIONS_PATH, body)


def parse_generation(answer: object) -> Generation:
    """The :class:`~remote.engines.records.Generation` of a ``/v1/completions`` answer: the first
    choice's ``text`` and ``token_ids``, the token count from ``usage.completion_tokens`` (else
    the ids' length). An answer of another form is an empty generation (0 tokens)."""
    if not isinstance(answer, Mapping):
        return Generation()
    choices = answer.get("choices") or []
    first = choices[0] if choices and isinstance(choices[0], Mapping) else {}
    text = first.get("text") if isinstance(first.get("text"), str) else ""
    ids = first.get("token_ids")
    ids = [int(x) for x in ids] if isinstance(ids, list) else None
    usage = answer.get("usage") if isinstance(answer.get("usage"), Mapping) else {}
    n = usage.get("completion_tokens")
    tokens = int(n) if isinstance(n, int) and not isinstance(n, bool) else (len(ids) if ids is not None else 0)
    return Generation(text=text, output_ids=ids, tokens=tokens)


def served_names(answer: object) -> list[str]:
    """The ``id`` of every model a ``GET /v1/models`` answer lists ([] for another form)."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("data"), list):
        return []
    return [m["id"] for m in answer["data"] if isinstance(m, Mapping) and isinstance(m.get("id"), str)]


def greedy_request(prompt: str, max_new_tokens: int) -> HttpRequest:
    """The readiness and runner-trial generation: :func:`generate_request` without ``model``
    (vLLM's ``_is_model_supported`` accepts a request naming none: the served model,
    ``entrypoints/serve/engine/serving.py``)."""
    req = generate_request("", prompt, max_new_tokens)
    body = dict(req.body or {})
    body.pop("model", None)
    return HttpRequest(req.method, req.path, body)


def bench_request(input_ids: list[int], output_len: int) -> HttpRequest:
    """One streamed benchmark request: ``/v1/completions`` with the token ids as the prompt (vLLM
    takes a list of ints as ``prompt``), exactly ``output_len`` tokens (``ignore_eos``), greedy,
    the usage in the last chunk (``stream_options.include_usage``)."""
    body: dict[str, Any] = {"prompt": [int(t) for t in input_ids], "max_tokens": int(output_len), "temperature": 0,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    return HttpRequest("POST", COMPLETIONS_PATH, body)


def bench_chunk(chunk: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
    """``(it carries text, its usage)`` of one decoded stream chunk of :func:`bench_request` (an
    OpenAI completion chunk: ``choices[0].text``; ``usage`` on the last one)."""
    choices = chunk.get("choices") or []
    text = bool(choices and isinstance(choices[0], Mapping) and choices[0].get("text"))
    usage = chunk.get("usage") if isinstance(chunk.get("usage"), Mapping) else {}
    return text, usage
