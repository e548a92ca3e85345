"""The tuner on out-of-memory errors: a candidate is skipped, the inputs every candidate needs stop
the tune (moved from the e2e faults file: it needs no test bed)."""

from __future__ import annotations


def test_tuner_skips_a_candidate_out_of_memory_but_stops_on_inputs_out_of_memory(monkeypatch):
    import torch

    import remote.tuning.providers
    from remote.tuning.tuner import space as sp
    from remote.tuning.tuner.driver import tune_on_device
    from remote.tuning.tuner.events import Fatal
    from remote.tuning.tuner.search import CPU_PROTOCOL, Evaluator

    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    cfgs = sp.smoke_space()[:2]

    class Provider:
        name, separable = "fake", False

        def __init__(self):
            self.problems = []

        def make_problem(self, shape, M, *a, **k):
            self.problems.append(M)
            raise oom

        def full_fn(self, p, up, down):
            def run():
                if up == cfgs[0]:
                    raise oom
            return run

    class Timer:
        def time(self, fn, **proto):
            fn()
            return 1.0

    # a candidate that runs out of memory is skipped (logged), the others are timed
    logged = []
    ev = Evaluator(Provider(), None, Timer(), log=lambda m, lvl="info": logged.append(m), cpu=True)
    got = ev.measure("joint", cfgs, CPU_PROTOCOL)
    assert list(got) == [sp.cfg_key(cfgs[1])] and ev.failed == 1 and "OutOfMemoryError" in logged[0]

    # out of memory for the inputs every candidate needs: a `fatal` message, no other batch size
    prov = Provider()
    monkeypatch.setattr(remote.tuning.providers, "get_provider", lambda name: prov)
    msgs = []
    spec = dict(shape={"E": 8, "N": 64, "hidden": 128, "topk": 2}, dtype="float32", space="smoke",
                provider="fake", seed=0, dtype_selector=None, block_shape=None, shipped=None, check=False)
    tune_on_device(spec, "cpu", [1, 2, 4], msgs.append)
    assert prov.problems == [1], "the tune must stop at the first out-of-memory"
    assert [type(m) for m in msgs] == [Fatal] and msgs[0].batch_size == 1
    assert "out of GPU memory" in msgs[0].text and "OutOfMemoryError" in msgs[0].traceback
