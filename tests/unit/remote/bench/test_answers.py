"""The payload's ``answers`` (greedy answers for the runner trial's output check) against the stand-in
SGLang server, and the stand-in's per-runner knobs (``ORCH_STANDIN_RUNNER_SPEED``,
``ORCH_STANDIN_WRONG_RUNNERS``) it is tested with."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest

from orchestrator.host.runner_trial import agreement
from remote.bench import answers
from remote.protocol import PayloadError
from tests.unit.remote.bench.test_bench import standin_factory  # noqa: F401  (the fixture)
from tests.waiting import CEILING_S  # a hang guard only: the waits end on their condition

PROMPTS = ["The capital of France is", "one two three four five six", "def f(x):"]


def _ask(url, tmp_path, prompts=PROMPTS, n=8):
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"prompts": prompts, "max_new_tokens": n}))
    return answers.run(SimpleNamespace(url=url, request=str(req), timeout=CEILING_S))["answers"]


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
