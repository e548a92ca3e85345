"""Bad input (issue 7): one clear error naming the file, host or field; nothing changed anywhere.

The first part runs the real CLI without hosts (inventory and import errors stop before
any connection); the second runs it against a test-bed host and proves that hostile values
(unit names, device names, model paths, interpreter paths with spaces, quotes, ``;``,
``$()``, newlines, ``..``, ``/``) never reach a shell unquoted and change nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.connection import quote_argv
from orchestrator.engine.results import TaskFailed
from orchestrator.tasks.install import install
from remote.engines.sglang.naming import sglang_device_name
from tests.fakes import FakePayload, make_ctx
from tests.e2e.helpers import REPO, inventory, orch, recap
from tests.waiting import run_watched

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
GOOD_ENTRY = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
              "num_warps": 4, "num_stages": 2}
HOSTILE = ["a b", "it's", 'say "hi"', "x;touch PWN", "$(touch PWN)", "`touch PWN`", "a\ntouch PWN",
           "../../etc", "/etc/passwd", "${IFS}PWN", "-rf", "a|b&c>d<e", "\\", "*", "~root"]


def _cli(*args: str, cwd: Path, state_dir: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "orchestrator", *args]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    env = dict(os.environ, COLUMNS="400", PYTHONPATH=str(REPO), XDG_STATE_HOME=str(cwd / "xdg"))
    return run_watched(cmd, cwd=cwd, env=env)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ inventory (no hosts)
@pytest.mark.parametrize("text,needle", [
    # YAML syntax error: file:line:column
    ("all:\n  children:\n    gpus:\n      hosts:\n        a: {ansible_host: 10.0.0.1\n",
     "hosts.yaml:6:1: YAML syntax error"),
    # mistyped variable, with the suggestion
    ("all:\n  children:\n    gpus:\n      hosts:\n        a:\n          orch_tune_spce: fast\n",
     "hosts.yaml:6: host 'a': unknown variable 'orch_tune_spce' (did you mean 'orch_tune_space'?)"),
    # a host in no group: 'hosts:' forgotten, so 'a' would silently be nothing
    ("all:\n  children:\n    gpus:\n      a:\n        ansible_host: 10.0.0.1\n",
     "hosts.yaml:4: group 'gpus': unknown key 'a'"),
    # a wrong type names the host and the field
    ("all:\n  hosts:\n    a:\n      ansible_port: abc\n", "hosts.yaml:4: host 'a': ansible_port must be an integer"),
    # a hostile value in a typed field is refused, not passed on
    ("all:\n  hosts:\n    a:\n      orch_tune_space: 'smoke; rm -rf /'\n", "host 'a': orch_tune_space"),
])
def test_inventory_errors_name_file_line_and_field(tmp_path, text, needle):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(text)
    proc = _cli("tune", str(inv), "--service", "sglang-qwen", cwd=tmp_path, state_dir=tmp_path / "state")
    assert proc.returncode == 2, proc.stderr
    err = _one_line(proc.stderr)
    assert err.startswith("orch: error: ") and needle in err, err
    assert len(proc.stderr.strip().splitlines()) <= 3, "one clear error, not a traceback"
    assert not (tmp_path / "state").exists(), "no run record for input that never ran"


def test_limit_matching_nothing(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  children:\n    gpus:\n      hosts:\n        gpu-a:\n        gpu-b:\n")
    proc = _cli("tune", str(inv), "--service", "u", "--limit", "gpu-c", cwd=tmp_path, state_dir=tmp_path / "s")
    assert proc.returncode == 2
    assert "--limit 'gpu-c': pattern 'gpu-c' matches no host or group" in _one_line(proc.stderr)
    proc = _cli("tune", str(inv), "--service", "u", "--limit", "gpus:!gpu-*", cwd=tmp_path, state_dir=tmp_path / "s")
    assert proc.returncode == 2 and "selects no hosts" in _one_line(proc.stderr)
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------- config content
def _key() -> dict:
    return {"device_name": "NVIDIA_H200", "triton_version": "3.9.0", "provider": "builtin",
            "sglang_version": "0.5.23", "E": 8, "N": 64, "hidden": 128, "topk": 2, "dtype_selector": None,
            "block_shape": None, "per_channel_quant": False, "batch_sizes": [1], "space": "smoke"}


@pytest.mark.parametrize("content,needle", [
    ('{"1": {"BLOCK_SIZE_M": 16', "invalid JSON at line"),
    ('{"one": ' + json.dumps(GOOD_ENTRY) + "}", "key 'one' is not a positive integer batch size"),
    ('{"1": ' + json.dumps(dict(GOOD_ENTRY, BLOCK_SIZE_M=3)) + "}", "BLOCK_SIZE_M must be a power of two"),
    ('{"1": ' + json.dumps(dict(GOOD_ENTRY, evil="$(reboot)")) + "}", "unknown field 'evil'"),
    ("HUGE", "more than 4194304"),
])
def test_import_refuses_invalid_or_huge_config(tmp_path, content, needle):
    src = tmp_path / "imp"
    src.mkdir()
    (src / "key.json").write_text(json.dumps(_key()))
    if content == "HUGE":
        content = json.dumps({str(i): GOOD_ENTRY for i in range(1, 70000)})
    (src / UP).write_text(content)
    proc = _cli("configs", "import", str(src), cwd=tmp_path, state_dir=tmp_path / "state")
    assert proc.returncode == 2, proc.stderr
    err = _one_line(proc.stderr)
    assert UP in err and needle in err, err
    stored = list((tmp_path / "state").rglob("*.json")) if (tmp_path / "state").exists() else []
    assert not stored, "nothing is stored from a refused import"


@pytest.mark.parametrize("content", ['{"1": {}}', "[]", '{"1": ' + json.dumps(GOOD_ENTRY) + ', "1": {}}', "x" * 10])
def test_tuned_file_from_host_validated_before_install(tmp_path, content):
    """A config fetched from a host (tune) is checked on the controller before install is asked."""
    f = tmp_path / UP
    f.write_text(content)
    payload = FakePayload()  # no command scripted: reaching the host with invalid content fails the test
    ctx = make_ctx(tmp_path, payload=payload)
    ctx.run.tuned_files = {"up": str(f)}
    with pytest.raises(TaskFailed, match=f"refusing to install {UP}"):
        install(ctx, dest_dir="/x/configs/triton_3_9_0")
    assert not ctx.run.install_attempted and not payload.calls


# --------------------------------------------------------------------- hostile values
@pytest.mark.parametrize("value", HOSTILE)
def test_quote_argv_reaches_the_program_verbatim(tmp_path, value):
    """The quoting every connection uses: a shell gives the program exactly the value, runs nothing."""
    cmd = quote_argv(["printf", "%s", value])
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == value
    assert not list(tmp_path.iterdir()), "the shell ran something"


@pytest.mark.parametrize("name", ["../../etc", "a/b", "..", ".", "x\ny", "a\\b", "", "NVIDIA\x00H200"])
def test_device_name_that_would_escape_the_folder_is_refused(name):
    with pytest.raises(ValueError):
        sglang_device_name(name)


# ------------------------------------------------------------------ on the test bed
def _snapshot(h) -> dict:
    return {"sglang": h.file_tree_hash("/opt/sglang"), "state": h.file_tree_hash("/var/lib/orch/runs"),
            "units": h.file_tree_hash("/etc/systemd/system"), "active": h.unit_state(),
            "pid": h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip(),
            "lock": h.sh("test -e /var/lib/orch/lock.json", check=False).returncode}


@pytest.mark.testbed
def test_bad_and_hostile_values_on_a_host_change_nothing(testbed_factory, tmp_path):
    bed = testbed_factory(1)
    h = bed.hosts[0]
    tag = "orchpwn" + secrets.token_hex(3)
    # a unit that is not an SGLang server
    h.sh("printf '[Service]\\nExecStart=/bin/sleep 100000\\n' > /etc/systemd/system/web.service "
         "&& systemctl daemon-reload && systemctl start web")
    # the venv reached through a path with a space, quotes, ';' and '$()' (a real, working interpreter)
    weird = f"/srv/py env;'q\"$(touch {tag})"
    h.sh(f"ln -s {Path(sys.executable).parent.parent} {quote_argv([weird])}")
    h.wait_http("/health")
    s = tmp_path / "state"
    inv = inventory(bed, tmp_path / "hosts.yaml")
    # prime the payload so the snapshot below includes it
    assert orch("tune", str(inv), "--service", "sglang-qwen", "--check", state_dir=s).returncode == 0
    snap = _snapshot(h)
    cases = [
        # (--service, host vars, outcome checker)
        ("nope", {}, "unit nope"),
        ("web", {}, "unit web is not an SGLang server"),
        (f"sglang-qwen; touch {tag}", {}, f"sglang-qwen; touch {tag}"),
        (f"$(touch {tag})", {}, f"$(touch {tag})"),
        ("sglang-qwen", {"orch_device_name": "../../../../tmp/x"}, "forbidden character '/'"),
        ("sglang-qwen", {"orch_device_name": "NVIDIA ..H200"}, "could escape a folder"),
        ("sglang-qwen", {"orch_device_name": f"H200/$(touch {tag})"}, "forbidden character '/'"),
        ("sglang-qwen", {"orch_model_config": f"/models/x; touch {tag}\n$(touch {tag})"}, "/models/x; touch"),
    ]
    for service, hv, needle in cases:
        inv = inventory(bed, tmp_path / "hosts.yaml", host_vars={h.name: hv})
        proc = orch("tune", str(inv), "--service", service, "--json", state_dir=s)
        assert proc.returncode == 1, (service, hv, proc.stderr[-3000:])
        r = recap(proc)["hosts"][h.name]
        assert r["outcome"] == "failed" and needle in r["cause"], (service, hv, r["cause"])
        assert _snapshot(h) == snap, (service, hv)
    # device name with shell syntax but no '/': a legal name, quoted everywhere (check mode)
    inv = inventory(bed, tmp_path / "hosts.yaml",
                    host_vars={h.name: {"orch_device_name": f"X;touch {tag} $(touch {tag})`touch {tag}`",
                                        "ansible_python_interpreter": f"{weird}/bin/python"}})
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", state_dir=s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert recap(proc)["hosts"][h.name]["outcome"] == "check"
    events = (Path(recap(proc)["run_dir"]) / "events.jsonl").read_text()
    # the server's own last lookup (device NVIDIA_H200) decides the name written; orch's derivation
    # from the hostile orch_device_name is reported beside it, verbatim (spaces as '_'), run by nothing
    assert f"(orch derived {h.triton_dir}/E=8,N=64,device_name=X;touch_{tag}_$(touch_{tag})`touch_{tag}`.json)" \
        in events, "the hostile device name is used verbatim (spaces as '_') in the file name"
    assert f"would write {h.triton_dir}/E=8,N=64,device_name=NVIDIA_H200.json" in events
    assert _snapshot(h) == snap
    # nothing ran: no file named by the tag anywhere on the host or the controller
    found = h.sh(f"find /root /tmp /srv /var/lib/orch /opt/sglang /models -name '{tag}*' 2>/dev/null",
                 check=False).stdout.strip()
    assert not found, found
    assert not list(REPO.glob(f"{tag}*")) and not list(Path("/tmp").glob(f"{tag}*"))
    assert h.sh("systemctl is-active web", check=False).stdout.strip() == "active"


@pytest.mark.testbed
def test_model_the_tuner_cannot_run_is_refused_before_the_stop(testbed_factory, tmp_path):
    """A server on int8 weights (``--quantization w8a8_int8``: SGLang looks for
    ``dtype=int8_w8a8`` files) is refused with the reason, while it keeps serving: the
    refusal comes before the unit is stopped, so nothing on the host changes."""
    bed = testbed_factory(1, host_options={0: {"extra_args": ["--quantization", "w8a8_int8"]}})
    h = bed.hosts[0]
    h.wait_http("/health")
    snap = _snapshot(h)
    inv = inventory(bed, tmp_path / "hosts.yaml")
    proc = orch("tune", str(inv), "--service", "sglang-qwen", "--json", state_dir=tmp_path / "state")
    assert proc.returncode == 1, proc.stderr[-3000:]
    r = recap(proc)["hosts"][h.name]
    assert r["outcome"] == "failed", r
    assert "dtype=int8_w8a8" in r["cause"] and "orch configs import" in r["cause"], r["cause"]
    assert _snapshot(h) == snap
    h.wait_http("/health")


@pytest.mark.parametrize("model,ok", [
    ({"dtype_selector": None, "weight_dtype": "bfloat16"}, True),
    ({"dtype_selector": "float32", "weight_dtype": "float32"}, True),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e4m3", "block_shape": [128, 128]}, True),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e4m3", "block_shape": None}, True),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e4m3", "per_channel_quant": True}, False),
    ({"dtype_selector": "fp8_w8a8", "weight_dtype": "fp8_e5m2"}, False),
    ({"dtype_selector": "int8_w8a8", "weight_dtype": "int8"}, False),
    ({"dtype_selector": "int4_w4a16", "weight_dtype": "int4"}, False),
])
def test_untunable_reason(model, ok):
    """The payload decides (``remote.tuning.support.unsupported_reason``, reported by the probe as
    ``model.tuner_unsupported``); the controller's refusal carries it with what to do."""
    from orchestrator.facts.probe import ProbedModel
    from orchestrator.facts.schema import from_dict
    from remote.tuning.support import unsupported_reason
    model = dict(model, tuner_unsupported=unsupported_reason(model))
    why = from_dict(ProbedModel, model).untunable_reason()
    assert (why is None) == ok, why
    if not ok:
        assert model["dtype_selector"] in why and "orch configs import" in why
