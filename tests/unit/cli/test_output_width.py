"""Terminal output fits the terminal and cuts nothing essential, on a terminal and into a pipe.

``orch doctor``, ``orch runs``, ``orch bench``, the tune summary and the reaper's task line are
rendered with rich at 80, 150 and 250 columns (``Console(width=..., record=True)``): no line is
wider than the terminal, except a path or a URL alone on its line (a path is never broken);
verdicts, their reasons, file names, PIDs and command lines appear whole (a name on one line; a
long text, once the line breaks and indents are joined, word for word: it was wrapped at spaces,
never inside a word); narrow terminals get one block per host instead of a table. Into a pipe
(:class:`orchestrator.ui.OrchConsole` without a terminal, 80 columns) the same rules hold and no
line ends in padding.
"""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from orchestrator.cli.bench import print_bench
from orchestrator.cli.doctor import print_doctor, verdict_reason
from orchestrator.engine.results import HostRecap, TaskResult
from orchestrator.facts.summary import RunSummary
from orchestrator.cli.runs import print_runs
from orchestrator.tasks.reap import reap_message
from orchestrator.ui import OrchConsole, Reporter, print_recap, print_summary

WIDTHS = [80, 150, 250]
UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
FP8_UP = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
HOLDER = ("sglang::scheduler_TP0 /srv/orch-checkout/tests/testbed/holder.py --comm sglang::scheduler_TP0 "
          "/dev/nvidia0 /dev/nvidiactl")
PERSISTENCED = "nvidia-persistenced /srv/orch-checkout/tests/testbed/holder.py --comm nvidia-persistenced /dev/nvidia0"


def lone_path(line: str) -> bool:
    """True for a line that is one path or URL and nothing else (indent aside): the one line the
    output rules let be wider than the terminal, since breaking it would break the path."""
    words = line.split()
    return len(words) == 1 and "/" in words[0]


def render(width: int, draw) -> str:
    """Text that ``draw(console)`` prints on a terminal ``width`` columns wide (styles dropped)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None, force_terminal=True)
    draw(console)
    text = console.export_text()
    too_wide = [line for line in text.splitlines() if cell_len(line) > width and not lone_path(line)]
    assert not too_wide, f"{len(too_wide)} line(s) wider than {width}: {too_wide[:3]}"
    return text


def piped(draw, width: int = 80) -> str:
    """What ``draw(console)`` writes into a pipe (orch's console without a terminal, ``width``
    columns as rich takes from ``$COLUMNS``): every line at most ``width`` cells or a lone path,
    and none ending in spaces."""
    out = io.StringIO()
    draw(OrchConsole(width=width, file=out, color_system=None))
    text = out.getvalue()
    assert "\x1b" not in text
    too_wide = [line for line in text.splitlines() if cell_len(line) > width and not lone_path(line)]
    assert not too_wide, f"{len(too_wide)} line(s) wider than {width}: {too_wide[:3]}"
    padded = [line for line in text.splitlines() if line != line.rstrip()]
    assert not padded, f"{len(padded)} line(s) end in spaces: {padded[:3]}"
    return text


def flat(text: str) -> str:
    """Text with every run of whitespace (line breaks and indents included) made one space."""
    return " ".join(text.split())


def assert_whole(text: str, *names: str) -> None:
    """Each name appears on one line of ``text``."""
    lines = text.splitlines()
    for name in names:
        assert any(name in line for line in lines), f"{name!r} is not on one line:\n{text}"


def assert_wrapped_at_spaces(text: str, *paragraphs: str) -> None:
    """Each paragraph appears word for word once line breaks and indents are joined."""
    for p in paragraphs:
        assert flat(p) in flat(text), f"{p!r} was cut or broken inside a word:\n{text}"


def _file(name: str, where: str = "installed", error: str | None = None) -> dict:
    return {"name": name, "in_installed_folder": where == "installed",
            "other_folders": ["triton_3_1_0"] if where == "other" else [], "error": error}


def _row(verdict: str, why: str, up: dict, down: dict, backend: str = "auto", log: dict | None = None,
         notes: list[str] | None = None, **kw) -> dict:
    row = {"gpus": [], "device_name": "NVIDIA_H200", "triton_version": "3.9.0", "sglang_version": "0.5.23",
           "backend": backend, "tp": 1, "ep": 1, "E": 8, "N": 64, "dtype_selector": None,
           "file_names": {"up": up["name"], "down": down["name"]}, "files": {"up": up, "down": down},
           "log": log if log is not None else {"loaded": [], "fallback": [], "default": [], "down_missing": False},
           "verdict": verdict, "why": why,
           "notes": notes if notes is not None else [
               f"1 GPU holder(s) outside the unit: pid 32 ({HOLDER}) (not killed; orch tune reaps them)"]}
    row.update(kw)
    return row


BAD_JSON = "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
ROWS = {
    "gpu-a": _row("tuned", "up and down files in the installed Triton folder, valid, loaded at the last start",
                  _file(UP), _file(DOWN), log={"loaded": [f"/x/{UP}", f"/x/{DOWN}"]}),
    "gpu-b": _row("fallback", "only in triton_3_1_0 (sub-optimal)", _file(UP, "other"), _file(DOWN, "other"),
                  log={"fallback": [[f"/x/{UP}", f"/y/{UP}", "3.1.0"], [f"/x/{DOWN}", f"/y/{DOWN}", "3.1.0"]]}),
    "gpu-d": _row("not-triton", "--moe-runner-backend flashinfer_cutlass: Triton MoE config files are not used by "
                  "this server; orch tune would change nothing. FlashInfer autotunes at start-up on SM90+ (cache "
                  "~/.cache/sglang/flashinfer/autotune/)", _file(UP, "missing"), _file(DOWN, "missing"),
                  backend="flashinfer_cutlass", log={}),
    "gpu-f": _row("broken", f"triton_3_9_0/{UP} is invalid (a start would crash): {BAD_JSON}",
                  _file(UP, error=BAD_JSON), _file(DOWN, "missing"), log={"default": [f"/x/{UP}", f"/x/{DOWN}"]}),
    "gpu-x": {"verdict": "unreachable", "error": "10.213.9.2:22: connect timed out after 10 s (host down, or a "
                                                 "firewall drops SSH)"},
}


@pytest.mark.parametrize("width", WIDTHS)
def test_doctor_fits_and_cuts_nothing(width):
    text = render(width, lambda c: print_doctor(ROWS, c))
    table = "┃" in text
    assert table == (width >= 250), text  # these rows need about 220 columns as a table
    assert_whole(text, UP, DOWN, "flashinfer_cutlass", "triton_3_1_0")
    for host, row in ROWS.items():
        assert_whole(text, host, row["verdict"])
        assert_wrapped_at_spaces(text, verdict_reason(row))
    assert_wrapped_at_spaces(text, HOLDER)
    if not table:  # blocks give the invalid file's error next to it
        assert_wrapped_at_spaces(text, f"{UP} installed folder {BAD_JSON}")


def test_doctor_blocks_keep_a_long_fp8_name_whole():
    """An fp8 block-quantised name (84 characters for the down file) stays on one line at 150
    columns."""
    rows = {"gpu-q": _row("default", "no up file in any Triton folder: SGLang's default config (sub-optimal)",
                          _file(FP8_UP, "missing"), _file(FP8_UP.replace(".json", "_down.json"), "missing"),
                          notes=[])}
    down = FP8_UP.replace(".json", "_down.json")
    assert_whole(render(150, lambda c: print_doctor(rows, c)), FP8_UP, down)
    # narrower than the name: it wraps at its one space ("[128, 128]"), nowhere else
    assert_wrapped_at_spaces(render(90, lambda c: print_doctor(rows, c)), FP8_UP, down)


def _runs_recap() -> dict:
    changed = [{"action": "replaced", "path": f"/opt/sglang/configs/triton_3_9_0/{UP}"},
               {"action": "created", "path": f"/opt/sglang/configs/triton_3_9_0/{DOWN}"}]
    runs = [{"run_id": "20261129T092040Z-tune-6c2b53", "created": "2026-11-29T09:20:40.123456+00:00",
             "action": "tune", "changed": changed, "status": "completed",
             "state": {"state": "completed", "data": {"summary": {"bench_before": {"output_throughput": 101.25},
                                                                 "bench_after": {"output_throughput": 152.5}}}}}]
    return {"gpu-a": HostRecap("gpu-a", outcome="check", summary=RunSummary(runs=runs)),
            "gpu-b": HostRecap("gpu-b", outcome="unreachable",
                               cause="10.213.2.2:22: connection refused (sshd is not running, or a firewall "
                                     "rejects SSH); nothing was read from this host")}


@pytest.mark.parametrize("width", WIDTHS)
def test_runs_fits_and_names_both_files(width):
    recaps = _runs_recap()
    text = render(width, lambda c: print_runs(c, recaps))
    assert ("┃" in text) == (width >= 250)
    assert_whole(text, "20261129T092040Z-tune-6c2b53", f"replaced: {UP}", f"created: {DOWN}", "101.2 → 152.5")
    assert_wrapped_at_spaces(text, recaps["gpu-b"].cause)


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_fits(width):
    level = {"max_concurrency": 64, "completed": 640, "failed": 0, "timed_out": 0, "output_throughput": 12345.67,
             "total_throughput": 23456.78, "request_throughput": 12.345, "median_ttft_ms": 123.45,
             "p99_ttft_ms": 456.78, "median_itl_ms": 7.89, "valid": True}
    recaps = {"gpu-a": HostRecap("gpu-a", outcome="completed"),
              "gpu-b": HostRecap("gpu-b", outcome="failed", cause="level 64: 12 of 640 requests failed (1.9% > 1%): "
                                                                  "HTTP 503 Service Unavailable from /generate")}
    results = {"gpu-a": {"levels": [dict(level, max_concurrency=c) for c in (1, 16, 64)]}}
    text = render(width, lambda c: print_bench(c, recaps, results))
    assert ("┃" in text) == (width >= 150)
    for value in ("12345.7", "23456.8", "12.35", "123.5", "456.8", "7.9", "640"):
        assert_whole(text, value)
    assert_wrapped_at_spaces(text, recaps["gpu-b"].cause)


@pytest.mark.parametrize("width", WIDTHS)
def test_reaper_line_keeps_pids_and_command_lines(width):
    msg = reap_message([{"pid": 4242, "cmdline": HOLDER, "signal": "SIGTERM"}],
                       [{"pid": 4243, "cmdline": PERSISTENCED}])

    def draw(console):
        Reporter(console).task_result("gpu-a", "Reap leftover GPU processes", TaskResult("changed", msg))

    text = render(width, draw)
    assert_whole(text, "4242", "4243", "/srv/orch-checkout/tests/testbed/holder.py", "sglang::scheduler_TP0",
                 "nvidia-persistenced")
    assert_wrapped_at_spaces(text, f"killed pid 4242 by SIGTERM: {HOLDER}", f"kept pid 4243 (protected): {PERSISTENCED}")


@pytest.mark.parametrize("width", WIDTHS)
def test_summary_fits_and_names_where_the_speedup_was_measured(width):
    installed = [f"/opt/sglang/configs/triton_3_9_0/{UP}", f"/opt/sglang/configs/triton_3_9_0/{DOWN}"]
    speedups = {"1": 1.5, "4": 2.0, "16": 2.7}
    recaps = {"gpu-a": HostRecap("gpu-a", outcome="completed", summary=RunSummary(installed=installed,
                                                                                 speedup_vs_default=speedups)),
              "gpu-b": HostRecap("gpu-b", outcome="completed",
                                 summary=RunSummary(installed=installed, speedup_vs_default=speedups,
                                                    speedup_measured_on="gpu-a")),
              "gpu-c": HostRecap("gpu-c", outcome="failed", cause="the server did not become ready within 60 s after "
                                                                  "the start; the old files were restored")}
    text = render(width, lambda c: print_summary(c, recaps))
    assert_whole(text, UP, DOWN, "2.008x geo-mean (1.50x–2.70x)", "measured on gpu-a")
    assert_wrapped_at_spaces(text, recaps["gpu-c"].cause)


def test_task_lines_into_a_pipe_wrap_at_spaces_and_keep_names_whole():
    """Into a pipe or a log file (not a terminal), a task's message is wrapped at spaces to the
    width (80 when $COLUMNS says nothing), the lines after the first indented; grep still finds
    the pid with its signal and the command line's path whole on one line. No line ends in spaces."""
    msg = reap_message([{"pid": 4242, "cmdline": HOLDER, "signal": "SIGTERM"}], [])
    text = piped(lambda c: Reporter(c).task_result("gpu-a", "Reap leftover GPU processes",
                                                   TaskResult("changed", msg)))
    lines = text.splitlines()
    assert lines[0].startswith("    changed gpu-a Reap leftover GPU processes — killed 1 leftover GPU")
    assert all(ln.startswith(" " * 12) for ln in lines[1:])
    assert_whole(text, "killed pid 4242 by SIGTERM:", "/srv/orch-checkout/tests/testbed/holder.py")
    assert_wrapped_at_spaces(text, f"killed pid 4242 by SIGTERM: {HOLDER}")


LONG_DIR = "/opt/sglang/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_9_0"


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_a_path_wider_than_the_line_stands_whole_on_its_own_line(terminal):
    """The plan's paths (118 characters on the test bed) never break at 80 columns: each is a line
    of its own, the one kind of line wider than the terminal; the words around them wrap at spaces."""
    up, down = f"{LONG_DIR}/{UP}", f"{LONG_DIR}/{DOWN}"
    msg = (f"would write {down} (new)\ninstalled {up} (replaced only if the new file differs)\n"
           "server answers at http://127.0.0.1:30000 (from the host)")

    def draw(c):
        Reporter(c).task_result("gpu-a", "Plan the files to write", TaskResult("ok", msg))

    text = render(80, draw) if terminal else piped(draw)
    lines = text.splitlines()
    for path in (up, down):
        assert any(ln.strip() == path for ln in lines), text
    assert_whole(text, "http://127.0.0.1:30000")
    assert_wrapped_at_spaces(text, msg)


def _recaps_with_a_long_name() -> dict:
    return {"gpu-a": HostRecap("gpu-a", outcome="completed", ok=20, changed=6),
            "orchtb-3f2a-rack-17-gpu-b": HostRecap("orchtb-3f2a-rack-17-gpu-b", outcome="unreachable", unreachable=1,
                                                   cause="10.213.2.2:22: connection refused")}


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_the_recap_never_cuts_a_column(terminal):
    """The recap is a table when it fits; at 80 columns with a long host name it is one line per
    host, Ansible's way, each count with its whole name: never ``unreachab…``."""
    recaps = _recaps_with_a_long_name()
    text = render(80, lambda c: print_recap(c, recaps)) if terminal else piped(lambda c: print_recap(c, recaps))
    assert "…" not in text and "┃" not in text
    assert_whole(text, "gpu-a : completed", "orchtb-3f2a-rack-17-gpu-b : unreachable")
    assert_wrapped_at_spaces(text, "ok=20 changed=6 unreachable=0 failed=0 skipped=0 rescued=0",
                             "ok=0 changed=0 unreachable=1 failed=0 skipped=0 rescued=0")
    wide = render(150, lambda c: print_recap(c, recaps))
    assert "┃" in wide and "unreachable" in wide and "…" not in wide


def test_piped_tables_and_blocks_carry_no_padding():
    """A table's centred title, the summary's blocks and the causes under a table: into a pipe no
    line ends in spaces (rich pads them all to the width)."""
    installed = [f"{LONG_DIR}/{UP}", f"{LONG_DIR}/{DOWN}"]
    recaps = {"gpu-a": HostRecap("gpu-a", outcome="completed", summary=RunSummary(
                  installed=installed, speedup_vs_default={"1": 1.5, "4": 2.0})),
              "gpu-c": HostRecap("gpu-c", outcome="failed", cause="the server did not become ready within 60 s "
                                                                  "after the start; the old files were restored")}
    for width in (80, 250):
        text = piped(lambda c: (print_recap(c, recaps), print_summary(c, recaps)), width)
        assert_whole(text, UP, DOWN, "PLAY RECAP", "SUMMARY")
        assert_wrapped_at_spaces(text, recaps["gpu-c"].cause)
    text = piped(lambda c: print_doctor(ROWS, c))
    for row in ROWS.values():
        assert_wrapped_at_spaces(text, verdict_reason(row))
