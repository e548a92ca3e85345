"""The payload's ``answers`` (greedy answers for the runner trial's output check) against the stand-in
SGLang server, and the stand-in's per-runner knobs (``ORCH_STANDIN_RUNNER_SPEED``,
``ORCH_STANDIN_WRONG_RUNNERS``) it is tested with."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest

from orchestrator.host.runner_trial import agreement, known_misses, load_checks
from remote.bench import answers
from remote.protocol import PayloadError
from tests.unit.remote.bench.test_bench import standin_factory  # noqa: F401  (the fixture)
from tests.waiting import CEILING_S  # a hang guard only: the waits end on their condition

PROMPTS = ["The capital of France is", "one two three four five six", "def f(x):"]


def _ask(url, tmp_path, prompts=PROMPTS, n=8, concurrent=False):
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"prompts": prompts, "max_new_tokens": n}))
    return answers.run(SimpleNamespace(url=url, request=str(req), timeout=CEILING_S,
                                       concurrent=concurrent))["answers"]


def _info(url):
    return json.loads(urllib.request.urlopen(url + "/get_server_info", timeout=CEILING_S).read())["standin_moe"]


def test_greedy_answers_repeat_and_a_wrong_runner_differs(standin_factory, tmp_path):  # noqa: F811
    right = standin_factory(ORCH_STANDIN_RUNNER_SPEED="triton=0.5,cutlass=2")
    wrong = standin_factory(ORCH_STANDIN_WRONG_RUNNERS="flashinfer_cutlass,triton")
    a, b, c = _ask(right, tmp_path), _ask(right, tmp_path), _ask(wrong, tmp_path)
    assert len(a) == 3 and all(len(x["output_ids"]) == 8 and x["text"] for x in a)
    assert agreement(a, b) == 1.0
    assert agreement(a, c) == 0.0
    assert _info(right)["runner"] == "triton" and _info(right)["runner_speed"] == 0.5
    assert _info(right)["token_delay_ms"] == pytest.approx(3.0)  # default 6 ms (no tuned file) x 0.5
    assert _info(wrong)["wrong_answers"] is True and _info(wrong)["token_delay_ms"] == pytest.approx(6.0)


@pytest.mark.parametrize("req", [{"prompts": [], "max_new_tokens": 4}, {"prompts": ["x"], "max_new_tokens": 0},
                                 {"prompts": [3], "max_new_tokens": 4}])
def test_bad_requests(tmp_path, req):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(req))
    with pytest.raises(PayloadError) as exc:
        answers.run(SimpleNamespace(url="http://127.0.0.1:9", request=str(path), timeout=1.0))
    assert exc.value.kind == "bad_input"


def test_agreement_counts_prompts():
    ref = [{"output_ids": [1, 2]}, {"output_ids": [3]}, {"text": "a", "output_ids": None}, {"output_ids": [5]}]
    cand = [{"output_ids": [1, 2]}, {"output_ids": [4]}, {"text": "a", "output_ids": None}, {"output_ids": [5]}]
    assert agreement(ref, cand) == 0.75


def test_known_answers_and_a_non_deterministic_runner(standin_factory, tmp_path):  # noqa: F811
    """Issue 32 row 3 stand-in: the shipped known-answer prompts are answered right by a working
    runner and wrong by a wrong one; ``ORCH_STANDIN_NONDETERMINISTIC_RUNNERS`` makes a few prompts
    answer two ways (their second half only), from one request to the next and from one start to
    the next, the known answers never."""
    prompts, expected = load_checks(None)
    state = tmp_path / "state"
    state.mkdir()
    shaky = standin_factory(ORCH_STANDIN_NONDETERMINISTIC_RUNNERS="triton=3", ORCH_STANDIN_STATE_DIR=str(state))
    wrong = standin_factory(ORCH_STANDIN_WRONG_RUNNERS="triton", ORCH_STANDIN_STATE_DIR=str(state))
    one, two = _ask(shaky, tmp_path, prompts, 32), _ask(shaky, tmp_path, prompts, 32)
    assert known_misses(expected, one) == [] and known_misses(expected, two) == []
    assert one[prompts.index("Question: What is 17 multiplied by 23? Answer:")]["text"].startswith(" 391 ")
    differ = [i for i, (a, b) in enumerate(zip(one, two)) if a != b]
    assert 0 < len(differ) < len(prompts) // 2, differ
    assert all(one[i]["output_ids"][:16] == two[i]["output_ids"][:16] for i in differ)  # the second half only
    assert len(known_misses(expected, _ask(wrong, tmp_path, prompts, 32))) == 3


def test_concurrent_answers_and_runners_wrong_only_batched_or_alone(standin_factory, tmp_path):  # noqa: F811
    """Issue 32 row 5 stand-in: ``answers --concurrent`` sends the prompts at once (in prompt
    order back); a runner wrong only batched answers one at a time right, a runner wrong only alone
    answers one at a time wrong."""
    prompts = [f"prompt number {i} " + "word " * i for i in range(12)]
    right = standin_factory()
    batched = standin_factory(ORCH_STANDIN_WRONG_BATCHED_RUNNERS="triton")
    alone = standin_factory(ORCH_STANDIN_WRONG_SINGLE_RUNNERS="triton")
    ref = _ask(right, tmp_path, prompts)
    assert _ask(right, tmp_path, prompts, concurrent=True) == ref  # same answers, same order
    assert _ask(batched, tmp_path, prompts) == ref
    assert agreement(ref, _ask(batched, tmp_path, prompts, concurrent=True)) < 0.5
    assert agreement(ref, _ask(alone, tmp_path, prompts)) == 0.0
    assert agreement(ref, _ask(alone, tmp_path, prompts, concurrent=True)) > 0.5


def test_a_scheduler_that_dies_on_the_first_request(standin_factory, tmp_path):  # noqa: F811
    """Issue 32 row 4 stand-in: the server is ready, then dies on its first generation request."""
    url = standin_factory(ORCH_STANDIN_CRASH_ON_REQUEST="triton")
    assert _info(url)["crash_on_request"] is True
    with pytest.raises(PayloadError) as exc:
        _ask(url, tmp_path)
    assert exc.value.kind == "runtime"
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=CEILING_S)
