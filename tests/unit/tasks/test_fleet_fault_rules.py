"""Pure rules behind the fleet faults of issue 21 (docs/reliability.md, "Faults real fleets report")."""

from orchestrator.host.sigkill import requests_without_tokens
from remote.engines import engine_named


def tokens_of(answer) -> int:
    """Output tokens of a generation answer as readiness reads them (``Engine.parse_generation``)."""
    return engine_named(None).parse_generation(answer).tokens


def test_tokens_of_a_generate_answer():
    # SGLang 0.5.23 /generate: meta_info.completion_tokens; output_ids when the count is absent
    assert tokens_of({"text": " the", "meta_info": {"completion_tokens": 1}}) == 1
    assert tokens_of({"text": "", "meta_info": {"completion_tokens": 0}}) == 0
    assert tokens_of({"output_ids": [5, 7]}) == 2
    assert tokens_of({"meta_info": {"completion_tokens": True}}) == 0  # a bool is no count
    for bad in (None, "x", [], {"meta_info": "x"}):
        assert tokens_of(bad) == 0


def test_every_request_must_return_tokens():
    good = {"max_concurrency": 4, "num_prompts": 20, "completed": 20, "failed": 0, "timed_out": 0, "warmup_failed": 0}
    assert requests_without_tokens([good]) == []
    one_empty = dict(good, max_concurrency=1, num_prompts=10, completed=9, failed=1,
                     errors=["stream ended without any generated token"])
    (line,) = requests_without_tokens([one_empty, good])
    assert line.startswith("concurrency 1: 9 of 10 requests returned tokens") and "without any generated" in line
    assert requests_without_tokens([dict(good, warmup_failed=1)]) == [
        "concurrency 4: 20 of 20 requests returned tokens, 1 warm-up request(s) failed"]
    assert requests_without_tokens([dict(good, completed=19, timed_out=1)])
