"""``orch report``: the HTML report of a run record (orchestrator/report.py).

The fixture ``tests/data/report_run`` is a real run record of ``orch tune`` on the
1-host test bed (events stripped of their ``data`` payloads to keep it small). Expected
numbers are read from the fixture's JSON files, never written here by hand.
"""

from __future__ import annotations

import base64
import html as htmlmod
import json
import re
import shutil
from pathlib import Path

import pytest

from orchestrator import report as rep
from orchestrator.cli import main
from tests.paths import DATA, REPO
from tests.waiting import run_watched

FIXTURE = DATA / "report_run"
RUN_ID = "20261129T092040Z-tune-6c2b53"
HOSTILE = "evil<script>alert(1)"
HAVE_MPL = rep.have_matplotlib()


def _state(tmp_path: Path) -> tuple[Path, Path]:
    state = tmp_path / "state"
    run_dir = state / "runs" / RUN_ID
    shutil.copytree(FIXTURE, run_dir)
    return state, run_dir


def _load(p: Path):
    return json.loads(p.read_text())


def _dump(p: Path, data) -> None:
    p.write_text(json.dumps(data, indent=1))


def _add_host(run_dir: Path, name: str, scale: float) -> None:
    """Clone host gpu-a as ``name`` with tuned times multiplied by ``scale`` and a shipped config 10% faster
    than the default."""
    dst = run_dir / "hosts" / name
    shutil.copytree(run_dir / "hosts" / "gpu-a", dst)
    r = _load(dst / "report.json")
    for row in r["batch_sizes"].values():
        row["tuned_us"] *= scale
        row["speedup_vs_default"] = round(row["default_us"] / row["tuned_us"], 4)
        row["shipped_us"] = row["default_us"] * 0.9
        row["speedup_vs_shipped"] = round(row["shipped_us"] / row["tuned_us"], 4)
    _dump(dst / "report.json", r)
    recap = _load(run_dir / "recap.json")
    recap[name] = dict(recap["gpu-a"], outcome="failed", cause=f"bad thing on {name} & <b>co</b>")
    _dump(run_dir / "recap.json", recap)
    run = _load(run_dir / "run.json")
    run["hosts"].append(name)
    _dump(run_dir / "run.json", run)


def test_report_contains_the_numbers_of_the_run(tmp_path):
    _, run_dir = _state(tmp_path)
    out = rep.build_report(run_dir)
    assert out == run_dir / "report.html"
    text = out.read_text()
    tune = _load(FIXTURE / "hosts/gpu-a/report.json")
    assert len(tune["batch_sizes"]) >= 2
    for m, row in tune["batch_sizes"].items():
        line = re.search(rf'<tr><td class="n">{m}</td>(.*?)</tr>', text, re.S)
        assert line, f"no kernel row for M={m}"
        cells = line.group(1)
        assert f"{row['tuned_us']:,.1f}" in cells
        assert f"{row['default_us']:,.1f}" in cells
        assert f"{row['speedup_vs_default']:.3f}×" in cells
        up = row["up"]
        assert f"{up['BLOCK_SIZE_M']}/{up['BLOCK_SIZE_N']}/{up['BLOCK_SIZE_K']}/{up['GROUP_SIZE_M']}/" in cells
    for label in ("before", "after"):
        for lvl in _load(FIXTURE / f"hosts/gpu-a/bench_{label}.json")["levels"]:
            assert f"{lvl['output_throughput']:,.1f}" in text
    recap = _load(FIXTURE / "recap.json")["gpu-a"]
    for path in recap["summary"]["installed"]:
        assert f"<code>{htmlmod.escape(path)}</code>" in text
    assert f"{recap['summary']['throughput_change_pct']:+.1f} %" in text
    assert "completed" in text and "TRITON_INTERPRET=1" in text
    # self-contained: no scripts, no external references
    assert "<script" not in text.lower()
    assert not re.search(r'(src|href)="(?!#|data:)', text)
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    if HAVE_MPL:
        assert len(imgs) == 2  # kernel plot + throughput plot
        assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in imgs)
    else:
        assert not imgs and "matplotlib is not installed" in text


def test_tables_only_without_plots(tmp_path):
    _, run_dir = _state(tmp_path)
    text = rep.build_report(run_dir, tmp_path / "r.html", plots=False).read_text()
    assert "data:image" not in text and "matplotlib is not installed" in text
    assert "invalid" not in text
    after = _load(run_dir / "hosts/gpu-a/bench_after.json")
    after["levels"][-1].update(valid=False, failed=3)
    _dump(run_dir / "hosts/gpu-a/bench_after.json", after)
    text = rep.build_report(run_dir, tmp_path / "r.html", plots=False).read_text()
    assert "after invalid (3 failed)" in text
    assert f"{_load(FIXTURE / 'hosts/gpu-a/report.json')['batch_sizes']['4']['tuned_us']:,.1f}" in text


def test_hostile_host_name_is_escaped_and_hosts_are_grouped(tmp_path):
    _, run_dir = _state(tmp_path)
    _add_host(run_dir, HOSTILE, 1.25)
    text = rep.build_report(run_dir).read_text()
    assert "<script" not in text.lower()
    assert "evil&lt;script&gt;alert(1)" in text
    assert "<b>co</b>" not in text and "&amp; &lt;b&gt;co&lt;/b&gt;" in text
    # one group (same device/E/N/selectors) of both hosts, with each host's speedup per M
    data = rep.load_run(run_dir)
    assert len(data["groups"]) == 1 and len(data["groups"][0]["hosts"]) == 2
    tune2 = _load(run_dir / "hosts" / HOSTILE / "report.json")
    tune1 = _load(run_dir / "hosts/gpu-a/report.json")
    for m in tune1["batch_sizes"]:
        s1, s2 = tune1["batch_sizes"][m]["speedup_vs_default"], tune2["batch_sizes"][m]["speedup_vs_default"]
        assert s1 != s2
        row = re.search(rf'<tr><td class="n">{m}</td>(<td class="n[^"]*">[^<]*</td>){{5}}</tr>', text)
        assert row, f"no group row for M={m}"
        assert f"{s1:.3f}×" in row.group(0) and f"{s2:.3f}×" in row.group(0)
        assert f"{min(s1, s2):.3f}×" in row.group(0)
    # the shipped column appears for the host that has a shipped config only
    assert text.count("<th class=\"n\">shipped µs</th>") == 1
    for row in tune2["batch_sizes"].values():
        assert f"{row['shipped_us']:,.1f}" in text and f"{row['speedup_vs_shipped']:.3f}×" in text
    if HAVE_MPL:
        assert text.count("data:image/png;base64,") == 5  # 2 per host + the group plot


def test_failed_host_without_data(tmp_path):
    _, run_dir = _state(tmp_path)
    recap = _load(run_dir / "recap.json")
    recap["gpu-b"] = {"outcome": "unreachable", "cause": "Connect: no route to host", "ok": 0, "changed": 0,
                      "failed": 0, "unreachable": 1, "skipped": 0, "rescued": 0, "summary": {}}
    _dump(run_dir / "recap.json", recap)
    data = rep.load_run(run_dir)
    b = next(h for h in data["hosts"] if h["name"] == "gpu-b")
    assert b["kernel"] == [] and b["bench"] == [] and b["group"] is None
    text = rep.build_report(run_dir, plots=False).read_text()
    assert "Connect: no route to host" in text and "No tuning data" in text


def test_cli_report(tmp_path, capsys):
    state, run_dir = _state(tmp_path)
    out = tmp_path / "sub" / "x.html"
    assert main(["report", RUN_ID, "--state-dir", str(state), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.stat().st_size > 1000
    assert main(["report", "latest", "--state-dir", str(state)]) == 0
    assert (run_dir / "report.html").exists()
    assert main(["report", "20990101T000000Z-tune-000000", "--state-dir", str(state)]) == 2
    assert "not found" in capsys.readouterr().err


def test_after_run_hook_never_raises(tmp_path):
    class Console:
        def __init__(self):
            self.lines = []

        def print(self, msg, **_kw):
            self.lines.append(msg)

    c = Console()
    (tmp_path / "runs" / "x").mkdir(parents=True)
    assert rep.report_after_run(tmp_path / "runs" / "x", c) is None
    assert len(c.lines) == 1 and ("not written" in c.lines[0] or "is not installed" in c.lines[0])
    if HAVE_MPL:
        _, run_dir = _state(tmp_path)
        c = Console()
        assert rep.report_after_run(run_dir, c) == run_dir / "report.html"
        assert c.lines == [f"report: {run_dir / 'report.html'}"]


def test_matplotlib_comes_with_the_default_install():
    """The report's plots need no extra: matplotlib is one of orch's own dependencies."""
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.split(">")[0].split("=")[0].strip() == "matplotlib" for d in meta["dependencies"])
    assert HAVE_MPL


def test_an_earlier_different_report_is_kept(tmp_path, capsys):
    """`orch report` over the report the run wrote: the same report is replaced quietly; a
    different one (the record changed since) is kept under a new name, and stderr says so."""
    state, run_dir = _state(tmp_path)
    first, kept = rep.write_report(run_dir)
    assert kept is None
    earlier = first.read_text()
    assert main(["report", RUN_ID, "--state-dir", str(state)]) == 0
    assert sorted(p.name for p in run_dir.glob("report*.html")) == ["report.html"]
    assert "kept" not in capsys.readouterr().err
    recap = _load(run_dir / "recap.json")
    recap["gpu-a"]["cause"] = "edited after the first report"
    _dump(run_dir / "recap.json", recap)
    assert main(["report", RUN_ID, "--state-dir", str(state)]) == 0
    err = capsys.readouterr().err
    older = [p for p in run_dir.glob("report.*.html")]
    assert len(older) == 1 and older[0].read_text() == earlier
    assert f"the earlier one is kept as {older[0]}" in err
    assert "edited after the first report" in (run_dir / "report.html").read_text()


def test_reused_files_show_the_tuning_hosts_speedup_in_both_outputs(tmp_path):
    """A host that installed the files its group's tuning host made: the HTML recap and the
    terminal summary give the same geo-mean speedup, and both say where it was measured."""
    from orchestrator.engine.results import HostRecap
    from orchestrator.facts.summary import RunSummary
    from orchestrator.ui import speedup_text

    _, run_dir = _state(tmp_path)
    _add_host(run_dir, "gpu-b", 1.0)
    recap = _load(run_dir / "recap.json")
    tune = _load(run_dir / "hosts" / "gpu-b" / "report.json")
    recap["gpu-b"].update(outcome="completed", cause="")
    recap["gpu-b"]["summary"].update(speedup_measured_on="gpu-a", speedup_vs_default={
        m: row["speedup_vs_default"] for m, row in tune["batch_sizes"].items()})
    _dump(run_dir / "recap.json", recap)
    text = rep.build_report(run_dir, plots=False).read_text()
    row = re.search(r'<tr><td><a href="#host-1">gpu-b</a>(.*?)</tr>', text, re.S).group(1)
    terminal = speedup_text(HostRecap("gpu-b", summary=RunSummary.from_dict(recap["gpu-b"]["summary"])).summary)
    geomean = terminal.split("x", 1)[0]
    assert f"{geomean}×" in row and "measured on gpu-a" in row
    assert terminal.endswith("measured on gpu-a")
    assert "Measured on gpu-a, which tuned these files for the group" in text


@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed")
def test_opens_in_headless_chromium(tmp_path):
    _, run_dir = _state(tmp_path)
    _add_host(run_dir, HOSTILE, 1.25)
    page = rep.build_report(run_dir)
    shot = tmp_path / "shot.png"
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           f"--screenshot={shot}", "--window-size=1280,2000", page.resolve().as_uri()]
    r = run_watched(cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    # console messages (CSP violations, blocked loads, script errors) would be logged as CONSOLE
    assert not [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln], r.stderr[-3000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if HAVE_MPL:
        from PIL import Image  # comes with matplotlib

        img = Image.open(shot).convert("RGB")
        assert img.size == (1280, 2000)
        want = tuple(int(rep.COLORS["tuned"][i:i + 2], 16) for i in (1, 3, 5))
        hits = sum(n for n, px in img.getcolors(1 << 24) if all(abs(a - b) <= 12 for a, b in zip(px, want)))
        assert hits > 300, f"the tuned-config line colour covers only {hits} pixels: plots not rendered?"


def test_group_chart_draws_only_hosts_that_measured(tmp_path):
    """A group member that installed its tuning host's files carries that host's report.json: the
    group's chart and table get a line and a column only for the host that measured (no
    'gpu-b' line repeating gpu-a's data), and the page says gpu-b measured nothing."""
    _, run_dir = _state(tmp_path)
    _add_host(run_dir, "gpu-b", 1.0)
    recap = _load(run_dir / "recap.json")
    recap["gpu-b"].update(outcome="completed", cause="")
    recap["gpu-b"]["summary"].update(speedup_measured_on="gpu-a")
    _dump(run_dir / "recap.json", recap)
    data = rep.load_run(run_dir)
    (g,) = data["groups"]
    assert [h["name"] for h in g["hosts"]] == ["gpu-a", "gpu-b"]
    assert [h["name"] for h in g["tuned"]] == ["gpu-a"]
    assert all(len(row["by_host"]) == 1 for row in g["table"])
    text = rep.build_report(run_dir, plots=False).read_text()
    head = re.search(r'<tr><th class="n">M</th>(.*?)</tr>', text, re.S).group(1)
    assert "gpu-a" in head and "gpu-b" not in head
    assert "gpu-b: measured nothing in this run, no line" in text
    # with gpu-b measuring for itself, both hosts get a column
    recap["gpu-b"]["summary"].pop("speedup_measured_on")
    _dump(run_dir / "recap.json", recap)
    (g,) = rep.load_run(run_dir)["groups"]
    assert [h["name"] for h in g["tuned"]] == ["gpu-a", "gpu-b"]


def test_latest_is_the_last_run_that_changed_or_tried_to_change_hosts(tmp_path, capsys):
    """doctor, runs and --check write run.json with read_only: `orch report latest` passes over
    them (also older records that carry only check: true) and over a re-run that changed nothing,
    and says so when no other run exists; a failed run counts (it tried)."""
    state, run_dir = _state(tmp_path)
    runs = state / "runs"
    done = {"gpu-a": {"outcome": "completed", "changed": 0, "ok": 12}}
    for rid, body, recap in (("20991231T000000Z-doctor-aaaaaa", {"read_only": True}, {}),
                             ("20991231T000001Z-tune-bbbbbb", {"check": True}, {}),
                             ("20991231T000002Z-tune-cccccc", {"read_only": False}, done)):
        (runs / rid).mkdir()
        _dump(runs / rid / "run.json", dict(_load(run_dir / "run.json"), run_id=rid, **body))
        _dump(runs / rid / "recap.json", recap)
    assert rep.find_run_dir("latest", state) == run_dir
    assert not rep.changed_or_tried(runs / "20991231T000002Z-tune-cccccc")
    _dump(runs / "20991231T000002Z-tune-cccccc" / "recap.json", {"gpu-a": dict(done["gpu-a"], outcome="failed")})
    assert rep.find_run_dir("latest", state) == runs / "20991231T000002Z-tune-cccccc"
    shutil.rmtree(runs / "20991231T000002Z-tune-cccccc")
    assert main(["report", "latest", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    shutil.rmtree(run_dir)
    with pytest.raises(rep.ReportError) as ei:
        rep.find_run_dir("latest", state)
    assert "read-only" in str(ei.value) and "20991231T000001Z-tune-bbbbbb" in str(ei.value)
    assert rep.is_read_only(runs / "20991231T000001Z-tune-bbbbbb")


def test_a_failed_bench_run_is_not_latest(tmp_path, capsys):
    """`orch bench` loads the servers and changes no host: its run is read-only, so `orch report
    latest` passes over it even when it failed (the README promises the last run that changed or
    tried to change hosts). Its one host refuses SSH at once (a closed loopback port)."""
    import socket

    state, run_dir = _state(tmp_path)
    with socket.socket() as sock:  # a port nothing listens on: the connect is refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"all:\n  hosts:\n    gpu-z:\n      ansible_host: 127.0.0.1\n      ansible_port: {port}\n")
    assert main(["bench", str(inv), "--service", "sglang-qwen", "--state-dir", str(state)]) == 1
    capsys.readouterr()
    bench = [d for d in (state / "runs").iterdir() if "-bench-" in d.name]
    assert len(bench) == 1 and _load(bench[0] / "run.json")["read_only"] is True
    assert _load(bench[0] / "recap.json")["gpu-z"]["outcome"] == "unreachable"
    assert rep.find_run_dir("latest", state) == run_dir


def test_run_json_marks_read_only_runs(tmp_path):
    """run_playbook writes read_only (= check: doctor, runs and --check all run checked; or given:
    `orch bench`, which changes no host)."""
    from orchestrator.cli.run import run_playbook

    inv = tmp_path / "inv.yaml"
    inv.write_text("all:\n  hosts:\n    h1:\n      ansible_connection: local\n")
    pb = tmp_path / "pb.yaml"
    pb.write_text("- name: nothing\n  hosts: all\n  tasks: []\n")
    for check in (True, False):
        res = run_playbook(pb, inv, check=check, state_dir=tmp_path / "s")
        res.record.close()
        run = _load(res.record.dir / "run.json")
        assert run["read_only"] is check and run["name"] == "pb"
        assert rep.is_read_only(res.record.dir) is check
    res = run_playbook(pb, inv, check=False, read_only=True, state_dir=tmp_path / "s")
    res.record.close()
    assert _load(res.record.dir / "run.json")["read_only"] is True and rep.is_read_only(res.record.dir)


def test_doctor_report_shows_the_verdicts(tmp_path):
    """The report of an `orch doctor` run lists each host's verdict, why and the fix command."""
    _, run_dir = _state(tmp_path)
    _dump(run_dir / "doctor.json", {"gpu-a": {"verdict": "untuned", "why": "no tuned file for E=8,N=64",
                                             "notes": ["a <b>note</b>"], "fix": "orch tune inv.yaml --limit gpu-a"}})
    text = rep.build_report(run_dir, plots=False).read_text()
    sec = text.split("<h2>Doctor</h2>", 1)[1].split("</table>", 1)[0]
    assert "untuned" in sec and "no tuned file for E=8,N=64" in sec and "orch tune inv.yaml --limit gpu-a" in sec
    assert "&lt;b&gt;note" in sec
    (run_dir / "doctor.json").unlink()
    assert "<h2>Doctor</h2>" not in rep.build_report(run_dir, plots=False).read_text()

def test_runner_trial_table_in_report_and_recap(tmp_path):
    from rich.console import Console

    from orchestrator.facts.summary import RunSummary
    from orchestrator.ui import summary_table

    _, run_dir = _state(tmp_path)
    recap = _load(run_dir / "recap.json")
    trial = {"reference": "auto", "kept": "flashinfer_cutlass", "changed": True, "min_agreement": 90.0,
             "min_gain_pct": 3.0, "prompts": 16, "max_new_tokens": 32, "dropin": "/etc/systemd/system/u.service.d/x.conf",
             "candidates": [
                 {"runner": "auto", "reference": True, "tokens_per_s": {"1": 150.5, "4": 555.25}, "agreement": 1.0,
                  "passed": True, "kept": False, "why": "replaced by flashinfer_cutlass"},
                 {"runner": "flashinfer_cutlass", "tokens_per_s": {"1": 290.0, "4": 1050.75}, "agreement": 1.0,
                  "passed": True, "kept": True, "why": "fastest passing: +89.2% output tok/s"},
                 {"runner": "cutlass", "tokens_per_s": {"1": 400.0, "4": 1400.0}, "agreement": 0.125,
                  "passed": False, "kept": False, "why": "output check failed: 12% of 16 prompts agree"}]}
    recap["gpu-a"]["summary"]["runner_trial"] = trial
    _dump(run_dir / "recap.json", recap)
    text = rep.build_report(run_dir, tmp_path / "r.html", plots=False).read_text()
    section = text[text.index("MoE runner trial"):]
    for want in ("1,050.8", "555.2", ">12%<", "output check failed: 12% of 16 prompts agree", "<code>cutlass</code>",
                 "passing needs 90%"):
        assert want in section, want
    row = re.search(r"<tr><td><code>flashinfer_cutlass</code></td>(.*?)</tr>", section, re.S).group(1)
    assert ">kept<" in row
    summary = RunSummary.from_dict(recap["gpu-a"]["summary"])
    assert summary.runner_trial.candidates[2].top() == 1400.0
    console = Console(width=250, record=True)
    console.print(summary_table({"gpu-a": type("R", (), {"summary": summary})()}))
    out = console.export_text()
    assert "flashinfer_cutlass: 1050.8, agreement 100%, KEPT" in out and "cutlass: 1400.0, agreement 12%" in out


def test_recover_fields_are_shown_as_tables(tmp_path):
    """The summary's ``collected`` (what orch recover did with a dead run's tune),
    ``recover_restart`` and ``log_other_invocations`` (journal lines of another invocation that
    were dropped) each get their own section, escaped; before, only raw JSON among the other fields."""
    _, run_dir = _state(tmp_path)
    recap = _load(run_dir / "recap.json")
    rid = "20260101T000000Z-tune-0a0b0c"
    recap["gpu-a"]["summary"].update(
        collected=[{"run_id": rid, "state": "progress kept", "batch_sizes": [1, 4],
                    "what": "the tune did not finish; its checkpoint keeps batch sizes [1, 4] & <more>"}],
        recover_restart=f"sglang.service runs a process started after run {rid} (installed) stopped it",
        log_other_invocations=[{"invocation": "ab" * 16, "lines": 3, "first": "Using MoE kernel config <old>",
                                "unit": "sglang.service", "kept": ["cd" * 16]}])
    _dump(run_dir / "recap.json", recap)
    text = rep.build_report(run_dir, tmp_path / "r.html", plots=False).read_text()
    rec = text[text.index("Recovered from an unfinished run"):]
    assert f"<code>{rid}</code></td><td>progress kept</td>" in rec
    assert "checkpoint keeps batch sizes [1, 4] &amp; &lt;more&gt;" in rec
    assert f"Restarted on the restored files: sglang.service runs a process started after run {rid}" in rec
    other = text[text.index("Log lines of another invocation, dropped"):]
    assert f"<code>{'ab' * 16}</code></td><td class=\"n\">3</td>" in other
    assert "Using MoE kernel config &lt;old&gt;" in other
    extra = text[text.index("Other summary fields"):] if "Other summary fields" in text else ""
    assert "log_other_invocations" not in extra and "collected</th>" not in extra
