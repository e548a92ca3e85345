"""The playbook engine with in-process task modules (no hosts): blocks, rescue, check mode, serial."""

import textwrap
from dataclasses import dataclass, field

import pytest

from orchestrator.engine.context import RunOptions
from orchestrator.engine.playbook import PlaybookError, load_playbook
from orchestrator.engine.results import TaskFailed, TaskResult
from orchestrator.engine.runner import Engine
from orchestrator.engine.task import READ_ONLY, task


@dataclass
class H:
    name: str
    groups: list = field(default_factory=list)


class Rep:
    def __init__(self):
        self.lines = []

    def task_result(self, host, task, result):
        self.lines.append((host, task, result.status))

    def progress(self, *a, **k):
        pass

    def line(self, text):
        self.lines.append(text)


def make(tmp_path, text, fail_on=(), check=False):
    calls = []
    mods = {}

    @task("step", registry=mods)
    def step(ctx, what: str, value: object = None):
        calls.append((ctx.name, what, value))
        if (ctx.name, what) in fail_on or what in fail_on:
            raise TaskFailed(f"{what} broke")
        return TaskResult.changed(what, value=value)

    @task("look", check_mode=READ_ONLY, registry=mods)
    def look(ctx, what: str):
        calls.append((ctx.name, what, None))
        return TaskResult.ok(what, seen=what)

    pb = tmp_path / "pb.yaml"
    pb.write_text(textwrap.dedent(text))
    plays = load_playbook(pb, mods)
    events = []
    opts = RunOptions(run_id="r1", run_dir=tmp_path / "run", check=check)
    eng = Engine(mods, opts, Rep(), lambda ev, **f: events.append((ev, f)))
    return eng, plays, calls, events


def replace_task(eng, name, fn):
    """Swap the function behind task ``name`` (same declaration) for a test."""
    import dataclasses

    eng.tasks[name] = dataclasses.replace(eng.tasks[name], fn=fn)


PB = """
- hosts: all
  tasks:
    - look: {what: facts}
      register: f
    - block:
        - step: {what: stop}
        - step: {what: "install", value: "{{ f.seen }}-{{ inventory_hostname }}"}
        - step: {what: start}
      rescue:
        - step: {what: restore, value: "{{ orch_failure.cause }}"}
      always:
        - step: {what: unlock}
    - step: {what: after}
"""


def test_block_rescue_always_and_templating(tmp_path):
    eng, plays, calls, _ = make(tmp_path, PB, fail_on=[("b", "install")])
    recaps = eng.run_play(plays[0], [H("a"), H("b")], lambda h: {}, forks=1)
    a = [c for c in calls if c[0] == "a"]
    b = [c for c in calls if c[0] == "b"]
    assert [c[1] for c in a] == ["facts", "stop", "install", "start", "unlock", "after"]
    assert a[2][2] == "facts-a"
    # b: install failed -> rescue with the cause, always, and nothing after the block
    assert [c[1] for c in b] == ["facts", "stop", "install", "restore", "unlock"]
    assert "install broke" in b[3][2]
    assert recaps["a"].outcome == "completed" and recaps["b"].outcome == "failed"
    assert recaps["b"].rescued == 1 and "install broke" in recaps["b"].cause


def test_check_mode_runs_only_check_safe_tasks(tmp_path):
    eng, plays, calls, _ = make(tmp_path, PB, check=True)
    recaps = eng.run_play(plays[0], [H("a")], lambda h: {})
    assert [c[1] for c in calls] == ["facts"]
    assert recaps["a"].outcome == "check" and recaps["a"].skipped == 5


def test_serial_stops_after_failed_batch(tmp_path):
    eng, plays, calls, events = make(tmp_path, PB, fail_on=[("a", "start")])
    hosts = [H("a"), H("b"), H("c")]
    recaps = eng.run_play(plays[0], hosts, lambda h: {}, serial=1, max_fail_percentage=0)
    assert {c[0] for c in calls} == {"a"}
    assert recaps["b"].outcome == recaps["c"].outcome == "not started"
    assert any(ev == "play_aborted" and f["not_started"] == ["b", "c"] for ev, f in events)


def test_cancel_skips_to_rescue(tmp_path):
    eng, plays, calls, _ = make(tmp_path, PB)
    orig = eng.tasks["step"].fn

    def step(ctx, what, value=None):
        r = orig(ctx, what, value)
        if what == "stop":
            ctx.options.cancel.set()
        return r

    replace_task(eng, "step", step)
    recaps = eng.run_play(plays[0], [H("a")], lambda h: {})
    assert [c[1] for c in calls] == ["facts", "stop", "restore", "unlock"]
    assert "interrupted" in recaps["a"].cause


def test_playbook_errors_name_file_and_task(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("- hosts: all\n  tasks:\n    - name: Stop\n      stpe: {what: x}\n")
    tasks = make(tmp_path, PB)[0].tasks
    with pytest.raises(PlaybookError, match=r"bad.yaml: play 1 tasks\[0\] \(Stop\): unknown task 'stpe'; did you mean 'step'"):
        load_playbook(p, tasks)
    p.write_text("- hosts: all\n  tasks: [\n")
    with pytest.raises(PlaybookError, match=r"bad.yaml:\d+:\d+: YAML error"):
        load_playbook(p, tasks)


def test_bundled_playbooks_load():
    from orchestrator.engine.playbook import builtin_playbook
    from orchestrator.tasks import RENAMED, TASKS

    for name in ("tune", "rollback", "recover", "doctor", "bench", "runs"):
        plays = load_playbook(builtin_playbook(name), TASKS, RENAMED)
        assert plays[0].steps[0].module == "connect"


def test_unexpected_exception_in_task_still_runs_rescue(tmp_path):
    eng, plays, calls, events = make(tmp_path, PB)
    orig = eng.tasks["step"].fn

    def step(ctx, what, value=None):
        if what == "install":
            raise KeyError("boom")
        return orig(ctx, what, value)

    replace_task(eng, "step", step)
    recaps = eng.run_play(plays[0], [H("a")], lambda h: {})
    assert [c[1] for c in calls] == ["facts", "stop", "restore", "unlock"]
    assert "internal error in step: KeyError" in recaps["a"].cause
    assert any(ev == "internal_error" for ev, _ in events)


def test_rescue_keeps_going_after_a_failed_step(tmp_path):
    pb = PB.replace("        - step: {what: restore, value: \"{{ orch_failure.cause }}\"}",
                    "        - step: {what: restore, value: \"{{ orch_failure.cause }}\"}\n        - step: {what: restart}")
    eng, plays, calls, _ = make(tmp_path, pb, fail_on=["install", "restore"])
    recaps = eng.run_play(plays[0], [H("a")], lambda h: {})
    assert [c[1] for c in calls] == ["facts", "stop", "install", "restore", "restart", "unlock"]
    assert "rescue also failed" in recaps["a"].cause
