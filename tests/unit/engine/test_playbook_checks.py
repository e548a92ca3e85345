"""Playbooks are checked against the tasks' declarations when loaded, before any host is contacted."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.engine.playbook import PlaybookError, builtin_playbook, load_playbook
from orchestrator.engine.task import READ_ONLY, TaskArgError, check_value, reference_markdown, task
from orchestrator.tasks import RENAMED, TASKS


def _pb(tmp_path, body: str):
    p = tmp_path / "pb.yaml"
    p.write_text("- hosts: all\n  tasks:\n" + textwrap.indent(textwrap.dedent(body), "    "))
    return p


def _error(tmp_path, body: str) -> str:
    with pytest.raises(PlaybookError) as exc:
        load_playbook(_pb(tmp_path, body), TASKS, RENAMED)
    return str(exc.value)


def test_misspelt_argument_names_file_task_and_accepted_arguments(tmp_path):
    msg = _error(tmp_path, """
        - name: Stop the unit
          service: {unitt: "{{ service }}", state: stopped, timeout: 60}
    """)
    assert "pb.yaml: play 1 tasks[0] (Stop the unit): service: unknown argument 'unitt'" in msg
    assert "did you mean 'unit'" in msg
    assert "service accepts: name (alias unit, service), state, timeout, only_if_stopped_by_orch?" in msg


@pytest.mark.parametrize("body, needle", [
    ("- service: {name: x, state: stopped}\n", "missing required argument 'timeout'"),
    ("- service: {name: x, state: stoped, timeout: 5}\n", "argument 'state' must be one of stopped, started, restarted; got 'stoped'"),
    ("- service: {name: x, state: stopped, timeout: soon}\n", "argument 'timeout' must be a number, got 'soon'"),
    ("- service: {name: x, unit: y, state: stopped, timeout: 5}\n", "argument 'name' given twice"),
    ("- name: t\n  service: {name: x, state: stopped, timeout: 5}\n  retries: 3\n", "expected exactly one task key"),
    ("- gpu_reap: {protected: []}\n", "unknown task 'gpu_reap'; it is called 'reap' now"),
    ("- cleanup: {}\n", "unknown task 'cleanup'; cleanup was removed"),
    ("- servce: {name: x}\n", "unknown task 'servce'; did you mean 'service'?"),
    ("- connect: {}\n  when: \"orch_plan.action ==\"\n", "when 'orch_plan.action ==' does not parse"),
    ("- connect: {}\n  timeout: -1\n", "timeout must be a positive number of seconds"),
    ("- connect: {}\n  check_mode: maybe\n", "check_mode must be true or false"),
    ("- connect: {}\n  register: 'a b'\n", "register must be a variable name"),
    ("- unit_facts: {name: \"{{ service \"}\n", "template '{{ service ' does not parse"),
    ("- block:\n    - connect: {}\n  rescue: []\n  retries: 2\n", "unknown keys ['retries']; a block accepts"),
])
def test_each_kind_of_bad_task_is_one_clear_error(tmp_path, body, needle):
    assert needle in _error(tmp_path, body)


@pytest.mark.parametrize("keywords, needle", [
    ("  max_fail_percentage: 120\n", "play 1: max_fail_percentage must be a number 0-100, got 120"),
    ("  serial: [1, x]\n", "play 1: serial item 2"),
    ("  order: random\n", "play 1: order must be one of"),
])
def test_bad_batching_keyword_of_a_play_is_refused_at_load(tmp_path, keywords, needle):
    """A play's ``max_fail_percentage`` was checked only once a batch had failed (mid-run)."""
    p = tmp_path / "pb.yaml"
    p.write_text("- hosts: all\n" + keywords + "  tasks:\n    - connect: {}\n")
    with pytest.raises(PlaybookError, match=needle):
        load_playbook(p, TASKS, RENAMED)


def test_aliases_and_templates_pass_the_load_check(tmp_path):
    plays = load_playbook(_pb(tmp_path, """
        - service: {unit: "{{ service }}", state: stopped, timeout: "{{ orch_stop_timeout }}"}
          check_mode: false
          timeout: 30
          register: stop
    """), TASKS)
    t = plays[0].steps[0]
    assert t.args == {"name": "{{ service }}", "state": "stopped", "timeout": "{{ orch_stop_timeout }}"}
    assert (t.check_mode, t.timeout, t.register) == (False, 30.0, "stop")


def test_every_bundled_playbook_is_valid_and_repeats_no_variable_default():
    """The playbooks pass the check, and no `| default(...)` shadows a variable of the table (its
    default is applied to every host already, so a second one could only disagree)."""
    from orchestrator.inventory import KNOWN_VARS

    for name in ("tune", "rollback", "recover", "doctor", "bench", "runs"):
        path = builtin_playbook(name)
        load_playbook(path, TASKS, RENAMED)
        text = path.read_text()
        for var in KNOWN_VARS:
            assert f"{var} | default(" not in text, (name, var)


def test_declaration_contradicting_its_function_is_refused():
    reg = {}
    with pytest.raises(ValueError, match="alias 'unit' names no parameter 'nmae'"):
        @task("x", aliases={"unit": "nmae"}, registry=reg)
        def x(ctx, name: str):
            pass
    with pytest.raises(ValueError, match="check_mode must be one of"):
        task("y", check_mode="sometimes")


def test_values_are_checked_and_converted_like_ansible():
    from typing import Literal

    assert check_value("300", float, "t") == 300.0
    assert check_value("yes", bool, "b") is True and check_value("off", bool, "b") is False
    assert check_value(["1", 2], list[int], "m") == [1, 2]
    assert check_value(None, list[int] | None, "m") is None
    with pytest.raises(TaskArgError, match="must be a whole number"):
        check_value(2.5, int, "n")
    with pytest.raises(TaskArgError, match=r"argument 'm\[1\]' must be a number"):
        check_value([1, "x"], list[int], "m")
    with pytest.raises(TaskArgError, match="must be one of a, b"):
        check_value("c", Literal["a", "b"], "k")
    with pytest.raises(TaskArgError, match="must be true or false"):
        check_value("perhaps", bool, "b")


def test_reference_lists_every_task_with_its_contract():
    reg = {}

    @task("probe_x", check_mode=READ_ONLY, sets=("orch_x",), aliases={"unit": "name"}, registry=reg)
    def probe_x(ctx, name: str, sizes: list[int] | None = None):
        """Read the thing.

        More text that is not the summary."""

    text = reference_markdown(reg)
    row = text.splitlines()[2]
    assert row.startswith("| `probe_x` | `name` (str; required, alias `unit`)<br>`sizes` (list[int] or null; default `None`)")
    assert "| runs (read-only) | `orch_x` | Read the thing. |" in row
    assert set(TASKS) <= {line.split("`")[1] for line in reference_markdown(TASKS).splitlines()[2:]}


def _stops_without_rescue(steps, rescued: bool) -> list[str]:
    """The ``service: state: stopped`` steps of ``steps`` that no enclosing block's rescue follows
    with a start of the unit this run stopped (``only_if_stopped_by_orch``)."""
    from orchestrator.engine.playbook import Block

    def starts_again(rescue) -> bool:
        for s in rescue:
            if isinstance(s, Block):
                if starts_again(s.block):
                    return True
            elif (s.module == "service" and s.args.get("state") in ("started", "restarted")
                  and s.args.get("only_if_stopped_by_orch") is True):
                return True
        return False

    bad = []
    for s in steps:
        if isinstance(s, Block):
            bad += _stops_without_rescue(s.block, rescued or starts_again(s.rescue))
        elif s.module == "service" and s.args.get("state") == "stopped" and not rescued:
            bad.append(s.name)
    return bad


def test_every_bundled_stop_is_followed_by_a_rescue_that_starts_the_unit_again():
    """A service orch stopped is running again when orch exits: a step failing (or an interrupt)
    between a playbook's stop and its start must lead to a rescue that starts the unit this run
    stopped. recover.yaml stops every rank of a disturbed multi-node server, running ones too."""
    for name in ("tune", "rollback", "recover", "doctor", "bench", "runs", "runner-trial"):
        plays = load_playbook(builtin_playbook(name), TASKS, RENAMED)
        for play in plays:
            assert _stops_without_rescue(play.steps, False) == [], name
