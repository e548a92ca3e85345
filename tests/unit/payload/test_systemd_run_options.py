"""Every option and property orch passes to ``systemd-run`` is one systemd documents (the test bed's
``systemd-run`` is a stand-in, tests/testbed/systemd_run.py, so a name it accepts proves nothing
about the real one). The names were checked against systemd's man pages and sources; the list and
where each was checked is ``tests/data/systemd/systemd_run_options.json``. Where this machine has a
real ``systemd-run`` (and its documentation), the names are checked against it too."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.payload.test_transient import RESULT, SHOW, _client, _state

VERIFIED = json.loads((Path(__file__).resolve().parents[2] / "data" / "systemd" / "systemd_run_options.json").read_text())
UNIT = "orch-tune-20260101T000000Z-tune-abcdef.service"
TRANSIENT_SETTINGS = Path("/usr/share/doc/systemd/TRANSIENT-SETTINGS.md.gz")


def _launch(properties: list[str] | None = None) -> list[str]:
    """The ``systemd-run`` command line orch runs for a tune (memory limit and timeout set), or with
    ``properties`` for the prepare step (``Nice=``, orchestrator/tasks/tune.py prepare_tune)."""
    client, conn = _client([
        (r"^systemd-run --version", (0, "systemd 252 (252.38-1~deb12u1)\n", "")),  # has --collect
        (r"^systemd-run ", (0, "", "")),
        (SHOW, (0, _state("inactive", loaded="not-found"), "")),
        (r"^tail -c ", (0, RESULT + "\n", "")),
        (r"", (0, "", "")),
    ])
    client.call_in_unit("tune", ["--space", "smoke"], UNIT, memory_max=123, timeout=600, poll_s=0,
                        environment={"CUDA_HOME": "/usr/local/cuda"}, properties=properties)
    launch = next(a for a, _ in conn.calls if a[0] == "systemd-run" and "--version" not in a)
    return launch[1:launch.index("--")]


def _split(opts: list[str]) -> tuple[set[str], dict[str, str]]:
    names, props = set(), {}
    for o in opts:
        name = o.split("=", 1)[0] + ("=" if "=" in o else "")
        names.add(name)
        if name == "--property=":
            key, _, value = o.split("=", 1)[1].partition("=")
            props[key] = value
    return names, props


@pytest.mark.parametrize("properties", [None, ["Nice=10"]])
def test_every_option_and_property_orch_passes_is_a_verified_systemd_name(properties):
    names, props = _split(_launch(properties))
    assert "--collect" in names and {"EnvironmentFile", "ExecStopPost"} <= set(props)  # issue 32 rows 10, 15
    assert names <= set(VERIFIED["options"]), names - set(VERIFIED["options"])
    assert set(props) <= set(VERIFIED["properties"]), set(props) - set(VERIFIED["properties"])
    for key, value in props.items():  # the value's form is the documented one
        forms = VERIFIED["properties"][key]["values"]
        ok = {"file:": value.startswith("file:/"), "bytes": value.isdigit(), "seconds": value.isdigit(),
              "path": value.startswith("/"), "command": value.startswith("/bin/sh -c '") and value.endswith("'"),
              "integer": value.lstrip("-").isdigit() and -20 <= int(value) <= 19}
        assert any(ok[f] for f in forms), (key, value)
    if properties:
        assert props["Nice"] == "10"


@pytest.mark.skipif(shutil.which("systemd-run") is None, reason="no systemd-run on this machine")
def test_the_options_are_in_this_machines_systemd_run_help():
    text = subprocess.run(["systemd-run", "--help"], capture_output=True, text=True, timeout=30).stdout
    for name in VERIFIED["options"]:
        assert re.search(rf"(^|\s){re.escape(name.rstrip('='))}(=|\s|$)", text, re.M), name


@pytest.mark.skipif(not TRANSIENT_SETTINGS.exists(), reason="no systemd TRANSIENT-SETTINGS.md here")
def test_the_properties_are_available_for_transient_units_in_this_machines_systemd():
    text = gzip.decompress(TRANSIENT_SETTINGS.read_bytes()).decode()
    for key in VERIFIED["properties"]:
        assert re.search(rf"^✓ {key}=$", text, re.M), key
