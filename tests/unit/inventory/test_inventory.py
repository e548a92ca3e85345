"""Inventory loader, variables, precedence and --limit patterns (orchestrator/inventory)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from orchestrator.inventory import (BUILTIN_PROTECTED_PROCESSES, KNOWN_VARS, InventoryError,
                                    effective_vars, known_vars_markdown, load_inventory)
from tests.paths import REPO


def write(base: Path, rel: str, text: str) -> Path:
    p = base / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def load(tmp_path: Path, text: str, **files: str):
    for rel, body in files.items():
        write(tmp_path, rel.replace("__", "/"), body)
    return load_inventory(write(tmp_path, "inv.yaml", text))


def error_of(tmp_path: Path, text: str, **files: str) -> InventoryError:
    with pytest.raises(InventoryError) as ei:
        load(tmp_path, text, **files)
    return ei.value


def names(hosts) -> list[str]:
    return [h.name for h in hosts]


FLEET = """
all:
  hosts:
    lone:
  children:
    gpus:
      children:
        h200:
        rtx6000:
    h200:
      hosts:
        h200-a:
        h200-b:
    rtx6000:
      hosts:
        rtx-[01:03]:
    canary:
      hosts:
        rtx-01:
        h200-a:
    empty: {}
"""


# ------------------------------------------------------------------ structure

def test_structure_order_groups_and_ungrouped(tmp_path):
    inv = load(tmp_path, FLEET)
    assert names(inv.hosts) == ["lone", "h200-a", "h200-b", "rtx-01", "rtx-02", "rtx-03"]
    assert inv.get_host("rtx-01").groups == ["canary", "gpus", "rtx6000"]
    assert inv.get_host("lone").groups == ["ungrouped"]
    assert inv.groups["ungrouped"].hosts == ["lone"]
    assert inv.groups["gpus"].hosts == ["h200-a", "h200-b", "rtx-01", "rtx-02", "rtx-03"]
    assert inv.groups["gpus"].direct_hosts == []
    assert inv.groups["h200"].depth == 2 and inv.groups["canary"].depth == 1
    assert inv.groups["empty"].hosts == []
    assert inv.groups["all"].hosts == names(inv.hosts)


def test_top_level_groups_other_than_all_and_string_forms(tmp_path):
    inv = load(tmp_path, """
        h200:
          hosts: h200-a
        gpus:
          children: h200
          hosts:
            gpu-x:2222:
    """)
    assert names(inv.hosts) == ["h200-a", "gpu-x"]
    # a top-level group joins 'all' only when it has no other parent (Ansible's reconcile)
    assert inv.groups["h200"].parents == ["gpus"] and inv.groups["gpus"].parents == ["all"]
    assert inv.groups["h200"].depth == 2
    assert inv.host_vars("gpu-x")["ansible_port"] == 2222
    assert inv.groups["gpus"].hosts == ["h200-a", "gpu-x"]


def test_host_ranges(tmp_path):
    inv = load(tmp_path, """
        all:
          hosts:
            n-[a:c]-[1:5:2]:
            w[08:10]:
    """)
    assert names(inv.hosts) == ["n-a-1", "n-a-3", "n-a-5", "n-b-1", "n-b-3", "n-b-5",
                                "n-c-1", "n-c-3", "n-c-5", "w08", "w09", "w10"]


def test_device_name_not_in_torchs_form_is_warned(tmp_path):
    """Issue 22: ``orch_device_name: H200`` names files SGLang never looks for on an H200 (torch says
    ``NVIDIA H200``): accepted, with a warning naming the file, the line and the likely torch form."""
    inv = load(tmp_path, """
        all:
          hosts:
            a:
              orch_device_name: H200
            b:
              orch_device_name: NVIDIA H200
            c:
              orch_device_name: "{{ 'NVIDIA H200' }}"
    """)
    assert inv.host_vars("a")["orch_device_name"] == "H200"
    assert len(inv.warnings) == 1 and "inv.yaml:4: host 'a': orch_device_name 'H200'" in inv.warnings[0]
    assert "did you mean 'NVIDIA H200'?" in inv.warnings[0]


def test_example_inventory_loads():
    inv = load_inventory(REPO / "inventories" / "example.yaml")
    assert {"rtx6000", "h200", "gpus", "canary"} <= set(inv.groups)
    assert inv.warnings == []
    v = inv.host_vars("rtx-02")
    assert v["ansible_host"] == "10.20.0.12"  # rendered from a range + template
    assert v["orch_sglang_url"] is None
    assert inv.host_vars("rtx-04")["orch_sglang_url"] == "http://10.20.0.14:30080"
    assert inv.host_vars("rtx-04")["orch_tune_space"] == "smoke"
    assert inv.host_vars("h200-a")["orch_tune_space"] == "full"
    assert names(inv.select("gpus:&canary")) == ["rtx-01", "h200-a"]


# ------------------------------------------------------------------ precedence

def test_precedence_inventory_file_levels(tmp_path):
    inv = load(tmp_path, """
        all:
          vars: {v: all, only_all: 1}
          children:
            parent:
              vars: {v: parent, only_parent: 1}
              children:
                child:
                  vars: {v: child}
                  hosts:
                    h1:
                    h2: {v: host}
    """)
    assert inv.host_vars("h1")["v"] == "child"
    assert inv.host_vars("h2")["v"] == "host"
    assert inv.host_vars("h1")["only_all"] == 1 and inv.host_vars("h1")["only_parent"] == 1


def test_precedence_files_over_inventory_as_ansible(tmp_path):
    inv = load(tmp_path, """
        all:
          vars: {a: inv_all, b: inv_all, c: inv_all, d: inv_all, e: inv_all}
          children:
            g:
              vars: {a: inv_g, b: inv_g, c: inv_g, d: inv_g}
              hosts:
                h1: {c: inv_host, d: inv_host}
        """,
        group_vars__all=" a: file_all\n b: file_all\n",
        group_vars__g=" b: file_g\n",  # file without extension, as Ansible allows
        host_vars__h1__main=" d: file_host\n",  # folder form
    )
    v = inv.host_vars("h1")
    # Ansible: inventory group vars < group_vars/all < group_vars/* < inventory host vars < host_vars/*
    assert v["a"] == "file_all"      # group_vars/all beats even a deeper group's inventory vars
    assert v["b"] == "file_g"
    assert v["c"] == "inv_host"
    assert v["d"] == "file_host"
    assert v["e"] == "inv_all"
    origin = inv.get_host("h1").origins["d"]
    assert origin.endswith(os.path.join("host_vars", "h1", "main") + ":1")


def test_group_vars_files_child_beats_parent_and_host_in_several_groups(tmp_path):
    inv = load(tmp_path, """
        all:
          children:
            parent:
              children:
                child:
                  hosts:
                    h: {seen: first, keep: 1}
            other:
              hosts:
                h: {seen: second}
        """,
        **{"group_vars__parent.yaml": "v: parent\n", "group_vars__child.yml": "v: child\n"})
    v = inv.host_vars("h")
    assert v["v"] == "child"
    assert v["seen"] == "second" and v["keep"] == 1  # a host's entries merge, later wins
    assert inv.get_host("h").groups == ["child", "other", "parent"]


def test_sibling_groups_merge_by_name_then_priority(tmp_path):
    text = """
        all:
          children:
            alpha:
              vars: {v: alpha%s}
              hosts: {h: }
            beta:
              vars: {v: beta}
              hosts: {h: }
    """
    assert load(tmp_path, text % "").host_vars("h")["v"] == "beta"  # same depth: name order
    inv = load(tmp_path, text % ", ansible_group_priority: 10")
    assert inv.host_vars("h")["v"] == "alpha"
    assert inv.groups["alpha"].priority == 10
    assert "ansible_group_priority" not in inv.host_vars("h")


def test_group_vars_first_matching_extension_wins_with_warning(tmp_path):
    inv = load(tmp_path, "all:\n  children:\n    g:\n      hosts: {h: }\n",
               **{"group_vars__g.yml": "v: yml\n", "group_vars__g.yaml": "v: yaml\n",
                  "group_vars__gg.yaml": "v: 1\n"})
    assert inv.host_vars("h")["v"] == "yml"
    assert any("g.yaml: ignored" in w for w in inv.warnings)
    assert any("gg.yaml: no group 'gg'" in w and "did you mean 'g'" in w for w in inv.warnings)


def test_defaults_and_derived(tmp_path):
    inv = load(tmp_path, """
        all:
          hosts:
            a:
            b: {ansible_host: 10.9.0.2, ansible_port: null, orch_protected_processes: [mydaemon]}
    """)
    va, vb = inv.host_vars("a"), inv.host_vars("b")
    for name, spec in KNOWN_VARS.items():
        if not spec.group_only:
            assert name in va
    # no fixed port (as Ansible's ssh plugin): ~/.ssh/config's Port, else 22, decides at connect
    assert va["ansible_host"] == "a" and va["ansible_port"] is None
    assert vb["ansible_host"] == "10.9.0.2"
    assert va["orch_sglang_url"] is None  # derived later from the unit's --port
    assert vb["ansible_port"] is None  # null = default
    assert va["orch_ready_timeout"] == 1800 and va["orch_bench_concurrency"] == [1, 16, 64]
    assert va["orch_state_dir"] == "/var/lib/orch"
    assert va["orch_known_hosts"] is None  # ~/.ssh/config UserKnownHostsFile, else ~/.ssh/known_hosts{,2}
    assert vb["orch_protected_processes"] == [*BUILTIN_PROTECTED_PROCESSES, "mydaemon"]
    assert va["orch_protected_processes"] == list(BUILTIN_PROTECTED_PROCESSES)
    # a copy each time: callers cannot change the inventory through it
    va["orch_bench_concurrency"].append(9)
    assert inv.host_vars("a")["orch_bench_concurrency"] == [1, 16, 64]
    assert effective_vars(inv.get_host("a"))["ansible_connection"] == "ssh"


def test_normalised_types(tmp_path):
    inv = load(tmp_path, """
        all:
          hosts:
            a:
              ansible_port: "2200"
              ansible_become: "yes"
              orch_triton_interpret: on
              orch_regression_threshold: "2.5%"
              orch_tune_batch_sizes: [1, "16", 64]
              ansible_user: 1000
    """)
    v = inv.host_vars("a")
    assert v["ansible_port"] == 2200 and v["ansible_become"] is True
    assert v["orch_triton_interpret"] is True and v["orch_regression_threshold"] == 2.5
    assert v["orch_tune_batch_sizes"] == [1, 16, 64] and v["ansible_user"] == "1000"


def test_templates(tmp_path):
    inv = load(tmp_path, """
        all:
          vars:
            port: 31000
            orch_sglang_url: "http://{{ ansible_host }}:{{ port }}"
            orch_ready_timeout: "{{ base_wait * 2 }}"
            base_wait: 600
            levels: [1, 8]
            orch_bench_concurrency: "{{ levels }}"
          hosts:
            a: {ansible_host: 10.1.0.5}
    """)
    v = inv.host_vars("a")
    assert v["orch_sglang_url"] == "http://10.1.0.5:31000"
    assert v["orch_ready_timeout"] == 1200
    assert v["orch_bench_concurrency"] == [1, 8]  # native types: a list stays a list


def test_secret_never_shown(tmp_path):
    inv = load(tmp_path, "all:\n  hosts:\n    a: {ansible_become_password: hunter2}\n")
    assert "hunter2" not in repr(inv.get_host("a"))
    assert inv.host_vars("a")["ansible_become_password"] == "hunter2"
    err = error_of(tmp_path, "all:\n  hosts:\n    a: {ansible_become_password: [hunter2]}\n")
    assert "hunter2" not in str(err) and "inv.yaml:3" in str(err)


def test_ssh_common_args_jump_host_read_other_options_refused(tmp_path):
    inv = load(tmp_path, "all:\n  hosts:\n    a: {ansible_ssh_common_args: '-o ProxyJump=ops@login:2222'}\n")
    assert inv.host_vars("a")["ansible_ssh_common_args"] == "-o ProxyJump=ops@login:2222"
    assert not inv.warnings
    err = error_of(tmp_path, "all:\n  hosts:\n    a: {ansible_ssh_common_args: '-J login -o X=1'}\n")
    assert "inv.yaml:3" in str(err) and "unsupported option -o X" in str(err), err
    err = error_of(tmp_path, "all:\n  hosts:\n    a: {orch_jump_host: 'ops@login:99999'}\n")
    assert "inv.yaml:3" in str(err) and "orch_jump_host" in str(err) and "bad port '99999'" in str(err), err


# ------------------------------------------------------------------ errors with file:line

def loc(tmp_path: Path, rel: str, line: int) -> str:
    return f"{tmp_path / rel}:{line}"


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    err = error_of(tmp_path, "all:\n  hosts:\n    a:\n   b: [1\n")
    assert str(err).startswith(loc(tmp_path, "inv.yaml", 4) + ":")
    assert "YAML syntax error" in str(err) and "\n" not in str(err)
    assert err.line == 4 and err.column is not None


def test_yaml_syntax_error_in_group_vars_file(tmp_path):
    err = error_of(tmp_path, "all:\n  hosts: {a: }\n", group_vars__all__x="ok: 1\nbad: : :\n")
    assert str(err).startswith(os.path.join(str(tmp_path), "group_vars", "all", "x") + ":2:")


def test_bad_port(tmp_path):
    err = error_of(tmp_path, """
        all:
          children:
            g:
              hosts:
                gpu-a:
                  ansible_port: abc
    """)
    assert str(err) == (f"{loc(tmp_path, 'inv.yaml', 6)}: host 'gpu-a': ansible_port must be "
                        f"an integer 1-65535, got 'abc'")
    assert "65536" in str(error_of(tmp_path, "all:\n  hosts:\n    a: {ansible_port: 65536}\n"))


def test_unknown_variable_with_suggestion(tmp_path):
    err = error_of(tmp_path, """
        all:
          children:
            h200:
              vars:
                orch_servce: sglang
              hosts: {a: }
    """)
    assert str(err) == (f"{loc(tmp_path, 'inv.yaml', 5)}: group 'h200': unknown variable "
                        f"'orch_servce' (did you mean 'orch_service'?)")
    err = error_of(tmp_path, "all:\n  hosts: {a: }\n", host_vars__a="x: 1\nansible_usr: me\n")
    assert str(err) == (f"{tmp_path / 'host_vars' / 'a'}:2: host 'a': unknown variable "
                        f"'ansible_usr' (did you mean 'ansible_user'?)")


@pytest.mark.parametrize("assignment, needle", [
    ("ansible_become: maybe", "ansible_become must be a boolean, got 'maybe'"),
    ("ansible_connection: smart", "ansible_connection must be one of 'ssh', 'local'"),
    ("orch_tune_space: ful", "did you mean 'full'?"),
    ("orch_tune_batch_sizes: [1, 0]", "orch_tune_batch_sizes must be a list of positive"),
    ("orch_tune_batch_sizes: [4, 4]", "must not repeat"),
    ("orch_bench_concurrency: 16", "orch_bench_concurrency must be a list"),
    ("orch_ready_timeout: -5", "orch_ready_timeout must be a positive number of seconds"),
    ("orch_state_dir: var/lib/orch", "orch_state_dir must be an absolute path"),
    ("orch_sglang_url: localhost:30000", "orch_sglang_url must be an http(s) URL"),
    ("orch_regression_threshold: 150", "a percentage 0-100"),
    ("orch_protected_processes: {a: 1}", "orch_protected_processes must be a list"),
    ("ansible_port: true", "ansible_port must be an integer 1-65535, got True"),
    ("group_names: [x]", "reserved"),
    ("2bad: 1", "invalid variable name"),
])
def test_wrong_types(tmp_path, assignment, needle):
    err = error_of(tmp_path, f"all:\n  hosts:\n    a:\n      {assignment}\n")
    assert str(err).startswith(loc(tmp_path, "inv.yaml", 4) + ": host 'a': ")
    assert needle in str(err)


def test_template_errors_name_the_assignment(tmp_path):
    err = error_of(tmp_path, "all:\n  vars:\n    orch_ready_timeout: '{{ nope }}'\n"
                             "  hosts: {a: }\n")
    assert str(err).startswith(loc(tmp_path, "inv.yaml", 3) + ": host 'a': ")
    assert "'nope' is undefined" in str(err)
    err = error_of(tmp_path, "all:\n  vars:\n    w: 'x'\n    orch_ready_timeout: '{{ w }}'\n"
                             "  hosts: {a: }\n")
    assert "inv.yaml:4" in str(err) and "orch_ready_timeout must be a positive" in str(err)
    err = error_of(tmp_path, "all:\n  vars:\n    p: '{{ q }}'\n    q: '{{ p }}'\n"
                             "  hosts: {a: }\n")
    assert "template loop" in str(err)
    err = error_of(tmp_path, "all:\n  vars:\n    z: \"{{ 1 / 0 }}\"\n  hosts: {a: }\n")
    assert "inv.yaml:3" in str(err) and "cannot render template" in str(err)


@pytest.mark.parametrize("text, line, needle", [
    ("all:\n  hosts:\n    - a\n    - b\n", 3, "hosts must be a mapping of host names"),
    ("all:\n  host:\n    a:\n", 2, "unknown key 'host', expected hosts, children or vars "
                                   "(did you mean 'hosts'?)"),
    ("all:\n  gpu-a:\n", 2, "a host goes under 'hosts:'"),
    ("all:\n  children:\n    g: [a]\n", 3, "group 'g' must be a mapping"),
    ("all:\n  hosts:\n    a: [1]\n", 3, "host 'a' vars must be a mapping"),
    ("all:\n  hosts:\n    a:\n    a:\n", 4, "duplicate key 'a' (first at line 3)"),
    ("all:\n  children:\n    gpus:\n      children:\n        h20:\n    h200:\n"
     "      hosts: {a: }\n", 5, "group 'h20' is referenced but never defined (did you mean 'h200'?)"),
    ("all:\n  children:\n    x:\n      children:\n        y:\n          children:\n"
     "            x:\n      hosts: {a: }\n", 7, "makes a loop"),
    ("all:\n  hosts:\n    'bad host':\n", 3, "invalid host name 'bad host'"),
    ("all:\n  hosts:\n    'a,b':\n", 3, "invalid host name"),
    ("all:\n  hosts:\n    n[3:1]:\n", 3, "bad range"),
    ("all:\n  hosts:\n    a:\n      ansible_group_priority: 3\n", 4, "only honoured"),
    ("all:\n  hosts:\n    a:\n  children:\n    a:\n      hosts: {b: }\n", 3,
     "'a' is both a host and a group"),
    ("- a\n- b\n", 1, "INI inventories are not supported"),
    ("all:\n  vars: [1]\n  hosts: {a: }\n", 2, "group 'all' vars must be a mapping"),
])
def test_structural_errors(tmp_path, text, line, needle):
    err = error_of(tmp_path, text)
    assert str(err).startswith(loc(tmp_path, "inv.yaml", line) + ": "), str(err)
    assert needle in str(err)
    assert "\n" not in str(err)


def test_empty_and_missing_files(tmp_path):
    assert str(error_of(tmp_path, "")).endswith("the inventory is empty")
    assert "defines no hosts" in str(error_of(tmp_path, "all:\n  children:\n    g: {}\n"))
    with pytest.raises(InventoryError, match="no such file"):
        load_inventory(tmp_path / "missing.yaml")
    err = error_of(tmp_path, "all:\n  hosts: {a: }\n", group_vars__all="x: !vault |\n  abc\n")
    assert os.path.join("group_vars", "all") + ":1" in str(err)


def test_unsafe_yaml_tag_rejected(tmp_path):
    err = error_of(tmp_path, "all:\n  hosts:\n    a: {x: !!python/object/apply:os.system [id]}\n")
    assert "inv.yaml:3" in str(err)


def test_known_vars_table_renders():
    md = known_vars_markdown()
    for name in KNOWN_VARS:
        assert f"`{name}`" in md
    assert "| `orch_ready_timeout` | seconds | 1800 |" in md
    assert md.count("\n") == len(KNOWN_VARS) + 2


# ------------------------------------------------------------------ --limit

@pytest.fixture
def fleet(tmp_path):
    return load(tmp_path, FLEET)


@pytest.mark.parametrize("limit, expected", [
    (None, ["lone", "h200-a", "h200-b", "rtx-01", "rtx-02", "rtx-03"]),
    ("all", ["lone", "h200-a", "h200-b", "rtx-01", "rtx-02", "rtx-03"]),
    ("*", ["lone", "h200-a", "h200-b", "rtx-01", "rtx-02", "rtx-03"]),
    ("h200", ["h200-a", "h200-b"]),
    ("rtx-02,h200-b", ["h200-b", "rtx-02"]),                 # inventory order, not limit order
    ("rtx-*", ["rtx-01", "rtx-02", "rtx-03"]),
    ("rtx-0[!2]", ["rtx-01", "rtx-03"]),                     # fnmatch class ([13] = subscript)
    ("gpus:!rtx-02", ["h200-a", "h200-b", "rtx-01", "rtx-03"]),
    ("!canary", ["lone", "h200-b", "rtx-02", "rtx-03"]),     # only exclusions: from all
    ("gpus:&canary", ["h200-a", "rtx-01"]),
    ("!rtx-01:gpus:&canary", ["h200-a"]),                    # order of terms does not matter
    ("gpus, !h200", ["rtx-01", "rtx-02", "rtx-03"]),
    ("~rtx-0[12]$", ["rtx-01", "rtx-02"]),
    ("~h2", ["h200-a", "h200-b"]),                           # regex matches group h200 too
    ("rtx6000[0]", ["rtx-01"]),
    ("rtx6000[-1]", ["rtx-03"]),
    ("gpus[1:3]", ["h200-b", "rtx-01", "rtx-02"]),           # Ansible slices include the end
    ("gpus[3:]", ["rtx-02", "rtx-03"]),
    ("ungrouped", ["lone"]),
    ("h200:empty", ["h200-a", "h200-b"]),                    # an empty group is a known name
])
def test_limit(fleet, limit, expected):
    assert names(fleet.select(limit)) == expected


@pytest.mark.parametrize("limit, needle", [
    ("h20", "pattern 'h20' matches no host or group (did you mean 'h200'?)"),
    ("gpus:!rtx-09", "pattern 'rtx-09' matches no host or group"),
    ("zz-*", "pattern 'zz-*' matches no host or group"),
    ("h200:&rtx6000", "selects no hosts"),
    ("empty", "selects no hosts"),
    ("h200[5]", "out of range"),
    ("rtx-0[13]", "([13] is read as a subscript, as in Ansible)"),
    ("~[", "bad regex"),
    (" , ", "is empty"),
    ("gpus:!", "without a pattern"),
])
def test_limit_errors(fleet, limit, needle):
    with pytest.raises(InventoryError) as ei:
        fleet.select(limit)
    assert needle in str(ei.value)
    assert repr(limit) in str(ei.value)


def test_limit_from_file(fleet, tmp_path):
    retry = tmp_path / "retry.txt"
    retry.write_text("rtx-03\n\n# comment\nh200-a\n")
    assert names(fleet.select(f"@{retry}")) == ["h200-a", "rtx-03"]
    assert names(fleet.select(f"@{retry}:!h200")) == ["rtx-03"]


def test_get_host_suggests(fleet):
    with pytest.raises(InventoryError, match="did you mean 'rtx-01'"):
        fleet.get_host("rtx-1")


def test_old_variable_names_are_aliases_of_the_new(tmp_path):
    """``orch_sglang_url`` is the old name of ``orch_server_url`` (issue 28): it sets the new one
    when that is unset, and both read the same value; ``orch_engine`` takes an engine orch knows."""
    inv = load(tmp_path, """
        all:
          hosts:
            a: {ansible_host: 10.1.0.5, orch_sglang_url: "http://10.1.0.5:31000"}
            b: {orch_server_url: "http://b:1", orch_engine: sglang}
    """)
    a, b = inv.host_vars("a"), inv.host_vars("b")
    assert a["orch_server_url"] == a["orch_sglang_url"] == "http://10.1.0.5:31000" and a["orch_engine"] is None
    assert b["orch_server_url"] == b["orch_sglang_url"] == "http://b:1" and b["orch_engine"] == "sglang"
    with pytest.raises(InventoryError, match="orch_engine must be one of 'sglang'"):
        load(tmp_path, """
            all:
              hosts:
                c: {orch_engine: tgi}
        """)
