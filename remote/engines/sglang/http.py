"""SGLang's native HTTP requests orch sends and the answers it reads, declared once (standard library only).

SGLang 0.5.23 ``srt/entrypoints/http_server.py``:

- ``GET /v1/models`` (:data:`LIVENESS_PATH`) answers once the HTTP server listens, before the
  server can generate (sglang #33719): liveness only;
- ``GET /health`` (:data:`HEALTH_PATH`) answers 200 without generating (``health_generate``
  generates only with ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``), 503 while starting;
- ``POST /generate`` (``GenerateReqInput``): :func:`generate_request` is a greedy one (``text``,
  ``sampling_params`` ``{"temperature": 0, "max_new_tokens": N}``: SGLang samples the top token at
  temperature 0); the answer (:func:`parse_generation`) carries ``text``, ``output_ids`` and
  ``meta_info.completion_tokens``; a batched request answers a list;
- the benchmark's streamed ``/generate`` (what ``python -m sglang.bench_serving --backend sglang``
  sends, SGLang 0.5.x ``async_request_sglang_generate``): :func:`bench_request` with
  ``input_ids``, ``ignore_eos`` and ``stream``; each chunk (:func:`bench_chunk`) carries the
  cumulative ``text`` and ``meta_info.completion_tokens`` / ``meta_info.prompt_tokens``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..records import Generation, HttpRequest

LIVENESS_PATH = "/v1/models"
HEALTH_PATH = "/health"
GENERATE_PATH = "/generate"


def generate_request(prompt: str, max_new_tokens: int) -> HttpRequest:
    """A greedy ``POST /generate`` of ``prompt``, at most ``max_new_tokens`` output tokens."""
    return HttpRequest("POST", GENERATE_PATH, {"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": int(max_new_tokens)}})


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_generation(answer: object) -> Generation:
    """The :class:`~remote.engines.records.Generation` of a ``/generate`` answer: ``text`` and
    ``output_ids`` of the answer (its first element for a list); ``tokens`` from a dict answer's
    ``meta_info.completion_tokens``, else the length of its ``output_ids``, 0 for anything else."""
    tokens = 0
    if isinstance(answer, dict):
        meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
        ids = answer.get("output_ids")
        tokens = _count(meta.get("completion_tokens"))
        if tokens is None:
            tokens = len(ids) if isinstance(ids, list) else 0
    first = answer[0] if isinstance(answer, list) and answer else answer
    if not isinstance(first, dict):
        return Generation("", None, tokens)
    ids = first.get("output_ids")
    return Generation(str(first.get("text", "")), ids if isinstance(ids, list) else None, tokens)


def bench_request(input_ids: list[int], output_len: int) -> HttpRequest:
    """One streamed benchmark ``POST /generate`` of the prompt ``input_ids`` (exactly
    ``output_len`` output tokens: ``ignore_eos``), as ``sglang.bench_serving`` sends it."""
    return HttpRequest("POST", GENERATE_PATH, {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
        "stream": True,
    })


def bench_chunk(chunk: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
    """``(the chunk has text, its usage)`` of one decoded stream chunk of :func:`bench_request`:
    the usage is ``meta_info`` (cumulative ``completion_tokens``, ``prompt_tokens``)."""
    usage = chunk.get("meta_info")
    return bool(chunk.get("text")), usage if isinstance(usage, Mapping) else {}
