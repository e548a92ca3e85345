"""Task keywords with Ansible's meanings: register (changed/failed/skipped), check_mode, timeout;
facts declared by the task; hooks when a host's play ends."""

from __future__ import annotations

import textwrap
import time

from orchestrator.engine.context import RunOptions
from orchestrator.engine.playbook import load_playbook
from orchestrator.engine.results import TaskResult
from orchestrator.engine.runner import Engine
from orchestrator.engine.task import AWARE, READ_ONLY, task
from tests.fakes import ScriptedConnection


class H:
    def __init__(self, name):
        self.name = name
        self.groups = []


class Rep:
    def __init__(self):
        self.results = []

    def task_result(self, host, name, result):
        self.results.append((name, result.status, result.msg))

    def progress(self, *a, **k):
        pass

    def line(self, text):
        pass


def _registry(calls):
    reg = {}

    @task("change", registry=reg)
    def change(ctx, what: str):
        calls.append(("change", what, ctx.check))
        return TaskResult.changed(what)

    @task("noop", check_mode=READ_ONLY, registry=reg)
    def noop(ctx, what: str):
        calls.append(("noop", what, ctx.check))
        return TaskResult.ok(what)

    @task("aware", check_mode=AWARE, registry=reg)
    def aware(ctx, what: str):
        calls.append(("aware", what, ctx.check))
        return TaskResult.ok(what)

    @task("publish", check_mode=READ_ONLY, sets=("orch_thing",), registry=reg)
    def publish(ctx, value: str, sneak: bool = False):
        facts = {"orch_thing": value}
        if sneak:
            facts["orch_other"] = 1
        return TaskResult.ok("published", facts=facts)

    @task("plan_as_dict", check_mode=READ_ONLY, sets=("orch_plan",), registry=reg)
    def plan_as_dict(ctx):
        return TaskResult.ok("planned", facts={"orch_plan": {"action": "tune"}})

    @task("wait", registry=reg)
    def wait(ctx, seconds: float):
        # a command run from a task honours its timeout: (the deadline is per thread)
        return TaskResult.ok("waited", out=ctx.connection.run(["sleep", str(seconds)]).stdout)

    @task("poll", registry=reg)
    def poll(ctx, seconds: float):
        deadline = ctx.deadline(seconds)
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return TaskResult.ok("polled")

    def done(c):
        calls.append(("done", c.name, c.protected))

    @task("hook", check_mode=READ_ONLY, registry=reg)
    def hook(ctx):
        ctx.run.when_done(done)
        return TaskResult.ok("hooked")

    return reg


def _run(tmp_path, body, check=False, connection=None):
    calls = []
    reg = _registry(calls)
    pb = tmp_path / "pb.yaml"
    pb.write_text("- hosts: all\n  tasks:\n" + textwrap.indent(textwrap.dedent(body), "    "))
    plays = load_playbook(pb, reg)
    rep = Rep()
    eng = Engine(reg, RunOptions(run_id="r1", run_dir=tmp_path / "run", check=check), rep, lambda *a, **k: None)
    if connection is not None:
        orig = eng._run_host

        def run_host(play, host, variables, recap):
            import orchestrator.engine.runner as runner

            real = runner.HostContext

            class Ctx(real):
                def __init__(self, *a, **k):
                    super().__init__(*a, **k)
                    self.connection = connection
            runner.HostContext = Ctx
            try:
                orig(play, host, variables, recap)
            finally:
                runner.HostContext = real
        eng._run_host = run_host
    recaps = eng.run_play(plays[0], [H("a")], lambda h: {})
    return recaps["a"], calls, rep.results


def test_register_has_ansible_flags_and_jinja_tests(tmp_path):
    recap, calls, _ = _run(tmp_path, """
        - change: {what: x}
          register: a
        - noop: {what: y}
          register: b
        - noop: {what: z}
          when: false
          register: c
        - noop: {what: "{{ [a is changed, a is success, b is changed, c is skipped, b is failed, a.changed] | string }}"}
        - noop: {what: "ran"}
          when: "a is changed and b is not changed and c is skipped and b is succeeded"
    """)
    assert recap.outcome == "completed", recap.cause
    assert ("noop", "[True, True, False, True, False, True]", False) in calls
    assert ("noop", "ran", False) in calls


def test_check_mode_keyword_has_ansibles_meaning(tmp_path):
    # under --check: check_mode: false runs a changing task for real; the rest follow --check
    recap, calls, results = _run(tmp_path, """
        - change: {what: forced-real}
          check_mode: false
        - change: {what: skipped}
        - aware: {what: follows}
    """, check=True)
    assert calls == [("change", "forced-real", False), ("aware", "follows", True)]
    assert ("change", "skipped", "check mode: would run") in results
    # on a real run: check_mode: true puts that task in check mode (a changing task is skipped)
    recap, calls, results = _run(tmp_path, """
        - change: {what: forced-check}
          check_mode: true
        - aware: {what: in-check}
          check_mode: true
        - change: {what: real}
    """)
    assert calls == [("aware", "in-check", True), ("change", "real", False)]
    assert results[0] == ("change", "skipped", "check mode: would run")


def test_task_timeout_cuts_commands_and_waits(tmp_path):
    from orchestrator.connection.local import LocalConnection

    t0 = time.monotonic()
    recap, _, results = _run(tmp_path, """
        - wait: {seconds: 30}
          timeout: 0.5
    """, connection=LocalConnection("a"))
    assert time.monotonic() - t0 < 10
    assert recap.outcome == "failed" and "timed out after 0.5 s" in recap.cause
    recap, _, _ = _run(tmp_path, """
        - poll: {seconds: 30}
          timeout: 0.3
    """)
    assert recap.outcome == "failed" and "timed out after 0.3 s" in recap.cause
    # without a timeout: keyword the same task ends on its own terms
    recap, _, _ = _run(tmp_path, "- poll: {seconds: 0.05}\n")
    assert recap.outcome == "completed"


def test_facts_are_declared_and_merged(tmp_path):
    recap, calls, _ = _run(tmp_path, """
        - publish: {value: hello}
        - noop: {what: "{{ orch_thing }}"}
    """)
    assert recap.outcome == "completed" and ("noop", "hello", False) in calls
    recap, _, _ = _run(tmp_path, "- publish: {value: x, sneak: true}\n")
    assert recap.outcome == "failed" and "set undeclared facts ['orch_other']" in recap.cause
    # a fact of another type than orchestrator/facts/catalog.py declares never reaches the variables
    recap, _, _ = _run(tmp_path, "- plan_as_dict: {}\n")
    assert recap.outcome == "failed" and "task plan_as_dict: fact orch_plan must be Plan, got dict" in recap.cause


def test_when_done_hooks_run_once_protected_after_a_failure(tmp_path):
    recap, calls, _ = _run(tmp_path, """
        - hook: {}
        - hook: {}
        - change: {what: "{{ undefined_variable }}"}
    """)
    assert recap.outcome == "failed" and "undefined_variable" in recap.cause
    assert [c for c in calls if c[0] == "done"] == [("done", "a", True)]


def test_scripted_connection_refuses_unscripted_commands():
    conn = ScriptedConnection([("^systemctl is-active", "active\n")])
    assert conn.run(["systemctl", "is-active", "u"]).stdout == "active\n"
    try:
        conn.run(["rm", "-rf", "/"])
    except AssertionError as exc:
        assert "unscripted command on h1: rm -rf /" in str(exc)
    else:
        raise AssertionError("an unscripted command must fail the test")
