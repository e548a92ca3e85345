"""One start's log read by journal cursor and file offset, and the log proof's rule for gaps
(issue 21 row 7, docs/reliability.md): a missing loaded-files line with a gap is not proven, a
line that shows the default config fails with or without one."""

from __future__ import annotations

import pytest

from orchestrator.engine.results import TaskFailed
from orchestrator.facts.systemd_unit import Unit
from orchestrator.facts.journal import LogMark, journal_gaps, mark_start, read_start
from orchestrator.tasks import TASKS
from tests.fakes import ScriptedConnection, make_ctx

UP = "/cfg/E=8,N=64,device_name=NVIDIA_H200.json"
CURSOR = "s=ab;i=2a;b=01;m=2a;t=2a;x=ff"


def test_mark_takes_the_cursor_and_the_files_inode_and_size():
    conn = ScriptedConnection([(r"--show-cursor", f"-- cursor: {CURSOR}\n"), (r"^stat", "77 1200\n"),
                               (r"^journalctl", "old\n"), (r"^tail", "file old\n")])
    mark = mark_start(conn, Unit("sglang-qwen", log_files=["/var/log/sglang.log"]))
    assert mark.cursor == CURSOR and mark.files == {"/var/log/sglang.log": (77, 1200)}


def test_read_after_the_cursor_and_from_the_recorded_size():
    conn = ScriptedConnection([(r"--after-cursor " + CURSOR.replace(";", ";"), "new journal\n"),
                               (r"^stat", "77 1500\n"), (r"^tail -c \+1201 ", "new file\n")])
    got = read_start(conn, Unit("sglang-qwen", log_files=["/f"]), LogMark(CURSOR, {"/f": (77, 1200)}, "old"))
    assert got.text == "new journal\nnew file\n" and got.gaps == [] and got.by_cursor


@pytest.mark.parametrize("now, how", [("78 100\n", "replaced (rotated)"), ("77 100\n", "truncated")])
def test_a_rotated_or_truncated_file_is_read_from_its_start_and_is_a_gap(now, how):
    conn = ScriptedConnection([(r"--after-cursor", ""), (r"^stat", now), (r"^tail -n ", "after rotation\n")])
    got = read_start(conn, Unit("sglang-qwen", log_files=["/f"]), LogMark(CURSOR, {"/f": (77, 1200)}, "old"))
    assert got.text == "after rotation\n" and got.gaps == [f"/f was {how} during the start: lines written "
                                                           "before that are not read"]


def test_without_a_cursor_the_copy_is_the_fallback():
    conn = ScriptedConnection([(r"^journalctl", "a\nb\n")])
    got = read_start(conn, Unit("sglang-qwen"), LogMark(None, {}, "a\n"))
    assert got.text == "b\n" and not got.by_cursor


def test_journald_rate_limit_lines_are_gaps_of_their_unit_only():
    text = ("systemd-journald[52]: Suppressed 913 messages from sglang-qwen.service\n"
            "systemd-journald[52]: Suppressed 4 messages from other.service\n")
    assert journal_gaps(text, "sglang-qwen") == ["journald suppressed 913 messages of sglang-qwen.service "
                                                 "(rate limiting)"]


def verify(tmp_path, log: str):
    conn = ScriptedConnection([(r"--show-cursor", f"-- cursor: {CURSOR}\n"), (r"--after-cursor", log)])
    ctx = make_ctx(tmp_path, {}, connection=conn)
    ctx.run.start_mark = LogMark(CURSOR, {}, "")
    return TASKS["verify_log"].fn(ctx, name="sglang-qwen", expect_paths=[UP]), ctx


def test_missing_line_with_a_gap_is_not_proven(tmp_path):
    result, ctx = verify(tmp_path, "systemd-journald[52]: Suppressed 9 messages from sglang-qwen.service\n")
    assert result.status == "ok" and result.data["not_proven"] == [UP]
    assert "not proven (log gap" in result.msg and ctx.run.summary.log_gaps


def test_missing_line_without_a_gap_fails(tmp_path):
    with pytest.raises(TaskFailed, match="log does not show"):
        verify(tmp_path, "x: server_args=ServerArgs(model_path='/m')\n")


def test_the_default_config_shown_fails_even_with_a_gap(tmp_path):
    log = ("systemd-journald[52]: Suppressed 9 messages from sglang-qwen.service\n"
           f"x: Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {UP}, "
           "you can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n")
    with pytest.raises(TaskFailed, match="default MoE config"):
        verify(tmp_path, log)


def _quiet_verify(tmp_path, log: str):
    conn = ScriptedConnection([(r"--show-cursor", f"-- cursor: {CURSOR}\n"), (r"--after-cursor", log)])
    ctx = make_ctx(tmp_path, {"orch_unit": {"server": {"log_level": "warning"}}}, connection=conn)
    ctx.run.start_mark = LogMark(CURSOR, {}, "")
    return TASKS["verify_log"].fn(ctx, name="sglang-qwen", expect_paths=[UP])


def test_a_server_at_log_level_warning_never_logs_the_loaded_line_not_proven_but_its_warnings_count(tmp_path):
    """Issue 32 row 18: ``--log-level warning`` drops SGLang's INFO ``Using MoE kernel config from``;
    the missing line is not proven (the benchmark after decides), a WARNING default line still fails."""
    result = _quiet_verify(tmp_path, "x: some warning\n")
    assert result.status == "ok" and result.data["not_proven"] == [UP]
    assert "not proven (--log-level warning: SGLang logs the files it loaded at INFO" in result.msg
    log = (f"x: Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {UP}, "
           "you can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n")
    with pytest.raises(TaskFailed, match="default MoE config"):
        _quiet_verify(tmp_path, log)


def test_without_a_cursor_the_files_are_still_read_by_offset_and_a_truncation_is_a_gap():
    # a unit whose output all goes to a file: the journal may hold no entry of it, so no cursor
    conn = ScriptedConnection([(r"^journalctl", ""), (r"^stat", "77 10\n"), (r"^tail -n ", "after\n")])
    got = read_start(conn, Unit("sglang-qwen", log_files=["/f"]), LogMark(None, {"/f": (77, 1200)}, "old file\n", ""))
    assert got.text == "after\n" and not got.by_cursor and "/f was truncated" in got.gaps[0]


# ------------------------------------------------ one start's journal kept to its invocation ID
NEW, OLD = "a" * 32, "b" * 32
UNIT = "sglang-qwen.service"
DOWN = UP.replace(".json", "_down.json")


def _entry(msg: str, inv: str | None = None, **more) -> str:
    import json

    e = {"__CURSOR": "c", "MESSAGE": msg, "_SYSTEMD_UNIT": UNIT, **more}
    if inv:
        e["_SYSTEMD_INVOCATION_ID"] = inv
    return json.dumps(e) + "\n"


def test_entries_of_another_invocation_are_dropped_and_entries_without_one_kept():
    from orchestrator.facts.journal import split_invocations

    out = (_entry("new start", NEW) + _entry("old straggler", OLD) + _entry("fast exit, no id")
           + _entry("systemd-journald[52]: Suppressed 3 messages from sglang-qwen.service", "5" * 32,
                    _SYSTEMD_UNIT="systemd-journald.service", OBJECT_SYSTEMD_UNIT=UNIT,
                    OBJECT_SYSTEMD_INVOCATION_ID=NEW)
           + _entry("Started sglang-qwen.service.", None, _SYSTEMD_UNIT="init.scope", UNIT=UNIT, INVOCATION_ID=NEW,
                    SYSLOG_IDENTIFIER="systemd", _PID="1")
           + "not json\n")
    text, dropped = split_invocations(out, "sglang-qwen", [NEW])
    assert text == ("new start\nfast exit, no id\nsystemd-journald[52]: Suppressed 3 messages from "
                    "sglang-qwen.service\nsystemd[1]: Started sglang-qwen.service.\nnot json\n")
    assert dropped == [{"invocation": OLD, "lines": 1, "first": "old straggler"}]
    # no invocation known (an older systemd): nothing is dropped
    assert "old straggler" in split_invocations(out, "sglang-qwen", [])[0]


def test_read_start_keeps_the_starts_invocation_and_the_current_one():
    conn = ScriptedConnection([(r"--after-cursor", _entry("mine", NEW) + _entry("restarted", "c" * 32)
                                + _entry("old", OLD)),
                               (r"show -p InvocationID", f"InvocationID={'c' * 32}\n")])
    mark = LogMark(CURSOR, {}, "old", invocation=NEW)
    got = read_start(conn, Unit("sglang-qwen"), mark)
    assert got.text == "mine\nrestarted\n" and got.invocations == [NEW, "c" * 32]
    assert [o["invocation"] for o in got.other_invocations] == [OLD]
    after = [c for c, _ in conn.calls if "--after-cursor" in c][0]
    assert after[-3:] == ["-o", "json", "--all"]


def test_the_proof_ignores_an_earlier_invocations_lookup_lines_and_says_so(tmp_path):
    straggler = ("Down MoE config file not found at " + DOWN + "; reusing the tuned up-projection config "
                 "without TMA. Performance might be sub-optimal.")
    log = (_entry(f"Using MoE kernel config from {UP}.", NEW) + _entry(f"Using MoE kernel config from {DOWN}.", NEW)
           + _entry(straggler, OLD))
    conn = ScriptedConnection([(r"--after-cursor", log), (r"show -p InvocationID", f"InvocationID={NEW}\n")])
    ctx = make_ctx(tmp_path, {}, connection=conn)
    ctx.run.start_mark = LogMark(CURSOR, {}, "", invocation=NEW)
    result = TASKS["verify_log"].fn(ctx, name="sglang-qwen", expect_paths=[UP, DOWN])
    assert result.status == "ok" and result.data["other_invocations"][0]["invocation"] == OLD
    assert ctx.run.summary.log_other_invocations[0]["lines"] == 1
    # the same log read without the invocation (the code before): the old line fails the proof
    ctx.run.start_mark = LogMark(CURSOR, {}, "")
    with pytest.raises(TaskFailed, match="did not find the down config"):
        TASKS["verify_log"].fn(ctx, name="sglang-qwen", expect_paths=[UP, DOWN])


def test_the_invocation_id_is_read_as_systemd_formats_it():
    from orchestrator.facts.journal import invocation_id

    conn = ScriptedConnection([(r"show -p InvocationID", "InvocationID=" + "AB" * 16 + "\n")])
    assert invocation_id(conn, Unit("u")) == "ab" * 16
    assert invocation_id(ScriptedConnection([(r"show", "InvocationID=\n")]), Unit("u")) is None


def test_last_start_without_a_start_line_is_the_current_invocations_entries():
    """Issue 32 row 18: a unit run with ``--log-level warning`` logs no ``server_args=`` line; its last
    start is then the journal entries of the unit's current invocation (an earlier one's are not)."""
    import json

    from orchestrator.facts.journal import last_start_log

    old, new = "0" * 31 + "1", "ab" * 16

    def entry(msg, inv):
        return json.dumps({"MESSAGE": msg, "_SYSTEMD_UNIT": "sglang-qwen.service", "_SYSTEMD_INVOCATION_ID": inv})

    js = "\n".join([entry("old start: Using default MoE kernel config. ...", old), entry("new start line", new)]) + "\n"
    conn = ScriptedConnection([(r"-o json", js), (r"^journalctl -u sglang-qwen", "x: old start\nx: new start line\n"),
                               (r"InvocationID", f"InvocationID={new}\n")])
    assert last_start_log(conn, Unit("sglang-qwen")) == "new start line\n"
    with_start = ScriptedConnection([(r"^journalctl -u sglang-qwen", "x: server_args=ServerArgs(a=1)\nx: after\n")])
    assert last_start_log(with_start, Unit("sglang-qwen")) == "x: server_args=ServerArgs(a=1)\nx: after\n"
    empty = ScriptedConnection([(r"^journalctl -u sglang-qwen", "")])
    assert last_start_log(empty, Unit("sglang-qwen")) is None and len(empty.calls) == 1
