"""Errors: every exception class has its root or says why not, and every command's bad input is one
line naming the field (exit status 2, no traceback), for ``orch`` and for the payload."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import pkgutil
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main as orch_main
from orchestrator.errors import OrchError
from remote.__main__ import main as payload_main
from remote.protocol import PayloadError
from tests.paths import REPO
from tests.waiting import run_watched

MODEL = str(REPO / "tests" / "data" / "models" / "Qwen3-30B-A3B.json")


# --------------------------------------------------------------------------- the roots

def exception_classes(package: str, path: list[str]) -> list[type]:
    """Every exception class defined at the top of a module of ``package`` (each module imported)."""
    found = []
    for info in pkgutil.walk_packages(path, package + "."):
        mod = importlib.import_module(info.name)
        found += [obj for obj in vars(mod).values()
                  if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name]
    return found


def caught_names(folder: Path) -> set[str]:
    """Names of the classes that ``except`` clauses under ``folder`` catch."""
    names: set[str] = set()
    for f in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                for e in (node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]):
                    names.add(e.attr if isinstance(e, ast.Attribute) else getattr(e, "id", ""))
    return names


def problems(package: str, path: list[str], root: type) -> list[str]:
    """Classes of ``package`` that derive from neither ``root`` nor are declared with
    ``internal_error`` (the declaration must be the class's own, with a reason), and declared ones
    that no ``except`` under the package catches (by their name or a base's)."""
    caught = caught_names(Path(path[0]))
    out = []
    for cls in exception_classes(package, path):
        reason = cls.__dict__.get("internal_reason")
        if issubclass(cls, root):
            if reason:
                out.append(f"{cls.__module__}.{cls.__qualname__} derives from {root.__name__} and is declared internal")
        elif not (isinstance(reason, str) and reason.strip()):
            out.append(f"{cls.__module__}.{cls.__qualname__} derives from neither {root.__name__} nor is declared "
                       "with internal_error('where it is caught')")
        elif not {c.__name__ for c in cls.__mro__[:-1]} & caught:
            out.append(f"{cls.__module__}.{cls.__qualname__} is declared internal but nothing catches it")
    return out


def test_every_controller_error_is_an_orch_error_or_declared_internal():
    import orchestrator

    classes = {c.__name__ for c in exception_classes("orchestrator", orchestrator.__path__)}
    # the classes the hand-written list of the earlier test named are among those found
    assert {"ConnectError", "SerialError", "PlaybookError", "Cancelled", "TaskFailed", "UnitError", "InventoryError",
            "PayloadFailed", "ReportError", "StoreError", "TemplateError", "UsageError"} <= classes
    assert problems("orchestrator", orchestrator.__path__, OrchError) == []


def test_every_payload_error_is_a_payload_error_or_declared_internal(monkeypatch):
    import remote

    # the tuning kernel's module is imported too: as the CPU tests of the suite import it
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))

    classes = {c.__name__ for c in exception_classes("remote", remote.__path__)}
    assert {"PayloadError", "BadInput", "SglangUnavailable", "Interrupted"} <= classes
    assert problems("remote", remote.__path__, PayloadError) == []


def test_a_new_undeclared_class_fails_the_check(tmp_path, monkeypatch):
    pkg = tmp_path / "newpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rules.py").write_text(
        "from remote.protocol import PayloadError, internal_error\n"
        "class Rooted(PayloadError):\n    pass\n"
        "class Undeclared(ValueError):\n    pass\n"
        "@internal_error('')\nclass EmptyReason(ValueError):\n    pass\n"
        "@internal_error('caught below')\nclass NeverCaught(ValueError):\n    pass\n"
        "class Inherits(NeverCaught):\n    pass\n"
        "@internal_error('caught below')\nclass Caught(ValueError):\n    pass\n"
        "def f():\n    try:\n        raise Caught()\n    except Caught:\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = problems("newpkg", [str(pkg)], PayloadError)
    assert [p.split(" ")[0] for p in found] == ["newpkg.rules.Undeclared", "newpkg.rules.EmptyReason",
                                                "newpkg.rules.NeverCaught", "newpkg.rules.Inherits"], found
    assert "nothing catches it" in found[2] and "neither" in found[3], "a subclass declares for itself"


# --------------------------------------------------------------------------- orch commands

INVENTORY = """all:
  hosts:
    gpu-a:
      ansible_connection: local
      orch_state_dir: {state}
"""


@pytest.fixture
def env(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(INVENTORY.format(state=tmp_path / "host-state"))
    (tmp_path / "a-file").write_text("")
    (tmp_path / "probe-no-gpu.json").write_text(json.dumps({"device_name": None, "gpus": []}))
    return tmp_path


HOST_COMMANDS = ("tune", "rollback", "recover", "bench")

# (argv with {inv} / {tmp}, text the one line must contain: the field)
ORCH_CASES = [
    *[(f"{c} {{inv}} --serial 0", "--serial") for c in HOST_COMMANDS],
    *[(f"{c} {{inv}} --serial 150%", "--serial") for c in HOST_COMMANDS],
    *[(f"{c} {{inv}} --max-fail-percentage 120", "--max-fail-percentage") for c in HOST_COMMANDS],
    *[(f"{c} {{inv}} --max-fail-percentage -1", "--max-fail-percentage") for c in HOST_COMMANDS],
    *[(f"{c} {{inv}} --forks 0", "--forks") for c in HOST_COMMANDS + ("doctor", "runs")],
    *[(f"{c} {{inv}} --forks x", "--forks") for c in HOST_COMMANDS + ("doctor", "runs")],
    *[(f"{c} {{inv}} --order bogus", "--order") for c in HOST_COMMANDS],
    *[(f"{c} {{inv}} --limit nohost", "--limit") for c in HOST_COMMANDS + ("doctor",)],
    *[(f"{c} {{tmp}}/nope.yaml", "nope.yaml") for c in HOST_COMMANDS + ("doctor", "runs")],
    *[(f"{c} {{inv}} --state-dir {{tmp}}/a-file", "--state-dir") for c in HOST_COMMANDS + ("doctor", "runs")],
    *[(f"{c} {{inv}} --bogus", "--bogus") for c in HOST_COMMANDS + ("doctor", "runs")],
    *[(c, "inventory") for c in HOST_COMMANDS + ("doctor", "runs")],
    ("tune {inv} --serial 1,0", "--serial"),
    ("tune {inv} --serial 0%", "--serial"),
    ("tune {inv} --regression-threshold -5", "--regression-threshold"),
    ("tune {inv} --regression-threshold nan", "--regression-threshold"),
    ("tune {inv} --tune-on nohost", "--tune-on"),
    ("tune {inv} --run-id ../x", "--run-id"),
    ("tune {inv} --playbook {tmp}/nope.yaml", "nope.yaml"),
    ("rollback {inv} --to ../../x", "--to"),
    ("bench {inv} --concurrency 1,x", "--concurrency"),
    ("bench {inv} --input-len 0", "--input-len"),
    ("bench {inv} --output-len -3", "--output-len"),
    ("bench {inv} --level-timeout 0", "--level-timeout"),
    ("bench {inv} --level-timeout nan", "--level-timeout"),
    ("bench {inv} --bench-tool x", "--bench-tool"),
    ("bench {inv} --tool x", "--tool"),
    ("runs {inv} --host nohost", "nohost"),
    ("report nope --state-dir {tmp}/s", "nope"),
    ("report latest --state-dir {tmp}/s", "no runs"),
    ("report", "run_id"),
    ("configs bogus", "action"),
    ("configs show --state-dir {tmp}/s", "hash prefix"),
    ("configs export abc --state-dir {tmp}/s", "'abc'"),
    ("configs import {tmp}/nodir --state-dir {tmp}/s", "key.json"),
    ("config-names --model-config {model} --device-name ''", "--device-name"),
    ("config-names --model-config {model} --device-name a/b", "--device-name"),
    ("config-names --model-config {model} --device-name 'NVIDIA H200' --tp 0", "--tp"),
    ("config-names --model-config {model} --device-name 'NVIDIA H200' --tp x", "--tp"),
    ("config-names --model-config {model} --device-name 'NVIDIA H200' --ep 5", "--ep"),
    ("config-names --model-config {model} --device-name 'NVIDIA H200' --dtype bogus", "--dtype"),
    ("config-names --model-config {model} --device-name 'NVIDIA H200' --quantization bogus", "--quantization"),
    ("config-names --model-config {tmp}/nope.json --device-name 'NVIDIA H200'", "nope.json"),
    ("config-names --model-config {model}", "--device-name"),
    ("config-names --model-config {model} --probe {tmp}/nope.json", "--probe"),
    ("config-names --model-config {model} --probe {tmp}/a-file", "--probe"),
    ("config-names --model-config {model} --probe {tmp}/probe-no-gpu.json", "--probe"),
    ("config-names --model-config {model} --probe {tmp}/a-file --device-name 'NVIDIA H200'", "--probe"),
    ("bogus", "bogus"),
]


def _argv(text: str, tmp: Path) -> list[str]:
    import shlex

    return shlex.split(text.format(inv=tmp / "hosts.yaml", tmp=tmp, model=MODEL))


@pytest.mark.parametrize("cmd, field", ORCH_CASES, ids=[c for c, _ in ORCH_CASES])
def test_orch_bad_input_is_one_line_naming_the_field(env, capsys, cmd, field):
    own_state = "--state-dir" in cmd or cmd.split()[0] not in HOST_COMMANDS + ("doctor", "runs")
    rc = orch_main(_argv(cmd, env) + ([] if own_state else ["--state-dir", str(env / "s")]))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("orch: error: "), err
    assert field in err and "Traceback" not in err, err
    assert not (env / "s" / "runs").exists() and not (env / "host-state").exists(), "refused before anything ran"


def test_config_names_device_name_rejected_by_sglang_rule_is_one_line_from_the_console():
    """Issue 17: ``--device-name ''`` ended in ``ValueError: device name is empty`` and a traceback."""
    p = run_watched([sys.executable, "-m", "orchestrator", "config-names", "--model-config", MODEL, "--tp", "1",
                        "--device-name", ""], cwd=REPO)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "orch: error: --device-name: device name is empty\n"


def test_config_names_flags_a_device_name_not_in_torchs_form(capsys):
    """Issue 22: ``H200`` names a file SGLang never looks for on an H200 (torch says ``NVIDIA H200``):
    the names are printed (a device orch does not know must stay nameable), with a warning naming the
    torch form and the file SGLang would look for."""
    assert orch_main(["config-names", "--model-config", MODEL, "--device-name", "H200"]) == 0
    out, err = capsys.readouterr()
    assert out == "E=128,N=768,device_name=H200.json\nE=128,N=768,device_name=H200_down.json\n"
    assert len(err.splitlines()) == 1 and "warning" in err
    assert "'NVIDIA H200'" in err and "device_name=NVIDIA_H200" in err
    for good in ("NVIDIA H200", "NVIDIA_H200"):  # torch's form, and SGLang's (the same file)
        assert orch_main(["config-names", "--model-config", MODEL, "--device-name", good]) == 0
        out, err = capsys.readouterr()
        assert err == "" and out.startswith("E=128,N=768,device_name=NVIDIA_H200.json\n")


def test_config_names_takes_the_device_name_from_a_hosts_probe(tmp_path, capsys):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"device_name": "NVIDIA_H100_80GB_HBM3", "mixed_gpus": False,
                                 "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}))
    assert orch_main(["config-names", "--model-config", MODEL, "--probe", str(probe)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json",
                                "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3_down.json"] and err == ""


def test_inventory_warnings_are_printed_before_the_run(env, capsys):
    inv = env / "hosts.yaml"
    inv.write_text(inv.read_text() + "      orch_device_name: H200\n")
    pb = env / "nothing.yaml"
    pb.write_text("- name: nothing\n  hosts: all\n  tasks: []\n")
    assert orch_main(["tune", str(inv), "--playbook", str(pb), "--check", "--state-dir", str(env / "s")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: " in err and "orch_device_name 'H200' is not in torch's form" in err
    assert err.index("did you mean 'NVIDIA H200'?") < err.index("orch tune run")


# --------------------------------------------------------------------------- payload commands

SHAPE = ["--shape", "E=8,N=64,hidden=128,topk=2", "--space", "smoke"]
PAYLOAD_CASES = [
    (["bogus"], "bogus"),
    (["version", "--bogus"], "--bogus"),
    (["names", "--model-config", MODEL, "--device-name", "NVIDIA H200", "--bogus"], "--bogus"),
    (["names", "--model-config", MODEL], "--device-name"),
    (["names", "--model-config", MODEL, "--device-name", ""], "device name"),
    (["names", "--model-config", MODEL, "--device-name", "NVIDIA H200", "--tp", "x"], "--tp"),
    (["names", "--model-config", MODEL, "--device-name", "NVIDIA H200", "--tp", "0"], "--tp"),
    (["probe", "--device-name", "a/b", "--model-config", MODEL], "device name"),
    (["tune", *SHAPE, "--device-name", "a/b", "--out", "{tmp}/o"], "device name"),
    (["tune", *SHAPE, "--device-name", "NVIDIA H200", "--out", "{tmp}/o", "--seed", "x"], "--seed"),
    (["tune", *SHAPE, "--device-name", "NVIDIA H200", "--out", "{tmp}/o", "--batch-sizes", "0,4"], "--batch-sizes"),
    (["port", "--port", "x"], "--port"),
    (["port", "--port", "0"], "--port"),
    (["reap", "--kill-timeout", "nan", "--check"], "--kill-timeout"),
    (["runs", "--state-dir", "{tmp}/hs", "--limit", "-1"], "--limit"),
    (["restore", "--run-id", "../x", "--state-dir", "{tmp}/hs"], "run id"),
    (["lock", "--state-dir", "{tmp}/hs"], "op"),
    (["install", "--request", "{tmp}/a-file"], "request"),
    (["bench", "--url", "http://127.0.0.1:1", "--request-timeout", "nan"], "--request-timeout"),
    (["bench", "--url", "http://127.0.0.1:1", "--concurrency", "0"], "--concurrency"),
    (["reach", "--url", "http://127.0.0.1:1", "--timeout", "-1"], "--timeout"),
    (["reach", "--url", "notaurl"], "--url"),
]


@pytest.mark.parametrize("argv, field", PAYLOAD_CASES, ids=[" ".join(a) for a, _ in PAYLOAD_CASES])
def test_payload_bad_input_ends_in_one_bad_input_line(tmp_path, capsys, monkeypatch, argv, field):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "0"))  # tune sets it: restored after
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    rc = payload_main([a.format(tmp=tmp_path) for a in argv])
    out, err = capsys.readouterr()
    lines = [json.loads(x) for x in out.splitlines()]
    ends = [x for x in lines if x["type"] in ("result", "error")]
    assert rc == 2 and len(ends) == 1 and ends[0] is lines[-1], out
    assert lines[-1]["kind"] == "bad_input" and field in lines[-1]["msg"], lines[-1]
    assert "Traceback" not in err, err


def test_payload_state_folder_that_is_a_file_is_one_runtime_line(tmp_path, capsys):
    """The host's state, not the command's input (as ``remote.host.fs.ensure_private_dir`` says):
    ``runtime``, named, without the traceback a crash has."""
    (tmp_path / "a-file").write_text("")
    assert payload_main(["runs", "--state-dir", str(tmp_path / "a-file")]) == 1
    out, err = capsys.readouterr()
    last = json.loads(out.splitlines()[-1])
    assert last["kind"] == "runtime" and "is not a folder (--state-dir" in last["msg"] and "Traceback" not in err
