"""``orch recover`` ends only the payload processes tagged with the unfinished run's id
(orchestrator.payload.client.tag_pattern; moved from the e2e faults file: it needs no test bed)."""

from __future__ import annotations

import pytest


def test_recover_stops_only_the_tagged_processes_of_the_unfinished_run():
    import re

    from orchestrator.payload.client import tag_pattern

    rid = "20260512T101500Z-tune-1a2b3c"
    pat = re.compile(tag_pattern(rid))  # plain ERE: the same meaning for Python's re
    assert pat.search(f"timeout --kill-after=30 172800 env PYTHONPATH=/x ORCH_TAG={rid}.9f8e python -m remote tune")
    for other in ("python -m remote tune --model-config /m",  # started by hand: no tag
                  f"timeout 9 env ORCH_TAG={rid}x.1 python -m remote tune",  # another run, same prefix
                  "timeout 9 env ORCH_TAG=20260512T101500Z-tune-1a2b3d.1 python -m remote bench"):
        assert not pat.search(other), other
    assert tag_pattern("a.b") == "ORCH_TAG=a[.]b[.]"
    for bad in ("x.*", "a|b", "", "..", "r$(id)", "a b"):  # from a host's records: no pattern syntax
        with pytest.raises(ValueError):
            tag_pattern(bad)
